/* state_import.c - the import cursor (devio.h): the stream taken in unit by unit, its header
 * checked when whole and everything the sequence needs reserved then, held under the id
 * DV_SEQ_IMPORTING (invisible to everything else) until the checksum is right; any failure
 * gives all of it back. A restore (state_park.c) feeds a parked state back into its own entry
 * the same way. */
#include <stdlib.h>
#include <string.h>

#include "device/core/state_stream.h"
#include "device/status.h"

devio_status devio_import_open(devio_device *d, uint64_t max_bytes, devio_import **out,
                               devio_error *err)
{
    *out = NULL;
    if (!devio_backend_has_state_io(d->ops))
        return devio_fail(err, DEVIO_E_UNSUPPORTED, "backend '%s' cannot write a sequence's state",
                          d->ops->name);
    devio_import *m = calloc(1, sizeof *m);
    if (!m || !(m->snaps = calloc(d->bcfg.ssm_snapshots + 1u, sizeof *m->snaps)) ||
        !st_unit_buffers(d, &m->rows, &m->raw)) {
        devio_import_close(m);
        return devio_fail(err, DEVIO_E_NOMEM, "out of memory for an import");
    }
    m->d = d;
    m->max_bytes = max_bytes;
    m->c = (st_cursor){.kind = U_HEADER};
    devio_sum64_init(&m->sum, 0);
    *out = m;
    return DEVIO_OK;
}

void st_import_drop(devio_import *m)
{
    devio_device *d = m->d;
    dv_seq *q = m->q;
    if (!q)
        return;
    for (uint32_t i = q->n_released; i < q->n_blocks; i++)
        dv_block_unref(d, q->blocks[i]);
    if (q->ssm_slot >= 0)
        dv_ssm_slot_put(d, q);
    for (uint32_t i = 0; i < m->n_snaps; i++)
        dv_snap_put(d, m->snaps[i]);
    if (m->target) { /* a restore: the sequence stays parked, as it was */
        q->n_blocks = q->n_released = 0;
        q->state_lost = false;
    } else {
        free(q->toks);
        *q = (dv_seq){.blocks = q->blocks, .ssm_slot = -1};
    }
    m->q = NULL;
    m->n_snaps = 0;
}

/* Take everything the header asks for (lock held): a table entry, the blocks, the slots. */
static devio_status import_reserve(devio_import *m, devio_error *err)
{
    devio_device *d = m->d;
    const st_plan *p = &m->p;
    dv_seq *q = m->target;
    for (uint32_t i = 0; i < d->cfg.max_seqs && !q; i++)
        if (!d->seqs[i].id)
            q = &d->seqs[i];
    uint32_t blocks = p->end_block - p->first_block;
    if (!q)
        return devio_fail_at(err, DEVIO_E_OUT_OF_SEQS, "max_seqs", d->cfg.max_seqs,
                             "all %u sequence slots are in use", d->cfg.max_seqs);
    if (blocks > d->pool.n_free)
        return devio_fail_at(err, DEVIO_E_OUT_OF_KV_BLOCKS, "needed", blocks,
                             "the state needs %u KV blocks; %u are free", blocks, d->pool.n_free);
    if (p->has_slot && d->n_ssm_free == 0)
        return devio_fail_at(err, DEVIO_E_OUT_OF_SSM_SLOTS, "ssm_slots", d->bcfg.ssm_slots,
                             "all %u SSM state slots are in use", d->bcfg.ssm_slots);
    if (p->n_snaps > d->n_snap_free)
        return devio_fail_at(err, DEVIO_E_OUT_OF_SNAPSHOTS, "needed", p->n_snaps,
                             "the state has %u snapshots; %u snapshot slots are free", p->n_snaps,
                             d->n_snap_free);
    if (!dv_seq_toks_reserve(d, q, p->len))
        return devio_fail(err, DEVIO_E_NOMEM, "out of memory for the token record");
    if (!m->target) {
        q->id = DV_SEQ_IMPORTING;
        q->busy = 0;
        q->pins = 0;
        q->parked = NULL;
        q->hashed = 0;
        q->last_hash = 0;
    }
    q->len = p->len;
    q->n_blocks = p->end_block;
    q->n_released = p->first_block;
    q->state_lost = false;
    q->ssm_slot = -1;
    for (uint32_t i = 0; i < q->n_blocks; i++)
        q->blocks[i] = i < q->n_released ? DEVIO_KV_BLOCK_RELEASED : devio_kv_pool_take(&d->pool);
    m->q = q;
    if (p->has_slot)
        dv_ssm_slot_take(d, q);
    for (; m->n_snaps < p->n_snaps; m->n_snaps++)
        m->snaps[m->n_snaps] = dv_snap_take(d, q, 0);
    return DEVIO_OK;
}

