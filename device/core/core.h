/* core.h - private state of a device: sequences, tickets, logits handles, the backend.
 * Shared by the core's .c files only (core.c, config.c, seqs.c, seq_blocks.c, logits_handles.c,
 * ssm_pool.c, launch.c, step.c, effects.c, sample_proc.c); nothing outside device/ includes it.
 * Its declarations are grouped by the file that defines them. */
#ifndef DEVIO_CORE_H
#define DEVIO_CORE_H

#include <stdbool.h>
#include <stdint.h>

#include "device/backend/backend.h"
#include "device/devio.h"
#include "device/core/kv_pool.h"
#include "device/core/adapter_table.h"
#include "device/sample/sampler.h"

#ifndef DEVIO_NO_THREADS
#include <pthread.h>
#endif

/* The id of a sequence table entry an import holds, not yet live: never found, listed or
 * counted, and never handed out free (state_io.c). */
#define DV_SEQ_IMPORTING UINT64_MAX

typedef struct dv_seq {
    uint64_t id;      /* 0 = free entry */
    uint32_t len;     /* tokens cached, including those of a launched step */
    uint32_t n_blocks; /* entries of blocks in use: positions [0, n_blocks * block_size) */
    uint32_t *blocks; /* max_blocks_per_seq entries, owned by the device */
    /* Sliding window: entries [0, n_released) are DEVIO_KV_BLOCK_RELEASED,
     * their blocks given back because the next token reads none of their
     * positions. Always n_released * block_size <= max(0, len + 1 - window)
     * (truncate refuses to break it), so the partial last block and every
     * key a token of the next step reads stay held. */
    uint32_t n_released;
    uint64_t busy;    /* ticket id while inside an unawaited ticket, else 0 */
    int32_t ssm_slot; /* SSM state slot (hybrid models, length > 0), else -1 */
    bool state_lost;  /* a failed step left the state in ssm_slot undefined */
    uint32_t pins;    /* exports open on it (state_export.c): launches and effects refused */
    uint8_t *parked;  /* its state stream in host memory when parked (state_park.c), owned;
                         it then holds no blocks, state slot or snapshots */
    uint64_t parked_bytes;
    uint32_t hashed;     /* full blocks whose prefix hash is chained (events.c) */
    uint64_t last_hash;  /* the prefix hash of block hashed - 1; 0 when none */
    int32_t *toks;    /* the token at each position [0, len): the penalties' history;
                         owned, toks_cap entries (4 bytes per token, grown as needed) */
    uint32_t toks_cap;
} dv_seq;

typedef struct dv_handle {
    uint64_t id;      /* 0 = free */
    uint32_t n_rows;
    bool ready;       /* the step that fills it has run */
    uint32_t *arena_rows; /* the logits arena row of each of its rows, logits_rows entries */
    uint32_t *pos;    /* sequence position of the token of each row */
    uint64_t seq;     /* the sequence whose positions these are: freed with it */
    uint64_t ticket;  /* the step that fills it */
    bool internal;    /* a step's own (prompt logprobs): never named to a client */
} dv_handle;

/* What a launched row changed, so that a failed step can be undone exactly. */
typedef struct dv_trow {
    uint32_t seq_index;   /* index in the sequence table */
    uint32_t old_len;
    uint32_t n_tokens;
    uint32_t old_blocks;  /* block count before the launch */
    int64_t cow_src;      /* the shared block a copy-on-write replaced, -1 = none */
    uint32_t cow_taken;   /* pool.taken[cow_src] then: was it freed and taken again since? */
    uint64_t handle;      /* logits handle id, 0 = none */
    int32_t sample;       /* index into the ticket's samples, -1 = none */
    int32_t adapter_entry; /* adapter table entry, -1 = none */
    uint32_t adapter_gen; /* the entry's generation at launch */
    bool took_ssm_slot;   /* the launch gave the sequence its SSM state slot */
    bool proc;            /* the sample has processing or top logprobs (its arrays in the
                             ticket's proc_buf) */
    bool prompt;          /* prompt logprobs: ticket prompt_lps[tok_start ..] */
    uint64_t prompt_handle; /* a handle of its own holding positions 0..n-2 for them (the
                               row did not ask for every position's logits), 0 = none;
                               released when the step settles */
    const uint32_t *prompt_rows; /* the logits rows of positions 0..n-2 (that handle's, or
                                     the row's own handle's with logits "all") */
    uint32_t n_snaps;     /* snapshots the row takes: ticket snap_ids[tok_start ..] */
} dv_trow;

