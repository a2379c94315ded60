/* ref_state.h - the reference backend's state, shared by its two halves:
 * ref_backend.c (create, destroy, adapters, state copies: the vtable) and
 * ref_step.c (one forward step). Nothing outside ref/ includes it.
 * Ownership: everything a ref_state points to is allocated by ref_create
 * and freed by ref_destroy, except what it borrows (marked so). */
#ifndef DEVIO_REF_STATE_H
#define DEVIO_REF_STATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "device/adapter/adapter.h"
#include "device/backend/backend.h"
#include "ref/pool.h"
#include "ref/ref_gemm.h"
#include "ref/ref_kernels.h"
#include "ref/ref_mixer.h"

/* The projection weights of a layer, packed (ref_gemm.h); the ones a layer
 * lacks stay empty. */
typedef enum ref_weight {
    REF_WQ = 0, REF_WK, REF_WV, REF_WO, REF_WGATE, REF_WUP, REF_WDOWN, REF_WIN, REF_WOUT,
    REF_W_N
} ref_weight;

typedef struct ref_state {
    const devio_model *model; /* borrowed */
    devio_backend_config cfg; /* its pointers are borrowed from the core */
    uint32_t d, n_heads, n_kv, hd, f, vocab, q_dim, kv_dim;
    uint32_t d_pad, q_pad, f_pad;
    float eps, attn_scale;

    /* n_layers pools of [kv_blocks, n_kv, block_size, hd]: head-major inside
     * a block, so one head's keys are contiguous for attention. */
    ref_kv **k_cache, **v_cache;
    size_t block_elems;         /* block_size * kv_dim */
    const float *rope_cos, *rope_sin; /* [max_seq_len, hd / 2], the core's */
    size_t bytes;               /* everything create allocated, for info */

    /* Every projection packed once at create: [n_layers * REF_W_N], and
     * the logits head. The model's own copies are not read by a step. */
    ref_panels *panels;
    ref_panels lm_panels;

    /* Norm weights and biases widened once: they are tiny and read per token. */
    float *attn_norm, *ffn_norm; /* [n_layers, d] */
    float *final_norm;           /* [d] */
    float *bq, *bk, *bv;         /* [n_layers, q_dim / kv_dim] or NULL */
    float *q_norm, *k_norm;      /* [n_layers, head_dim] (Qwen3) or NULL */

    /* Activations, max_batch_tokens rows each; padded rows keep zeros past
     * their width because nothing writes there. */
    float *x;   /* [T, d_pad] residual stream */
    float *h;   /* [T, d_pad] normed input of a projection */
    float *q;   /* [T, q_dim] */
    float *k;   /* [T, kv_dim] */
    float *v;   /* [T, kv_dim] */
    float *att; /* [T, q_pad] attention output */
    float *act; /* [T, f_pad] silu(gate) * up */
    uint32_t *tok_pos;          /* [T] the batch's positions, compacted for the last layer */
    const uint32_t **tok_blocks;
    const devio_adapter **tok_adapter; /* [T] the LoRA adapter of each token's row, or NULL */
    const devio_adapter **slots; /* [adapter_slots] what adapter_add placed, borrowed */
    uint32_t *slot_gen;          /* [adapter_slots] the generation it was placed under */
    uint32_t lora_targets;      /* union of the targets of this step's adapters */
    /* LoRA (unfused path, only when a step's adapters target the module):
     * base outputs before their epilogue, and one token's A x. */
    float *o_tmp;    /* [T, d_pad] o_proj / down_proj outputs */
    float *g_tmp;    /* [T, f_pad] gate_proj outputs */
    float *u_tmp;    /* [T, f_pad] up_proj outputs */
    float *lora_row; /* [max(d, f, q_dim) padded] one widened row of A or B */
    float *lora_a;   /* [max_lora_rank] */
    float **out_ptr; /* [T] logits rows, in batch order of the wanted tokens */

    devio_pool *pool;
    ref_scratch *scratch; /* one per pool thread */
    uint32_t n_scratch;
    /* pool and scratch again, and the packed activations of a projection
     * (ref_gemm_xpack_floats, owned here): what ref_matmul_run takes. */
    ref_gemm_work work;

    /* Hybrid models (numspec rule 10): per layer, the mixer's small weights
     * widened (mixer layers only) and its offset inside a state slot; the
     * state and snapshot pools; the mixer's activations. */
    ref_mixer_weights *mix;     /* [n_layers] */
    float **in_bias, **out_bias;/* [n_layers] in_proj / out_proj biases, or NULL */
    size_t *mix_off;            /* [n_layers] */
    float *ssm_slots;           /* [ssm_slots, slot_floats] */
    float *ssm_snaps;           /* [ssm_snapshots, slot_floats] */
    uint32_t in_pad, conv_pad, i_pad;
    float *zx;       /* [T, in_pad] in_proj outputs */
    float *xa;       /* [T, conv_pad] conv outputs */
    float *ym;       /* [T, i_pad] the mixer's output before out_proj */
    float *scan_tmp; /* [threads, ssm_state] */
} ref_state;

/* The whole step of a checked batch, on the calling thread (the pool's
 * threads help): the backend's wait slot. */
devio_status ref_step_run(void *state, const devio_batch *b, devio_error *err);

#endif
