/* step.c - the step runner (backend wait, then host sampling), await, logits reads and adapter commands.
 * It never changes a sequence while a step runs, and a failed step is undone before its ticket ends;
 * a step that succeeded gives back, when awaited, the KV blocks its rows left below the sliding window. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "device/core/core.h"
#include "device/status.h"

/* One sampled row on the host, with its processing and top logprobs. The
 * penalties read the row's sequence's token record, which nothing changes
 * while the sequence is busy in t. */
static devio_status sample_row(devio_device *d, dv_ticket *t, devio_batch_sample *sm,
                               const float *logits)
{
    const dv_trow *tr = &t->rows[sm->row];
    const int32_t *history;
    uint32_t n_history =
        dv_proc_history(&sm->params, &d->seqs[tr->seq_index], sm->position, &history);
    devio_top_logprobs top = {.n = sm->params.logprobs,
                              .ids = t->top_ids + (size_t)sm->row * DEVIO_TOP_LOGPROBS_MAX,
                              .logprobs = t->top_lps + (size_t)sm->row * DEVIO_TOP_LOGPROBS_MAX};
    return devio_sampler_run_ex(d->sampler, logits, &sm->params, history, n_history,
                                sm->position, &sm->token, &sm->logprob, &top);
}

/* The prompt logprobs of t's rows that asked: token i's raw logprob read
 * from the logits of position i - 1 (NaN for the first token, and for a row
 * whose logits are all NaN or -inf there). */
static devio_status prompt_logprobs(devio_device *d, dv_ticket *t)
{
    for (uint32_t r = 0; r < t->n_rows; r++) {
        const dv_trow *tr = &t->rows[r];
        if (!tr->prompt)
            continue;
        uint32_t t0 = t->brows[r].tok_start;
        t->prompt_lps[t0] = NAN;
        for (uint32_t i = 1; i < tr->n_tokens; i++) {
            const float *logits;
            devio_status s = dv_logits_row(d, tr->prompt_rows[i - 1], d->step_buf, &logits,
                                           &t->err);
            if (s != DEVIO_OK)
                return s;
            if (devio_sampler_logprob(d->sampler, logits, t->tokens[t0 + i],
                                      &t->prompt_lps[t0 + i]) != DEVIO_OK)
                t->prompt_lps[t0 + i] = NAN;
        }
    }
    return DEVIO_OK;
}

/* Wait for the step of t, then sample its rows on the host unless the
 * backend sampled them. Runs without the device lock. */
static void run_step(devio_device *d, dv_ticket *t)
{
    memset(&t->err, 0, sizeof t->err);
    t->status = devio_backend_wait(d->ops, d->backend, &t->batch, &t->err);
    if (t->status != DEVIO_OK && t->err.status == DEVIO_OK)
        devio_fail(&t->err, t->status, "backend '%s' failed the step", d->ops->name);
    for (uint32_t i = 0; i < t->batch.n_samples && t->status == DEVIO_OK && !t->device_sampled;
         i++) {
        devio_batch_sample *sm = &t->samples[i];
        const float *logits;
        t->status = dv_logits_row(d, sm->logits_row, d->step_buf, &logits, &t->err);
        if (t->status != DEVIO_OK)
            break;
        if (sample_row(d, t, sm, logits) != DEVIO_OK)
            t->status = devio_fail_at(&t->err, DEVIO_E_DEVICE, "row", sm->row,
                                      "row %u: cannot sample, every logit is NaN or -inf "
                                      "or the logit processing left none",
                                      sm->row);
    }
    if (t->status == DEVIO_OK)
        t->status = prompt_logprobs(d, t);
    t->t_end = devio_clock_us();
}

void dv_run_queue_head(devio_device *d)
{
    dv_ticket *t = &d->tickets[d->queue[d->q_head]];
    /* The device starts a step when it finished the previous one, or at
     * its launch when it was idle then. */
    t->t_start = t->t_launch > d->last_end ? t->t_launch : d->last_end;
    dv_unlock(d);
    run_step(d, t);
    dv_lock(d);
    d->last_end = t->t_end;
    t->state = DV_T_DONE;
    d->q_head = (d->q_head + 1) % d->cfg.max_depth;
    d->q_len--;
    for (uint32_t r = 0; r < t->n_rows; r++) {
        dv_trow *tr = &t->rows[r];
        dv_handle *h = dv_handle_find(d, tr->handle);
        if (h)
            h->ready = true;
        /* The prompt logprobs are read: their handle goes back. */
        dv_handle *ph = dv_handle_find(d, tr->prompt_handle);
        if (ph)
            dv_handle_release(d, ph);
        tr->prompt_handle = 0;
        tr->prompt_rows = NULL;
    }
#ifndef DEVIO_NO_THREADS
    pthread_cond_broadcast(&d->cv_done);
#endif
}

