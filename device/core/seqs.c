/* seqs.c - the sequences' public face: create one, find one, describe one, list them.
 * Every change of a sequence's length or blocks is launch.c's, effects.c's or seq_blocks.c's; this file never takes a block. */
#include <stdlib.h>

#include "device/core/core.h"
#include "device/status.h"

dv_seq *dv_seq_find(devio_device *d, uint64_t id)
{
    if (id == 0 || id == DV_SEQ_IMPORTING)
        return NULL;
    for (uint32_t i = 0; i < d->cfg.max_seqs; i++)
        if (d->seqs[i].id == id)
            return &d->seqs[i];
    return NULL;
}

void dv_ids_used(devio_device *d)
{
    if (d->cfg.on_ids)
        d->cfg.on_ids(d->cfg.on_ids_ctx, d->next_seq_id - 1, d->next_handle_id - 1);
}

uint64_t dv_new_seq_id(devio_device *d)
{
    uint64_t id = d->next_seq_id++;
    dv_ids_used(d);
    return id;
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
        q->id = dv_new_seq_id(d);
        q->len = 0;
        q->n_blocks = 0;
        q->n_released = 0;
        q->busy = 0;
        q->pins = 0;
        q->hashed = 0;
        q->last_hash = 0;
        q->parked = NULL;
        q->parked_bytes = 0;
        q->ssm_slot = -1;
        q->state_lost = false;
        *seq = q->id;
        dv_emit_seq(d, DEVIO_EVENT_SEQ_CREATED, q->id, 0);
        goto out;
    }
    s = devio_fail_at(err, DEVIO_E_OUT_OF_SEQS, "max_seqs", d->cfg.max_seqs,
                      "all %u sequence slots are in use", d->cfg.max_seqs);
out:
    dv_unlock(d);
    return s;
}

/* A sequence's state, its snapshots' lengths ascending. */
static void seq_info_fill(const devio_device *d, const dv_seq *q, devio_seq_info *out)
{
    /* blocks: those the sequence holds, not the entries its window released. */
    *out = (devio_seq_info){.seq = q->id, .len = q->len, .blocks = dv_seq_blocks_held(q),
                            .busy_ticket = q->busy, .ssm_slot = q->ssm_slot >= 0,
                            .parked = q->parked != NULL};
    int32_t owner = (int32_t)(q - d->seqs);
    uint32_t cap = sizeof out->snapshots / sizeof *out->snapshots;
    for (uint32_t i = 0; i < d->bcfg.ssm_snapshots; i++) {
        if (d->snap_owner[i] != owner)
            continue;
        uint32_t len = d->snap_len[i], k = out->n_snapshots < cap ? out->n_snapshots : cap;
        /* Insertion into the first cap lengths, kept ascending. */
        while (k > 0 && out->snapshots[k - 1] > len) {
            if (k < cap)
                out->snapshots[k] = out->snapshots[k - 1];
            k--;
        }
        if (k < cap)
            out->snapshots[k] = len;
        out->n_snapshots++;
    }
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
        seq_info_fill(d, q, out);
    dv_unlock(d);
    return s;
}

static int by_seq(const void *a, const void *b)
{
    uint64_t x = ((const devio_seq_info *)a)->seq, y = ((const devio_seq_info *)b)->seq;
    return (x > y) - (x < y);
}

devio_status devio_seq_list(devio_device *d, devio_seq_info *out, uint32_t cap, uint32_t *n,
                            devio_error *err)
{
    devio_status s = DEVIO_OK;
    *n = 0;
    dv_lock(d);
    if (d->torn_down)
        s = devio_fail(err, DEVIO_E_TORN_DOWN, "device torn down");
    for (uint32_t i = 0; s == DEVIO_OK && i < d->cfg.max_seqs; i++) {
        if (!d->seqs[i].id || d->seqs[i].id == DV_SEQ_IMPORTING)
            continue;
        if (*n < cap)
            seq_info_fill(d, &d->seqs[i], &out[*n]);
        (*n)++;
    }
    dv_unlock(d);
    if (out)
        qsort(out, *n < cap ? *n : cap, sizeof *out, by_seq);
    return s;
}
