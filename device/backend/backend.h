/* backend.h - the backend seam: the vtable every compute engine fills (the
 * reference in ref/, CUDA in kernels/, test backends), the facts the core
 * hands it, and the checked wrappers through which the core calls it. Its
 * version is DEVIO_BACKEND_ABI, which every backend's ops carry and the core
 * and the plugin registry check. Version 3 added kv_blocks_fit; version 4
 * the recurrent state of hybrid models (state and snapshot slots, ssm_copy);
 * version 5 copies_weights; version 6 device-side sampling
 * (batch.device_sampling, sample.sample_only); version 7 the sampler's
 * logit processing on the device; version 8 one sampling record
 * (devio_batch_sample.params carries the processing, history beside it);
 * version 9 a sequence's state read and written (state_read, state_write)
 * for export and import (docs/state.md).
 * A backend only computes: it never validates plans, counts blocks, owns
 * sequences or decides what a number must be (device/numerics/numspec.h does).
 *
 * The life of a step, as the core drives it:
 *   devio_launch    validates and reserves, builds a devio_batch in one of
 *                   max_depth tickets, checks it (devio_batch_check) and
 *                   calls submit, which enqueues the step and returns at once;
 *                   optionally calls sample to enqueue device-side sampling.
 *   the worker      calls wait for the oldest submitted batch; when wait
 *                   returns, the step's KV writes, logits and samples are
 *                   final. Host sampling (if any) follows.
 * So with max_depth 2 a GPU backend computes step n while step n+1 is being
 * validated, laid out and enqueued. The batch and everything it points to
 * stays valid and unchanged from submit until wait returns.
 *
 * Threads: submit (and sample) run on the launching thread, wait on the
 * worker thread (or inside devio_await in builds without threads), so a
 * backend must accept submit concurrently with a wait of an earlier batch.
 * Submits are serialised among themselves, and so are waits, adapter and
 * logits calls; wait is called once per submitted batch, in submit order.
 * adapter_add/adapter_remove are only called when no batch is in flight. */
#ifndef DEVIO_BACKEND_H
#define DEVIO_BACKEND_H

#include <stdbool.h>
#include <stdint.h>

#include "device/devio.h"
#include "device/model/model.h"
#include "device/sample/sampler.h"

#define DEVIO_BACKEND_ABI 9u

/* A block-table entry whose block the sequence gave back because every
 * position in it fell below the sliding window (docs/objects.md, KV pool):
 * attention never reads it, and a batch may carry it only there
 * (devio_batch_check). Never a block index: pools are smaller. */
#define DEVIO_KV_BLOCK_RELEASED UINT32_MAX

struct devio_adapter; /* device/adapter/adapter.h */

/* The model's dimensions, checked once by the core (device/backend/shape.h) before
 * any backend sees the model. Every weight of `model` has the shape these
 * say and any dtype of devio_dtype: F32, F16 or BF16, or, as a 2-D weight
 * whose rows are whole blocks, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K or
 * Q6_K; gate_proj and up_proj share a dtype. */
