/* core.c - the device core: configuration, open and teardown, sequences, facts, logits handles.
 * Backend-neutral bookkeeping: it never computes, and allocates only at open. Launch lives in
 * launch.c, the step runner and await in step.c, effects in effects.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/cpus.h"
#include "device/core.h"
#include "device/shape.h"
#include "device/status.h"

devio_config devio_config_default(void)
{
    return (devio_config){
        .kv_blocks = 0,
        .block_size = 16,
        .max_depth = 2,
        .max_seqs = 256,
        .max_seq_len = 0,
        .max_rows = 64,
        .max_batch_tokens = 2048,
        .logits_handles = 64,
        .logits_rows = 256,
        .max_loras = 4,
        .max_lora_rank = 64,
        .threads = 0,
        .numerics = DEVIO_NUMERICS_STRICT,
        .epoch = 1,
        .first_ticket_id = 1,
        .use_worker_thread = true,
    };
}

devio_sample_params devio_sample_params_default(void)
{
    return (devio_sample_params){.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f,
                                 .seed = 0};
}

static const char *const numerics_names[] = {"strict", "fast"};

const char *devio_numerics_str(devio_numerics n)
{
    return (unsigned)n < 2 ? numerics_names[n] : "unknown";
}

bool devio_numerics_parse(const char *s, devio_numerics *out)
{
    for (int i = 0; s && i < 2; i++)
        if (strcmp(s, numerics_names[i]) == 0) {
            *out = (devio_numerics)i;
            return true;
        }
    return false;
}

#ifndef DEVIO_NO_THREADS
void dv_lock(devio_device *d) { pthread_mutex_lock(&d->mu); }
void dv_unlock(devio_device *d) { pthread_mutex_unlock(&d->mu); }
#else
void dv_lock(devio_device *d) { (void)d; }
void dv_unlock(devio_device *d) { (void)d; }
#endif

/* --threads 0: the CPUs this process may use (affinity and cgroup quota, common/cpus.h). */
static uint32_t default_threads(void) { return devio_usable_cpus(); }

/* ---- sequences and handles ------------------------------------------- */

dv_seq *dv_seq_find(devio_device *d, uint64_t id)
{
    if (id == 0)
        return NULL;
    for (uint32_t i = 0; i < d->cfg.max_seqs; i++)
        if (d->seqs[i].id == id)
            return &d->seqs[i];
    return NULL;
}

dv_handle *dv_handle_find(devio_device *d, uint64_t id)
{
    if (id == 0)
        return NULL;
    for (uint32_t i = 0; i < d->cfg.logits_handles; i++)
        if (d->handles[i].id == id)
            return &d->handles[i];
    return NULL;
}

devio_status dv_logits_row(devio_device *d, uint32_t slot, float *buf, const float **out,
                           devio_error *err)
{
    *out = buf;
    if (devio_backend_has_device_logits(d->ops))
        return devio_backend_logits_read(d->ops, d->backend, slot, buf, err);
    *out = d->logits_arena + (size_t)slot * d->vocab;
    return DEVIO_OK;
}

dv_handle *dv_handle_alloc(devio_device *d, uint32_t n)
{
    for (uint32_t i = 0; i < d->cfg.logits_handles; i++) {
        dv_handle *h = &d->handles[i];
        if (h->id)
            continue;
        h->id = d->next_handle_id++;
        h->n_rows = n;
        h->ready = false;
        for (uint32_t r = 0; r < n; r++)
            h->slots[r] = d->row_free[--d->n_row_free];
        d->n_handles_live++;
        return h;
    }
    return NULL;
}

void dv_handle_release(devio_device *d, dv_handle *h)
{
    for (uint32_t r = h->n_rows; r-- > 0;)
        d->row_free[d->n_row_free++] = h->slots[r];
    h->id = 0;
    h->n_rows = 0;
    d->n_handles_live--;
}

uint32_t dv_seq_shrink(devio_device *d, dv_seq *s, uint32_t new_len)
{
    uint32_t keep = (new_len + d->cfg.block_size - 1) / d->cfg.block_size;
    uint32_t freed = 0;
    while (s->n_blocks > keep) {
        uint32_t i = --s->n_blocks;
        if (dv_seq_block_live(s, i))
            freed += devio_kv_pool_unref(&d->pool, s->blocks[i]);
    }
    if (s->n_released > s->n_blocks)
        s->n_released = s->n_blocks;
    s->len = new_len;
    return freed;
}

