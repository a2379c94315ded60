/* launch.c - devio_launch as reserve (validate a plan, take what it needs and its id, lay out the batch) then commit (submit it).
 * A plan is refused whole before anything changes; a cancelled reservation or a submit the backend refuses is undone exactly. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "device/core/core.h"
#include "device/status.h"

/* Hybrid models: a row's sequence must have its state, and the plan's new
 * state slots (sequences of length 0) and snapshots must be free. */
static devio_status validate_ssm(devio_device *d, const devio_plan *p, devio_error *err)
{
    uint32_t ssm_need = 0, snaps = 0;
    for (uint32_t r = 0; r < p->n_rows; r++) {
        const devio_row *row = &p->rows[r];
        const dv_seq *q = dv_seq_find(d, row->seq);
        if (row->snapshot > DEVIO_SNAP_EACH)
            return devio_fail_at(err, DEVIO_E_INVALID, "row", r, "row %u: bad snapshot mode", r);
        if (!d->hybrid)
            continue;
        if (q->state_lost)
            return devio_fail_at(err, DEVIO_E_DEVICE, "row", r,
                                 "row %u: sequence %llu lost its state in a failed step; "
                                 "truncate it to a snapshot or to 0, or free it",
                                 r, (unsigned long long)row->seq);
        ssm_need += q->ssm_slot < 0;
        snaps += devio_snapshots_of(row->snapshot, row->n_tokens);
    }
    if (ssm_need > d->n_ssm_free)
        return devio_fail_at(err, DEVIO_E_OUT_OF_SSM_SLOTS, "needed", ssm_need,
                             "plan needs %u SSM state slots, %u are free", ssm_need,
                             d->n_ssm_free);
    if (snaps > d->n_snap_free)
        return devio_fail_at(err, DEVIO_E_OUT_OF_SNAPSHOTS, "needed", snaps,
                             "plan needs %u SSM snapshots, %u are free", snaps, d->n_snap_free);
    return DEVIO_OK;
}

/* Prompt logprobs read the logits of positions 0..n-2: a row that does not
 * keep every position's logits takes a handle of its own for them. */
static bool needs_prompt_handle(const devio_row *row)
{
    return row->prompt_logprobs && row->n_tokens > 1 && row->logits != DEVIO_LOGITS_ALL;
}

/* A sampled row's processing and the room its sequence's token record needs. */
static devio_status validate_proc(devio_device *d, const devio_row *row, uint32_t r, dv_seq *q,
                                  size_t *proc_bytes, devio_error *err)
{
    if (row->has_sample && dv_proc_asks(&row->sample)) {
        devio_status s = dv_proc_check(d, &row->sample, err);
        if (s != DEVIO_OK) {
            devio_error_prefix(err, "row %u: ", r);
            if (err) {
                err->detail_val = r;
                snprintf(err->detail_key, sizeof err->detail_key, "row");
            }
            return s;
        }
        *proc_bytes += dv_proc_bytes(&row->sample);
    }
    if (!dv_seq_toks_reserve(d, q, q->len + row->n_tokens))
        return devio_fail_at(err, DEVIO_E_NOMEM, "row", r,
                             "row %u: out of memory for the sequence's token record", r);
    return DEVIO_OK;
}

