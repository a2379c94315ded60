/* effects.c - apply: sample, fork, truncate, snapshot, free, release.
 * Each effect runs after every launched step and either fully happens or changes nothing. */
#include <stdlib.h>
#include <string.h>

#include "device/core/core.h"
#include "device/status.h"

/* The sequence an effect names, if it may be changed now: not in a ticket, not being
 * exported, and not parked unless `parked_ok` (free and restore). */
static devio_status idle_seq_of(devio_device *d, uint64_t id, bool parked_ok, dv_seq **out,
                                devio_error *err)
{
    dv_seq *q = dv_seq_find(d, id);
    if (!q)
        return devio_fail_at(err, DEVIO_E_UNKNOWN_SEQ, "seq", (int64_t)id, "no sequence %llu",
                             (unsigned long long)id);
    if (q->busy)
        return devio_fail_at(err, DEVIO_E_SEQ_BUSY, "ticket", (int64_t)q->busy,
                             "sequence %llu is busy in ticket %llu", (unsigned long long)id,
                             (unsigned long long)q->busy);
    if (q->pins)
        return devio_fail_at(err, DEVIO_E_SEQ_BUSY, "seq", (int64_t)id,
                             "sequence %llu is being exported", (unsigned long long)id);
    if (q->parked && !parked_ok)
        return devio_fail_at(err, DEVIO_E_SEQ_BUSY, "seq", (int64_t)id,
                             "sequence %llu is parked; restore it first", (unsigned long long)id);
    *out = q;
    return DEVIO_OK;
}

static devio_status idle_seq(devio_device *d, uint64_t id, dv_seq **out, devio_error *err)
{
    return idle_seq_of(d, id, false, out, err);
}

static devio_status apply_sample(devio_device *d, const devio_effect *e, devio_outcome *o,
                                 devio_error *err)
{
    dv_handle *h = dv_handle_find(d, e->logits);
    if (!h)
        return devio_fail_at(err, DEVIO_E_UNKNOWN_LOGITS, "logits", (int64_t)e->logits,
                             "no logits handle %llu", (unsigned long long)e->logits);
    if (!h->ready)
        return devio_fail(err, DEVIO_E_DEVICE, "logits %llu were not computed (the step failed)",
                          (unsigned long long)e->logits);
    if (e->has_row && e->row >= h->n_rows)
        return devio_fail_at(err, DEVIO_E_INVALID, "row", e->row,
                             "row %u outside the handle's %u rows", e->row, h->n_rows);
    devio_status s = devio_sampler_check(&e->params, err);
    if (s == DEVIO_OK)
        s = dv_proc_check(d, &e->params, err);
    if (s != DEVIO_OK)
        return s;
    uint32_t first = e->has_row ? e->row : 0;
    uint32_t n = e->has_row ? 1 : h->n_rows;
    /* The penalties count the handle's sequence's tokens before each position. */
    const bool penalised = devio_sample_penalised(&e->params);
    const dv_seq *q = penalised ? dv_seq_find(d, h->seq) : NULL;
    if (penalised && (!q || q->len <= h->pos[first + n - 1]))
        return devio_fail_at(err, DEVIO_E_INVALID, "logits", (int64_t)e->logits,
                             "penalties need the tokens of the handle's sequence %llu, which no "
                             "longer holds the handle's positions", (unsigned long long)h->seq);
    uint32_t n_top = e->params.logprobs;
    o->tokens = malloc(n * sizeof *o->tokens);
    o->logprobs = malloc(n * sizeof *o->logprobs);
    if (n_top) {
        o->top_ids = malloc((size_t)n * n_top * sizeof *o->top_ids);
        o->top_logprobs = malloc((size_t)n * n_top * sizeof *o->top_logprobs);
    }
    if (!o->tokens || !o->logprobs || (n_top && (!o->top_ids || !o->top_logprobs))) {
        devio_outcome_free(o);
        return devio_fail(err, DEVIO_E_NOMEM, "out of memory sampling");
    }
    for (uint32_t i = 0; i < n; i++) {
        uint32_t r = first + i;
        const float *logits;
        s = dv_logits_row(d, h->arena_rows[r], d->read_buf, &logits, err);
        if (s != DEVIO_OK) {
            devio_outcome_free(o);
            return s;
        }
        /* The sampled token would follow the token whose logits these are. */
        uint64_t at = (uint64_t)h->pos[r] + 1;
        const int32_t *history;
        uint32_t n_history = dv_proc_history(&e->params, q, at, &history);
        devio_top_logprobs top = {.n = n_top,
                                  .ids = n_top ? o->top_ids + (size_t)i * n_top : NULL,
                                  .logprobs = n_top ? o->top_logprobs + (size_t)i * n_top : NULL};
        s = devio_sampler_run_ex(d->fx_sampler, logits, &e->params, history, n_history, at,
                                 &o->tokens[i], &o->logprobs[i], &top);
        if (s != DEVIO_OK) {
            devio_outcome_free(o);
            return devio_fail(err, s, "cannot sample position %u: every logit is NaN or -inf "
                                      "or the logit processing left none", r);
        }
    }
    o->n_tokens = n;
    o->n_top = n_top;
    return DEVIO_OK;
}