uint32_t dv_window_first_key(const devio_device *d, uint32_t len)
{
    uint32_t w = d->shape.window;
    return w > 0 && len + 1 > w ? len + 1 - w : 0;
}

uint32_t dv_seq_release_window(devio_device *d, dv_seq *s)
{
    if (d->shape.window == 0)
        return 0;
    /* Block b is unneeded when its last position (b+1)*bs - 1 lies below
     * the first key of the next token. */
    uint32_t upto = dv_window_first_key(d, s->len) / d->cfg.block_size;
    if (upto > s->n_blocks)
        upto = s->n_blocks;
    uint32_t freed = 0;
    for (; s->n_released < upto; s->n_released++) {
        freed += devio_kv_pool_unref(&d->pool, s->blocks[s->n_released]);
        s->blocks[s->n_released] = DEVIO_KV_BLOCK_RELEASED;
    }
    return freed;
}

/* ---- SSM state slots and snapshots ------------------------------------ */

void dv_slot_take(devio_device *d, dv_seq *q)
{
    q->slot = (int32_t)d->slot_free[--d->n_slot_free];
    q->state_lost = false;
}

void dv_slot_put(devio_device *d, dv_seq *q)
{
    d->slot_free[d->n_slot_free++] = (uint32_t)q->slot;
    q->slot = -1;
}

void dv_snap_put(devio_device *d, uint32_t snap)
{
    d->snap_owner[snap] = -1;
    d->snap_free[d->n_snap_free++] = snap;
}

uint32_t dv_snap_take(devio_device *d, const dv_seq *q, uint32_t len)
{
    uint32_t snap = d->snap_free[--d->n_snap_free];
    d->snap_owner[snap] = (int32_t)(q - d->seqs);
    d->snap_len[snap] = len;
    return snap;
}

int32_t dv_snap_find(const devio_device *d, const dv_seq *q, uint32_t len)
{
    int32_t owner = (int32_t)(q - d->seqs);
    for (uint32_t i = 0; i < d->bcfg.ssm_snapshots; i++)
        if (d->snap_owner[i] == owner && d->snap_len[i] == len)
            return (int32_t)i;
    return -1;
}

uint32_t dv_snap_drop_after(devio_device *d, const dv_seq *q, uint32_t len)
{
    int32_t owner = (int32_t)(q - d->seqs);
    uint32_t n = 0;
    for (uint32_t i = 0; i < d->bcfg.ssm_snapshots; i++)
        if (d->snap_owner[i] == owner && d->snap_len[i] > len) {
            dv_snap_put(d, i);
            n++;
        }
    return n;
}

uint32_t dv_ssm_release(devio_device *d, dv_seq *q)
{
    if (!d->hybrid)
        return 0;
    uint32_t n = 0;
    int32_t owner = (int32_t)(q - d->seqs);
    for (uint32_t i = 0; i < d->bcfg.ssm_snapshots; i++)
        if (d->snap_owner[i] == owner) {
            dv_snap_put(d, i);
            n++;
        }
    if (q->slot >= 0)
        dv_slot_put(d, q);
    q->state_lost = false;
    return n;
}

/* ---- open and teardown ------------------------------------------------ */

static void ticket_bufs_free(dv_ticket *t)
{
    free(t->rows);
    free(t->brows);
    free(t->tokens);
    free(t->tok_pos);
    free(t->tok_row);
    free(t->out_tok);
    free(t->out_slot);
    free(t->copy_src);
    free(t->copy_dst);
    free(t->samples);
    free(t->snap_slots);
    free(t->procs);
    free(t->lprocs);
    free(t->proc_buf);
    free(t->top_ids);
    free(t->top_lps);
    free(t->prompt_lps);
}

static void device_free(devio_device *d)
{
    if (!d)
        return;
    /* The adapters leave the backend's slots before the backend goes. */
    devio_lora_table_fini(&d->lora);
    devio_backend_destroy(d->ops, d->backend);
    if (d->tickets)
        for (uint32_t i = 0; i < d->cfg.max_depth; i++)
            ticket_bufs_free(&d->tickets[i]);
    if (d->handles)
        for (uint32_t i = 0; i < d->cfg.logits_handles; i++) {
            free(d->handles[i].slots);
            free(d->handles[i].pos);
        }
    free(d->tickets);
    free(d->queue);
    free(d->handles);
    free(d->logits_arena);
    free(d->read_buf);
    free(d->step_buf);
    free(d->row_free);
    for (uint32_t i = 0; d->seqs && i < d->cfg.max_seqs; i++)
        free(d->seqs[i].toks);
    free(d->seqs);
    free(d->block_tables);
    free(d->rope_cos);
    free(d->rope_sin);
    free(d->slot_free);
    free(d->snap_owner);
    free(d->snap_len);
    free(d->snap_free);
    devio_kv_pool_fini(&d->pool);
    devio_sampler_free(d->sampler);
    devio_sampler_free(d->fx_sampler);
    free(d);
}

