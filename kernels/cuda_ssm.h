/* cuda_ssm.h - the CUDA backend's Mamba-2 mixer kernels (numspec rule 10)
 * between in_proj and out_proj: the causal conv, the selective-state scan
 * and the gated norm, as C functions that enqueue them on a stream. Shared
 * by cuda_ssm.cu (nvcc) and cuda_mixer.c (the C compiler): no CUDA types
 * cross it. Every function returns the launch's cudaError_t as an int.
 *
 * State: one slot (or snapshot) is slot_floats floats; mixer layer m holds,
 * at layer_off inside it, the conv window [conv_dim][K-1] (oldest first)
 * then S [H][P][N] (backend.h's layout). Slots and snapshots live in one
 * device array: state slot i at index i, snapshot j at ssm_slots + j. A
 * row's conv touches only the window part and its scan only the S part, so
 * the two kernels of a layer never race, and no two rows share a slot. */
#ifndef DEVIO_CUDA_SSM_H
#define DEVIO_CUDA_SSM_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The widest state and conv kernel the kernels take (create refuses more). */
#define CUDA_SSM_MAX_STATE 256u
#define CUDA_SSM_MAX_CONV 32u

/* Snapshot modes of a row, as backend.h's devio.h's devio_snapshot numbers them. */
enum { CUDA_SNAP_NONE = 0, CUDA_SNAP_END = 1, CUDA_SNAP_EACH = 2 };

/* One row of a step as the mixer kernels read it: uploaded with the step's
 * tables, all words. */
typedef struct cuda_ssm_row {
    uint32_t tok_start, n_tokens;
    uint32_t slot;      /* the row's state slot (an index into the state array) */
    uint32_t fresh;     /* 1 when pos0 == 0: the state starts from +0.0f */
    uint32_t snap_mode; /* CUDA_SNAP_* */
    uint32_t snap_off;  /* END: snaps[snap_off]; EACH: snaps[snap_off + i] after token i */
} cuda_ssm_row;
#define CUDA_SSM_ROW_WORDS 6u

/* One mixer layer of one step. Device pointers unless said otherwise. */
typedef struct cuda_ssm {
    uint32_t H, P, G, N, K, I, conv_dim, in_dim;
    float dt_min, dt_max, eps;
    const cuda_ssm_row *rows; /* [n_rows] */
    uint32_t n_rows;
    const uint32_t *snaps;    /* state array indices of the rows' snapshots */
    float *state;             /* [ssm_slots + ssm_snapshots, slot_floats] */
    uint64_t slot_floats;
    uint64_t layer_off;       /* this layer's floats inside a slot */
    /* The layer's weights, widened to f32; conv_b NULL when absent. */
    const float *conv_w, *conv_b, *dt_bias, *a_log, *d_skip, *norm;
    const float *zx;          /* [n_tok, in_dim] in_proj's outputs z | xBC | dt */
    float *xa;                /* [n_tok, conv_dim] the conv's activated outputs */
    float *y;                 /* [n_tok, I] the scan's outputs, then the gated norm's */
    uint32_t bc_pending;      /* set by cuda_ssm_conv_scan: the B and C windows are still to
                                 move, which cuda_ssm_gate_norm does */
} cuda_ssm;

/* The conv of every row, one thread per (row, channel) running the row's
 * tokens in order: xa = silu(lane_dot(conv_w[c], window, K) + conv_b[c]),
 * the window moving by one; window written back to the slot and snapshots. */
int cuda_ssm_conv(const cuda_ssm *m, void *stream);

/* The recurrence of every row, one warp per (row, head, channel p) running
 * the row's tokens in order, the N states spread over the lanes as the lane
 * rule spreads its terms: S = S * dA + (dt * B) * x, y = lane_dot(S, C, N)
 * + D * x; S written back to the slot and snapshots. */
int cuda_ssm_scan(const cuda_ssm *m, void *stream);

/* Fast numerics: the same recurrence cut into chunks of CUDA_SSM_CHUNK tokens computed side
 * by side (a row of a long prompt no longer runs its tokens one after the other in one warp):
 * each chunk from zero (its row's state for the first), then the chunks' last states made
 * whole in order, then each chunk's outputs given what its starting state adds (the state
 * decays by the product of dA, a scalar per token and head). `chunks`: the step's chunks over
 * all rows (a row of n tokens has ceil(n / CUDA_SSM_CHUNK)); cs holds a state of I * N floats
 * for each chunk of the rows of more than one chunk, lam [n_tok, H] floats. No snapshot after
 * each token (those rows take cuda_ssm_scan). Products and sums in f32 in an order of their
 * own. */
#define CUDA_SSM_CHUNK 32u
int cuda_ssm_scan_chunked(const cuda_ssm *m, uint32_t chunks, float *cs, float *lam,
                          void *stream);

/* Decode steps, every row one token: cuda_ssm_conv then cuda_ssm_scan as one kernel, a block
 * per (row, head, SCAN_WARPS channels) computing its group's B and C itself (the conv of
 * those 2N channels, kept in shared memory) and each warp its channel's x: every number,
 * window and state is those two kernels', bit for bit (xa is not written). The B and C
 * windows, which the group's other blocks read, are left as they were; m->bc_pending is set
 * and cuda_ssm_gate_norm, next on the stream, moves them. */
int cuda_ssm_conv_scan(cuda_ssm *m, void *stream);

/* y = norm_w * (q * rsqrt(mean of q*q over the group + eps)) with
 * q = y * silu(z), one warp per (token, group), in place, for n_tok tokens; first, when
 * m->bc_pending, the B and C windows cuda_ssm_conv_scan left. */
int cuda_ssm_gate_norm(const cuda_ssm *m, uint32_t n_tok, void *stream);

#ifdef __cplusplus
}
#endif

#endif
