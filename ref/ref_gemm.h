/* ref_gemm.h - the reference backend's projections: weights packed once into
 * panels, activations packed per call, and a register-blocked micro-kernel
 * that computes every output by the lane rule of device/numerics/numspec.h (rule 3),
 * bit for bit what ref_lane_dot gives, for any number of tokens.
 *
 * Layout (docs/numerics.md, "Projections"): a weight [m, n] becomes
 * ceil(m / 16) panels of 16 output rows; inside a panel the elements are in
 * lane-major order, [8 quads of lanes][k32 steps][4 lanes][16 rows] with
 * k32 = ceil(n / 32), so element (row o, column k) sits at lane k % 32,
 * step k / 32. The lane rule adds the terms of lane l in increasing k, which
 * is the order the kernel reads a lane in; the 32 lane sums are then folded
 * as the rule folds them. Four lanes side by side let a decode step (one
 * token, four lanes at a time) read each panel as one stream. Rows past m
 * and columns past n are zeros. The dtype is kept (bf16 and f16 are widened
 * in registers, or once per block of tokens into the thread's scratch when
 * a panel serves several groups), so a packed weight takes as many bytes as
 * the file's. A quantized weight (device/numerics/quant.h) keeps one int8 per element
 * in that order (its split form's q) and, per step and row, the scale (and
 * offset) of each group of 32 inputs (16 for Q6_K); it is widened into the
 * thread's scratch, exactly, before every use: about 1.1 to 1.3 bytes per
 * weight, never a binary32 copy of the model.
 *
 * Ownership: a ref_panels owns its data (ref_panels_pack allocates,
 * ref_panels_free releases); a ref_matmul borrows everything it points to. */
#ifndef DEVIO_REF_GEMM_H
#define DEVIO_REF_GEMM_H

#include <stddef.h>
#include <stdint.h>

#include "device/backend/backend.h"
#include "ref/pool.h"
#include "ref/ref_kernels.h"

/* Output rows per panel, and lanes stored side by side. */
#define REF_PANEL_ROWS 16u
#define REF_LANE_QUAD 4u

typedef struct ref_panels {
    void *data;        /* owned: ceil(m / 16) * 16 * k32 * 32 elements of dtype (int8 q when quantized) */
    float *qscale;     /* owned, quantized only: [panel][k32][groups][16 rows] */
    float *qoffset;    /* owned, quantized types with an offset only; same layout */
    uint32_t qgroups;  /* groups per 32 inputs: 2 for Q6_K, else 1 */
    devio_dtype dtype;
    uint32_t m, n, k32;
    size_t bytes;
} ref_panels;

/* Pack the row-major weight w [m, n] of dtype dt into p, the panels cut
 * across the pool's threads. Returns 0, or -1 when memory is short (p then
 * holds nothing). */
int ref_panels_pack(ref_panels *p, devio_pool *pool, const void *w, devio_dtype dt, uint32_t m,
                    uint32_t n);
void ref_panels_free(ref_panels *p);

/* What a projection does with each dot product (rule 3 and 7). */
typedef enum ref_epilogue {
    REF_EPI_STORE = 0,  /* y = dot */
    REF_EPI_BIAS,       /* y = dot + bias[o] */
    REF_EPI_ADD,        /* y = y + dot (residual) */
    REF_EPI_ADD_SCALED, /* y = y + dot * scale (Granite's residual_multiplier) */
    REF_EPI_SILU_MUL,   /* y = devio_siluf(dot(w)) * dot(w2) */
} ref_epilogue;

/* One projection over n_tok token rows. Everything is borrowed. */
typedef struct ref_matmul {
    const ref_panels *w;  /* [m, n] */
    const ref_panels *w2; /* REF_EPI_SILU_MUL: the up weight, same dtype and shape */
    const float *bias;    /* REF_EPI_BIAS: [m] f32 */
    float scale;          /* REF_EPI_ADD_SCALED */
    ref_epilogue epi;
    const float *x;       /* n_tok rows of stride ldx >= n */
    size_t ldx;
    uint32_t n_tok;
    float *y;             /* output rows of stride ldy, or ... */
    size_t ldy;
    float *const *y_rows; /* ... when not NULL, output row pointers [n_tok] */
    uint32_t rows_per_job; /* set by ref_matmul_run */
} ref_matmul;

/* What a run needs besides its projections: the pool, one scratch per pool
 * thread, and the packed activations, ref_gemm_xpack_floats(T, n) floats
 * for batches up to T tokens of width up to n, 64-byte aligned (the cpu
 * backend's 32-byte loads from them then never span two cache lines, as
 * from calloc's 16 bytes half of them do). All borrowed. */
typedef struct ref_gemm_work {
    devio_pool *pool;
    ref_scratch *scratch;
    float *xpack;
} ref_gemm_work;

size_t ref_gemm_xpack_floats(uint32_t max_tokens, uint32_t max_n);

/* Run up to 4 projections that read the same x (same rows, stride and n)
 * as one parallel region: x is packed once, then jobs are ranges of whole
 * panels, each output element computed whole by one job. */
void ref_matmul_run(const ref_gemm_work *wk, ref_matmul *mm, uint32_t count);

#endif