static devio_status check_config(devio_config *c, const devio_model *m, devio_error *err)
{
    if (c->block_size == 0 || c->block_size > 1024)
        return devio_fail(err, DEVIO_E_INVALID, "block_size must be in 1..1024");
    if (c->max_depth == 0 || c->max_depth > 64)
        return devio_fail(err, DEVIO_E_INVALID, "max_depth must be in 1..64");
    if (c->max_seqs == 0 || c->max_rows == 0 || c->max_batch_tokens == 0)
        return devio_fail(err, DEVIO_E_INVALID, "max_seqs, max_rows, max_batch_tokens must be > 0");
    if (c->logits_handles == 0 || c->logits_rows == 0)
        return devio_fail(err, DEVIO_E_INVALID, "logits_handles and logits_rows must be > 0");
    if (c->numerics != DEVIO_NUMERICS_STRICT && c->numerics != DEVIO_NUMERICS_FAST)
        return devio_fail(err, DEVIO_E_INVALID, "numerics must be strict or fast");
    uint32_t model_max = m->cfg.max_position_embeddings ? m->cfg.max_position_embeddings : 4096;
    if (c->max_seq_len == 0)
        c->max_seq_len = model_max < DEVIO_MAX_SEQ_LEN_DEFAULT ? model_max
                                                              : DEVIO_MAX_SEQ_LEN_DEFAULT;
    if (c->max_seq_len > model_max)
        return devio_fail(err, DEVIO_E_INVALID, "max_seq_len %u exceeds the model's %u positions",
                          c->max_seq_len, model_max);
    if (c->kv_blocks >= DEVIO_KV_BLOCK_RELEASED)
        return devio_fail(err, DEVIO_E_INVALID, "kv_blocks must be below %u",
                          DEVIO_KV_BLOCK_RELEASED);
    if (c->max_rows > c->max_batch_tokens)
        c->max_rows = c->max_batch_tokens;
    uint32_t per_seq = (c->max_seq_len + c->block_size - 1) / c->block_size;
    if (c->kv_blocks == 0) {
        /* 16 full-length sequences, within the memory budget, and one at
         * least (a smaller pool could never hold a sequence it admits). */
        uint64_t want = (uint64_t)per_seq * (c->max_seqs < 16 ? c->max_seqs : 16);
        uint64_t per_block = devio_kv_block_bytes(&m->cfg, c->block_size);
        uint64_t budget = (uint64_t)(c->kv_memory_mib ? c->kv_memory_mib : 1024) << 20;
        if (per_block > 0 && want > budget / per_block)
            want = budget / per_block > per_seq ? budget / per_block : per_seq;
        c->kv_blocks = (uint32_t)(want > 1u << 20 ? 1u << 20 : want);
    }
    if (c->threads == 0)
        c->threads = default_threads();
    if (c->first_ticket_id == 0)
        c->first_ticket_id = 1;
#ifdef DEVIO_NO_THREADS
    c->use_worker_thread = false;
    c->threads = 1;
#endif
    return DEVIO_OK;
}

static void *zalloc(size_t n, size_t size) { return calloc(n > 0 ? n : 1, size); }
#define ALLOC_N(p, n) ((p) = zalloc((size_t)(n), sizeof *(p)))

static bool alloc_ticket(dv_ticket *t, const devio_config *c)
{
    return ALLOC_N(t->rows, c->max_rows) && ALLOC_N(t->brows, c->max_rows) &&
           ALLOC_N(t->tokens, c->max_batch_tokens) && ALLOC_N(t->tok_pos, c->max_batch_tokens) &&
           ALLOC_N(t->tok_row, c->max_batch_tokens) && ALLOC_N(t->out_tok, c->max_batch_tokens) &&
           ALLOC_N(t->out_slot, c->max_batch_tokens) && ALLOC_N(t->copy_src, c->max_rows) &&
           ALLOC_N(t->copy_dst, c->max_rows) && ALLOC_N(t->samples, c->max_rows) &&
           ALLOC_N(t->snap_slots, c->max_batch_tokens) && ALLOC_N(t->procs, c->max_rows) && ALLOC_N(t->lprocs, c->max_rows) &&
           ALLOC_N(t->top_ids, (size_t)c->max_rows * DEVIO_TOP_LOGPROBS_MAX) &&
           ALLOC_N(t->top_lps, (size_t)c->max_rows * DEVIO_TOP_LOGPROBS_MAX) &&
           ALLOC_N(t->prompt_lps, c->max_batch_tokens);
}