typedef struct devio_model_shape {
    uint32_t n_layers;
    uint32_t d;          /* hidden_size */
    uint32_t n_heads, n_kv_heads, head_dim;
    uint32_t q_dim;      /* n_heads * head_dim */
    uint32_t kv_dim;     /* n_kv_heads * head_dim */
    uint32_t f;          /* intermediate_size */
    uint32_t vocab;
    float eps;           /* rms_norm_eps */
    float attn_scale;    /* devio_rsqrtf((float)head_dim), or Granite's attention_multiplier (rule 6) */
    bool has_bias;       /* some layer has a q, k or v bias */
    uint32_t rotary_dim; /* RoPE turns dimensions [0, rotary_dim) of a head (rule 4) */
    bool qk_norm;        /* Qwen3: q and k heads RMSNormed before RoPE (rule 4a) */
    uint32_t window;     /* attention keys within window positions (rule 6), 0 = all */
    float emb_mult, res_mult, logit_scale; /* rules 1, 7, 8; 1.0 but for Granite */
    /* Hybrid models (numspec rule 10); every field 0 when n_mixers is 0.
     * Layer li is a mixer when model->layers[li].kind says so. */
    uint32_t n_attn;     /* attention layers */
    uint32_t n_mixers;   /* Mamba-2 mixer layers */
    bool has_mlp;        /* false for Mamba2: a layer is norm, mixer, residual */
    uint32_t ssm_heads, ssm_head_dim, ssm_groups, ssm_state, ssm_conv; /* H, P, G, N, K */
    uint32_t ssm_inner;  /* I = H * P */
    uint32_t conv_dim;   /* I + 2 * G * N */
    uint32_t in_dim;     /* I + conv_dim + H: in_proj's rows */
    bool conv_bias, proj_bias;
    float dt_min, dt_max, ssm_eps;
    /* One state slot (or snapshot) holds, for every mixer layer m in layer
     * order, the conv window [conv_dim, K-1] then the SSM state [H, P, N]:
     * slot_floats = n_mixers * (conv_dim * (K-1) + H*P*N) binary32. */
    uint64_t slot_floats;
} devio_model_shape;

/* What the core tells a backend at create: the sizes of every pool and
 * buffer it must allocate now, so that the step path never allocates.
 * Every pointer is borrowed and outlives the backend state. */
typedef struct devio_backend_config {
    uint32_t kv_blocks;        /* blocks in the KV pool */
    uint32_t block_size;       /* tokens per block */
    uint32_t max_batch_tokens; /* tokens in one step, at most */
    uint32_t max_rows;         /* rows in one step, at most */
    uint32_t max_seq_len;      /* positions per sequence, at most */
    uint32_t max_depth;        /* batches submitted and not yet waited, at most */
    uint32_t threads;          /* host compute threads, >= 1 */
    devio_numerics numerics;   /* a backend refuses at create what it cannot keep */
    uint32_t adapter_slots;    /* adapter indices of adapter_add are < this (max_loras) */
    uint32_t max_lora_rank;    /* largest rank adapter_add may be given */
    uint32_t logits_rows;     /* logits rows the core may name: out_row < this */
    uint32_t ssm_slots;        /* recurrent-state slots (0 for attention-only models) */
    uint32_t ssm_snapshots;    /* snapshot slots (0 for attention-only models) */
    /* The RoPE tables below are [max_seq_len, rotary_dim/2]. */
    const devio_model_shape *shape;
    /* RoPE of numspec rule 4, built once by the core: [max_seq_len, rotary_dim/2]. */
    const float *rope_cos, *rope_sin;
    /* The core's host logits arena, [logits_rows, vocab] f32. A backend
     * without logits_read writes the logits of output i into row
     * out_row[i] of it; a backend with logits_read keeps its own. */
    float *logits_host;
} devio_backend_config;

/* One row of a step. Rows are laid out in plan order and their tokens are
 * contiguous: row r holds batch tokens [tok_start, tok_start + n_tokens),
 * and tok_start of row r+1 is tok_start + n_tokens of row r. */
typedef struct devio_batch_row {
    uint32_t pos0;            /* sequence length before the step = position of its first token */
    uint32_t n_tokens;
    uint32_t tok_start;
    const uint32_t *blocks;   /* block table: position p lives in blocks[p / block_size];
                                 with a sliding window, entries wholly below the first key
                                 the row's first token reads may be DEVIO_KV_BLOCK_RELEASED
                                 (above) and must never be read */
    int32_t adapter;          /* adapter index (see adapter_add), -1 = base model */
    uint32_t adapter_gen;     /* the generation adapter_add was given for that index */
    /* Recurrent state (hybrid models; -1 / NONE for attention-only models):
     * the sequence's state slot, and where snapshots of it go. When pos0 is
     * 0 the state starts from zeros (the slot's old contents are ignored);
     * otherwise from what the slot holds. Snapshot slot snap_slots[i] of
     * EACH receives the state after token i; END's single slot the state
     * after the last token. No two rows share a state or snapshot slot. */
    int32_t ssm_slot;
    devio_snapshot snapshot;   /* devio.h; NONE for attention-only models */
    const int32_t *snap_slots; /* END: 1 slot; EACH: n_tokens slots, one after each token */
} devio_batch_row;

