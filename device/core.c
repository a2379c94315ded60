/* core.c - the device core: open, sequences, launch, await, the step runner.
 * Backend-neutral bookkeeping; it never computes and never allocates on the step path. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "device/core.h"
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

uint64_t dv_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

#ifndef DEVIO_NO_THREADS
void dv_lock(devio_device *d) { pthread_mutex_lock(&d->mu); }
void dv_unlock(devio_device *d) { pthread_mutex_unlock(&d->mu); }
#else
void dv_lock(devio_device *d) { (void)d; }
void dv_unlock(devio_device *d) { (void)d; }
#endif

static uint32_t default_threads(void)
{
#if defined(_SC_NPROCESSORS_ONLN) && !defined(DEVIO_NO_THREADS)
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (uint32_t)n : 1;
#else
    return 1;
#endif
}

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

float *dv_handle_row(devio_device *d, const dv_handle *h, uint32_t row)
{
    return d->logits_arena + (size_t)h->slots[row] * d->vocab;
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
    while (s->n_blocks > keep)
        freed += devio_kv_pool_unref(&d->pool, s->blocks[--s->n_blocks]);
    s->len = new_len;
    return freed;
}

/* ---- the step runner -------------------------------------------------- */

static void run_step(devio_device *d, dv_ticket *t, devio_sampler *sampler)
{
    t->t_start = dv_now_us();
    memset(&t->err, 0, sizeof t->err);
    t->status = devio_backend_forward(d->ops, d->backend, &t->batch, &t->err);
    if (t->status != DEVIO_OK && t->err.status == DEVIO_OK)
        devio_fail(&t->err, t->status, "backend '%s' failed the step", d->ops->name);
    for (uint32_t r = 0; r < t->n_rows && t->status == DEVIO_OK; r++) {
        dv_trow *row = &t->rows[r];
        if (!row->has_sample)
            continue;
        /* The sampled token takes the position after the row's last token. */
        t->status = devio_sampler_run(sampler, row->sample_src, &row->sample,
                                      (uint64_t)row->old_len + row->n_tokens, &row->token,
                                      &row->logprob);
        if (t->status != DEVIO_OK)
            t->status = devio_fail_at(&t->err, DEVIO_E_DEVICE, "row", r,
                          "row %u: cannot sample, every logit is NaN or -inf", r);
    }
    t->t_end = dv_now_us();
}

/* Settle queue head; called with the lock held. Drops it during compute. */
static void run_queue_head(devio_device *d)
{
    dv_ticket *t = &d->tickets[d->queue[d->q_head]];
    t->state = DV_T_RUNNING;
    dv_unlock(d);
    run_step(d, t, d->sampler);
    dv_lock(d);
    t->state = DV_T_DONE;
    d->q_head = (d->q_head + 1) % d->cfg.max_depth;
    d->q_len--;
    for (uint32_t r = 0; r < t->n_rows; r++) {
        dv_handle *h = dv_handle_find(d, t->rows[r].handle);
        if (h)
            h->ready = true;
    }
#ifndef DEVIO_NO_THREADS
    pthread_cond_broadcast(&d->cv_done);
#endif
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
        run_queue_head(d);
    }
    dv_unlock(d);
    return NULL;
}
#endif

void dv_drain(devio_device *d)
{
#ifndef DEVIO_NO_THREADS
    if (d->worker_started) {
        while (d->q_len > 0)
            pthread_cond_wait(&d->cv_done, &d->mu);
        return;
    }
#endif
    while (d->q_len > 0)
        run_queue_head(d);
}

/* ---- open and teardown ------------------------------------------------ */