static devio_status alloc_tables(devio_device *d)
{
    const devio_config *c = &d->cfg;
    size_t slots = (size_t)c->logits_rows + (size_t)c->max_depth * c->max_rows;
    if (devio_sampler_create(d->vocab, &d->sampler) != DEVIO_OK ||
        devio_sampler_create(d->vocab, &d->fx_sampler) != DEVIO_OK)
        return DEVIO_E_NOMEM;
    if (!ALLOC_N(d->seqs, c->max_seqs) ||
        !ALLOC_N(d->block_tables, (size_t)c->max_seqs * d->max_blocks_per_seq) ||
        !ALLOC_N(d->handles, c->logits_handles) ||
        !ALLOC_N(d->logits_arena, slots * d->vocab) || !ALLOC_N(d->read_buf, d->vocab) ||
        !ALLOC_N(d->step_buf, d->vocab) ||
        !ALLOC_N(d->row_free, c->logits_rows) || !ALLOC_N(d->tickets, c->max_depth) ||
        !ALLOC_N(d->queue, c->max_depth))
        return DEVIO_E_NOMEM;
    for (uint32_t i = 0; i < c->max_seqs; i++) {
        d->seqs[i].blocks = d->block_tables + (size_t)i * d->max_blocks_per_seq;
        d->seqs[i].slot = -1;
    }
    for (uint32_t i = 0; i < c->logits_handles; i++)
        if (!ALLOC_N(d->handles[i].slots, c->logits_rows) ||
            !ALLOC_N(d->handles[i].pos, c->logits_rows))
            return DEVIO_E_NOMEM;
    for (uint32_t i = 0; i < c->logits_rows; i++)
        d->row_free[i] = c->logits_rows - 1 - i;
    d->n_row_free = c->logits_rows;
    for (uint32_t i = 0; i < c->max_depth; i++) {
        if (!alloc_ticket(&d->tickets[i], c))
            return DEVIO_E_NOMEM;
        d->tickets[i].sample_slot0 = c->logits_rows + i * c->max_rows;
    }
    return DEVIO_OK;
}

/* Memory the state slots and the snapshots may each take when their count
 * is derived (--ssm-slots 0, --ssm-snapshots 0). */
#define SSM_POOL_BYTES (1ull << 30)

/* Hybrid models: the state slot and snapshot pools and their tables. A
 * derived count is what SSM_POOL_BYTES holds, at least 1: slots at most
 * max_seqs, snapshots at most 4 per slot. Attention-only models get none. */
static devio_status ssm_pools(devio_device *d, devio_error *err)
{
    devio_config *c = &d->cfg;
    d->hybrid = d->shape.n_mixers > 0;
    if (!d->hybrid) {
        c->ssm_slots = c->ssm_snapshots = 0;
        return DEVIO_OK;
    }
    if (!devio_backend_has_ssm(d->ops))
        return devio_fail(err, DEVIO_E_UNSUPPORTED,
                          "backend '%s' keeps no recurrent state: it cannot run %s",
                          d->ops->name, d->model->cfg.architecture);
    uint64_t slot_bytes = d->shape.slot_floats * sizeof(float);
    uint64_t fit = SSM_POOL_BYTES / (slot_bytes ? slot_bytes : 1);
    fit = fit > 0 ? fit : 1;
    if (c->ssm_slots == 0)
        c->ssm_slots = (uint32_t)(fit < c->max_seqs ? fit : c->max_seqs);
    if (c->ssm_snapshots == 0) {
        uint64_t want = 4ull * c->ssm_slots;
        c->ssm_snapshots = (uint32_t)(fit < want ? fit : want);
    }
    if (c->ssm_slots > (1u << 20) || c->ssm_snapshots > (1u << 20))
        return devio_fail(err, DEVIO_E_INVALID, "ssm_slots and ssm_snapshots are at most %u",
                          1u << 20);
    if (!ALLOC_N(d->slot_free, c->ssm_slots) || !ALLOC_N(d->snap_owner, c->ssm_snapshots) ||
        !ALLOC_N(d->snap_len, c->ssm_snapshots) || !ALLOC_N(d->snap_free, c->ssm_snapshots))
        return devio_fail(err, DEVIO_E_NOMEM, "out of memory for the SSM slot tables");
    for (uint32_t i = 0; i < c->ssm_slots; i++)
        d->slot_free[i] = c->ssm_slots - 1 - i;
    d->n_slot_free = c->ssm_slots;
    for (uint32_t i = 0; i < c->ssm_snapshots; i++) {
        d->snap_owner[i] = -1;
        d->snap_free[i] = c->ssm_snapshots - 1 - i;
    }
    d->n_snap_free = c->ssm_snapshots;
    return DEVIO_OK;
}

