/* state_park.c - the park and restore effects (docs/state.md, "Parked sequences"). Park writes a
 * sequence's whole state stream, snapshots included, into host memory and gives back its
 * blocks, state slot and snapshots; the sequence keeps its id, length, token record and
 * logits handles, and refuses steps and every other effect but free and restore until it is
 * restored. Restore feeds the stream back into the sequence's own entry as an import would:
 * everything reserved at its header, all of it given back on a failure, the sequence then still
 * parked. Both run inside devio_apply: lock held, nothing in flight. */
#include <stdlib.h>
#include <string.h>

#include "device/core/state_stream.h"
#include "device/status.h"

static uint64_t park_limit(const devio_device *d)
{
    return (uint64_t)(d->cfg.park_memory_mib ? d->cfg.park_memory_mib : 1024u) << 20;
}

/* q's whole state, snapshots included, into a fresh buffer *out of *n bytes. */
static devio_status park_stream(devio_device *d, dv_seq *q, uint8_t **out, uint64_t *n,
                                devio_error *err)
{
    devio_export x = {0};
    *out = NULL;
    devio_status s = DEVIO_OK;
    if (!(x.snaps = calloc(d->bcfg.ssm_snapshots + 1u, sizeof *x.snaps)) ||
        !st_unit_buffers(d, &x.rows, &x.raw))
        s = devio_fail(err, DEVIO_E_NOMEM, "out of memory parking sequence %llu",
                       (unsigned long long)q->id);
    uint8_t *buf = NULL;
    if (s == DEVIO_OK) {
        st_export_begin(&x, d, q, true);
        uint64_t used = d->parked_bytes, limit = park_limit(d);
        if (x.h.total > limit - (used < limit ? used : limit))
            s = devio_fail_at(err, DEVIO_E_TOO_LARGE, "needed", (int64_t)x.h.total,
                              "parking sequence %llu takes %llu bytes; %llu of the %llu bytes "
                              "of --park-memory are in use",
                              (unsigned long long)q->id, (unsigned long long)x.h.total,
                              (unsigned long long)used, (unsigned long long)limit);
        else if (!(buf = malloc((size_t)x.h.total)))
            s = devio_fail(err, DEVIO_E_NOMEM, "out of memory for %llu bytes of parked state",
                           (unsigned long long)x.h.total);
    }
    for (uint64_t at = 0; s == DEVIO_OK && x.c.kind != U_END; at += x.n) {
        s = st_export_unit(&x, err);
        if (s == DEVIO_OK)
            memcpy(buf + at, x.rows, (size_t)x.n);
        st_next_unit(&x.p, &x.c);
    }
    free(x.snaps);
    free(x.rows);
    free(x.raw);
    if (s != DEVIO_OK) {
        free(buf);
        return s;
    }
    *out = buf;
    *n = x.h.total;
    return DEVIO_OK;
}

devio_status dv_seq_park(devio_device *d, dv_seq *q, devio_outcome *o, devio_error *err)
{
    if (q->parked)
        return devio_fail_at(err, DEVIO_E_INVALID, "seq", (int64_t)q->id,
                             "sequence %llu is parked already", (unsigned long long)q->id);
    if (q->state_lost)
        return devio_fail_at(err, DEVIO_E_DEVICE, "seq", (int64_t)q->id,
                             "sequence %llu lost its state in a failed step",
                             (unsigned long long)q->id);
    if (!devio_backend_has_state_io(d->ops))
        return devio_fail(err, DEVIO_E_UNSUPPORTED, "backend '%s' cannot read a sequence's state",
                          d->ops->name);
    uint8_t *buf;
    uint64_t n;
    devio_status s = park_stream(d, q, &buf, &n, err);
    if (s != DEVIO_OK)
        return s;
    uint32_t len = q->len;
    o->freed_blocks = dv_seq_shrink(d, q, 0); /* a block a fork holds stays with it */
    o->freed_snapshots = dv_ssm_release(d, q);
    q->len = len;
    q->n_released = 0;
    q->parked = buf;
    q->parked_bytes = n;
    d->parked_bytes += n;
    d->n_parked++;
    o->parked_bytes = n;
    dv_emit_seq(d, DEVIO_EVENT_SEQ_PARKED, q->id, 0);
    return DEVIO_OK;
}

devio_status dv_seq_restore(devio_device *d, dv_seq *q, devio_outcome *o, devio_error *err)
{
    if (!q->parked)
        return devio_fail_at(err, DEVIO_E_INVALID, "seq", (int64_t)q->id,
                             "sequence %llu is not parked", (unsigned long long)q->id);
    devio_import m = {.d = d, .target = q, .locked = true, .c = {.kind = U_HEADER}};
    devio_status s = DEVIO_OK;
    if (!(m.snaps = calloc(d->bcfg.ssm_snapshots + 1u, sizeof *m.snaps)) ||
        !st_unit_buffers(d, &m.rows, &m.raw))
        s = devio_fail(err, DEVIO_E_NOMEM, "out of memory restoring sequence %llu",
                       (unsigned long long)q->id);
    devio_sum64_init(&m.sum, 0);
    if (s == DEVIO_OK)
        s = st_import_feed(&m, q->parked, (size_t)q->parked_bytes, err);
    if (s == DEVIO_OK && m.c.kind != U_END) { /* cannot be: the stream is the park's own */
        s = devio_fail(err, DEVIO_E_DEVICE, "sequence %llu's parked state is short",
                       (unsigned long long)q->id);
        st_import_drop(&m);
    }
    free(m.snaps);
    free(m.rows);
    free(m.raw);
    if (s != DEVIO_OK)
        return s;
    o->parked_bytes = q->parked_bytes;
    dv_seq_unpark(d, q);
    q->hashed = 0; /* its blocks are new: each full one stored again */
    q->last_hash = 0;
    dv_blocks_stored(d, q);
    dv_emit_seq(d, DEVIO_EVENT_SEQ_RESTORED, q->id, 0);
    return DEVIO_OK;
}

void dv_seq_unpark(devio_device *d, dv_seq *q)
{
    if (!q->parked)
        return;
    free(q->parked);
    d->parked_bytes -= q->parked_bytes;
    d->n_parked--;
    q->parked = NULL;
    q->parked_bytes = 0;
}
