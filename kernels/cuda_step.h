/* cuda_step.h - one step being enqueued, shared by cuda_step.c (the step, attention layers,
 * the MLP, outputs), cuda_mixer.c (mixer layers) and cuda_project.c (the projections both
 * call). Calls go one way: step -> mixer -> project, step -> project. Private to kernels/. */
#ifndef DEVIO_CUDA_STEP_H
#define DEVIO_CUDA_STEP_H

#include "kernels/cuda_ssm.h"
#include "kernels/cuda_state.h"

/* Where a step's per-token tables sit in the uploaded words (device
 * pointers into st->meta), for all tokens or for the tokens whose logits
 * are wanted. */
typedef struct step_tables {
    const int32_t *tokens;
    const uint32_t *pos, *bt_off, *bt, *out_tok;
    const int32_t *slot;
    const uint32_t *groups; /* fast numerics: the tokens grouped by adapter slot (SGMV) */
} step_tables;

typedef struct cuda_step {
    cuda_state *st;
    const devio_batch *b;
    uint32_t ring;                /* the step's slot among the max_depth in flight */
    step_tables all, out;
    const cuda_ssm_row *ssm_rows; /* device: [b->n_rows] (hybrid models) */
    const uint32_t *ssm_snaps;    /* device: the rows' snapshot slots, state array indices */
    uint32_t max_keys;            /* the most keys a token of the step attends to */
    uint32_t mixer_words;         /* the hybrid tables' words in the upload */
    uint32_t ssm_chunks;          /* fast numerics: the chunks the scan is cut into, or 0 for
                                     the sequential scan (cuda_ssm.h) */
    devio_error *err;
} cuda_step;

/* No LoRA target: a module no adapter can adapt. */
#define CUDA_NO_LORA (-1)

#define CHECK(s, call, what)                                                                       \
    do {                                                                                           \
        devio_status s_ = cuda_check((s)->st, (call), (what), (s)->err);                           \
        if (s_ != DEVIO_OK)                                                                        \
            return s_;                                                                             \
    } while (0)

/* ---- cuda_project.c ---- */

/* Rule 3 on the step's stream. */
devio_status step_project(cuda_step *sp, cuda_matvec mv, const char *what);

/* h = rmsnorm(x) with weight w for the n_use projections users of h: when
 * they all round h alike for the GEMM, the norm writes that rounding into
 * st->x16 too and they take it from there (no rounding pass of their own). */
devio_status step_norm_for(cuda_step *sp, const float *x, const float *w, uint32_t n,
                           cuda_matvec **users, uint32_t n_use);

/* Rule 3a on y for the tokens whose adapter adapts `target` (a
 * devio_lora_target, or CUDA_NO_LORA) of layer li, when some adapter of the
 * step does. */
devio_status step_lora(cuda_step *sp, uint32_t li, int target, const step_tables *t,
                       const float *x, uint32_t ldx, float *y, uint32_t ldy, uint32_t max_out,
                       uint32_t n);

/* x += W in (+ bias) (+ LoRA): mv.y is the residual x; mv.bias, when set,
 * is the projection's bias. With neither bias nor LoRA one fused add;
 * otherwise z = dot (+ b) is stored, adapted, then added (rules 3, 3a). */
devio_status step_residual(cuda_step *sp, uint32_t li, int target, cuda_matvec mv,
                           const step_tables *t, const char *what);

/* ---- cuda_mixer.c ---- */

/* Mixer layer li, split as an attention layer is: first the
 * part every token runs because it moves the row's state (norm, in_proj,
 * conv, scan, gated norm into st->my), then out_proj into the residual rows
 * x of n tokens whose gated-norm rows are y. */
devio_status cuda_mixer_first(cuda_step *sp, uint32_t li, uint32_t n);
devio_status cuda_mixer_out(cuda_step *sp, uint32_t li, uint32_t n, float *x, const float *y,
                            const step_tables *t);

/* The hybrid tables of a step (cuda_mixer.c): every row's cuda_ssm_row and
 * its snapshots, packed into host words w whose device copy is at dev.
 * Returns the words used; sets sp->ssm_rows and sp->ssm_snaps. */
uint32_t cuda_mixer_pack(cuda_step *sp, uint32_t *w, const uint32_t *dev);

#endif