static void device_free(devio_device *d)
{
    if (!d)
        return;
    devio_backend_destroy(d->ops, d->backend);
    if (d->tickets)
        for (uint32_t i = 0; i < d->cfg.max_depth; i++) {
            dv_ticket *t = &d->tickets[i];
            free(t->rows);
            free(t->brows);
            free(t->tokens);
            free(t->out_index);
            free(t->out_rows);
            free(t->copy_src);
            free(t->copy_dst);
            free(t->sample_scratch);
        }
    if (d->handles)
        for (uint32_t i = 0; i < d->cfg.logits_handles; i++) {
            free(d->handles[i].slots);
            free(d->handles[i].pos);
        }
    free(d->tickets);
    free(d->queue);
    free(d->handles);
    free(d->logits_arena);
    free(d->row_free);
    free(d->seqs);
    free(d->block_tables);
    devio_kv_pool_fini(&d->pool);
    devio_sampler_free(d->sampler);
    devio_sampler_free(d->fx_sampler);
    devio_lora_table_fini(&d->lora);
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
    uint32_t model_max = m->cfg.max_position_embeddings ? m->cfg.max_position_embeddings : 4096;
    if (c->max_seq_len == 0)
        c->max_seq_len = model_max < 4096 ? model_max : 4096;
    if (c->max_seq_len > model_max)
        return devio_fail(err, DEVIO_E_INVALID, "max_seq_len %u exceeds the model's %u positions",
                          c->max_seq_len, model_max);
    if (c->max_rows > c->max_batch_tokens)
        c->max_rows = c->max_batch_tokens;
    uint32_t per_seq = (c->max_seq_len + c->block_size - 1) / c->block_size;
    if (c->kv_blocks == 0) {
        uint64_t want = (uint64_t)per_seq * (c->max_seqs < 16 ? c->max_seqs : 16);
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

static devio_status alloc_tables(devio_device *d)
{
    const devio_config *c = &d->cfg;
    if (devio_kv_pool_init(&d->pool, c->kv_blocks) != DEVIO_OK)
        return DEVIO_E_NOMEM;
    if (devio_lora_table_init(&d->lora, c->max_loras, c->max_lora_rank, c->adapters_root,
                              d->model) != DEVIO_OK)
        return DEVIO_E_NOMEM;
    if (devio_sampler_create(d->vocab, &d->sampler) != DEVIO_OK ||
        devio_sampler_create(d->vocab, &d->fx_sampler) != DEVIO_OK)
        return DEVIO_E_NOMEM;
    if (!ALLOC_N(d->seqs, c->max_seqs) ||
        !ALLOC_N(d->block_tables, (size_t)c->max_seqs * d->max_blocks_per_seq) ||
        !ALLOC_N(d->handles, c->logits_handles) ||
        !ALLOC_N(d->logits_arena, (size_t)c->logits_rows * d->vocab) ||
        !ALLOC_N(d->row_free, c->logits_rows) || !ALLOC_N(d->tickets, c->max_depth) ||
        !ALLOC_N(d->queue, c->max_depth))
        return DEVIO_E_NOMEM;
    for (uint32_t i = 0; i < c->max_seqs; i++)
        d->seqs[i].blocks = d->block_tables + (size_t)i * d->max_blocks_per_seq;
    for (uint32_t i = 0; i < c->logits_handles; i++)
        if (!ALLOC_N(d->handles[i].slots, c->logits_rows) ||
            !ALLOC_N(d->handles[i].pos, c->logits_rows))
            return DEVIO_E_NOMEM;
    for (uint32_t i = 0; i < c->logits_rows; i++)
        d->row_free[i] = c->logits_rows - 1 - i;
    d->n_row_free = c->logits_rows;
    for (uint32_t i = 0; i < c->max_depth; i++) {
        dv_ticket *t = &d->tickets[i];
        if (!ALLOC_N(t->rows, c->max_rows) || !ALLOC_N(t->brows, c->max_rows) ||
            !ALLOC_N(t->tokens, c->max_batch_tokens) ||
            !ALLOC_N(t->out_index, c->max_batch_tokens) ||
            !ALLOC_N(t->out_rows, c->max_batch_tokens) || !ALLOC_N(t->copy_src, c->max_rows) ||
            !ALLOC_N(t->copy_dst, c->max_rows) ||
            !ALLOC_N(t->sample_scratch, (size_t)c->max_rows * d->vocab))
            return DEVIO_E_NOMEM;
    }
    return DEVIO_OK;
}

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
    devio_backend_config bc = {
        .kv_blocks = d->cfg.kv_blocks,
        .block_size = d->cfg.block_size,
        .max_batch_tokens = d->cfg.max_batch_tokens,
        .max_rows = d->cfg.max_rows,
        .max_seq_len = d->cfg.max_seq_len,
        .threads = d->cfg.threads,
        .max_lora_rank = d->cfg.max_lora_rank,
    };
    s = devio_backend_create(backend, model, &bc, &d->backend, err);
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

devio_facts devio_facts_get(devio_device *d)
{
    dv_lock(d);
    devio_facts f = {
        .block_size = d->cfg.block_size,
        .blocks_total = d->pool.n_blocks,
        .blocks_free = d->pool.n_free,
        .blocks_shared = d->pool.n_shared,
        /* Attention-only models hold no SSM state: the pools are empty. */
        .ssm_slots_total = 0,
        .ssm_slots_used = 0,
        .ssm_snapshots_total = 0,
        .ssm_snapshots_used = 0,
        .tickets_in_flight = d->in_flight,
        .logits_live = d->n_handles_live,
        .adapters_loaded = d->lora.n_loaded,
        .epoch = d->cfg.epoch,
    };
    dv_unlock(d);
    return f;
}

devio_status devio_seq_create(devio_device *d, uint64_t *seq, devio_error *err)
{
    devio_status s = DEVIO_OK;
    dv_lock(d);
    if (d->torn_down) {
        s = devio_fail(err, DEVIO_E_TORN_DOWN, "device torn down");
        goto out;
    }
    for (uint32_t i = 0; i < d->cfg.max_seqs; i++) {
        dv_seq *q = &d->seqs[i];
        if (q->id)
            continue;
        q->id = d->next_seq_id++;
        q->len = 0;
        q->n_blocks = 0;
        q->busy = 0;
        *seq = q->id;
        goto out;
    }
    s = devio_fail_at(err, DEVIO_E_OUT_OF_SEQS, "max_seqs", d->cfg.max_seqs,
                      "all %u sequence slots are in use", d->cfg.max_seqs);
out:
    dv_unlock(d);
    return s;
}

devio_status devio_seq_info_get(devio_device *d, uint64_t seq, devio_seq_info *out,
                                devio_error *err)
{
    devio_status s = DEVIO_OK;
    dv_lock(d);
    dv_seq *q = d->torn_down ? NULL : dv_seq_find(d, seq);
    if (d->torn_down)
        s = devio_fail(err, DEVIO_E_TORN_DOWN, "device torn down");
    else if (!q)
        s = devio_fail_at(err, DEVIO_E_UNKNOWN_SEQ, "seq", (int64_t)seq, "no sequence %llu",
                          (unsigned long long)seq);
    else
        *out = (devio_seq_info){.seq = q->id, .len = q->len, .blocks = q->n_blocks,
                                .busy_ticket = q->busy, .n_snapshots = 0};
    dv_unlock(d);
    return s;
}

/* ---- launch ----------------------------------------------------------- */

/* Validate a plan against the device limits and state; changes nothing. */
static devio_status validate_plan(devio_device *d, const devio_plan *p, uint32_t *kv_need,
                                  uint32_t *handles_need, uint32_t *rows_need, devio_error *err)
{
    const devio_config *c = &d->cfg;
    if (!p || p->n_rows == 0 || !p->rows)
        return devio_fail(err, DEVIO_E_INVALID, "plan has no rows");
    if (p->n_rows > c->max_rows)
        return devio_fail_at(err, DEVIO_E_TOO_LARGE, "max_rows", c->max_rows,
                             "plan has %u rows, max_rows is %u", p->n_rows, c->max_rows);
    uint64_t total = 0;
    *kv_need = *handles_need = *rows_need = 0;
    for (uint32_t r = 0; r < p->n_rows; r++) {
        const devio_row *row = &p->rows[r];
        dv_seq *q = dv_seq_find(d, row->seq);
        if (!q)
            return devio_fail_at(err, DEVIO_E_UNKNOWN_SEQ, "row", r, "row %u: no sequence %llu", r,
                                 (unsigned long long)row->seq);
        for (uint32_t k = 0; k < r; k++)
            if (p->rows[k].seq == row->seq)
                return devio_fail_at(err, DEVIO_E_INVALID, "row", r,
                                     "row %u: sequence %llu appears twice in the plan", r,
                                     (unsigned long long)row->seq);
        if (q->busy)
            return devio_fail_at(err, DEVIO_E_SEQ_BUSY, "row", r,
                                 "row %u: sequence %llu is busy in ticket %llu", r,
                                 (unsigned long long)row->seq, (unsigned long long)q->busy);
        if (row->n_tokens == 0 || !row->tokens)
            return devio_fail_at(err, DEVIO_E_INVALID, "row", r, "row %u has no tokens", r);
        for (uint32_t i = 0; i < row->n_tokens; i++)
            if (row->tokens[i] < 0 || (uint32_t)row->tokens[i] >= d->vocab)
                return devio_fail_at(err, DEVIO_E_INVALID, "row", r,
                                     "row %u: token %d is outside the vocabulary [0, %u)", r,
                                     row->tokens[i], d->vocab);
        if ((uint64_t)q->len + row->n_tokens > c->max_seq_len)
            return devio_fail_at(err, DEVIO_E_TOO_LARGE, "row", r,
                                 "row %u: length %u + %u exceeds max_seq_len %u", r, q->len,
                                 row->n_tokens, c->max_seq_len);
        if (row->logits > DEVIO_LOGITS_ALL)
            return devio_fail_at(err, DEVIO_E_INVALID, "row", r, "row %u: bad logits mode", r);
        if (row->adapter && devio_lora_table_find(&d->lora, row->adapter) < 0)
            return devio_fail_at(err, DEVIO_E_UNKNOWN_ADAPTER, "row", r,
                                 "row %u: adapter '%s' is not loaded", r, row->adapter);
        if (row->has_sample) {
            devio_status s = devio_sampler_check(&row->sample, err);
            if (s != DEVIO_OK) {
                if (err) {
                    err->detail_val = r;
                    snprintf(err->detail_key, sizeof err->detail_key, "row");
                }
                return s;
            }
        }
        total += row->n_tokens;
        uint32_t bs = c->block_size;
        uint32_t have = q->n_blocks;
        uint32_t want = (q->len + row->n_tokens + bs - 1) / bs;
        *kv_need += want - have;
        /* Writing into a shared partial block copies it first. */
        if (q->len % bs != 0 && devio_kv_pool_is_shared(&d->pool, q->blocks[have - 1]))
            *kv_need += 1;
        if (row->logits != DEVIO_LOGITS_NONE) {
            *handles_need += 1;
            *rows_need += row->logits == DEVIO_LOGITS_ALL ? row->n_tokens : 1;
        }
    }
    if (total > c->max_batch_tokens)
        return devio_fail_at(err, DEVIO_E_TOO_LARGE, "max_batch_tokens", c->max_batch_tokens,
                             "plan has %llu tokens, max_batch_tokens is %u",
                             (unsigned long long)total, c->max_batch_tokens);
    if (*kv_need > d->pool.n_free)
        return devio_fail_at(err, DEVIO_E_OUT_OF_KV_BLOCKS, "needed", *kv_need,
                             "plan needs %u KV blocks, %u are free", *kv_need, d->pool.n_free);
    if (*handles_need > c->logits_handles - d->n_handles_live || *rows_need > d->n_row_free)
        return devio_fail_at(err, DEVIO_E_OUT_OF_LOGITS, "needed_rows", *rows_need,
                             "plan needs %u logits handles and %u rows; %u and %u are free",
                             *handles_need, *rows_need, c->logits_handles - d->n_handles_live,
                             d->n_row_free);
    return DEVIO_OK;
}

/* Reserve and lay out one validated row in ticket slot t. Cannot fail. */
static void commit_row(devio_device *d, dv_ticket *t, uint32_t r, const devio_row *row,
                       uint32_t *tok, uint32_t *n_out)
{
    dv_seq *q = dv_seq_find(d, row->seq);
    dv_trow *tr = &t->rows[r];
    uint32_t bs = d->cfg.block_size;
    *tr = (dv_trow){.seq_index = (uint32_t)(q - d->seqs), .old_len = q->len,
                    .n_tokens = row->n_tokens, .old_blocks = q->n_blocks,
                    .has_sample = row->has_sample, .sample = row->sample, .lora_slot = -1};
    const devio_adapter *adapter = NULL;
    if (row->adapter) {
        tr->lora_slot = devio_lora_table_find(&d->lora, row->adapter);
        devio_lora_entry *e = &d->lora.entries[tr->lora_slot];
        tr->lora_gen = e->generation;
        adapter = e->weights;
        devio_lora_table_acquire(&d->lora, tr->lora_slot);
    }
    if (q->len % bs != 0 && devio_kv_pool_is_shared(&d->pool, q->blocks[q->n_blocks - 1])) {
        uint32_t src = q->blocks[q->n_blocks - 1];
        uint32_t dst = devio_kv_pool_take(&d->pool);
        devio_kv_pool_unref(&d->pool, src);
        q->blocks[q->n_blocks - 1] = dst;
        t->copy_src[t->batch.n_copies] = src;
        t->copy_dst[t->batch.n_copies] = dst;
        t->batch.n_copies++;
    }
    uint32_t want = (q->len + row->n_tokens + bs - 1) / bs;
    while (q->n_blocks < want)
        q->blocks[q->n_blocks++] = devio_kv_pool_take(&d->pool);

    dv_handle *h = NULL;
    if (row->logits != DEVIO_LOGITS_NONE) {
        h = dv_handle_alloc(d, row->logits == DEVIO_LOGITS_ALL ? row->n_tokens : 1);
        tr->handle = h->id;
    }
    t->brows[r] = (devio_batch_row){.pos0 = q->len, .n_tokens = row->n_tokens,
                                    .tok_start = *tok, .blocks = q->blocks,
                                    .adapter = adapter};
    for (uint32_t i = 0; i < row->n_tokens; i++) {
        uint32_t ti = *tok + i;
        bool last = i + 1 == row->n_tokens;
        t->tokens[ti] = row->tokens[i];
        t->out_index[ti] = -1;
        float *dst = NULL;
        if (h && (row->logits == DEVIO_LOGITS_ALL || last)) {
            uint32_t hr = row->logits == DEVIO_LOGITS_ALL ? i : 0;
            h->pos[hr] = q->len + i;
            dst = dv_handle_row(d, h, hr);
        } else if (last && row->has_sample) {
            dst = t->sample_scratch + (size_t)r * d->vocab;
        }
        if (dst) {
            t->out_index[ti] = (int32_t)*n_out;
            t->out_rows[(*n_out)++] = dst;
        }
        if (last)
            tr->sample_src = dst;
    }
    *tok += row->n_tokens;
    q->len += row->n_tokens;
    q->busy = t->id;
}

devio_status devio_launch(devio_device *d, const devio_plan *plan, uint64_t *ticket,
                          devio_error *err)
{
    devio_status s = DEVIO_OK;
    dv_lock(d);
    if (d->torn_down) {
        s = devio_fail(err, DEVIO_E_TORN_DOWN, "device torn down");
        goto out;
    }
    if (d->in_flight >= d->cfg.max_depth) {
        s = devio_fail_at(err, DEVIO_E_DEPTH_EXCEEDED, "max_depth", d->cfg.max_depth,
                          "%u tickets in flight, max_depth is %u", d->in_flight,
                          d->cfg.max_depth);
        goto out;
    }
    uint32_t kv_need, handles_need, rows_need;
    s = validate_plan(d, plan, &kv_need, &handles_need, &rows_need, err);
    if (s != DEVIO_OK)
        goto out;

    dv_ticket *t = NULL;
    uint32_t slot = 0;
    for (; slot < d->cfg.max_depth; slot++)
        if (d->tickets[slot].state == DV_T_FREE) {
            t = &d->tickets[slot];
            break;
        }
    /* in_flight < max_depth guarantees a free slot. */
    t->id = d->next_ticket_id++;
    t->n_rows = plan->n_rows;
    t->batch = (devio_batch){.n_rows = plan->n_rows, .rows = t->brows, .tokens = t->tokens,
                             .out_index = t->out_index, .out_rows = t->out_rows,
                             .copy_src = t->copy_src, .copy_dst = t->copy_dst};
    uint32_t tok = 0, n_out = 0;
    for (uint32_t r = 0; r < plan->n_rows; r++)
        commit_row(d, t, r, &plan->rows[r], &tok, &n_out);
    t->batch.n_tokens = tok;
    t->batch.n_out = n_out;
    t->t_launch = dv_now_us();
    t->state = DV_T_QUEUED;
    d->queue[(d->q_head + d->q_len) % d->cfg.max_depth] = slot;
    d->q_len++;
    d->in_flight++;
    *ticket = t->id;
#ifndef DEVIO_NO_THREADS
    pthread_cond_signal(&d->cv_work);
#endif
out:
    dv_unlock(d);
    return s;
}

/* ---- await ------------------------------------------------------------ */

static dv_ticket *ticket_find(devio_device *d, uint64_t id)
{
    for (uint32_t i = 0; i < d->cfg.max_depth; i++)
        if (d->tickets[i].state != DV_T_FREE && d->tickets[i].id == id)
            return &d->tickets[i];
    return NULL;
}

/* Still waiting for ticket `id` in slot t: not done, not taken by another awaiter. */
static bool still_pending(const dv_ticket *t, uint64_t id)
{
    return t->id == id && t->state != DV_T_DONE && t->state != DV_T_FREE;
}

/* Wait until t settles or the timeout passes. Lock held. */
static void wait_done(devio_device *d, dv_ticket *t, int64_t timeout_ms)
{
    uint64_t id = t->id;
#ifndef DEVIO_NO_THREADS
    if (d->worker_started) {
        if (timeout_ms < 0) {
            while (still_pending(t, id))
                pthread_cond_wait(&d->cv_done, &d->mu);
            return;
        }
        struct timespec dl;
        clock_gettime(CLOCK_MONOTONIC, &dl);
        dl.tv_sec += timeout_ms / 1000;
        dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (dl.tv_nsec >= 1000000000L) {
            dl.tv_sec++;
            dl.tv_nsec -= 1000000000L;
        }
        while (still_pending(t, id))
            if (pthread_cond_timedwait(&d->cv_done, &d->mu, &dl) != 0)
                return;
        return;
    }
#endif
    (void)timeout_ms;
    while (still_pending(t, id))
        run_queue_head(d);
}

/* Undo a failed step's reservations: lengths, new blocks, handles. */
static void rollback_step(devio_device *d, dv_ticket *t)
{
    for (uint32_t r = 0; r < t->n_rows; r++) {
        dv_trow *tr = &t->rows[r];
        dv_seq *q = &d->seqs[tr->seq_index];
        dv_seq_shrink(d, q, tr->old_len);
        dv_handle *h = dv_handle_find(d, tr->handle);
        if (h)
            dv_handle_release(d, h);
    }
}

devio_status devio_await(devio_device *d, uint64_t ticket, int64_t timeout_ms,
                         devio_step_result *out, devio_error *err)
{
    devio_status s = DEVIO_OK;
    memset(out, 0, sizeof *out);
    dv_lock(d);
    if (d->torn_down) {
        s = devio_fail(err, DEVIO_E_TORN_DOWN, "device torn down");
        goto out;
    }
    dv_ticket *t = ticket_find(d, ticket);
    if (!t) {
        if (ticket >= d->cfg.first_ticket_id && ticket < d->next_ticket_id)
            s = devio_fail_at(err, DEVIO_E_TICKET_CONSUMED, "ticket", (int64_t)ticket,
                              "ticket %llu was already awaited", (unsigned long long)ticket);
        else
            s = devio_fail_at(err, DEVIO_E_UNKNOWN_TICKET, "ticket", (int64_t)ticket,
                              "no ticket %llu", (unsigned long long)ticket);
        goto out;
    }
    wait_done(d, t, timeout_ms);
    if (t->id != ticket || t->state == DV_T_FREE) {
        s = devio_fail_at(err, DEVIO_E_TICKET_CONSUMED, "ticket", (int64_t)ticket,
                          "ticket %llu was awaited by another caller", (unsigned long long)ticket);
        goto out;
    }
    if (t->state != DV_T_DONE) {
        s = devio_fail_at(err, DEVIO_E_TICKET_PENDING, "ticket", (int64_t)ticket,
                          "ticket %llu has not settled yet", (unsigned long long)ticket);
        goto out;
    }
    devio_row_result *rows = calloc(t->n_rows, sizeof *rows);
    if (!rows) {
        s = devio_fail(err, DEVIO_E_NOMEM, "out of memory for the step result");
        goto out;
    }
    if (t->status != DEVIO_OK) {
        s = t->status;
        if (err)
            *err = t->err;
        rollback_step(d, t);
        free(rows);
    } else {
        for (uint32_t r = 0; r < t->n_rows; r++) {
            const dv_trow *tr = &t->rows[r];
            const dv_seq *q = &d->seqs[tr->seq_index];
            rows[r] = (devio_row_result){.seq = q->id, .len = tr->old_len + tr->n_tokens,
                                         .logits = tr->handle, .sampled = tr->has_sample,
                                         .token = tr->token, .logprob = tr->logprob};
        }
        *out = (devio_step_result){.ticket = t->id, .n_rows = t->n_rows, .rows = rows,
                                   .queued_us = t->t_start - t->t_launch,
                                   .compute_us = t->t_end - t->t_start,
                                   .n_tokens = t->batch.n_tokens};
    }
    for (uint32_t r = 0; r < t->n_rows; r++) {
        d->seqs[t->rows[r].seq_index].busy = 0;
        devio_lora_table_release(&d->lora, t->rows[r].lora_slot, t->rows[r].lora_gen);
    }
    t->state = DV_T_FREE;
    d->in_flight--;
out:
    dv_unlock(d);
    return s;
}

void devio_step_result_free(devio_step_result *r)
{
    if (!r)
        return;
    free(r->rows);
    r->rows = NULL;
    r->n_rows = 0;
}

/* ---- logits and LoRA -------------------------------------------------- */

devio_status devio_logits_read(devio_device *d, uint64_t logits, uint32_t row, uint32_t n,
                               float *dst, uint32_t *n_rows_out, devio_error *err)
{
    devio_status s = DEVIO_OK;
    dv_lock(d);
    dv_drain(d);
    dv_handle *h = d->torn_down ? NULL : dv_handle_find(d, logits);
    if (d->torn_down) {
        s = devio_fail(err, DEVIO_E_TORN_DOWN, "device torn down");
    } else if (!h) {
        s = devio_fail_at(err, DEVIO_E_UNKNOWN_LOGITS, "logits", (int64_t)logits,
                          "no logits handle %llu", (unsigned long long)logits);
    } else if (!h->ready) {
        s = devio_fail(err, DEVIO_E_DEVICE, "logits %llu were not computed (the step failed)",
                       (unsigned long long)logits);
    } else if ((uint64_t)row + n > h->n_rows) {
        s = devio_fail_at(err, DEVIO_E_INVALID, "row", row,
                          "rows [%u, %u) outside the handle's %u rows", row, row + n, h->n_rows);
    } else {
        if (n_rows_out)
            *n_rows_out = h->n_rows;
        for (uint32_t i = 0; i < n && dst; i++)
            memcpy(dst + (size_t)i * d->vocab, dv_handle_row(d, h, row + i),
                   sizeof(float) * d->vocab);
    }
    dv_unlock(d);
    return s;
}

devio_status devio_lora(devio_device *d, const devio_lora_cmd *cmd, devio_lora_ack *ack,
                        devio_error *err)
{
    devio_status s;
    dv_lock(d);
    if (d->torn_down) {
        memset(ack, 0, sizeof *ack);
        s = devio_fail(err, DEVIO_E_TORN_DOWN, "device torn down");
    } else {
        /* Quiescence: every launched step has run before the table changes.
         * A list changes nothing (rows are counted at launch): no wait. */
        if (cmd->kind != DEVIO_LORA_LIST)
            dv_drain(d);
        s = devio_lora_table_apply(&d->lora, cmd, ack, err);
    }
    dv_unlock(d);
    return s;
}

void devio_lora_ack_free(devio_lora_ack *a)
{
    if (!a)
        return;
    free(a->adapters);
    a->adapters = NULL;
    a->n_adapters = 0;
}