/* Shape, RoPE tables and the backend, in that order: what every backend
 * needs is checked and computed here, once. */
static devio_status open_backend(devio_device *d, devio_error *err)
{
    const devio_config *c = &d->cfg;
    devio_status s = devio_model_shape_get(d->model, &d->shape, err);
    if (s == DEVIO_OK)
        s = devio_rope_tables(&d->model->cfg, d->shape.rotary_dim, c->max_seq_len,
                              &d->rope_cos, &d->rope_sin, err);
    if (s != DEVIO_OK)
        return s;
    s = ssm_pools(d, err);
    if (s != DEVIO_OK)
        return s;
    d->bcfg = (devio_backend_config){
        .kv_blocks = c->kv_blocks,
        .block_size = c->block_size,
        .max_batch_tokens = c->max_batch_tokens,
        .max_rows = c->max_rows,
        .max_seq_len = c->max_seq_len,
        .max_depth = c->max_depth,
        .threads = c->threads,
        .numerics = c->numerics,
        .adapter_slots = c->max_loras,
        .max_lora_rank = c->max_lora_rank,
        .logits_slots = c->logits_rows + c->max_depth * c->max_rows,
        .ssm_slots = c->ssm_slots,
        .ssm_snapshots = c->ssm_snapshots,
        .shape = &d->shape,
        .rope_cos = d->rope_cos,
        .rope_sin = d->rope_sin,
        .logits_host = d->logits_arena,
    };
    if (d->kv_auto) {
        /* --kv-blocks 0 on a backend that knows its memory: what fits, up
         * to what max_seqs full-length sequences could use. */
        uint64_t cap = (uint64_t)c->max_seqs * d->max_blocks_per_seq;
        uint64_t fit = devio_backend_kv_blocks_fit(d->ops, d->model, &d->bcfg);
        if (fit > 0) {
            d->cfg.kv_blocks = (uint32_t)(fit < cap ? fit : cap);
            d->bcfg.kv_blocks = d->cfg.kv_blocks;
        }
    }
    s = devio_backend_create(d->ops, d->model, &d->bcfg, &d->backend, err);
    if (s != DEVIO_OK)
        return s;
    if (devio_lora_table_init(&d->lora, c->max_loras, c->max_lora_rank, c->adapters_root,
                              d->model, d->ops, d->backend) != DEVIO_OK)
        return devio_fail(err, DEVIO_E_NOMEM, "out of memory for the adapter table");
    return DEVIO_OK;
}

#ifndef DEVIO_NO_THREADS
static void *worker_main(void *arg)
{
    devio_device *d = arg;
    dv_lock(d);
    for (;;) {
        while (d->q_len == 0 && !d->stop)
            pthread_cond_wait(&d->cv_work, &d->mu);
        if (d->q_len == 0 && d->stop)
            break;
        uint64_t id = d->tickets[d->queue[d->q_head]].id;
        dv_run_queue_head(d);
        if (d->cfg.on_settled) {
            /* Unlocked: the callee may take its own locks, which device
             * callers may hold while they call in. */
            dv_unlock(d);
            d->cfg.on_settled(d->cfg.on_settled_ctx, id);
            dv_lock(d);
        }
    }
    dv_unlock(d);
    return NULL;
}
#endif