/* A ticket's life: FREE -> RESERVED (devio_launch_reserve: everything taken,
 * nothing submitted) -> SUBMITTED (devio_launch_commit; or back to FREE by
 * devio_launch_cancel) -> DONE (the step settled) -> HELD (devio_await_begin
 * gave its result to one caller) -> FREE (devio_await_end consumed it; or
 * back to DONE, still awaitable). */
typedef enum { DV_T_FREE = 0, DV_T_RESERVED, DV_T_SUBMITTED, DV_T_DONE, DV_T_HELD } dv_tstate;

/* One entry of the ticket table; max_depth of them, every array sized at open. */
typedef struct dv_ticket {
    uint64_t id;
    dv_tstate state;
    uint32_t n_rows;
    dv_trow *rows;              /* max_rows */
    devio_batch_row *brows;     /* max_rows */
    int32_t *tokens;            /* max_batch_tokens */
    uint32_t *tok_pos, *tok_row;/* max_batch_tokens */
    uint32_t *out_tok, *out_row; /* max_batch_tokens */
    uint32_t *copy_src, *copy_dst; /* max_rows */
    devio_batch_sample *samples;/* max_rows */
    char *proc_buf;             /* owned: the arrays of the samples' processing, remade at
                                   each reserve */
    int32_t *top_ids;           /* max_rows * DEVIO_TOP_LOGPROBS_MAX: top logprobs by row */
    float *top_lps;
    float *prompt_lps;          /* max_batch_tokens: prompt logprobs by batch token */
    int32_t *snap_ids;          /* max_batch_tokens: each row's snapshots at its tok_start */
    uint32_t sample_row0;      /* first of this ticket's max_rows scratch logits rows */
    bool device_sampled;        /* the backend's sample function took the batch's samples */
    bool held_seen;             /* another await found it HELD: tell the waits when it ends */
    devio_batch batch;
    devio_status status;
    devio_error err;
    uint64_t t_launch, t_start, t_end;
} dv_ticket;

struct devio_device {
    const devio_model *model;
    devio_config cfg;
    const devio_backend_ops *ops;
    void *backend;
    devio_backend_config bcfg;  /* what the backend was created with */
    devio_model_shape shape;
    float *rope_cos, *rope_sin;
    uint32_t vocab;
    uint32_t max_blocks_per_seq;
    bool kv_auto;               /* --kv-blocks was 0: the backend may size the pool (kv_blocks_fit) */
    bool torn_down;

    devio_kv_pool pool;
    uint64_t *block_hash;   /* kv_blocks: the prefix a full block holds (events.c) */
    uint8_t *block_stored;  /* kv_blocks: block_hash is valid */
    dv_seq *seqs;           /* max_seqs */
    uint32_t *block_tables; /* max_seqs * max_blocks_per_seq */
    uint64_t next_seq_id;

    /* Logits arena rows: [0, logits_rows) back handles, then max_rows
     * scratch rows per ticket entry for rows that sample without keeping logits. */
    dv_handle *handles;     /* logits_handles */
    float *logits_arena;    /* logits_rows * vocab, host */
    uint32_t *row_free;     /* stack of free logits arena rows */
    uint32_t n_row_free;
    uint32_t n_handles_live;
    uint64_t next_handle_id;
    float *read_buf;        /* vocab floats: a row read back for effects and handle reads */
    float *step_buf;        /* vocab floats: a row read back by the step runner */

    dv_ticket *tickets;     /* max_depth entries */
    uint32_t *queue;        /* FIFO of submitted tickets' indices in tickets, max_depth */
    uint32_t q_head, q_len;
    uint32_t in_flight;     /* reserved or launched, not yet awaited */
    uint32_t n_reserved;    /* RESERVED tickets: dv_drain waits for them too */
    uint64_t next_ticket_id;
    uint64_t last_end;      /* when the previous step settled (monotonic us) */

    /* SSM state of hybrid models (bcfg.ssm_slots, bcfg.ssm_snapshots; both
     * 0 otherwise). A snapshot is owned by one sequence (its index in seqs)
     * and taken at one length. */
    bool hybrid;
    uint32_t *ssm_free;     /* stack of free state slots */
    uint32_t n_ssm_free;
    int32_t *snap_owner;    /* [ssm_snapshots] sequence index, -1 = free */
    uint32_t *snap_len;     /* [ssm_snapshots] */
    uint32_t *snap_free;    /* stack of free snapshot slots */
    uint32_t n_snap_free;