/* A sampled token a row asks for: from the logits of its last token,
 * written to logits row `logits_row`, at sequence position `position`. */
typedef struct devio_batch_sample {
    uint32_t row;
    uint32_t logits_row;
    uint64_t position;
    devio_sample_params params; /* the row's whole sample: draw, logit processing, top
                                   logprobs; its arrays set until wait returns */
    bool sample_only; /* no handle holds the row: only this sample reads those logits, so a
                         backend that samples them need not bring them to the host */
    const int32_t *history; /* the penalties' history (device/sample/sampler.h step 0b),
                               n_history tokens, NULL when 0; set until wait returns when
                               device_sampling */
    uint32_t n_history;
    int32_t token;  /* output of the sample entry */
    float logprob;  /* output of the sample entry */
} devio_batch_sample;

/* One step, built by the core and checked by devio_batch_check before any
 * backend sees it. Every array is borrowed from submit until wait returns. */
typedef struct devio_batch {
    uint64_t ticket;               /* for messages */
    uint32_t n_rows;
    const devio_batch_row *rows;
    uint32_t n_tokens;
    const int32_t *tokens;         /* [n_tokens], each < vocab */
    const uint32_t *tok_pos;       /* [n_tokens] absolute position of each token */
    const uint32_t *tok_row;       /* [n_tokens] row of each token */
    /* Which tokens want logits, computed once by the core: output i is the
     * logits of token out_tok[i] (strictly increasing), written to logits
     * row out_row[i]. */
    uint32_t n_out;
    const uint32_t *out_tok;
    const uint32_t *out_row;
    uint32_t lora_targets;         /* union of the target bits of the rows' adapters */
    /* Block copies to do first, in order, before any token of the step is
     * computed (copy-on-write): dst <- src for every layer's K and V. */
    uint32_t n_copies;
    const uint32_t *copy_src;
    const uint32_t *copy_dst;
    /* Rows asking for a sampled token. The core samples them on the host
     * after wait unless it called the backend's sample entry for the batch. */
    uint32_t n_samples;
    devio_batch_sample *samples;
    bool device_sampling; /* the core calls the backend's sample entry for this batch right
                             after submit (fast numerics, no row asking top logprobs, the
                             slot present) */
} devio_batch;

/* A state slot (snapshot false, index < ssm_slots) or a snapshot slot
 * (snapshot true, index < ssm_snapshots). */
typedef struct devio_ssm_ref {
    bool snapshot;
    uint32_t index;
} devio_ssm_ref;

/* What state_read and state_write move: the K half or the V half of one
 * KV block of one attention layer, block_size * kv_dim elements of the
 * backend's KV element (devio_device_info.kv_elem_bytes: binary32 under
 * strict numerics, binary16 or binary32 under fast) laid out
 * [n_kv_heads][block_size][head_dim],
 * as every backend keeps a block; or one whole state slot or snapshot,
 * slot_floats binary32 (devio_model_shape says their order). `layer` is
 * the attention layer's ordinal (0 for the first attention layer of the
 * model, whatever mixers come before it). */
typedef enum devio_state_part {
    DEVIO_STATE_K = 0,
    DEVIO_STATE_V,
    DEVIO_STATE_SSM,
} devio_state_part;
typedef struct devio_state_ref {
    devio_state_part part;
    uint32_t layer, block; /* K and V */
    devio_ssm_ref ssm;     /* SSM */
} devio_state_ref;

/* The vtable. Filled with designated initializers as `static const` data;
 * callers use the wrappers below, never the entries. Every entry is required
 * unless marked optional. An entry that fails fills err and changes nothing
 * the core can observe unless its contract says otherwise. */