/* Validate a plan against the device limits and state; changes nothing. */
static devio_status validate_plan(devio_device *d, const devio_plan *p, uint32_t *kv_need,
                                  uint32_t *handles_need, uint32_t *rows_need,
                                  size_t *proc_bytes, devio_error *err)
{
    const devio_config *c = &d->cfg;
    if (!p || p->n_rows == 0 || !p->rows)
        return devio_fail(err, DEVIO_E_INVALID, "plan has no rows");
    if (p->n_rows > c->max_rows)
        return devio_fail_at(err, DEVIO_E_TOO_LARGE, "max_rows", c->max_rows,
                             "plan has %u rows, max_rows is %u", p->n_rows, c->max_rows);
    uint64_t total = 0;
    *kv_need = *handles_need = *rows_need = 0;
    *proc_bytes = 0;
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
        if (q->busy) {
            devio_fail_at(err, DEVIO_E_SEQ_BUSY, "row", r,
                          "row %u: sequence %llu is busy in ticket %llu", r,
                          (unsigned long long)row->seq, (unsigned long long)q->busy);
            if (err)
                err->ticket = q->busy;
            return DEVIO_E_SEQ_BUSY;
        }
        if (q->pins || q->parked)
            return devio_fail_at(err, DEVIO_E_SEQ_BUSY, "row", r,
                                 "row %u: sequence %llu is %s", r, (unsigned long long)row->seq,
                                 q->parked ? "parked; restore it first" : "being exported");
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
        if (row->adapter && devio_adapter_table_find(&d->adapters, row->adapter) < 0)
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
        devio_status ps = validate_proc(d, row, r, q, proc_bytes, err);
        if (ps != DEVIO_OK)
            return ps;
        total += row->n_tokens;
        uint32_t bs = c->block_size;
        /* Entries, held or released: a released entry lies below the
         * window and is never taken again, so only positions past the last
         * entry need new blocks. */
        uint32_t have = q->n_blocks;
        uint32_t want = (q->len + row->n_tokens + bs - 1) / bs;
        *kv_need += want - have;
        /* Writing into a shared partial block copies it first (a partial
         * last block is never released). */
        if (q->len % bs != 0 && dv_seq_block_live(q, have - 1) &&
            devio_kv_pool_is_shared(&d->pool, q->blocks[have - 1]))
            *kv_need += 1;
        if (row->logits != DEVIO_LOGITS_NONE) {
            *handles_need += 1;
            *rows_need += row->logits == DEVIO_LOGITS_ALL ? row->n_tokens : 1;
        }
        if (needs_prompt_handle(row)) {
            *handles_need += 1;
            *rows_need += row->n_tokens - 1;
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
    return validate_ssm(d, p, err);
}

/* Copy-on-write of the partial last block of q, when it is shared. */
static void cow_last_block(devio_device *d, dv_ticket *t, dv_seq *q, dv_trow *tr)
{
    uint32_t bs = d->cfg.block_size;
    if (q->len % bs == 0 || !dv_seq_block_live(q, q->n_blocks - 1) ||
        !devio_kv_pool_is_shared(&d->pool, q->blocks[q->n_blocks - 1]))
        return;
    uint32_t src = q->blocks[q->n_blocks - 1];
    uint32_t dst = devio_kv_pool_take(&d->pool);
    dv_block_unref(d, src);
    q->blocks[q->n_blocks - 1] = dst;
    tr->cow_src = src;
    tr->cow_taken = d->pool.taken[src];
    t->copy_src[t->batch.n_copies] = src;
    t->copy_dst[t->batch.n_copies] = dst;
    t->batch.n_copies++;
}

/* Lay out the tokens of row r: positions, rows, and which want logits
 * (every one for "all", the last for "last" or for a sample). */
static void layout_tokens(dv_ticket *t, uint32_t r, const devio_row *row, const dv_seq *q,
                          dv_handle *h, dv_handle *ph)
{
    devio_batch *b = &t->batch;
    dv_trow *tr = &t->rows[r];
    for (uint32_t i = 0; i < row->n_tokens; i++) {
        uint32_t ti = b->n_tokens + i;
        bool last = i + 1 == row->n_tokens;
        t->tokens[ti] = row->tokens[i];
        t->tok_pos[ti] = q->len + i;
        t->tok_row[ti] = r;
        int64_t logits_row = -1;
        if (h && (row->logits == DEVIO_LOGITS_ALL || last)) {
            uint32_t hr = row->logits == DEVIO_LOGITS_ALL ? i : 0;
            h->pos[hr] = q->len + i;
            logits_row = h->arena_rows[hr];
        } else if (last && row->has_sample) {
            logits_row = t->sample_row0 + r;
        } else if (ph && !last) {
            ph->pos[i] = q->len + i;
            logits_row = ph->arena_rows[i];
        }
        if (logits_row >= 0) {
            t->out_tok[b->n_out] = ti;
            t->out_row[b->n_out++] = (uint32_t)logits_row;
        }
        if (last && row->has_sample) {
            tr->sample = (int32_t)b->n_samples;
            t->samples[b->n_samples++] = (devio_batch_sample){
                .row = r, .logits_row = (uint32_t)logits_row, .params = row->sample, .sample_only = !h,
                /* The sampled token takes the position after the row's last token. */
                .position = (uint64_t)q->len + row->n_tokens};
        }
    }
    b->n_tokens += row->n_tokens;
}

/* The row's state slot (taken when the sequence is empty) and its
 * snapshots, at the lengths they will hold. */
static void commit_ssm(devio_device *d, dv_ticket *t, const devio_row *row, dv_seq *q,
                       dv_trow *tr, devio_batch_row *br)
{
    if (!d->hybrid)
        return;
    if (q->ssm_slot < 0) {
        dv_ssm_slot_take(d, q);
        tr->took_ssm_slot = true;
    }
    br->ssm_slot = q->ssm_slot;
    br->snapshot = row->snapshot;
    tr->n_snaps = devio_snapshots_of(row->snapshot, row->n_tokens);
    int32_t *snaps = t->snap_ids + br->tok_start;
    for (uint32_t i = 0; i < tr->n_snaps; i++) {
        uint32_t len = row->snapshot == DEVIO_SNAP_END ? q->len + row->n_tokens : q->len + i + 1;
        snaps[i] = (int32_t)dv_snap_take(d, q, len);
    }
    br->snap_slots = tr->n_snaps ? snaps : NULL;
}

/* Reserve and lay out one validated row in ticket t; its processing's
 * arrays are copied to *buf (advanced). Cannot fail. */
static void commit_row(devio_device *d, dv_ticket *t, uint32_t r, const devio_row *row,
                       char **buf)
{
    dv_seq *q = dv_seq_find(d, row->seq);
    dv_trow *tr = &t->rows[r];
    *tr = (dv_trow){.seq_index = (uint32_t)(q - d->seqs), .old_len = q->len,
                    .n_tokens = row->n_tokens, .old_blocks = q->n_blocks, .cow_src = -1,
                    .sample = -1, .adapter_entry = -1};
    if (row->adapter) {
        tr->adapter_entry = devio_adapter_table_find(&d->adapters, row->adapter);
        devio_adapter_entry *e = &d->adapters.entries[tr->adapter_entry];
        tr->adapter_gen = e->generation;
        t->batch.lora_targets |= e->weights->targets;
        devio_adapter_table_acquire(&d->adapters, tr->adapter_entry);
    }
    cow_last_block(d, t, q, tr);
    dv_block_rewritten(d, q);
    uint32_t want = (q->len + row->n_tokens + d->cfg.block_size - 1) / d->cfg.block_size;
    while (q->n_blocks < want)
        q->blocks[q->n_blocks++] = devio_kv_pool_take(&d->pool);
    dv_handle *h = NULL;
    if (row->logits != DEVIO_LOGITS_NONE) {
        h = dv_handle_alloc(d, row->logits == DEVIO_LOGITS_ALL ? row->n_tokens : 1);
        h->seq = row->seq;
        h->ticket = t->id;
        h->internal = false;
        tr->handle = h->id;
    }
    dv_handle *ph = NULL;
    if (needs_prompt_handle(row)) {
        ph = dv_handle_alloc(d, row->n_tokens - 1);
        ph->seq = row->seq;
        ph->ticket = t->id;
        ph->internal = true;
        tr->prompt_handle = ph->id;
    }
    tr->prompt = row->prompt_logprobs;
    tr->prompt_rows = ph ? ph->arena_rows : row->logits == DEVIO_LOGITS_ALL && h ? h->arena_rows : NULL;
    tr->proc = row->has_sample && dv_proc_asks(&row->sample);
    /* validate_proc made the room. */
    memcpy(q->toks + q->len, row->tokens, (size_t)row->n_tokens * sizeof *row->tokens);
    t->brows[r] = (devio_batch_row){.pos0 = q->len, .n_tokens = row->n_tokens,
                                    .tok_start = t->batch.n_tokens, .blocks = q->blocks,
                                    .adapter = tr->adapter_entry, .adapter_gen = tr->adapter_gen,
                                    .ssm_slot = -1, .snapshot = DEVIO_SNAP_NONE};
    commit_ssm(d, t, row, q, tr, &t->brows[r]);
    layout_tokens(t, r, row, q, h, ph);
    /* The sample's arrays are the caller's for the call only: the ticket's
     * copies (validate_proc made the room). */
    if (tr->proc)
        dv_proc_copy(&t->samples[tr->sample].params, buf);
    q->len += row->n_tokens;
    q->busy = t->id;
}

void dv_ticket_undo(devio_device *d, dv_ticket *t, bool ran)
{
    for (uint32_t r = t->n_rows; r-- > 0;) {
        dv_trow *tr = &t->rows[r];
        dv_seq *q = &d->seqs[tr->seq_index];
        for (uint32_t i = tr->n_snaps; i-- > 0;)
            dv_snap_put(d, (uint32_t)t->snap_ids[t->brows[r].tok_start + i]);
        if (tr->took_ssm_slot) {
            dv_ssm_slot_put(d, q);
        } else if (ran && q->ssm_slot >= 0) {
            q->state_lost = true; /* the step may have advanced it */
        }
        /* Back to the shared block the sequence held before the launch,
         * unless its other holders let it go meanwhile (freed, truncated or,
         * with a sliding window, released it), whether or not another
         * launch took it again since: then the copy stays. */
        if (tr->cow_src >= 0 && d->pool.refcount[tr->cow_src] > 0 &&
            d->pool.taken[tr->cow_src] == tr->cow_taken) {
            uint32_t copy = q->blocks[tr->old_blocks - 1];
            devio_kv_pool_ref(&d->pool, (uint32_t)tr->cow_src);
            q->blocks[tr->old_blocks - 1] = (uint32_t)tr->cow_src;
            dv_block_unref(d, copy);
        }
        dv_seq_shrink(d, q, tr->old_len);
        dv_handle *h = dv_handle_find(d, tr->handle);
        if (h)
            dv_handle_release(d, h);
        dv_handle *ph = dv_handle_find(d, tr->prompt_handle);
        if (ph)
            dv_handle_release(d, ph);
        q->busy = 0;
        devio_adapter_table_release(&d->adapters, tr->adapter_entry, tr->adapter_gen);
    }
}

/* A free entry of the ticket table (in_flight < max_depth guarantees one) with an empty batch. */
static dv_ticket *ticket_take(devio_device *d)
{
    uint32_t i = 0;
    while (d->tickets[i].state != DV_T_FREE)
        i++;
    dv_ticket *t = &d->tickets[i];
    t->id = d->next_ticket_id;
    t->batch = (devio_batch){.ticket = t->id, .rows = t->brows, .tokens = t->tokens,
                             .tok_pos = t->tok_pos, .tok_row = t->tok_row,
                             .out_tok = t->out_tok, .out_row = t->out_row,
                             .copy_src = t->copy_src, .copy_dst = t->copy_dst,
                             .samples = t->samples};
    t->device_sampled = false;
    return t;
}

/* Hand the laid-out batch to the backend; sampling goes to the device only
 * under fast numerics and when the backend has the optional sample function. */
static devio_status submit(devio_device *d, dv_ticket *t, devio_error *err)
{
    /* A backend samples with the params and step 0b; top logprobs are the
     * host's (run_step), so a batch with a row asking them is sampled there. */
    bool tops = false;
    for (uint32_t r = 0; r < t->n_rows; r++)
        tops = tops || (t->rows[r].sample >= 0 && t->samples[t->rows[r].sample].params.logprobs);
    t->batch.device_sampling = t->batch.n_samples > 0 &&
                               d->cfg.numerics == DEVIO_NUMERICS_FAST && !tops &&
                               devio_backend_has_sample(d->ops);
    for (uint32_t i = 0; i < t->batch.n_samples && t->batch.device_sampling; i++) {
        devio_batch_sample *sm = &t->samples[i];
        const dv_trow *tr = &t->rows[sm->row];
        /* The sequence's token record holds this step's tokens already (reserve). */
        sm->n_history = dv_proc_history(&sm->params, &d->seqs[tr->seq_index], sm->position,
                                        &sm->history);
    }
    devio_status s = devio_backend_submit(d->ops, d->backend, &d->bcfg, &t->batch, err);
    if (s == DEVIO_OK && t->batch.device_sampling) {
        s = devio_backend_sample(d->ops, d->backend, &t->batch, err);
        t->device_sampled = s == DEVIO_OK;
    }
    return s;
}

devio_status devio_launch_reserve(devio_device *d, const devio_plan *plan, uint64_t *ticket,
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
    size_t proc_bytes = 0;
    s = validate_plan(d, plan, &kv_need, &handles_need, &rows_need, &proc_bytes, err);
    if (s != DEVIO_OK)
        goto out;
    char *buf = proc_bytes ? malloc(proc_bytes) : NULL;
    if (proc_bytes && !buf) {
        s = devio_fail(err, DEVIO_E_NOMEM, "out of memory for the plan's sample processing");
        goto out;
    }
    dv_ticket *t = ticket_take(d);
    free(t->proc_buf);
    t->proc_buf = buf;
    t->n_rows = plan->n_rows;
    for (uint32_t r = 0; r < plan->n_rows; r++)
        commit_row(d, t, r, &plan->rows[r], &buf);
    t->batch.n_rows = plan->n_rows;
    /* The id is taken now and never handed out again, committed or not. */
    d->next_ticket_id++;
    t->state = DV_T_RESERVED;
    t->held_seen = false;
    d->n_reserved++;
    d->in_flight++;
    *ticket = t->id;
out:
    dv_unlock(d);
    return s;
}

/* The RESERVED ticket `id`, or NULL. Lock held. */
static dv_ticket *reserved_find(devio_device *d, uint64_t id)
{
    for (uint32_t i = 0; i < d->cfg.max_depth; i++)
        if (d->tickets[i].state == DV_T_RESERVED && d->tickets[i].id == id)
            return &d->tickets[i];
    return NULL;
}

/* t leaves RESERVED: to the queue (submitted) or back to FREE (undone). A
 * drain waiting for reservations to end is told. Lock held. */
static void reserve_end(devio_device *d, dv_ticket *t, bool submitted)
{
    d->n_reserved--;
    if (submitted) {
        t->state = DV_T_SUBMITTED;
        d->queue[(d->q_head + d->q_len) % d->cfg.max_depth] = (uint32_t)(t - d->tickets);
        d->q_len++;
    } else {
        dv_ticket_undo(d, t, false);
        t->state = DV_T_FREE;
        d->in_flight--;
    }
#ifndef DEVIO_NO_THREADS
    if (submitted)
        pthread_cond_signal(&d->cv_work);
    pthread_cond_broadcast(&d->cv_done);
#endif
}

devio_status devio_launch_commit(devio_device *d, uint64_t ticket, devio_error *err)
{
    devio_status s = DEVIO_OK;
    dv_lock(d);
    dv_ticket *t = reserved_find(d, ticket);
    if (!t) {
        s = devio_fail_at(err, DEVIO_E_UNKNOWN_TICKET, "ticket", (int64_t)ticket,
                          "no reserved ticket %llu", (unsigned long long)ticket);
        goto out;
    }
    t->t_launch = devio_clock_us();
    s = submit(d, t, err);
    /* A step the backend refused: nothing of it happened, undo it. */
    reserve_end(d, t, s == DEVIO_OK);
out:
    dv_unlock(d);
    return s;
}

void devio_launch_cancel(devio_device *d, uint64_t ticket)
{
    dv_lock(d);
    dv_ticket *t = reserved_find(d, ticket);
    if (t)
        reserve_end(d, t, false);
    dv_unlock(d);
}

devio_status devio_launch(devio_device *d, const devio_plan *plan, uint64_t *ticket,
                          devio_error *err)
{
    uint64_t id = 0;
    devio_status s = devio_launch_reserve(d, plan, &id, err);
    if (s == DEVIO_OK)
        s = devio_launch_commit(d, id, err);
    if (s == DEVIO_OK)
        *ticket = id;
    return s;
}
