/* core.c - the device core's life: open (tables, backend, worker thread), teardown, facts.
 * Backend-neutral bookkeeping: it never computes, and allocates only at open. The configuration
 * is config.c's, launch launch.c's, the step runner and await step.c's, effects effects.c's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "device/core/core.h"
#include "device/backend/shape.h"
#include "device/status.h"

/* ---- open and teardown ------------------------------------------------ */

static void ticket_bufs_free(dv_ticket *t)
{
    free(t->rows);
    free(t->brows);
    free(t->tokens);
    free(t->tok_pos);
    free(t->tok_row);
    free(t->out_tok);
    free(t->out_row);
    free(t->copy_src);
    free(t->copy_dst);
    free(t->samples);
    free(t->snap_ids);
    free(t->proc_buf);
    free(t->top_ids);
    free(t->top_lps);
    free(t->prompt_lps);
}

static void device_free(devio_device *d)
{
    if (!d)
        return;
    /* The adapters leave the backend before the backend goes. */
    devio_adapter_table_fini(&d->adapters);
    devio_backend_destroy(d->ops, d->backend);
    if (d->tickets)
        for (uint32_t i = 0; i < d->cfg.max_depth; i++)
            ticket_bufs_free(&d->tickets[i]);
    if (d->handles)
        for (uint32_t i = 0; i < d->cfg.logits_handles; i++) {
            free(d->handles[i].arena_rows);
            free(d->handles[i].pos);
        }
    free(d->tickets);
    free(d->queue);
    free(d->handles);
    free(d->logits_arena);
    free(d->read_buf);
    free(d->step_buf);
    free(d->row_free);
    for (uint32_t i = 0; d->seqs && i < d->cfg.max_seqs; i++) {
        free(d->seqs[i].toks);
        free(d->seqs[i].parked);
    }
    free(d->seqs);
    free(d->block_hash);
    free(d->block_stored);
    free(d->block_tables);
    free(d->rope_cos);
    free(d->rope_sin);
    dv_ssm_pool_free(d);
    devio_kv_pool_fini(&d->pool);
    devio_sampler_free(d->sampler);
    devio_sampler_free(d->fx_sampler);
    free(d);
}

static void *zalloc(size_t n, size_t size) { return calloc(n > 0 ? n : 1, size); }
#define ALLOC_N(p, n) ((p) = zalloc((size_t)(n), sizeof *(p)))

static bool alloc_ticket(dv_ticket *t, const devio_config *c)
{
    return ALLOC_N(t->rows, c->max_rows) && ALLOC_N(t->brows, c->max_rows) &&
           ALLOC_N(t->tokens, c->max_batch_tokens) && ALLOC_N(t->tok_pos, c->max_batch_tokens) &&
           ALLOC_N(t->tok_row, c->max_batch_tokens) && ALLOC_N(t->out_tok, c->max_batch_tokens) &&
           ALLOC_N(t->out_row, c->max_batch_tokens) && ALLOC_N(t->copy_src, c->max_rows) &&
           ALLOC_N(t->copy_dst, c->max_rows) && ALLOC_N(t->samples, c->max_rows) &&
           ALLOC_N(t->snap_ids, c->max_batch_tokens) &&
           ALLOC_N(t->top_ids, (size_t)c->max_rows * DEVIO_TOP_LOGPROBS_MAX) &&
           ALLOC_N(t->top_lps, (size_t)c->max_rows * DEVIO_TOP_LOGPROBS_MAX) &&
           ALLOC_N(t->prompt_lps, c->max_batch_tokens);
}