devio_status devio_open(const devio_model *model, const devio_backend_ops *backend,
                        const devio_config *cfg, devio_device **out, devio_error *err)
{
    *out = NULL;
    devio_status s = devio_backend_check(backend, err);
    if (s != DEVIO_OK)
        return s;
    devio_device *d = calloc(1, sizeof *d);
    if (!d)
        return devio_fail(err, DEVIO_E_NOMEM, "out of memory opening the device");
    d->model = model;
    d->ops = backend;
    d->cfg = cfg ? *cfg : devio_config_default();
    d->vocab = model->cfg.vocab_size;
    d->kv_auto = d->cfg.kv_blocks == 0;
    s = check_config(&d->cfg, model, err);
    if (s != DEVIO_OK)
        goto out_free;
    d->max_blocks_per_seq = (d->cfg.max_seq_len + d->cfg.block_size - 1) / d->cfg.block_size;
    d->next_seq_id = 1;
    d->next_handle_id = 1;
    d->next_ticket_id = d->cfg.first_ticket_id;
    if (alloc_tables(d) != DEVIO_OK) {
        s = devio_fail(err, DEVIO_E_NOMEM, "out of memory sizing the device tables");
        goto out_free;
    }
    s = open_backend(d, err);
    if (s == DEVIO_OK && devio_kv_pool_init(&d->pool, d->cfg.kv_blocks) != DEVIO_OK)
        s = devio_fail(err, DEVIO_E_NOMEM, "out of memory for the KV block table");
    if (s != DEVIO_OK)
        goto out_free;
#ifndef DEVIO_NO_THREADS
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->cv_work, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&d->cv_done, &ca);
    pthread_condattr_destroy(&ca);
    if (d->cfg.use_worker_thread) {
        if (pthread_create(&d->worker, NULL, worker_main, d) != 0) {
            s = devio_fail(err, DEVIO_E_DEVICE, "cannot start the device worker thread");
            goto out_sync;
        }
        d->worker_started = true;
    }
#endif
    *out = d;
    return DEVIO_OK;
#ifndef DEVIO_NO_THREADS
out_sync:
    pthread_cond_destroy(&d->cv_done);
    pthread_cond_destroy(&d->cv_work);
    pthread_mutex_destroy(&d->mu);
#endif
out_free:
    device_free(d);
    return s;
}

devio_status devio_teardown(devio_device *d, uint32_t *aborted_out)
{
    if (!d)
        return DEVIO_OK;
    dv_lock(d);
    dv_drain(d);
    d->torn_down = true;
    uint32_t aborted = d->in_flight;
#ifndef DEVIO_NO_THREADS
    d->stop = true;
    pthread_cond_broadcast(&d->cv_work);
#endif
    dv_unlock(d);
#ifndef DEVIO_NO_THREADS
    if (d->worker_started)
        pthread_join(d->worker, NULL);
    pthread_cond_destroy(&d->cv_done);
    pthread_cond_destroy(&d->cv_work);
    pthread_mutex_destroy(&d->mu);
#endif
    if (aborted_out)
        *aborted_out = aborted;
    device_free(d);
    return DEVIO_OK;
}

const devio_model *devio_model_of(const devio_device *d) { return d->model; }
const devio_config *devio_config_of(const devio_device *d) { return &d->cfg; }
uint32_t devio_max_depth(const devio_device *d) { return d->cfg.max_depth; }

void devio_device_info_get(devio_device *d, devio_device_info *out)
{
    memset(out, 0, sizeof *out);
    dv_lock(d);
    devio_backend_info_get(d->ops, d->backend, out);
    dv_unlock(d);
    snprintf(out->backend, sizeof out->backend, "%s", d->ops->name);
    out->numerics = d->cfg.numerics;
}

devio_facts devio_facts_get(devio_device *d)
{
    dv_lock(d);
    devio_facts f = {
        .block_size = d->cfg.block_size,
        .blocks_total = d->pool.n_blocks,
        .blocks_free = d->pool.n_free,
        .blocks_shared = d->pool.n_shared,
        /* Attention-only models hold no SSM state: the pools are empty. */
        .ssm_slots_total = d->bcfg.ssm_slots,
        .ssm_slots_used = d->bcfg.ssm_slots - d->n_slot_free,
        .ssm_snapshots_total = d->bcfg.ssm_snapshots,
        .ssm_snapshots_used = d->bcfg.ssm_snapshots - d->n_snap_free,
        .tickets_in_flight = d->in_flight,
        .logits_live = d->n_handles_live,
        .logits_rows_live = d->cfg.logits_rows - d->n_row_free,
        .adapters_loaded = d->lora.n_loaded,
        .epoch = d->cfg.epoch,
    };
    dv_unlock(d);
    return f;
}