typedef struct devio_backend_ops {
    uint32_t abi;     /* DEVIO_BACKEND_ABI */
    const char *name; /* "ref", "cuda", ...: what --backend names */
    /* After create the backend never reads the model's weight bytes again
     * (it copied them to its own memory): the process may give the host's
     * back (devio_model_release_weights). A backend without it refuses a
     * model whose weights were released. */
    bool copies_weights;

    /* Optional. Is the device this backend drives present and usable?
     * DEVIO_OK or DEVIO_E_UNSUPPORTED with the reason ("no CUDA device").
     * --backend auto takes the first backend whose probe says yes. */
    devio_status (*probe)(devio_error *err);

    /* Allocate the KV pool and every buffer a step needs, upload or map the
     * weights. `model` is borrowed and outlives the state. On failure
     * *state is NULL and nothing is held. */
    devio_status (*create)(const devio_model *model, const devio_backend_config *cfg,
                           void **state, devio_error *err);

    /* Release everything create made. state may be NULL. */
    void (*destroy)(void *state);

    /* Describe the device: every field of devio_device_info but backend
     * and numerics, which the core fills. Never fails. */
    void (*info)(void *state, devio_device_info *out);

    /* Enqueue one step and return without waiting for it: the block copies,
     * then every token of every row, writing each token's K and V into its
     * block and the logits of every output. The numbers are those of
     * device/numerics/numspec.h: a row's numbers never depend on the other rows, on
     * how its tokens were split into steps, on the thread count or on what
     * else is in flight. May compute synchronously (the reference defers
     * the whole step to wait). */
    devio_status (*submit)(void *state, const devio_batch *batch, devio_error *err);

    /* Block until `batch` (the oldest submitted and not yet waited) has
     * settled. On failure the KV contents of the rows' new positions and
     * the batch's logits are unspecified; nothing else changed. */
    devio_status (*wait)(void *state, const devio_batch *batch, devio_error *err);

    /* Optional pair (both or neither): adapter lifetime. Index `index` holds
     * adapter `a` from adapter_add until adapter_remove(index, generation);
     * `a` is borrowed for that time (a backend may copy it to its memory).
     * A generation is never reused for an index, so a stale copy can always be
     * told apart. Rows name adapters by index and generation. Without these
     * entries a backend runs no adapters (loads are refused). */
    devio_status (*adapter_add)(void *state, uint32_t index, uint32_t generation,
                                const struct devio_adapter *a, devio_error *err);
    void (*adapter_remove)(void *state, uint32_t index, uint32_t generation);

    /* Optional: logits stay in the backend's memory. Copy logits row `row`
     * (vocab floats) to host memory at dst. Called after the step that wrote
     * the row was waited. Without it the backend writes cfg->logits_host. */
    devio_status (*logits_read)(void *state, uint32_t row, float *dst, devio_error *err);

    /* Optional: sample on the device. Enqueue sampling of every entry of
     * batch->samples after the step (same definition as device/sample/sampler.h:
     * the same token and logprob bits), filling token and logprob by the
     * time wait returns. The core calls it right after submit, and only
     * under fast numerics: strict numerics sample on the host. */
    devio_status (*sample)(void *state, const devio_batch *batch, devio_error *err);

    /* Optional: the most KV blocks this backend could hold beside everything
     * else `cfg` asks for (cfg->kv_blocks is ignored), or 0 when it cannot
     * tell. Called before create when --kv-blocks is 0: the pool is then
     * what fits, and never more than max_seqs full-length sequences need. */
    uint32_t (*kv_blocks_fit)(const devio_model *model, const devio_backend_config *cfg);

    /* Required when the model has mixer layers (shape.n_mixers > 0), and
     * unused otherwise: copy one whole state slot (every mixer layer's conv
     * window and SSM state) from src to dst. Called by effects (fork,
     * snapshot, truncate) when no batch is in flight; when it returns the
     * copy is complete. dst != src. */
    devio_status (*ssm_copy)(void *state, devio_ssm_ref dst, devio_ssm_ref src, devio_error *err);

    /* Optional pair (both or neither): copy one part of the cache (see
     * devio_state_ref) to host memory at dst, or from host memory at src
     * into it, in exactly the bytes the backend computes with, so that a
     * state read on one backend and written on another that keeps the same
     * numbers continues bit for bit. Called by export and import when no
     * batch is in flight; when it returns the copy is complete. Without
     * them a device neither exports nor imports. */
    devio_status (*state_read)(void *state, devio_state_ref what, void *dst, devio_error *err);
    devio_status (*state_write)(void *state, devio_state_ref what, const void *src,
                                devio_error *err);
} devio_backend_ops;

