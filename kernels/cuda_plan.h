/* cuda_plan.h - how much device memory the CUDA backend takes, region by
 * region, and how many KV blocks fit beside the rest: plain arithmetic on the
 * model shape and the backend configuration, so that it is tested on any
 * machine. Never allocates; never calls CUDA. */
#ifndef DEVIO_CUDA_PLAN_H
#define DEVIO_CUDA_PLAN_H

#include <stdbool.h>
#include <stdint.h>

#include "device/backend/backend.h"

/* What the backend keeps free of its own allocations on the device, for the
 * CUDA context, kernels' stacks and the allocator's rounding: a fixed part
 * and a share of the total. */
#define CUDA_PLAN_RESERVE_BYTES (512ull << 20)
#define CUDA_PLAN_RESERVE_PER_MILLE 20u

typedef struct cuda_plan {
    uint64_t weights;     /* embedding, lm_head and projections, as loaded (bf16/f16/f32) */
    uint64_t small;       /* norms, biases and the mixers' small tensors widened to f32,
                             RoPE tables */
    uint64_t kv;          /* K and V pools: 2 * attention layers * kv_blocks * block bytes */
    uint64_t kv_block;    /* bytes one KV block takes over the attention layers, K and V
                             (f32, or f16 under fast numerics); 0 when the model has none */
    uint64_t ssm;         /* recurrent state: (ssm_slots + ssm_snapshots) slots */
    uint64_t ssm_slot;    /* one slot: slot_floats binary32 */
    uint64_t activations; /* the step's f32 buffers */
    uint64_t logits;      /* the logits staging rows */
    uint64_t lora;        /* adapter slots, f32 A and B for every module */
    uint64_t lora_slot;   /* one adapter slot */
    uint64_t meta;        /* one step's uploaded tables (tokens, positions, block tables,
                             hybrid models' rows and snapshots) */
    uint64_t fast;        /* fast numerics' buffers, the sum of fast_buf; 0 in strict */
    struct {
        uint64_t x16;     /* GEMM inputs in 16 bits: [T, widest input] */
        uint64_t qkv, gu; /* fused q/k/v and gate/up outputs: [T, q_dim + 2 kv_dim], [T, 2 f] */
        uint64_t bqkv;    /* bq, bk, bv side by side per layer, when the model has biases */
        uint64_t part;    /* attention's ranges before they are combined (cuda_fast.h) */
        uint64_t sample;  /* sampling's jobs, results and [logits_rows, 2 * vocab] scratch */
        uint64_t logits;  /* every logits slot the core names, [logits_rows, vocab]: logits
                             stay on the GPU until read (cuda_sampling.c) */
        uint64_t deq;     /* the largest quantized projection widened to f16 for a GEMM
                             (cuda_plan_for; 0 when none is quantized) */
        uint64_t ssm_cs;  /* hybrid models: the chunked scan's chunk states, I * N floats for
                             each of 2 * ceil(T / CUDA_SSM_CHUNK) chunks (cuda_ssm.h) */
        uint64_t ssm_lam; /* and its dA products, [T, H] floats */
    } fast_buf;
    uint64_t total;
    uint32_t meta_words;  /* meta / 4 */
    uint32_t logits_rows; /* rows of the staging buffer */
    uint32_t max_blocks_per_seq;
} cuda_plan;

/* The plan for `cfg` (with cfg->kv_blocks as asked) and `weight_bytes` of
 * weights; false when a size overflows 64 bits. */
bool cuda_plan_make(const devio_backend_config *cfg, uint64_t weight_bytes, cuda_plan *out);

/* Bytes of one K or V element: 4 (f32) in strict numerics, 2 (f16) in fast,
 * so that the same memory holds twice the tokens. */
uint32_t cuda_plan_kv_elem(const devio_backend_config *cfg);

/* The device memory the plan may use when `free_bytes` are free of `total_bytes`. */
uint64_t cuda_plan_budget(uint64_t free_bytes, uint64_t total_bytes);

/* The most KV blocks that fit in `budget` beside everything else of the plan
 * (whose kv part is ignored); 0 when not even the rest fits, UINT32_MAX
 * when it does and a block takes no memory (no attention layers). */
uint32_t cuda_plan_kv_fit(const cuda_plan *p, uint64_t budget);

/* In- and output widths of LoRA target t (a devio_lora_target) in any layer
 * of the shape (0 and 0 when the shape has no such module); false for a
 * target this backend does not apply. */
bool cuda_plan_lora_dims(const devio_model_shape *s, uint32_t t, uint32_t *in, uint32_t *out);

/* The plan for `cfg` and model m: cuda_plan_make with m's weight bytes and, under fast
 * numerics, fast_buf.deq for its quantized projections. */
bool cuda_plan_for(const devio_model *m, const devio_backend_config *cfg, cuda_plan *out);

/* Elements of m's largest quantized projection (the embedding and lm_head included), 0 when
 * none is quantized. */
uint64_t cuda_plan_dequant_elems(const devio_model *m);

/* Bytes of the tensors the backend uploads as they are: the embedding, lm_head
 * (when not tied), every layer's projections (attention, MLP, in_proj and
 * out_proj of a mixer). */
uint64_t cuda_plan_weight_bytes(const devio_model *m);

#endif
