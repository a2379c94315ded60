/* logits_handles.c - logits handles: find, allocate and release one, and read a logits slot.
 * Bookkeeping of arena rows sized at open: it never allocates memory or computes. */
#include "device/core/core.h"

dv_handle *dv_handle_find(devio_device *d, uint64_t id)
{
    if (id == 0)
        return NULL;
    for (uint32_t i = 0; i < d->cfg.logits_handles; i++)
        if (d->handles[i].id == id)
            return &d->handles[i];
    return NULL;
}

devio_status dv_logits_row(devio_device *d, uint32_t slot, float *buf, const float **out,
                           devio_error *err)
{
    *out = buf;
    if (devio_backend_has_device_logits(d->ops))
        return devio_backend_logits_read(d->ops, d->backend, slot, buf, err);
    *out = d->logits_arena + (size_t)slot * d->vocab;
    return DEVIO_OK;
}

dv_handle *dv_handle_alloc(devio_device *d, uint32_t n)
{
    for (uint32_t i = 0; i < d->cfg.logits_handles; i++) {
        dv_handle *h = &d->handles[i];
        if (h->id)
            continue;
        h->id = d->next_handle_id++;
        dv_ids_used(d);
        h->n_rows = n;
        h->ready = false;
        for (uint32_t r = 0; r < n; r++)
            h->arena_rows[r] = d->row_free[--d->n_row_free];
        d->n_handles_live++;
        return h;
    }
    return NULL;
}

void dv_handle_release(devio_device *d, dv_handle *h)
{
    for (uint32_t r = h->n_rows; r-- > 0;)
        d->row_free[d->n_row_free++] = h->arena_rows[r];
    h->id = 0;
    h->n_rows = 0;
    d->n_handles_live--;
}