/* Copy one state slot or snapshot to another through the backend. */
static devio_status ssm_copy(devio_device *d, bool dst_snap, uint32_t dst, bool src_snap,
                             uint32_t src, devio_error *err)
{
    return devio_backend_ssm_copy(d->ops, d->backend, &d->bcfg,
                                  (devio_ssm_ref){.snapshot = dst_snap, .index = dst},
                                  (devio_ssm_ref){.snapshot = src_snap, .index = src}, err);
}

/* A hybrid sequence whose state a failed step lost refuses what reads it. */
static devio_status state_ok(const dv_seq *q, devio_error *err)
{
    if (!q->state_lost)
        return DEVIO_OK;
    return devio_fail_at(err, DEVIO_E_DEVICE, "seq", (int64_t)q->id,
                         "sequence %llu lost its state in a failed step; truncate it to a "
                         "snapshot or to 0, or free it",
                         (unsigned long long)q->id);
}

static devio_status apply_fork(devio_device *d, const devio_effect *e, devio_outcome *o,
                               devio_error *err)
{
    dv_seq *p;
    devio_status s = idle_seq(d, e->seq, &p, err);
    if (s != DEVIO_OK || (s = state_ok(p, err)) != DEVIO_OK)
        return s;
    dv_seq *c = NULL;
    for (uint32_t i = 0; i < d->cfg.max_seqs && !c; i++)
        if (!d->seqs[i].id)
            c = &d->seqs[i];
    if (!c)
        return devio_fail_at(err, DEVIO_E_OUT_OF_SEQS, "max_seqs", d->cfg.max_seqs,
                             "all %u sequence slots are in use", d->cfg.max_seqs);
    if (!dv_seq_toks_reserve(d, c, p->len))
        return devio_fail(err, DEVIO_E_NOMEM, "out of memory for the child's token record");
    c->ssm_slot = -1;
    c->state_lost = false;
    if (p->ssm_slot >= 0) {
        /* The child gets a copy of the parent's state, and no snapshots. */
        if (d->n_ssm_free == 0)
            return devio_fail_at(err, DEVIO_E_OUT_OF_SSM_SLOTS, "ssm_slots", d->bcfg.ssm_slots,
                                 "all %u SSM state slots are in use", d->bcfg.ssm_slots);
        uint32_t ssm_slot = d->ssm_free[d->n_ssm_free - 1];
        if ((s = ssm_copy(d, false, ssm_slot, false, (uint32_t)p->ssm_slot, err)) != DEVIO_OK)
            return s;
        dv_ssm_slot_take(d, c);
    }
    c->id = dv_new_seq_id(d);
    c->len = p->len;
    if (p->len)
        memcpy(c->toks, p->toks, (size_t)p->len * sizeof *c->toks);
    c->busy = 0;
    c->pins = 0;
    c->hashed = p->hashed;
    c->last_hash = p->last_hash;
    c->parked = NULL;
    c->parked_bytes = 0;
    c->n_blocks = p->n_blocks;
    /* The child shares the blocks the parent holds and inherits its
     * released entries (below the window: neither will read them). */
    c->n_released = p->n_released;
    for (uint32_t i = 0; i < p->n_blocks; i++) {
        c->blocks[i] = p->blocks[i];
        if (dv_seq_block_live(p, i))
            devio_kv_pool_ref(&d->pool, p->blocks[i]);
    }
    o->seq = c->id;
    o->shared_blocks = dv_seq_blocks_held(p);
    dv_emit_seq(d, DEVIO_EVENT_SEQ_CREATED, c->id, p->id);
    return DEVIO_OK;
}

/* Sliding window: truncating to len is refused when the token at position
 * len would read a key whose block q released (positions [0, R), R =
 * n_released * block_size): every len > 0 with len + 1 - window < R. Length 0
 * reads no key and keeps no entry, so it is always allowed; the earliest
 * other length is R + window - 1. */