/* ---- checked wrappers: the only way the core reaches a backend ---------- */

/* Every required entry present, optional pairs complete, the ABI ours. */
devio_status devio_backend_check(const devio_backend_ops *ops, devio_error *err);
devio_status devio_backend_probe(const devio_backend_ops *ops, devio_error *err);
devio_status devio_backend_create(const devio_backend_ops *ops, const devio_model *model,
                                  const devio_backend_config *cfg, void **state,
                                  devio_error *err);
void devio_backend_destroy(const devio_backend_ops *ops, void *state);
/* ops->kv_blocks_fit, or 0 when the backend has none. */
uint32_t devio_backend_kv_blocks_fit(const devio_backend_ops *ops, const devio_model *model,
                                     const devio_backend_config *cfg);
void devio_backend_info_get(const devio_backend_ops *ops, void *state, devio_device_info *out);
/* Checks the batch against cfg (devio_batch_check) before the backend sees it. */
devio_status devio_backend_submit(const devio_backend_ops *ops, void *state,
                                  const devio_backend_config *cfg, const devio_batch *batch,
                                  devio_error *err);
devio_status devio_backend_wait(const devio_backend_ops *ops, void *state,
                                const devio_batch *batch, devio_error *err);
bool devio_backend_has_adapters(const devio_backend_ops *ops);
devio_status devio_backend_adapter_add(const devio_backend_ops *ops, void *state, uint32_t index,
                                       uint32_t generation, const struct devio_adapter *a,
                                       devio_error *err);
void devio_backend_adapter_remove(const devio_backend_ops *ops, void *state, uint32_t index,
                                  uint32_t generation);
bool devio_backend_has_device_logits(const devio_backend_ops *ops);
devio_status devio_backend_logits_read(const devio_backend_ops *ops, void *state, uint32_t row,
                                       float *dst, devio_error *err);
bool devio_backend_has_sample(const devio_backend_ops *ops);
bool devio_backend_has_ssm(const devio_backend_ops *ops);
/* Checks both refs against cfg before the backend sees them. */
devio_status devio_backend_ssm_copy(const devio_backend_ops *ops, void *state,
                                    const devio_backend_config *cfg, devio_ssm_ref dst,
                                    devio_ssm_ref src, devio_error *err);
devio_status devio_backend_sample(const devio_backend_ops *ops, void *state,
                                  const devio_batch *batch, devio_error *err);
bool devio_backend_has_state_io(const devio_backend_ops *ops);
/* Bytes of one part (devio_state_ref) for a backend created with cfg whose KV
 * elements are kv_elem bytes (its devio_device_info.kv_elem_bytes). */
uint64_t devio_state_part_bytes(const devio_backend_config *cfg, uint32_t kv_elem,
                                devio_state_part part);
/* Check `what` against cfg (layer, block and slot in range) before the backend sees it. */
devio_status devio_backend_state_read(const devio_backend_ops *ops, void *state,
                                      const devio_backend_config *cfg, devio_state_ref what,
                                      void *dst, devio_error *err);
devio_status devio_backend_state_write(const devio_backend_ops *ops, void *state,
                                       const devio_backend_config *cfg, devio_state_ref what,
                                       const void *src, devio_error *err);

/* The structural checks of a batch every backend relies on, so that none
 * reads or writes outside its buffers: sizes within cfg, rows contiguous,
 * tok_pos/tok_row consistent with the rows, positions below max_seq_len,
 * blocks, adapter indices, logits rows and state slots in range, out_tok increasing,
 * tokens in the vocabulary. Changes nothing. */
devio_status devio_batch_check(const devio_backend_config *cfg, const devio_batch *batch,
                               devio_error *err);

#endif
