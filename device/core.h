/* core.h - private state of a device: sequences, tickets, logits handles.
 * Shared by the core's .c files only; nothing outside device/ includes it. */
#ifndef DEVIO_CORE_H
#define DEVIO_CORE_H

#include <stdbool.h>
#include <stdint.h>

#include "device/backend.h"
#include "device/devio.h"
#include "device/kv_pool.h"
#include "device/lora_table.h"
#include "device/sampler.h"

#ifndef DEVIO_NO_THREADS
#include <pthread.h>
#endif

typedef struct dv_seq {
    uint64_t id;      /* 0 = free slot */
    uint32_t len;     /* tokens cached, including those of a launched step */
    uint32_t n_blocks;
    uint32_t *blocks; /* max_blocks_per_seq entries, owned by the device */
    uint64_t busy;    /* ticket id while inside an unawaited ticket, else 0 */
} dv_seq;

typedef struct dv_handle {
    uint64_t id;      /* 0 = free */
    uint32_t n_rows;
    bool ready;       /* the step that fills it has run */
    uint32_t *slots;  /* row slots in the logits arena, logits_rows entries */
    uint32_t *pos;    /* sequence position of the token of each row */
} dv_handle;

typedef struct dv_trow {
    uint32_t seq_index;   /* index in the sequence table */
    uint32_t old_len;
    uint32_t n_tokens;
    uint32_t old_blocks;  /* block count before the launch, for rollback */
    uint64_t handle;      /* logits handle id, 0 = none */
    bool has_sample;
    devio_sample_params sample;
    const float *sample_src; /* logits of the last token */
    int32_t token;
    float logprob;
    int32_t lora_slot;    /* adapter table entry, -1 = none */
    uint32_t lora_gen;    /* the entry's generation at launch */
} dv_trow;

typedef enum { DV_T_FREE = 0, DV_T_QUEUED, DV_T_RUNNING, DV_T_DONE } dv_tstate;

/* One ticket slot; max_depth of them, every array sized at open. */
typedef struct dv_ticket {
    uint64_t id;
    dv_tstate state;
    uint32_t n_rows;
    dv_trow *rows;              /* max_rows */
    devio_batch_row *brows;     /* max_rows */
    int32_t *tokens;            /* max_batch_tokens */
    int32_t *out_index;         /* max_batch_tokens */
    float **out_rows;           /* max_batch_tokens */
    uint32_t *copy_src, *copy_dst; /* max_rows */
    float *sample_scratch;      /* max_rows * vocab */
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
    uint32_t vocab;
    uint32_t max_blocks_per_seq;
    bool torn_down;

    devio_kv_pool pool;
    dv_seq *seqs;           /* max_seqs */
    uint32_t *block_tables; /* max_seqs * max_blocks_per_seq */
    uint64_t next_seq_id;

    dv_handle *handles;     /* logits_handles */
    float *logits_arena;    /* logits_rows * vocab */
    uint32_t *row_free;     /* stack of free row slots */
    uint32_t n_row_free;
    uint32_t n_handles_live;
    uint64_t next_handle_id;

    dv_ticket *tickets;     /* max_depth slots */
    uint32_t *queue;        /* FIFO of slot indices, max_depth */
    uint32_t q_head, q_len;
    uint32_t in_flight;     /* launched, not yet awaited */
    uint64_t next_ticket_id;

    devio_sampler *sampler; /* used by the step runner only */
    devio_sampler *fx_sampler; /* used by effects (under the lock) */
    devio_lora_table lora;

#ifndef DEVIO_NO_THREADS
    pthread_mutex_t mu;
    pthread_cond_t cv_work; /* worker: a step was queued or stop */
    pthread_cond_t cv_done; /* a step finished */
    pthread_t worker;
    bool worker_started;
    bool stop;
#endif
};

/* Locking: every public entry takes d->mu; these helpers expect it held. */
void dv_lock(devio_device *d);
void dv_unlock(devio_device *d);

/* Wait until every launched step has run (steps still unawaited are fine). */
void dv_drain(devio_device *d);

dv_seq *dv_seq_find(devio_device *d, uint64_t id);
dv_handle *dv_handle_find(devio_device *d, uint64_t id);
float *dv_handle_row(devio_device *d, const dv_handle *h, uint32_t row);

/* Allocate a handle of n rows; caller checked capacity. */
dv_handle *dv_handle_alloc(devio_device *d, uint32_t n);
void dv_handle_release(devio_device *d, dv_handle *h);

/* Drop blocks of s beyond those needed for new_len; returns blocks returned to the pool. */
uint32_t dv_seq_shrink(devio_device *d, dv_seq *s, uint32_t new_len);

uint64_t dv_now_us(void);

#endif
