/* state_export.c - the export cursor (devio.h): a sequence pinned while its state is read out
 * one unit at a time, under the device lock with no step in flight (dv_drain), as the backend
 * seam asks. */
#include <stdlib.h>
#include <string.h>

#include "device/core/state_stream.h"
#include "device/status.h"

void st_export_begin(devio_export *x, devio_device *d, dv_seq *q, bool snapshots)
{
    x->d = d;
    x->q = q;
    st_header_own(d, &x->h);
    x->h.len = q->len;
    x->h.kv_from = q->n_released * d->cfg.block_size;
    x->h.flags = q->ssm_slot >= 0 ? ST_HAS_SLOT : 0u;
    x->h.n_snaps = snapshots && d->hybrid ? st_owned_snaps(d, q, x->snaps) : 0u;
    x->p = st_plan_of(d, &x->h);
    x->h.total = st_stream_bytes(&x->p);
    x->c = (st_cursor){.kind = U_HEADER};
    x->n = x->off = 0;
    devio_sum64_init(&x->sum, 0);
}

devio_status devio_export_open(devio_device *d, uint64_t seq, bool snapshots, devio_export **out,
                               uint64_t *bytes, devio_error *err)
{
    *out = NULL;
    devio_export *x = calloc(1, sizeof *x);
    if (!x || !(x->snaps = calloc(d->bcfg.ssm_snapshots + 1u, sizeof *x->snaps)) ||
        !st_unit_buffers(d, &x->rows, &x->raw)) {
        devio_export_close(x);
        return devio_fail(err, DEVIO_E_NOMEM, "out of memory for an export");
    }
    devio_status s = DEVIO_OK;
    dv_lock(d);
    dv_seq *q = d->torn_down ? NULL : dv_seq_find(d, seq);
    if (d->torn_down)
        s = devio_fail(err, DEVIO_E_TORN_DOWN, "device torn down");
    else if (!devio_backend_has_state_io(d->ops))
        s = devio_fail(err, DEVIO_E_UNSUPPORTED, "backend '%s' cannot read a sequence's state",
                       d->ops->name);
    else if (!q)
        s = devio_fail_at(err, DEVIO_E_UNKNOWN_SEQ, "seq", (int64_t)seq, "no sequence %llu",
                          (unsigned long long)seq);
    else if (q->busy) {
        s = devio_fail_at(err, DEVIO_E_SEQ_BUSY, "ticket", (int64_t)q->busy,
                          "sequence %llu is busy in ticket %llu", (unsigned long long)seq,
                          (unsigned long long)q->busy);
        if (err)
            err->ticket = q->busy;
    } else if (q->parked)
        s = devio_fail_at(err, DEVIO_E_SEQ_BUSY, "seq", (int64_t)seq,
                          "sequence %llu is parked; restore it first", (unsigned long long)seq);
    else if (q->state_lost)
        s = devio_fail_at(err, DEVIO_E_DEVICE, "seq", (int64_t)seq,
                          "sequence %llu lost its state in a failed step", (unsigned long long)seq);
    if (s == DEVIO_OK) {
        st_export_begin(x, d, q, snapshots);
        q->pins++;
    }
    dv_unlock(d);
    if (s != DEVIO_OK) {
        devio_export_close(x);
        return s;
    }
    *bytes = x->h.total;
    *out = x;
    return DEVIO_OK;
}

devio_status st_export_unit(devio_export *x, devio_error *err)
{
    devio_device *d = x->d;
    const dv_seq *q = x->q;
    const st_cursor *c = &x->c;
    devio_status s = DEVIO_OK;
    x->n = st_unit_bytes(&x->p, c);
    if (c->kind == U_HEADER) {
        st_header_encode(&x->h, x->rows);
    } else if (c->kind == U_TOKENS) {
        for (uint32_t i = 0; i < x->n / 4u; i++)
            st_put32(x->rows + 4u * i, (uint32_t)q->toks[c->tok + i]);
    } else if (c->kind == U_KV) {
        devio_state_ref w = {.part = c->half ? DEVIO_STATE_V : DEVIO_STATE_K, .layer = c->layer,
                             .block = q->blocks[c->block]};
        uint32_t r0, r1;
        st_block_rows(&x->p, c->block, &r0, &r1);
        s = devio_backend_state_read(d->ops, d->backend, &d->bcfg, w, x->raw, err);
        st_rows_move(d, x->raw, x->rows, r0, r1, x->h.kv_elem, true);
    } else if (c->kind == U_SLOT || c->kind == U_SNAP) {
        uint8_t *at = x->rows;
        devio_ssm_ref r = {.snapshot = false, .index = (uint32_t)q->ssm_slot};
        if (c->kind == U_SNAP) {
            r = (devio_ssm_ref){.snapshot = true, .index = x->snaps[c->snap]};
            st_put32(at, d->snap_len[r.index]);
            st_put32(at + 4, 0);
            at += 8;
        }
        devio_state_ref w = {.part = DEVIO_STATE_SSM, .ssm = r};
        s = devio_backend_state_read(d->ops, d->backend, &d->bcfg, w, at, err);
    } else if (c->kind == U_SUM) {
        st_put64(x->rows, devio_sum64_final(&x->sum));
        return DEVIO_OK;
    }
    if (s == DEVIO_OK)
        devio_sum64_update(&x->sum, x->rows, (size_t)x->n);
    return s;
}

devio_status devio_export_read(devio_export *x, void *buf, size_t cap, size_t *n,
                               devio_error *err)
{
    *n = 0;
    while (*n < cap) {
        if (x->off == x->n) {
            if (x->c.kind == U_END)
                break;
            devio_device *d = x->d;
            dv_lock(d);
            devio_status s = d->torn_down ? devio_fail(err, DEVIO_E_TORN_DOWN, "device torn down")
                                          : DEVIO_OK;
            if (s == DEVIO_OK) {
                dv_drain(d);
                s = st_export_unit(x, err);
                if (s == DEVIO_OK && x->c.kind == U_SUM)
                    dv_emit_seq(d, DEVIO_EVENT_SEQ_EXPORTED, x->q->id, 0);
            }
            dv_unlock(d);
            if (s != DEVIO_OK)
                return s;
            x->off = 0;
            st_next_unit(&x->p, &x->c);
        }
        size_t k = (size_t)(x->n - x->off) < cap - *n ? (size_t)(x->n - x->off) : cap - *n;
        memcpy((uint8_t *)buf + *n, x->rows + x->off, k);
        x->off += k;
        *n += k;
    }
    return DEVIO_OK;
}

void devio_export_close(devio_export *x)
{
    if (!x)
        return;
    if (x->q) {
        dv_lock(x->d);
        x->q->pins--;
        dv_unlock(x->d);
    }
    free(x->snaps);
    free(x->rows);
    free(x->raw);
    free(x);
}