/* Take in the unit gathered in m->rows (lock held, nothing in flight). */
static devio_status import_unit(devio_import *m, devio_error *err)
{
    devio_device *d = m->d;
    const st_cursor *c = &m->c;
    if (c->kind == U_HEADER) {
        devio_status s = st_header_check(d, m->rows, m->max_bytes, &m->h, &m->p, err);
        return s != DEVIO_OK ? s : import_reserve(m, err);
    }
    dv_seq *q = m->q;
    if (c->kind == U_TOKENS) {
        for (uint32_t i = 0; i < m->n / 4u; i++) {
            uint32_t t = st_get32(m->rows + 4u * i);
            if (t >= d->vocab)
                return devio_fail(err, DEVIO_E_INVALID,
                                  "the state's token %u at position %u is outside the "
                                  "vocabulary", t, c->tok + i);
            q->toks[c->tok + i] = (int32_t)t;
        }
        return DEVIO_OK;
    }
    if (c->kind == U_KV) {
        uint32_t r0, r1;
        st_block_rows(&m->p, c->block, &r0, &r1);
        memset(m->raw, 0, (size_t)devio_state_part_bytes(&d->bcfg, d->kv_elem, DEVIO_STATE_K));
        st_rows_move(d, m->raw, m->rows, r0, r1, m->h.kv_elem, false);
        devio_state_ref w = {.part = c->half ? DEVIO_STATE_V : DEVIO_STATE_K, .layer = c->layer,
                             .block = q->blocks[c->block]};
        return devio_backend_state_write(d->ops, d->backend, &d->bcfg, w, m->raw, err);
    }
    if (c->kind == U_SLOT || c->kind == U_SNAP) {
        const uint8_t *at = m->rows;
        devio_ssm_ref r = {.snapshot = false, .index = (uint32_t)q->ssm_slot};
        if (c->kind == U_SNAP) {
            uint32_t len = st_get32(at), prev = c->snap ? d->snap_len[m->snaps[c->snap - 1]] : 0;
            if (len == 0 || len > q->len || len <= prev || st_get32(at + 4) != 0)
                return devio_fail(err, DEVIO_E_INVALID,
                                  "the state's snapshot %u is at length %u (after %u, of %u)",
                                  c->snap, len, prev, q->len);
            r = (devio_ssm_ref){.snapshot = true, .index = m->snaps[c->snap]};
            d->snap_len[r.index] = len;
            at += 8;
        }
        devio_state_ref w = {.part = DEVIO_STATE_SSM, .ssm = r};
        return devio_backend_state_write(d->ops, d->backend, &d->bcfg, w, at, err);
    }
    if (devio_sum64_final(&m->sum) != st_get64(m->rows))
        return devio_fail(err, DEVIO_E_INVALID,
                          "the state's checksum does not match its bytes (altered or cut)");
    return DEVIO_OK;
}

/* Record a failure: everything given back, every later call refused the same way. */
static devio_status import_fail(devio_import *m, devio_status s, const devio_error *err)
{
    m->failed = s;
    if (err)
        m->why = *err;
    else
        devio_fail(&m->why, s, "the import failed");
    if (!m->locked)
        dv_lock(m->d);
    st_import_drop(m);
    if (!m->locked)
        dv_unlock(m->d);
    return s;
}

devio_status devio_import_write(devio_import *m, const void *buf, size_t n, devio_error *err)
{
    return st_import_feed(m, buf, n, err);
}

devio_status st_import_feed(devio_import *m, const void *buf, size_t n, devio_error *err)
{
    devio_error local;
    devio_error *e = err ? err : &local;
    if (m->failed != DEVIO_OK) {
        *e = m->why;
        return m->failed;
    }
    /* The units these bytes complete are taken in under one hold of the lock, with at most one
     * wait for the steps in flight (before the first that writes through the backend): a launch
     * that comes meanwhile waits for the whole piece, rather than every unit for a step. */
    devio_device *d = m->d;
    bool held = false, drained = false;
    devio_status s = DEVIO_OK;
    const uint8_t *in = buf;
    while (n > 0) {
        if (m->c.kind == U_END) {
            s = devio_fail(e, DEVIO_E_INVALID, "bytes past the end of the state (%llu bytes)",
                           (unsigned long long)m->h.total);
            break;
        }
        uint64_t need = st_unit_bytes(&m->p, &m->c);
        size_t k = (size_t)(need - m->n) < n ? (size_t)(need - m->n) : n;
        memcpy(m->rows + m->n, in, k);
        m->n += k;
        in += k;
        n -= k;
        if (m->n < need)
            break;
        if (m->c.kind != U_SUM)
            devio_sum64_update(&m->sum, m->rows, (size_t)need);
        if (!m->locked && !held) {
            dv_lock(d);
            held = true;
        }
        if (d->torn_down) {
            s = devio_fail(e, DEVIO_E_TORN_DOWN, "device torn down");
            break;
        }
        bool backend = m->c.kind != U_HEADER && m->c.kind != U_TOKENS && m->c.kind != U_SUM;
        if (backend && held && !drained) {
            dv_drain(d);
            drained = true;
        }
        s = import_unit(m, e);
        if (s != DEVIO_OK)
            break;
        m->n = 0;
        st_next_unit(&m->p, &m->c);
    }
    if (held)
        dv_unlock(d);
    return s != DEVIO_OK ? import_fail(m, s, e) : DEVIO_OK;
}

devio_status devio_import_finish(devio_import *m, uint64_t *seq, devio_error *err)
{
    if (m->failed != DEVIO_OK) {
        if (err)
            *err = m->why;
        return m->failed;
    }
    if (m->c.kind != U_END) {
        devio_error local;
        devio_error *e = err ? err : &local;
        return import_fail(m, devio_fail(e, DEVIO_E_INVALID, "the state was cut short%s",
                                         m->c.kind == U_HEADER ? " (no whole header)" : ""),
                           e);
    }
    devio_device *d = m->d;
    dv_lock(d);
    m->q->id = dv_new_seq_id(d);
    *seq = m->q->id;
    m->live = true;
    dv_blocks_stored(d, m->q);
    dv_emit_seq(d, DEVIO_EVENT_SEQ_IMPORTED, m->q->id, 0);
    dv_unlock(d);
    return DEVIO_OK;
}

void devio_import_close(devio_import *m)
{
    if (!m)
        return;
    if (m->d && !m->live) {
        dv_lock(m->d);
        st_import_drop(m);
        dv_unlock(m->d);
    }
    free(m->snaps);
    free(m->rows);
    free(m->raw);
    free(m);
}