    devio_sampler *sampler; /* used by the step runner only */
    devio_sampler *fx_sampler; /* used by effects (under the lock) */
    devio_adapter_table adapters;
    uint64_t parked_bytes;   /* host bytes of every parked state */
    uint32_t n_parked;       /* parked sequences */
    uint32_t kv_elem;        /* bytes of a K or V element in the backend (its info's, or 4
                                strict and 2 fast when it does not say) */
    uint8_t fingerprint[32]; /* the model's (devio_model_fingerprint), once has_fingerprint */
    bool has_fingerprint;

#ifndef DEVIO_NO_THREADS
    pthread_mutex_t mu;
    pthread_cond_t cv_work; /* worker: a step was submitted or stop */
    pthread_cond_t cv_done; /* a step finished */
    pthread_t worker;
    bool worker_started;
    bool waiting;           /* the worker is inside a backend wait */
    bool stop;
#endif
};

/* ---- open and teardown (core.c) ---------------------------------------- */

/* Locking: every public entry takes d->mu; these helpers expect it held. Inline, so that
 * every file of the core locks without calling into another. */
#ifndef DEVIO_NO_THREADS
static inline void dv_lock(devio_device *d) { pthread_mutex_lock(&d->mu); }
static inline void dv_unlock(devio_device *d) { pthread_mutex_unlock(&d->mu); }
#else
static inline void dv_lock(devio_device *d) { (void)d; }
static inline void dv_unlock(devio_device *d) { (void)d; }
#endif

/* ---- configuration (config.c) ------------------------------------------- */

/* Check c against model m and fill what it left 0 (max_seq_len, kv_blocks,
 * threads, first_ticket_id, first_seq_id, first_logits_id) with the derived values. */
devio_status dv_config_check(devio_config *c, const devio_model *m, devio_error *err);

/* ---- sequences (seqs.c) -------------------------------------------------- */

/* The live sequence with this id, or NULL (id 0 is never live). */
dv_seq *dv_seq_find(devio_device *d, uint64_t id);
/* The next sequence id, told to cfg.on_ids (lock held). */
uint64_t dv_new_seq_id(devio_device *d);
/* Tell cfg.on_ids the highest sequence and logits ids handed out (lock held). */
void dv_ids_used(devio_device *d);

/* ---- a sequence's state (state_io.c, state_park.c) ---------------------- */

/* The model's fingerprint, taken at the first call (lock held; the weights not released). */
const uint8_t *dv_fingerprint(devio_device *d);
/* The park and restore effects (docs/state.md): q is idle, nothing in flight, lock held. */
devio_status dv_seq_park(devio_device *d, dv_seq *q, devio_outcome *o, devio_error *err);
devio_status dv_seq_restore(devio_device *d, dv_seq *q, devio_outcome *o, devio_error *err);
/* Free q's parked state, if any (a free of a parked sequence, teardown). */
void dv_seq_unpark(devio_device *d, dv_seq *q);

/* ---- events (events.c) ---------------------------------------------------- */

void dv_emit(devio_device *d, devio_event e);
void dv_emit_seq(devio_device *d, devio_event_kind kind, uint64_t seq, uint64_t parent);
/* One holder fewer of block b; 1 when it went back to the pool (its prefix, if stored, is
 * told removed), else 0. Every unref of the core goes through it. */
uint32_t dv_block_unref(devio_device *d, uint32_t b);
/* Hash and tell stored the blocks q filled since its last call (a step settled, an import). */
void dv_blocks_stored(devio_device *d, dv_seq *q);
/* A step is about to write into q's partial last block in place (no copy-on-write): a prefix
 * it was stored with (q was truncated inside it while a fork shared it) is told removed. */
void dv_block_rewritten(devio_device *d, const dv_seq *q);
/* q was truncated to q->len: its hash chain back to the blocks still full, the block it now
 * ends inside (when q alone holds it) told removed. */
void dv_hashes_truncated(devio_device *d, dv_seq *q);

/* ---- a sequence's blocks and the sliding window (seq_blocks.c) ---------- */

/* Drop blocks of s beyond those needed for new_len; returns blocks returned to the pool.
 * Released entries among the dropped ones return nothing (they hold no block). */
uint32_t dv_seq_shrink(devio_device *d, dv_seq *s, uint32_t new_len);
/* The first position the token at position len reads (rule 6): keys
 * j > len - window; 0 without a window. */
uint32_t dv_window_first_key(const devio_device *d, uint32_t len);
/* Blocks s still holds: its entries less the released ones. */
static inline uint32_t dv_seq_blocks_held(const dv_seq *s) { return s->n_blocks - s->n_released; }
/* Whether entry i of s holds a block (not released). */
static inline bool dv_seq_block_live(const dv_seq *s, uint32_t i) { return i >= s->n_released; }
/* Give back every block of s that lies wholly below the window of its next
 * token (position s->len) and mark its entry released; returns the blocks
 * that went back to the free stack (a block other sequences still hold
 * only loses one holder). Called after a step settles successfully. */
