/* kv_pool.c - reference counts and the free list of KV blocks.
 * Pure bookkeeping: it must never touch block contents or allocate after init. */
#include <assert.h>
#include <stdlib.h>

#include "device/core/kv_pool.h"

devio_status devio_kv_pool_init(devio_kv_pool *p, uint32_t n)
{
    p->n_blocks = n;
    p->n_free = n;
    p->n_shared = 0;
    p->refcount = calloc(n ? n : 1, sizeof *p->refcount);
    p->free_list = malloc((n ? n : 1) * sizeof *p->free_list);
    p->taken = calloc(n ? n : 1, sizeof *p->taken);
    if (!p->refcount || !p->free_list || !p->taken) {
        devio_kv_pool_fini(p);
        return DEVIO_E_NOMEM;
    }
    /* Stack order so that block 0 is handed out first: allocation is
     * deterministic for a given sequence of operations. */
    for (uint32_t i = 0; i < n; i++)
        p->free_list[i] = n - 1 - i;
    return DEVIO_OK;
}

void devio_kv_pool_fini(devio_kv_pool *p)
{
    free(p->refcount);
    free(p->free_list);
    free(p->taken);
    p->refcount = NULL;
    p->free_list = NULL;
    p->taken = NULL;
    p->n_blocks = p->n_free = p->n_shared = 0;
}

uint32_t devio_kv_pool_take(devio_kv_pool *p)
{
    assert(p->n_free > 0);
    uint32_t b = p->free_list[--p->n_free];
    assert(p->refcount[b] == 0);
    p->refcount[b] = 1;
    p->taken[b]++;
    return b;
}

void devio_kv_pool_ref(devio_kv_pool *p, uint32_t b)
{
    assert(b < p->n_blocks && p->refcount[b] > 0);
    if (p->refcount[b] == 1)
        p->n_shared++;
    p->refcount[b]++;
}

bool devio_kv_pool_unref(devio_kv_pool *p, uint32_t b)
{
    assert(b < p->n_blocks && p->refcount[b] > 0);
    p->refcount[b]--;
    if (p->refcount[b] == 1)
        p->n_shared--;
    if (p->refcount[b] > 0)
        return false;
    p->free_list[p->n_free++] = b;
    return true;
}