static devio_status alloc_tables(devio_device *d)
{
    const devio_config *c = &d->cfg;
    size_t arena = (size_t)c->logits_rows + (size_t)c->max_depth * c->max_rows;
    if (devio_sampler_create(d->vocab, &d->sampler) != DEVIO_OK ||
        devio_sampler_create(d->vocab, &d->fx_sampler) != DEVIO_OK)
        return DEVIO_E_NOMEM;
    if (!ALLOC_N(d->seqs, c->max_seqs) ||
        !ALLOC_N(d->block_tables, (size_t)c->max_seqs * d->max_blocks_per_seq) ||
        !ALLOC_N(d->handles, c->logits_handles) ||
        !ALLOC_N(d->logits_arena, arena * d->vocab) || !ALLOC_N(d->read_buf, d->vocab) ||
        !ALLOC_N(d->step_buf, d->vocab) ||
        !ALLOC_N(d->row_free, c->logits_rows) || !ALLOC_N(d->tickets, c->max_depth) ||
        !ALLOC_N(d->queue, c->max_depth))
        return DEVIO_E_NOMEM;
    for (uint32_t i = 0; i < c->max_seqs; i++) {
        d->seqs[i].blocks = d->block_tables + (size_t)i * d->max_blocks_per_seq;
        d->seqs[i].ssm_slot = -1;
    }
    for (uint32_t i = 0; i < c->logits_handles; i++)
        if (!ALLOC_N(d->handles[i].arena_rows, c->logits_rows) ||
            !ALLOC_N(d->handles[i].pos, c->logits_rows))
            return DEVIO_E_NOMEM;
    for (uint32_t i = 0; i < c->logits_rows; i++)
        d->row_free[i] = c->logits_rows - 1 - i;
    d->n_row_free = c->logits_rows;
    for (uint32_t i = 0; i < c->max_depth; i++) {
        if (!alloc_ticket(&d->tickets[i], c))
            return DEVIO_E_NOMEM;
        d->tickets[i].sample_row0 = c->logits_rows + i * c->max_rows;
    }
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
    s = dv_ssm_pool_open(d, err);
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
        .logits_rows = c->logits_rows + c->max_depth * c->max_rows,
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
    if (devio_adapter_table_init(&d->adapters, c->max_loras, c->max_lora_rank, c->adapters_root,
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
    s = dv_config_check(&d->cfg, model, err);
    if (s != DEVIO_OK)
        goto out_free;
    d->max_blocks_per_seq = (d->cfg.max_seq_len + d->cfg.block_size - 1) / d->cfg.block_size;
    d->next_seq_id = d->cfg.first_seq_id;
    d->next_handle_id = d->cfg.first_logits_id;
    d->next_ticket_id = d->cfg.first_ticket_id;
    if (alloc_tables(d) != DEVIO_OK) {
        s = devio_fail(err, DEVIO_E_NOMEM, "out of memory sizing the device tables");
        goto out_free;
    }
    s = open_backend(d, err);
    if (s == DEVIO_OK && (devio_kv_pool_init(&d->pool, d->cfg.kv_blocks) != DEVIO_OK ||
                          !ALLOC_N(d->block_hash, d->cfg.kv_blocks) ||
                          !ALLOC_N(d->block_stored, d->cfg.kv_blocks)))
        s = devio_fail(err, DEVIO_E_NOMEM, "out of memory for the KV block table");
    if (s != DEVIO_OK)
        goto out_free;
    /* A backend that copies the weights lets the process give the host's back
     * (devio_model_release_weights), after which they cannot be hashed. */
    if (backend->copies_weights && backend->state_read)
        (void)dv_fingerprint(d);
    devio_device_info di = {0};
    devio_backend_info_get(backend, d->backend, &di);
    d->kv_elem = di.kv_elem_bytes ? di.kv_elem_bytes
                 : d->cfg.numerics == DEVIO_NUMERICS_FAST ? 2u : 4u;
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
        .ssm_slots_used = d->bcfg.ssm_slots - d->n_ssm_free,
        .ssm_snapshots_total = d->bcfg.ssm_snapshots,
        .ssm_snapshots_used = d->bcfg.ssm_snapshots - d->n_snap_free,
        .tickets_in_flight = d->in_flight,
        .logits_live = d->n_handles_live,
        .logits_rows_live = d->cfg.logits_rows - d->n_row_free,
        .adapters_loaded = d->adapters.n_loaded,
        .epoch = d->cfg.epoch,
    };
    for (uint32_t i = 0; i < d->cfg.max_seqs; i++)
        f.seqs_live += d->seqs[i].id != 0 && d->seqs[i].id != DV_SEQ_IMPORTING;
    f.seqs_parked = d->n_parked;
    f.parked_bytes = d->parked_bytes;
    dv_unlock(d);
    return f;
}
