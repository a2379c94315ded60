/* seq_blocks.c - the blocks a sequence holds: shrinking it and releasing what its sliding window passed.
 * Reference counts only (device/core/kv_pool.h): it never touches block contents or takes a block. */
#include "device/core/core.h"

uint32_t dv_seq_shrink(devio_device *d, dv_seq *s, uint32_t new_len)
{
    uint32_t keep = (new_len + d->cfg.block_size - 1) / d->cfg.block_size;
    uint32_t freed = 0;
    while (s->n_blocks > keep) {
        uint32_t i = --s->n_blocks;
        if (dv_seq_block_live(s, i))
            freed += dv_block_unref(d, s->blocks[i]);
    }
    if (s->n_released > s->n_blocks)
        s->n_released = s->n_blocks;
    s->len = new_len;
    return freed;
}

uint32_t dv_window_first_key(const devio_device *d, uint32_t len)
{
    uint32_t w = d->shape.window;
    return w > 0 && len + 1 > w ? len + 1 - w : 0;
}

uint32_t dv_seq_release_window(devio_device *d, dv_seq *s)
{
    if (d->shape.window == 0)
        return 0;
    /* Block b is unneeded when its last position (b+1)*bs - 1 lies below
     * the first key of the next token. */
    uint32_t upto = dv_window_first_key(d, s->len) / d->cfg.block_size;
    if (upto > s->n_blocks)
        upto = s->n_blocks;
    uint32_t freed = 0;
    for (; s->n_released < upto; s->n_released++) {
        freed += dv_block_unref(d, s->blocks[s->n_released]);
        s->blocks[s->n_released] = DEVIO_KV_BLOCK_RELEASED;
    }
    return freed;
}
