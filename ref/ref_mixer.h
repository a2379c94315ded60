/* ref_mixer.h - the Mamba-2 mixer of the reference backend between its two
 * projections: the causal conv, the selective-state recurrence and the gated
 * norm of numspec rule 10, over every row of a step. The projections
 * (in_proj, out_proj, LoRA) stay with the backend's matmul. Never allocates.
 *
 * Work splits by (row, block of channels) for the conv, by (row, head) for
 * the recurrence and by token for the norm; each job runs its tokens in
 * position order, so no number depends on the split or the thread count. */
#ifndef DEVIO_REF_MIXER_H
#define DEVIO_REF_MIXER_H

#include <stddef.h>
#include <stdint.h>

#include "device/backend/backend.h"
#include "ref/pool.h"

/* One mixer layer's small weights, widened to binary32 once at create. */
typedef struct ref_mixer_weights {
    float *conv_w;  /* [conv_dim, K] */
    float *conv_b;  /* [conv_dim], zeros when the model has no conv bias */
    float *dt_bias; /* [H] */
    float *a;       /* [H] A = -devio_expf(A_log) */
    float *d_skip;  /* [H] */
    float *norm;    /* [I] */
} ref_mixer_weights;

/* One mixer layer of one step. Everything is borrowed. */
typedef struct ref_mixer {
    const devio_model_shape *shape;
    const devio_batch *batch;
    const ref_mixer_weights *w;
    const float *zx;   /* [n_tokens, ldzx] in_proj outputs: z | xBC | dt */
    size_t ldzx;
    float *xa;         /* [n_tokens, ldxa] scratch: the conv's activated outputs */
    size_t ldxa;
    float *y;          /* [n_tokens, ldy] out: the gated norm's output, zero past I */
    size_t ldy;
    float *slots;      /* [ssm_slots, slot_floats] the state slots */
    float *snaps;      /* [ssm_snapshots, slot_floats] the snapshots */
    size_t layer_off;  /* this layer's offset inside a slot (backend.h's layout) */
    float *tmp;        /* [threads, ssm_state] per-thread scratch */
} ref_mixer;

/* The floats of one mixer layer inside a slot: its conv window, then S. */
static inline size_t ref_mixer_layer_floats(const devio_model_shape *s)
{
    return (size_t)s->conv_dim * (s->ssm_conv - 1) +
           (size_t)s->ssm_inner * s->ssm_state;
}

/* Conv, recurrence and gated norm for every token of m->batch, updating
 * (and snapshotting) the rows' state slots. */
void ref_mixer_run(devio_pool *pool, const ref_mixer *m);

#endif
