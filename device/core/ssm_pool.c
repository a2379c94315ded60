/* ssm_pool.c - the SSM state slots and snapshots of hybrid models: sized at open, taken and given back.
 * Counts and owners only: the states live in the backend, and nothing here allocates after open. */
#include <stdlib.h>

#include "device/core/core.h"
#include "device/status.h"

/* Memory the state slots and the snapshots may each take when their count
 * is derived (--ssm-slots 0, --ssm-snapshots 0). */
#define SSM_POOL_BYTES (1ull << 30)

/* Hybrid models: the state slot and snapshot pools and their tables. A
 * derived count is what SSM_POOL_BYTES holds, at least 1: slots at most
 * max_seqs, snapshots at most 4 per slot. Attention-only models get none. */
devio_status dv_ssm_pool_open(devio_device *d, devio_error *err)
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
    /* Counts are at least 1 here (derived or checked above), so calloc never sees 0. */
    d->ssm_free = calloc(c->ssm_slots, sizeof *d->ssm_free);
    d->snap_owner = calloc(c->ssm_snapshots, sizeof *d->snap_owner);
    d->snap_len = calloc(c->ssm_snapshots, sizeof *d->snap_len);
    d->snap_free = calloc(c->ssm_snapshots, sizeof *d->snap_free);
    if (!d->ssm_free || !d->snap_owner || !d->snap_len || !d->snap_free)
        return devio_fail(err, DEVIO_E_NOMEM, "out of memory for the SSM slot tables");
    for (uint32_t i = 0; i < c->ssm_slots; i++)
        d->ssm_free[i] = c->ssm_slots - 1 - i;
    d->n_ssm_free = c->ssm_slots;
    for (uint32_t i = 0; i < c->ssm_snapshots; i++) {
        d->snap_owner[i] = -1;
        d->snap_free[i] = c->ssm_snapshots - 1 - i;
    }
    d->n_snap_free = c->ssm_snapshots;
    return DEVIO_OK;
}

void dv_ssm_pool_free(devio_device *d)
{
    free(d->ssm_free);
    free(d->snap_owner);
    free(d->snap_len);
    free(d->snap_free);
}

void dv_ssm_slot_take(devio_device *d, dv_seq *q)
{
    q->ssm_slot = (int32_t)d->ssm_free[--d->n_ssm_free];
    q->state_lost = false;
}

void dv_ssm_slot_put(devio_device *d, dv_seq *q)
{
    d->ssm_free[d->n_ssm_free++] = (uint32_t)q->ssm_slot;
    q->ssm_slot = -1;
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
    if (q->ssm_slot >= 0)
        dv_ssm_slot_put(d, q);
    q->state_lost = false;
    return n;
}
