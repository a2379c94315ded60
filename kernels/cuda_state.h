/* cuda_state.h - the CUDA backend's state, private to kernels/: what create
 * allocated on the device (cuda_backend.c) and what a step reads and writes
 * (cuda_step.c). All device memory is taken in create; a step never
 * allocates. Every pointer below is device memory unless it says host. */
#ifndef DEVIO_CUDA_STATE_H
#define DEVIO_CUDA_STATE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "device/adapter/adapter.h"
#include "device/backend/backend.h"
#include "device/sample/sampler.h"
#include "kernels/cuda_kernels.h"
#include "kernels/cuda_plan.h"
#include "kernels/cuda_sample.h"

/* A mixer layer's weights: in_proj and out_proj as loaded, the rest
 * widened to f32 in one device buffer (cuda_mixer.c); a bias the model
 * lacks is NULL. */
typedef struct cuda_mixer_w {
    const void *in_proj, *out_proj;
    int dt_in, dt_out;
    const float *in_bias, *out_bias, *conv_w, *conv_b, *dt_bias, *a_log, *d_skip, *norm;
    uint64_t state_off; /* its floats' offset inside a state slot */
} cuda_mixer_w;

/* A layer's projections as loaded (dtype as device/model/model.h numbers it). An
 * attention layer has wq..wo and KV pool `kv` (its attention ordinal); a
 * mixer layer has mx. Both have the MLP unless the shape says none. */
typedef struct cuda_layer {
    bool mixer;
    uint32_t kv;
    const void *wq, *wk, *wv, *wo, *w_gate, *w_up, *w_down;
    int dt_q, dt_k, dt_v, dt_o, dt_mlp, dt_down;
    /* Fast numerics: q, k and v stacked in one [q_dim + 2 kv_dim, d] weight,
     * gate and up in one [2f, d] (wq.. and w_gate, w_up point into them), so
     * that each is one GEMM; NULL when the types differ or are quantized. */
    const void *w_qkv, *w_gu;
    cuda_mixer_w mx;
} cuda_layer;

/* CUDA Graphs (cuda_step.c): a step of at most CUDA_GRAPH_MAX_TOKENS tokens
 * whose outputs fit the logits staging runs as a graph, captured the first
 * time its key is seen and replayed after; CUDA_GRAPHS are kept, the least
 * recently used dropped for a new one. The key holds everything the step's
 * kernels take from the host: table offsets, grid sizes, which LoRA targets
 * run and how attention splits its keys. */
#define CUDA_GRAPHS 32
#define CUDA_GRAPH_MAX_TOKENS 64u
typedef struct cuda_graph_key {
    uint32_t n_tokens, n_rows, n_out, n_snaps, lora_targets, splits_all, splits_out, ssm_chunks;
} cuda_graph_key;
typedef struct cuda_graph {
    cuda_graph_key key;
    cudaGraphExec_t exec; /* NULL: the entry is free */
    uint64_t used;        /* graph_clock at its last launch */
} cuda_graph;

/* What an adapter slot holds, host side. */
typedef struct cuda_adapter_slot {
    bool held;
    uint32_t generation;
    float *mem; /* device: plan.lora_slot bytes */
} cuda_adapter_slot;

/* A submitted step's sampling under fast numerics (cuda_sampling.c), per ring slot: the jobs
 * uploaded and their results copied back (host, pinned, plan.logits_rows each), and for each
 * of the batch's samples its job or -1 (sampled on the host in wait). */
typedef struct cuda_ring_samples {
    cuda_sample_job *jobs;
    cuda_sample_out *out;
    int32_t *job_of; /* host: [max_rows] */
    uint32_t n_jobs;
    uint32_t *args, *dargs; /* step 0b records (cuda_sample.h): pinned host and device copies of
                               args_cap words, grown when a batch needs more */
    size_t args_cap;
    bool gpu;        /* the GPU samples this step (cuda_sampling_prepare, in submit) */
    bool active;     /* the sample slot ran for the step in this ring slot */
} cuda_ring_samples;