static devio_status window_ok(const devio_device *d, const dv_seq *q, uint32_t len,
                              devio_error *err)
{
    uint64_t released = (uint64_t)q->n_released * d->cfg.block_size;
    if (len == 0 || released == 0 || dv_window_first_key(d, len) >= released)
        return DEVIO_OK;
    uint64_t earliest = released + d->shape.window - 1;
    return devio_fail_at(err, DEVIO_E_INVALID, "len", (int64_t)earliest,
                         "cannot truncate sequence %llu to %u: its KV positions 0..%llu were "
                         "released below the sliding window of %u, and the token at %u reads "
                         "keys from %u; truncate to 0 or to at least %llu",
                         (unsigned long long)q->id, len, (unsigned long long)(released - 1),
                         d->shape.window, len, dv_window_first_key(d, len),
                         (unsigned long long)earliest);
}

static devio_status apply_truncate(devio_device *d, const devio_effect *e, devio_outcome *o,
                                   devio_error *err)
{
    dv_seq *q;
    devio_status s = idle_seq(d, e->seq, &q, err);
    if (s != DEVIO_OK)
        return s;
    if (e->len > q->len)
        return devio_fail_at(err, DEVIO_E_INVALID, "len", q->len,
                             "cannot truncate sequence %llu of length %u to %u",
                             (unsigned long long)e->seq, q->len, e->len);
    if ((s = window_ok(d, q, e->len, err)) != DEVIO_OK)
        return s;
    if (d->hybrid && e->len == 0) {
        /* The state at length 0 is zeros: nothing to restore. */
        o->freed_snapshots = dv_ssm_release(d, q);
    } else if (d->hybrid && (e->len < q->len || q->state_lost)) {
        /* Back to a snapshot; at the current length too when a failed step
         * lost the state. */
        int32_t snap = dv_snap_find(d, q, e->len);
        if (snap < 0)
            return devio_fail_at(err, DEVIO_E_NO_SNAPSHOT, "len", e->len,
                                 "sequence %llu has no SSM snapshot at length %u",
                                 (unsigned long long)e->seq, e->len);
        if ((s = ssm_copy(d, false, (uint32_t)q->ssm_slot, true, (uint32_t)snap, err)) != DEVIO_OK)
            return s;
        q->state_lost = false;
        o->freed_snapshots = dv_snap_drop_after(d, q, e->len);
    }
    o->freed_blocks = dv_seq_shrink(d, q, e->len);
    dv_hashes_truncated(d, q);
    o->len = e->len;
    return DEVIO_OK;
}

static devio_status apply_snapshot(devio_device *d, const devio_effect *e, devio_outcome *o,
                                   devio_error *err)
{
    dv_seq *q;
    devio_status s = idle_seq(d, e->seq, &q, err);
    if (s != DEVIO_OK)
        return s;
    /* Attention-only models: the KV cache is the whole state and truncate
     * needs no snapshot, so a snapshot holds nothing and uses no slot. So
     * does one at length 0 (the state there is zeros), or at a length that
     * has one already (the state has not moved since). */
    o->len = q->len;
    if (!d->hybrid || q->len == 0 || dv_snap_find(d, q, q->len) >= 0)
        return DEVIO_OK;
    if ((s = state_ok(q, err)) != DEVIO_OK)
        return s;
    if (d->n_snap_free == 0)
        return devio_fail_at(err, DEVIO_E_OUT_OF_SNAPSHOTS, "ssm_snapshots",
                             d->bcfg.ssm_snapshots, "all %u SSM snapshots are in use",
                             d->bcfg.ssm_snapshots);
    uint32_t snap = d->snap_free[d->n_snap_free - 1];
    if ((s = ssm_copy(d, true, snap, false, (uint32_t)q->ssm_slot, err)) != DEVIO_OK)
        return s;
    dv_snap_take(d, q, q->len);
    return DEVIO_OK;
}

static devio_status apply_free(devio_device *d, const devio_effect *e, devio_outcome *o,
                               devio_error *err)
{
    dv_seq *q;
    devio_status s = idle_seq_of(d, e->seq, true, &q, err);
    if (s != DEVIO_OK)
        return s;
    o->parked_bytes = q->parked_bytes;
    dv_seq_unpark(d, q);
    o->freed_blocks = dv_seq_shrink(d, q, 0);
    o->freed_snapshots = dv_ssm_release(d, q);
    /* Its logits handles go with it: every one of them is settled (q is idle). */
    for (uint32_t i = 0; i < d->cfg.logits_handles; i++)
        if (d->handles[i].id && d->handles[i].seq == q->id) {
            dv_handle_release(d, &d->handles[i]);
            o->freed_logits++;
        }
    dv_emit_seq(d, DEVIO_EVENT_SEQ_FREED, q->id, 0);
    q->id = 0;
    free(q->toks);
    q->toks = NULL;
    q->toks_cap = 0;
    return DEVIO_OK;
}