/* Wait until busy(d, arg) is false, running the queue on this thread when
 * no worker runs it. A reserved ticket ends (commit or cancel) on its
 * launcher's thread, which tells cv_done. */
static void wait_while(devio_device *d, bool (*busy)(devio_device *, uint64_t), uint64_t arg)
{
#ifndef DEVIO_NO_THREADS
    while (busy(d, arg)) {
        if (d->worker_started || d->q_len == 0)
            pthread_cond_wait(&d->cv_done, &d->mu);
        else
            dv_run_queue_head(d);
    }
#else
    while (busy(d, arg) && d->q_len > 0)
        dv_run_queue_head(d);
#endif
}

static bool any_step(devio_device *d, uint64_t unused)
{
    (void)unused;
    return d->q_len > 0 || d->n_reserved > 0;
}

static dv_ticket *ticket_find(devio_device *d, uint64_t id);

static bool ticket_running(devio_device *d, uint64_t id)
{
    const dv_ticket *t = ticket_find(d, id);
    return t && (t->state == DV_T_RESERVED || t->state == DV_T_SUBMITTED);
}

void dv_drain(devio_device *d)
{
    wait_while(d, any_step, 0);
}

/* Whether a reserved launch copies from a block of sequence `seq`. */
static bool copies_from(devio_device *d, uint64_t seq)
{
    const dv_seq *q = dv_seq_find(d, seq);
    if (!q || d->n_reserved == 0)
        return false;
    for (uint32_t i = 0; i < d->cfg.max_depth; i++) {
        const dv_ticket *t = &d->tickets[i];
        if (t->state != DV_T_RESERVED)
            continue;
        for (uint32_t r = 0; r < t->n_rows; r++)
            for (uint32_t b = q->n_released; t->rows[r].cow_src >= 0 && b < q->n_blocks; b++)
                if (q->blocks[b] == (uint32_t)t->rows[r].cow_src)
                    return true;
    }
    return false;
}

void dv_wait_copies_from(devio_device *d, uint64_t seq)
{
    wait_while(d, copies_from, seq);
}

void dv_wait_handle(devio_device *d, uint64_t logits)
{
    const dv_handle *h = dv_handle_find(d, logits);
    if (h)
        wait_while(d, ticket_running, h->ticket);
}

/* ---- await ------------------------------------------------------------ */

static dv_ticket *ticket_find(devio_device *d, uint64_t id)
{
    for (uint32_t i = 0; i < d->cfg.max_depth; i++)
        if (d->tickets[i].state != DV_T_FREE && d->tickets[i].id == id)
            return &d->tickets[i];
    return NULL;
}

/* Still waiting for ticket `id` in ticket entry t: not done, or held by another awaiter. */
static bool still_pending(const dv_ticket *t, uint64_t id)
{
    return t->id == id && (t->state == DV_T_SUBMITTED || t->state == DV_T_HELD);
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
    /* No worker: run the queue here; a ticket another caller holds can only
     * be waited for (a build without threads has no other caller). */
    while (still_pending(t, id) && t->state == DV_T_SUBMITTED)
        dv_run_queue_head(d);
#ifndef DEVIO_NO_THREADS
    if (timeout_ms < 0)
        while (still_pending(t, id))
            pthread_cond_wait(&d->cv_done, &d->mu);
#else
    (void)timeout_ms;
#endif
}

/* The settled ticket t as a result, or its failure; changes nothing of the
 * device (await_finish does, when the result is taken). */
static devio_status result_of(devio_device *d, dv_ticket *t, devio_step_result *out,
                              devio_error *err)
{
    if (t->status != DEVIO_OK) {
        if (err)
            *err = t->err;
        return t->status;
    }
    devio_row_result *rows = calloc(t->n_rows, sizeof *rows);
    size_t n_prompt = 0;
    for (uint32_t r = 0; r < t->n_rows; r++)
        n_prompt += t->rows[r].prompt ? t->rows[r].n_tokens : 0;
    float *prompt = n_prompt ? malloc(n_prompt * sizeof *prompt) : NULL;
    if (!rows || (n_prompt && !prompt)) {
        free(rows);
        free(prompt);
        return devio_fail(err, DEVIO_E_NOMEM, "out of memory for the step result");
    }
    size_t at = 0;
    for (uint32_t r = 0; r < t->n_rows; r++) {
        const dv_trow *tr = &t->rows[r];
        const dv_seq *q = &d->seqs[tr->seq_index];
        const devio_batch_sample *sm = tr->sample >= 0 ? &t->samples[tr->sample] : NULL;
        rows[r] = (devio_row_result){.seq = q->id, .len = tr->old_len + tr->n_tokens,
                                     .logits = tr->handle, .sampled = sm != NULL,
                                     .token = sm ? sm->token : 0,
                                     .logprob = sm ? sm->logprob : 0.0f};
        if (tr->prompt) {
            memcpy(prompt + at, t->prompt_lps + t->brows[r].tok_start,
                   tr->n_tokens * sizeof *prompt);
            rows[r].prompt_logprobs = prompt + at;
            rows[r].n_prompt = tr->n_tokens;
            at += tr->n_tokens;
        }
        if (sm && sm->params.logprobs) {
            uint32_t n = sm->params.logprobs;
            rows[r].n_top = n;
            memcpy(rows[r].top_ids, t->top_ids + (size_t)r * DEVIO_TOP_LOGPROBS_MAX,
                   n * sizeof *rows[r].top_ids);
            memcpy(rows[r].top_logprobs, t->top_lps + (size_t)r * DEVIO_TOP_LOGPROBS_MAX,
                   n * sizeof *rows[r].top_logprobs);
        }
    }
    *out = (devio_step_result){.ticket = t->id, .n_rows = t->n_rows, .rows = rows,
                               .prompt_buf = prompt,
                               .queued_us = t->t_start - t->t_launch,
                               .compute_us = t->t_end - t->t_start,
                               .n_tokens = t->batch.n_tokens};
    return DEVIO_OK;
}