typedef struct cuda_state {
    const devio_model *model;  /* borrowed */
    devio_backend_config cfg;  /* its pointers are borrowed from the core */
    devio_model_shape sh;
    cuda_plan plan;
    cudaStream_t stream;
    cudaEvent_t *done;         /* host: [max_depth], one per submitted step */
    /* Steps submitted and waited so far. submit (the launching thread)
     * writes only `submitted`, wait (the worker) only `waited`, so the two
     * may run at once: step n uses ring slot n % max_depth. */
    _Atomic uint64_t submitted, waited;
    /* The first CUDA error; a step after it is refused. Set once under
     * fail_mu (either thread may hit an error); `failed` says it is set. */
    pthread_mutex_t fail_mu;
    atomic_bool failed;
    char failure[200];

    /* Fast numerics (--numerics fast): f32, f16 and bf16 projections are GEMMs
     * (cuda_gemm.h) on row-major weights, their inputs rounded to the weight's
     * type into x16 ([max_batch_tokens, widest input] 16-bit words); quantized
     * ones keep the strict kernel. Strict numerics: fast false, gemm NULL. */
    bool fast;
    struct cuda_gemm *gemm;
    void *x16;
    float *qkv, *gu;  /* [max_batch_tokens, q_dim + 2 kv_dim], [.., 2 f]: fused GEMM outputs */
    float *bqkv;      /* [L, q_dim + 2 kv_dim]: bq, bk, bv side by side, or NULL */
    float *part;      /* attention's ranges before they are combined (cuda_fast.h) */
    uint16_t *deq;    /* a quantized projection widened to f16 for the GEMM, or NULL */
    uint32_t gemv_max;/* batches of at most this many tokens take the GEMV (cuda_fast.h) */
    devio_sampler *sampler;            /* host: the samples the GPU does not take */
    cuda_sample_job *sample_jobs;      /* [plan.logits_rows] */
    cuda_sample_out *sample_out;       /* [plan.logits_rows] */
    float *sample_scratch;             /* [plan.logits_rows, 2 * vocab] */
    cuda_ring_samples *rings;          /* host: [max_depth] */

    /* Weights, uploaded once as loaded. */
    const void *embed, *lm_head; /* projections lane-major (cuda_kernels.h), row-major when fast */
    int dt_embed, dt_lm;
    bool embed_lane_major;       /* tied: the embedding is lm_head's copy */
    cuda_layer *layers;        /* host: [n_layers] of device pointers */
    void **allocs;             /* host: every cudaMalloc, for destroy */
    uint32_t n_allocs, cap_allocs;

    /* Widened once: norms, biases (zeros where a layer has none), RoPE as
     * the core built it (scaling and yarn's attention factor included). */
    float *attn_norm, *ffn_norm, *final_norm; /* [L, d], [L, d], [d] */
    float *bq, *bk, *bv;                      /* [L, q_dim / kv_dim] or NULL */
    float *q_norm, *k_norm;                   /* [L, head_dim] (Qwen3) or NULL */
    float *rope_cos, *rope_sin;               /* [max_seq_len, rotary_dim / 2] */

    /* KV pools of the attention layers: [n_attn][kv_blocks][n_kv][block_size][hd]
     * elements, f32 in strict numerics, f16 in fast (kv_elem bytes each). */
    void *k_cache, *v_cache;
    uint64_t layer_elems;
    uint32_t block_elems, kv_elem, n_attn;

    /* Recurrent state (hybrid models): state slots then snapshots,
     * [ssm_slots + ssm_snapshots, slot_floats] f32, zeroed at create. */
    float *ssm;
    /* The mixer's activations: in_proj's outputs [T, in_dim], the conv's
     * [T, conv_dim], the scan's and gated norm's [T, I], and the last
     * layer's gathered rows of those [T, I]. */
    float *zx, *xa, *my, *my2;
    /* Fast numerics' chunked scan (cuda_ssm.h): chunk states and the dA products. */
    float *ssm_cs, *ssm_lam;

    /* Activations for max_batch_tokens tokens, tightly packed rows. */
    float *x, *x2, *h, *q, *q2, *k, *v, *att, *act, *o_tmp, *g_tmp, *u_tmp, *lora_a;
    float *logits;             /* [plan.logits_rows, vocab] staging */
    float *dlogits;            /* fast numerics: [cfg.logits_rows, vocab], the slots' logits */
    float *read_buf;           /* fast numerics, host: [vocab], a row read for the host sampler */
    uint32_t smem;             /* attention shared memory per block */

    /* A step's tables: packed on the host in one of max_depth pinned
     * buffers, uploaded with one copy into meta. */
    uint32_t **host_meta;      /* host: [max_depth] pinned, plan.meta_words each */
    uint32_t *meta;

    /* LoRA: per slot, per layer, per target, the module (cuda_lora_mod). */
    cuda_adapter_slot *slots;  /* host: [adapter_slots] */
    cuda_lora_mod *host_mods;  /* host: [adapter_slots * L * DEVIO_LORA_N_TARGETS] */
    cuda_lora_mod *mods;       /* the same on the device */

    /* Graphs, used unless DEVIO_CUDA_GRAPHS=0; touched only by submit. */
    bool graphs_on;
    cuda_graph graphs[CUDA_GRAPHS];
    uint64_t graph_clock, graph_captures, graph_launches;

    bool logits_pinned;        /* cfg.logits_host registered with cudaHostRegister */
    uint64_t bytes;            /* device memory create took */
    char name[128];            /* the GPU's name */
    char cc[16];
    uint64_t memory_total;
} cuda_state;