/* release {logits}: the handle; release {seq}: every snapshot of it. */
static devio_status apply_release(devio_device *d, const devio_effect *e, devio_outcome *o,
                                  devio_error *err)
{
    if ((e->seq != 0) == (e->logits != 0))
        return devio_fail(err, DEVIO_E_INVALID, "release names a logits handle or a sequence");
    if (e->seq != 0) {
        dv_seq *q;
        devio_status s = idle_seq(d, e->seq, &q, err);
        if (s == DEVIO_OK && d->hybrid)
            o->freed_snapshots = dv_snap_drop_after(d, q, 0); /* none is at length 0 */
        return s;
    }
    dv_handle *h = dv_handle_find(d, e->logits);
    if (!h)
        return devio_fail_at(err, DEVIO_E_UNKNOWN_LOGITS, "logits", (int64_t)e->logits,
                             "no logits handle %llu", (unsigned long long)e->logits);
    dv_handle_release(d, h);
    return DEVIO_OK;
}

/* park and restore (state_park.c): the sequence's state to host memory and back. */
static devio_status apply_park(devio_device *d, const devio_effect *e, devio_outcome *o,
                               devio_error *err)
{
    dv_seq *q;
    devio_status s = idle_seq_of(d, e->seq, e->kind == DEVIO_EFFECT_RESTORE, &q, err);
    if (s != DEVIO_OK)
        return s;
    return e->kind == DEVIO_EFFECT_PARK ? dv_seq_park(d, q, o, err) : dv_seq_restore(d, q, o, err);
}

/* What an effect waits for, and no more, so that steps of other sequences
 * keep running: the step that fills the logits handle it reads or releases;
 * for a free or a truncate (its sequence is idle, or it is refused busy),
 * the launches being reserved whose plans copy from one of its blocks (a
 * copy-on-write of a block it shares, which it could give back or write
 * over before the copy runs); and on hybrid models every launched step
 * before an effect that may copy SSM state (a backend copies state only
 * with no batch in flight). A fork or a snapshot of an attention model
 * gives nothing back and waits for nothing. */
static void effect_wait(devio_device *d, const devio_effect *e)
{
    if (e->logits)
        dv_wait_handle(d, e->logits);
    else if ((d->hybrid && (e->kind == DEVIO_EFFECT_FORK || e->kind == DEVIO_EFFECT_TRUNCATE ||
                            e->kind == DEVIO_EFFECT_SNAPSHOT)) ||
             e->kind == DEVIO_EFFECT_PARK || e->kind == DEVIO_EFFECT_RESTORE)
        dv_drain(d); /* a backend copies state only with no batch in flight */
    else if (e->kind == DEVIO_EFFECT_FREE || e->kind == DEVIO_EFFECT_TRUNCATE)
        dv_wait_copies_from(d, e->seq);
}

devio_status devio_apply(devio_device *d, const devio_effect *e, devio_outcome *out,
                         devio_error *err)
{
    memset(out, 0, sizeof *out);
    out->kind = e->kind;
    devio_status s;
    dv_lock(d);
    if (d->torn_down) {
        s = devio_fail(err, DEVIO_E_TORN_DOWN, "device torn down");
        goto out;
    }
    effect_wait(d, e);
    switch (e->kind) {
    case DEVIO_EFFECT_SAMPLE: s = apply_sample(d, e, out, err); break;
    case DEVIO_EFFECT_FORK: s = apply_fork(d, e, out, err); break;
    case DEVIO_EFFECT_TRUNCATE: s = apply_truncate(d, e, out, err); break;
    case DEVIO_EFFECT_SNAPSHOT: s = apply_snapshot(d, e, out, err); break;
    case DEVIO_EFFECT_FREE: s = apply_free(d, e, out, err); break;
    case DEVIO_EFFECT_RELEASE: s = apply_release(d, e, out, err); break;
    case DEVIO_EFFECT_PARK:
    case DEVIO_EFFECT_RESTORE: s = apply_park(d, e, out, err); break;
    default: s = devio_fail(err, DEVIO_E_INVALID, "unknown effect kind %d", (int)e->kind); break;
    }
out:
    dv_unlock(d);
    return s;
}

void devio_outcome_free(devio_outcome *o)
{
    if (!o)
        return;
    free(o->tokens);
    free(o->logprobs);
    free(o->top_ids);
    free(o->top_logprobs);
    o->tokens = NULL;
    o->logprobs = NULL;
    o->top_ids = NULL;
    o->top_logprobs = NULL;
    o->n_tokens = 0;
    o->n_top = 0;
}