/* The result of t was taken: a failed step is undone; a step that succeeded
 * frees its sequences and gives back the KV blocks its rows left below the
 * sliding window (only now, so that the step itself had every key of its own
 * tokens). The ticket entry is free after. */
static void await_finish(devio_device *d, dv_ticket *t)
{
    if (t->status != DEVIO_OK) {
        dv_ticket_undo(d, t, true);
        if (t->status == DEVIO_E_DEVICE)
            dv_emit(d, (devio_event){.kind = DEVIO_EVENT_DEVICE_FAILED, .name = t->err.message});
    } else {
        for (uint32_t r = 0; r < t->n_rows; r++) {
            const dv_trow *tr = &t->rows[r];
            dv_seq *q = &d->seqs[tr->seq_index];
            q->busy = 0;
            devio_adapter_table_release(&d->adapters, tr->adapter_entry, tr->adapter_gen);
            dv_blocks_stored(d, q);
            dv_seq_release_window(d, q);
        }
    }
    t->state = DV_T_FREE;
    d->in_flight--;
}

devio_status devio_await_begin(devio_device *d, uint64_t ticket, int64_t timeout_ms,
                               devio_step_result *out, bool *held, devio_error *err)
{
    devio_status s = DEVIO_OK;
    memset(out, 0, sizeof *out);
    *held = false;
    dv_lock(d);
    if (d->torn_down) {
        s = devio_fail(err, DEVIO_E_TORN_DOWN, "device torn down");
        goto out;
    }
    dv_ticket *t = ticket_find(d, ticket);
    if (!t || t->state == DV_T_RESERVED) {
        /* A reserved ticket was not launched yet (its launch has not answered). */
        if (!t && ticket >= d->cfg.first_ticket_id && ticket < d->next_ticket_id)
            s = devio_fail_at(err, DEVIO_E_TICKET_CONSUMED, "ticket", (int64_t)ticket,
                              "ticket %llu was already awaited", (unsigned long long)ticket);
        else
            s = devio_fail_at(err, DEVIO_E_UNKNOWN_TICKET, "ticket", (int64_t)ticket,
                              "no ticket %llu", (unsigned long long)ticket);
        goto out;
    }
    if (t->state == DV_T_HELD)
        t->held_seen = true;
    wait_done(d, t, timeout_ms);
    if (t->id != ticket || t->state == DV_T_FREE) {
        s = devio_fail_at(err, DEVIO_E_TICKET_CONSUMED, "ticket", (int64_t)ticket,
                          "ticket %llu was awaited by another caller", (unsigned long long)ticket);
        goto out;
    }
    if (t->state != DV_T_DONE) {
        if (t->state == DV_T_HELD)
            t->held_seen = true;
        s = devio_fail_at(err, DEVIO_E_TICKET_PENDING, "ticket", (int64_t)ticket,
                          "ticket %llu has not settled yet", (unsigned long long)ticket);
        goto out;
    }
    s = result_of(d, t, out, err);
    if (s == DEVIO_E_NOMEM && t->status == DEVIO_OK)
        goto out; /* the result could not be built: the ticket stays for a retry */
    t->state = DV_T_HELD;
    *held = true;
out:
    dv_unlock(d);
    return s;
}

/* A settled step's logits handles, released before its answer is dropped. */
static void drop_handles(devio_device *d, const dv_ticket *t)
{
    if (t->status != DEVIO_OK)
        return; /* a failed step's undo releases them */
    for (uint32_t r = 0; r < t->n_rows; r++) {
        dv_handle *h = dv_handle_find(d, t->rows[r].handle);
        if (h)
            dv_handle_release(d, h);
    }
}

