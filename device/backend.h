/* backend.h - the compute vtable every backend fills (reference, CUDA).
 * A backend only computes: it never validates plans, counts blocks or owns
 * sequences; the device core does that and calls through the wrappers below. */
#ifndef DEVIO_BACKEND_H
#define DEVIO_BACKEND_H

#include <stdint.h>

#include "device/devio.h"
#include "device/model.h"

#define DEVIO_BACKEND_VERSION 1u

/* What the core tells a backend at creation: pool sizes it must allocate. */
typedef struct devio_backend_config {
    uint32_t kv_blocks;        /* blocks in the KV pool */
    uint32_t block_size;       /* tokens per block */
    uint32_t max_batch_tokens; /* tokens in one step, at most */
    uint32_t max_rows;         /* rows in one step, at most */
    uint32_t max_seq_len;      /* positions per sequence, at most */
    uint32_t threads;          /* compute threads, >= 1 */
    uint32_t max_lora_rank;    /* largest adapter rank a row may carry */
} devio_backend_config;

/* One row of a step as the backend sees it. Rows are laid out in plan order;
 * the tokens of row r are batch->tokens[tok_start .. tok_start+n_tokens). */
typedef struct devio_batch_row {
    uint32_t pos0;            /* sequence length before the step = position of first token */
    uint32_t n_tokens;
    uint32_t tok_start;
    const uint32_t *blocks;   /* block table: position p lives in blocks[p / block_size] */
    const struct devio_adapter *adapter; /* LoRA adapter of the row, NULL = base model */
} devio_batch_row;

/* One step. Every pointer is borrowed for the forward call only.
 * out_index[t] for every token t of the batch: -1 = no logits wanted,
 * otherwise the index i into out_rows where the backend writes the token's
 * vocab logits (host memory owned by the core, vocab floats each). */
typedef struct devio_batch {
    uint32_t n_rows;
    const devio_batch_row *rows;
    uint32_t n_tokens;
    const int32_t *tokens;
    const int32_t *out_index;
    uint32_t n_out;
    float *const *out_rows;
    /* Block copies to do first, in order, before any token of the step is
     * computed (copy-on-write): dst <- src for every layer's K and V. */
    uint32_t n_copies;
    const uint32_t *copy_src;
    const uint32_t *copy_dst;
} devio_batch;

/* The vtable. Filled with designated initializers as `static const` data.
 * Every slot is required unless marked optional. */
typedef struct devio_backend_ops {
    uint32_t version; /* DEVIO_BACKEND_VERSION */
    const char *name; /* "ref", "cuda" */

    /* Allocate the KV pool and every scratch buffer a step needs, so that
     * forward never allocates. `model` is borrowed and outlives the state.
     * On failure *state is NULL and nothing is held. */
    devio_status (*create)(const devio_model *model, const devio_backend_config *cfg,
                           void **state, devio_error *err);

    /* Release everything create made. state may be NULL. */
    void (*destroy)(void *state);

    /* Run one step: the block copies, then every token of every row, writing
     * K and V of each token into its block slot and the logits of each token
     * with out_index >= 0 into out_rows[out_index].
     * A row's numbers must not depend on the other rows, on how its tokens
     * were split into steps, or on the thread count. On failure the KV
     * contents of the rows' new positions are unspecified; nothing else
     * changes.
     *
     * LoRA, for a row whose adapter targets module M (weight W [out, in],
     * optional bias c, input x of the token; A = lora_A [r, in], B = lora_B
     * [out, r], s = the adapter's scale), in exactly this order:
     *   z[o]  = lane_dot(W[o], x, in) (+ c[o])      the base output
     *   a[j]  = lane_dot(A[j], x, in)               j < r
     *   u[o]  = lane_dot(B[o], a, r)
     *   z'[o] = z[o] + u[o] * s                     product rounded, then added
     * and z' replaces z in what follows (RoPE, the residual add, silu(gate) * up).
     * Rows without an adapter, or whose adapter does not target M, use z. */
    devio_status (*forward)(void *state, const devio_batch *batch, devio_error *err);
} devio_backend_ops;

/* Checked wrappers: the only way the core reaches a backend. */
devio_status devio_backend_check(const devio_backend_ops *ops, devio_error *err);
devio_status devio_backend_create(const devio_backend_ops *ops, const devio_model *model,
                                  const devio_backend_config *cfg, void **state,
                                  devio_error *err);
void devio_backend_destroy(const devio_backend_ops *ops, void *state);
devio_status devio_backend_forward(const devio_backend_ops *ops, void *state,
                                   const devio_batch *batch, devio_error *err);

/* The reference backend (ref/). */
extern const devio_backend_ops devio_ref_backend;

#endif