/* ---- cuda_device.c: shared by every file of the backend ---- */

/* A CUDA call's result: DEVIO_OK, or DEVIO_E_DEVICE with the error text and
 * the state marked failed (st->failure) so that no later step runs on it. */
devio_status cuda_check(cuda_state *st, int code, const char *what, devio_error *err);

/* DEVIO_E_DEVICE "the CUDA device failed earlier: ..." when the state is
 * marked failed, else DEVIO_OK. */
devio_status cuda_refuse_if_failed(cuda_state *st, devio_error *err);

/* cudaMalloc of `bytes`, zeroed, remembered for destroy. */
devio_status cuda_dalloc(cuda_state *st, void **p, uint64_t bytes, devio_error *err);
#define DALLOC(st, ptr, bytes, err) cuda_dalloc((st), (void **)&(ptr), (bytes), (err))
/* A tensor uploaded as loaded, or, as_matrix, a weight whose rows are lane-major when
 * lane_major and cuda_lane_major say so (cuda_kernels.h); *dev is NULL for an absent tensor. */
devio_status cuda_upload_as(cuda_state *st, const devio_tensor *t, bool as_matrix, bool lane_major,
                            const void **dev, int *dt, devio_error *err);
/* A projection weight uploaded, its rows lane-major where cuda_lane_major
 * says (cuda_kernels.h), row-major under fast numerics (a GEMM's); *dev is
 * NULL for an absent tensor. cuda_upload_strict: lane-major always, for a
 * projection fast numerics keep on the strict kernel (cuda_matvec.strict). */
devio_status cuda_upload(cuda_state *st, const devio_tensor *t, const void **dev, int *dt,
                         devio_error *err);
devio_status cuda_upload_strict(cuda_state *st, const devio_tensor *t, const void **dev, int *dt,
                                devio_error *err);

/* ---- the other files ---- */

/* The backend's submit and wait (cuda_step.c). */
devio_status cuda_submit(void *state, const devio_batch *b, devio_error *err);
devio_status cuda_wait(void *state, const devio_batch *b, devio_error *err);

/* A step's logits and samples (cuda_sampling.c): their buffers (in strict numerics only the
 * host arena pinned); the backend's sample and logits_read slots; in submit, whether the GPU
 * samples the step in ring slot `ring` (asked, its outputs in the staging rows, room for its
 * logit processing: else the host samples it) and whether logits slot `slot` of b is kept
 * nowhere (a sample the GPU takes is its only reader); and, in wait once step `ring`
 * finished, each sample's token and logprob, those the GPU did not take sampled on the host. */
devio_status cuda_sampling_create(cuda_state *st, devio_error *err);
void cuda_sampling_destroy(cuda_state *st);
devio_status cuda_sample_batch(void *state, const devio_batch *b, devio_error *err);
devio_status cuda_logits_read(void *state, uint32_t slot, float *dst, devio_error *err);
void cuda_sampling_prepare(cuda_state *st, uint32_t ring, const devio_batch *b);
bool cuda_sampling_skips(const cuda_state *st, uint32_t ring, const devio_batch *b,
                         uint32_t slot);
devio_status cuda_sampling_finish(cuda_state *st, uint32_t ring, const devio_batch *b,
                                  devio_error *err);

/* The backend's adapter_add and adapter_remove (cuda_adapters.c). */
devio_status cuda_adapter_add(void *state, uint32_t slot, uint32_t generation,
                              const struct devio_adapter *a, devio_error *err);
void cuda_adapter_remove(void *state, uint32_t slot, uint32_t generation);

/* Hybrid models (cuda_mixer.c). What the mixer kernels cannot compute,
 * refused before anything is allocated: DEVIO_E_UNSUPPORTED naming it. */
devio_status cuda_mixer_supported(const devio_model_shape *sh, devio_error *err);
/* The mixer layers' weights, the state array and the mixer's activations. */
devio_status cuda_mixer_create(cuda_state *st, devio_error *err);
/* The backend's ssm_copy: one whole slot or snapshot onto another. */
devio_status cuda_ssm_copy(void *state, devio_ssm_ref dst, devio_ssm_ref src, devio_error *err);
/* The backend's state_read and state_write (cuda_state_io.c). */
devio_status cuda_state_read(void *state, devio_state_ref what, void *dst, devio_error *err);
devio_status cuda_state_write(void *state, devio_state_ref what, const void *src,
                              devio_error *err);

#endif