void devio_await_end(devio_device *d, uint64_t ticket, devio_await_ending how)
{
    dv_lock(d);
    dv_ticket *t = ticket_find(d, ticket);
    bool tell = false;
    if (t && t->state == DV_T_HELD) {
        tell = t->held_seen;
        t->held_seen = false;
        if (how == DEVIO_AWAIT_DROP)
            drop_handles(d, t);
        if (how == DEVIO_AWAIT_KEEP)
            t->state = DV_T_DONE;
        else
            await_finish(d, t);
#ifndef DEVIO_NO_THREADS
        pthread_cond_broadcast(&d->cv_done);
#endif
    }
    dv_unlock(d);
#ifndef DEVIO_NO_THREADS
    /* Awaits that found it held may be parked: they look again now. */
    if (tell && d->cfg.on_settled && d->worker_started)
        d->cfg.on_settled(d->cfg.on_settled_ctx, ticket);
#else
    (void)tell;
#endif
}

devio_status devio_await(devio_device *d, uint64_t ticket, int64_t timeout_ms,
                         devio_step_result *out, devio_error *err)
{
    bool held = false;
    devio_status s = devio_await_begin(d, ticket, timeout_ms, out, &held, err);
    if (held)
        devio_await_end(d, ticket, DEVIO_AWAIT_CONSUME);
    return s;
}

void devio_step_result_free(devio_step_result *r)
{
    if (!r)
        return;
    free(r->rows);
    free(r->prompt_buf);
    r->rows = NULL;
    r->prompt_buf = NULL;
    r->n_rows = 0;
}

/* ---- logits and adapters ---------------------------------------------- */

devio_status devio_logits_read(devio_device *d, uint64_t logits, uint32_t row, uint32_t n,
                               float *dst, uint32_t *n_rows_out, devio_error *err)
{
    devio_status s = DEVIO_OK;
    dv_lock(d);
    if (!d->torn_down)
        dv_wait_handle(d, logits); /* its own step only: later ones keep running */
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
        for (uint32_t i = 0; i < n && dst && s == DEVIO_OK; i++) {
            float *to = dst + (size_t)i * d->vocab;
            const float *src;
            s = dv_logits_row(d, h->arena_rows[row + i], to, &src, err);
            if (s == DEVIO_OK && src != to)
                memcpy(to, src, sizeof(float) * d->vocab);
        }
    }
    dv_unlock(d);
    return s;
}

static int by_id(const void *a, const void *b)
{
    uint64_t x = ((const devio_logits_info *)a)->logits, y = ((const devio_logits_info *)b)->logits;
    return (x > y) - (x < y);
}

devio_status devio_logits_list(devio_device *d, devio_logits_info *out, uint32_t cap,
                               uint32_t *n, devio_error *err)
{
    devio_status s = DEVIO_OK;
    *n = 0;
    dv_lock(d);
    if (d->torn_down)
        s = devio_fail(err, DEVIO_E_TORN_DOWN, "device torn down");
    for (uint32_t i = 0; s == DEVIO_OK && i < d->cfg.logits_handles; i++) {
        const dv_handle *h = &d->handles[i];
        if (!h->id || h->internal)
            continue;
        if (*n < cap)
            out[*n] = (devio_logits_info){
                .logits = h->id, .seq = h->seq, .ticket = h->ticket, .rows = h->n_rows,
                .pos0 = h->pos[0],
                .state = h->ready                         ? DEVIO_LOGITS_READY
                         : ticket_running(d, h->ticket) ? DEVIO_LOGITS_PENDING
                                                          : DEVIO_LOGITS_FAILED};
        (*n)++;
    }
    dv_unlock(d);
    if (out)
        qsort(out, *n < cap ? *n : cap, sizeof *out, by_id);
    return s;
}

devio_status devio_adapter_command(devio_device *d, const devio_adapter_cmd *cmd, devio_adapter_ack *ack,
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
        if (cmd->kind != DEVIO_ADAPTER_CMD_LIST)
            dv_drain(d);
        s = devio_adapter_table_apply(&d->adapters, cmd, ack, err);
        if (s == DEVIO_OK && ack->evicted[0])
            dv_emit(d, (devio_event){.kind = DEVIO_EVENT_ADAPTER_UNLOADED, .name = ack->evicted});
        if (s == DEVIO_OK && (cmd->kind == DEVIO_ADAPTER_CMD_LOAD ||
                              cmd->kind == DEVIO_ADAPTER_CMD_UNLOAD))
            dv_emit(d, (devio_event){.kind = cmd->kind == DEVIO_ADAPTER_CMD_LOAD
                                                 ? DEVIO_EVENT_ADAPTER_LOADED
                                                 : DEVIO_EVENT_ADAPTER_UNLOADED,
                                     .name = cmd->name});
    }
    dv_unlock(d);
    return s;
}
