/* kv_pool.h - bookkeeping of the paged KV cache: reference-counted blocks.
 * Counts only; the block contents live in the backend. Never allocates after create. */
#ifndef DEVIO_KV_POOL_H
#define DEVIO_KV_POOL_H

#include <stdbool.h>
#include <stdint.h>

#include "device/backend/backend.h" /* DEVIO_KV_BLOCK_RELEASED */
#include "device/devio.h"

typedef struct devio_kv_pool {
    uint32_t n_blocks;
    uint32_t n_free;
    uint32_t n_shared;   /* blocks with refcount > 1 */
    uint32_t *refcount;  /* n_blocks entries */
    uint32_t *free_list; /* stack: free_list[n_free-1] is handed out next */
    uint32_t *taken;     /* n_blocks entries: times each block was taken (wraps), so a
                            holder can tell the block it let go from the same block taken again */
} devio_kv_pool;

/* Initialise a pool of n blocks, all free; block 0 is handed out first.
 * Release with devio_kv_pool_fini(). */
devio_status devio_kv_pool_init(devio_kv_pool *p, uint32_t n);
void devio_kv_pool_fini(devio_kv_pool *p);

/* Take a free block with refcount 1. Caller checks n_free first: taking
 * from an empty pool is an invariant violation. */
uint32_t devio_kv_pool_take(devio_kv_pool *p);

/* One more holder of block b (fork). */
void devio_kv_pool_ref(devio_kv_pool *p, uint32_t b);

/* One holder fewer; returns true when b went back to the free list. */
bool devio_kv_pool_unref(devio_kv_pool *p, uint32_t b);

static inline bool devio_kv_pool_is_shared(const devio_kv_pool *p, uint32_t b)
{
    return p->refcount[b] > 1;
}

#endif