uint32_t dv_seq_release_window(devio_device *d, dv_seq *s);

/* ---- logits handles (logits_handles.c) ---------------------------------- */

/* The live handle with this id, or NULL. */
dv_handle *dv_handle_find(devio_device *d, uint64_t id);
/* Allocate a handle of n rows; caller checked capacity. */
dv_handle *dv_handle_alloc(devio_device *d, uint32_t n);
/* Give h's logits rows back and free it. */
void dv_handle_release(devio_device *d, dv_handle *h);
/* The logits of logits slot `slot` in host memory: *out is the arena row, or
 * buf (vocab floats) read back from a backend that keeps its logits. */
devio_status dv_logits_row(devio_device *d, uint32_t slot, float *buf, const float **out,
                           devio_error *err);

/* ---- the step runner and await (step.c) --------------------------------- */

/* Wait until every launched step has settled (steps still unawaited are fine)
 * and no ticket is reserved (its plan may use what the caller is about to change). */
void dv_drain(devio_device *d);
/* Wait while a reserved launch copies from a block of sequence `seq` (its
 * copy-on-write source), which a free or a truncate could give back. */
void dv_wait_copies_from(devio_device *d, uint64_t seq);
/* Wait until the step that fills logits handle `logits` has settled (at
 * once for an unknown handle); later steps keep running. */
void dv_wait_handle(devio_device *d, uint64_t logits);
/* Settle the oldest submitted step; the lock is dropped during the backend wait. */
void dv_run_queue_head(devio_device *d);

/* ---- launch (launch.c) --------------------------------------------------- */

/* Undo every reservation of ticket t (failed submit or failed step): block
 * copies, lengths, new blocks, handles, adapter use, state slots and
 * snapshots; the sequences are as they were before the launch, except that
 * when the step ran (`ran`) the recurrent state of a hybrid sequence that
 * had one is lost (dv_seq.state_lost). Does not free the ticket entry. */
void dv_ticket_undo(devio_device *d, dv_ticket *t, bool ran);

/* ---- a sample's processing (sample_proc.c) ------------------------------- */

/* p asks for processing or top logprobs. */
bool dv_proc_asks(const devio_sample_params *p);
/* The penalties' history of a token drawn at `position` of q: q's tokens
 * at [p->penalty_from, position), none when p has no penalty or q is NULL. */
uint32_t dv_proc_history(const devio_sample_params *p, const dv_seq *q, uint64_t position,
                         const int32_t **history);
/* p's processing against the vocab and the ranges; a p that leaves no token
 * is refused. */
devio_status dv_proc_check(const devio_device *d, const devio_sample_params *p, devio_error *err);
/* Bytes of p's arrays, and p's arrays copied to *buf (advanced), dst's
 * pointers set to the copies. */
size_t dv_proc_bytes(const devio_sample_params *p);
void dv_proc_copy(devio_sample_params *dst, char **buf);
/* Room in q's token record for `need` positions; false when out of memory
 * (q unchanged). */
bool dv_seq_toks_reserve(const devio_device *d, dv_seq *q, uint32_t need);

/* ---- SSM state slots and snapshots (ssm_pool.c) ------------------------- */

/* Hybrid models: size (a count left 0 is derived from the memory it may
 * take) and allocate the state slot and snapshot tables; attention-only
 * models get none. Freed by dv_ssm_pool_free (safe on a partial open). */
devio_status dv_ssm_pool_open(devio_device *d, devio_error *err);
void dv_ssm_pool_free(devio_device *d);
/* Give q a free state slot (the caller checked n_ssm_free); the slot taken
 * is the top of the free stack, d->ssm_free[d->n_ssm_free - 1]. */
void dv_ssm_slot_take(devio_device *d, dv_seq *q);
/* Give q's state slot back (q holds one). */
void dv_ssm_slot_put(devio_device *d, dv_seq *q);
/* Release q's state slot, if any, and every snapshot it owns; returns the
 * number of snapshots released. */
uint32_t dv_ssm_release(devio_device *d, dv_seq *q);
/* Take a free snapshot (the caller checked n_snap_free) for q at len:
 * the top of the free stack, d->snap_free[d->n_snap_free - 1]. */
uint32_t dv_snap_take(devio_device *d, const dv_seq *q, uint32_t len);
void dv_snap_put(devio_device *d, uint32_t snap);
/* The snapshot q owns at exactly len, or -1. */
int32_t dv_snap_find(const devio_device *d, const dv_seq *q, uint32_t len);
/* Release q's snapshots at lengths above len; returns how many. */
uint32_t dv_snap_drop_after(devio_device *d, const dv_seq *q, uint32_t len);

#endif
