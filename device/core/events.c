/* events.c - the device's events (devio.h, docs/state.md): handed to cfg.on_event under the
 * lock, in order. Here too the prefix hashes of full KV blocks: each sequence keeps the hash
 * of its last full block (dv_seq.hashed, last_hash), each pool block whether it holds a full
 * prefix and which (block_hash, block_stored), so that a block given back or about to be
 * rewritten can say what left. A device opened without on_event keeps none of it: the step
 * path then hashes nothing. */
#include <string.h>

#include "common/sum64.h"
#include "device/core/core.h"

uint64_t devio_prefix_hash(uint64_t prev, const int32_t *tokens, uint32_t n)
{
    devio_sum64 s;
    devio_sum64_init(&s, prev);
    uint8_t b[4 * 64];
    for (uint32_t i = 0; i < n;) {
        uint32_t k = 0;
        for (; i < n && k < sizeof b; i++, k += 4) {
            uint32_t t = (uint32_t)tokens[i];
            b[k] = (uint8_t)t;
            b[k + 1] = (uint8_t)(t >> 8);
            b[k + 2] = (uint8_t)(t >> 16);
            b[k + 3] = (uint8_t)(t >> 24);
        }
        devio_sum64_update(&s, b, k);
    }
    return devio_sum64_final(&s);
}

void dv_emit(devio_device *d, devio_event e)
{
    if (d->cfg.on_event)
        d->cfg.on_event(d->cfg.on_event_ctx, &e);
}

void dv_emit_seq(devio_device *d, devio_event_kind kind, uint64_t seq, uint64_t parent)
{
    dv_emit(d, (devio_event){.kind = kind, .seq = seq, .parent = parent});
}

/* Block b no longer holds the prefix it was stored with. */
static void unstore(devio_device *d, uint32_t b)
{
    if (!d->block_stored[b])
        return;
    d->block_stored[b] = 0;
    dv_emit(d, (devio_event){.kind = DEVIO_EVENT_BLOCK_REMOVED, .block = b,
                             .prefix_hash = d->block_hash[b]});
}

uint32_t dv_block_unref(devio_device *d, uint32_t b)
{
    if (!devio_kv_pool_unref(&d->pool, b))
        return 0;
    unstore(d, b);
    return 1;
}

void dv_blocks_stored(devio_device *d, dv_seq *q)
{
    if (!d->cfg.on_event)
        return;
    uint32_t bs = d->cfg.block_size, full = q->len / bs;
    for (; q->hashed < full; q->hashed++) {
        uint32_t i = q->hashed;
        q->last_hash = devio_prefix_hash(q->last_hash, q->toks + (size_t)i * bs, bs);
        if (!dv_seq_block_live(q, i) || i >= q->n_blocks)
            continue; /* below a sliding window: not held, nothing to say */
        uint32_t b = q->blocks[i];
        if (d->block_stored[b])
            continue; /* shared with a fork that stored it */
        d->block_stored[b] = 1;
        d->block_hash[b] = q->last_hash;
        dv_emit(d, (devio_event){.kind = DEVIO_EVENT_BLOCK_STORED, .seq = q->id, .block = b,
                                 .prefix_len = (i + 1) * bs, .prefix_hash = q->last_hash});
    }
}

void dv_block_rewritten(devio_device *d, const dv_seq *q)
{
    if (!d->cfg.on_event)
        return;
    uint32_t last = q->n_blocks - 1;
    if (q->len % d->cfg.block_size && q->n_blocks && dv_seq_block_live(q, last))
        unstore(d, q->blocks[last]);
}

void dv_hashes_truncated(devio_device *d, dv_seq *q)
{
    if (!d->cfg.on_event)
        return;
    uint32_t bs = d->cfg.block_size, full = q->len / bs;
    /* The block the new length ends inside is written again by the next step: unless a fork
     * still shares it (the step then copies it), its stored prefix goes. */
    if (q->len % bs && full < q->n_blocks && dv_seq_block_live(q, full) &&
        !devio_kv_pool_is_shared(&d->pool, q->blocks[full]))
        unstore(d, q->blocks[full]);
    if (q->hashed <= full)
        return;
    q->hashed = 0;
    q->last_hash = 0;
    for (; q->hashed < full; q->hashed++)
        q->last_hash = devio_prefix_hash(q->last_hash, q->toks + (size_t)q->hashed * bs, bs);
}
