/* backend.c - the checked wrappers around the backend vtable, and the batch check.
 * The core reaches a backend only through these; they never compute. */
#include <stddef.h>

#include "device/adapter/adapter.h"
#include "device/backend/backend.h"
#include "device/status.h"

static const char *name_of(const devio_backend_ops *ops)
{
    return ops && ops->name ? ops->name : "?";
}

devio_status devio_backend_check(const devio_backend_ops *ops, devio_error *err)
{
    if (!ops)
        return devio_fail(err, DEVIO_E_INVALID, "no backend given");
    if (ops->abi != DEVIO_BACKEND_ABI)
        return devio_fail(err, DEVIO_E_UNSUPPORTED,
                          "backend '%s' has interface version %u, devio needs %u", name_of(ops),
                          ops->abi, DEVIO_BACKEND_ABI);
    if (!ops->name || !ops->name[0] || !ops->create || !ops->destroy || !ops->info ||
        !ops->submit || !ops->wait)
        return devio_fail(err, DEVIO_E_UNSUPPORTED, "backend '%s' lacks a required slot",
                          name_of(ops));
    if (!ops->adapter_add != !ops->adapter_remove)
        return devio_fail(err, DEVIO_E_UNSUPPORTED,
                          "backend '%s' has only one of adapter_add and adapter_remove",
                          name_of(ops));
    if (!ops->state_read != !ops->state_write)
        return devio_fail(err, DEVIO_E_UNSUPPORTED,
                          "backend '%s' has only one of state_read and state_write",
                          name_of(ops));
    return DEVIO_OK;
}

devio_status devio_backend_probe(const devio_backend_ops *ops, devio_error *err)
{
    devio_status s = devio_backend_check(ops, err);
    if (s != DEVIO_OK || !ops->probe)
        return s;
    return ops->probe(err);
}

devio_status devio_backend_create(const devio_backend_ops *ops, const devio_model *model,
                                  const devio_backend_config *cfg, void **state,
                                  devio_error *err)
{
    *state = NULL;
    devio_status s = devio_backend_check(ops, err);
    if (s != DEVIO_OK)
        return s;
    if (devio_model_weights_released(model) && !ops->copies_weights)
        return devio_fail(err, DEVIO_E_INVALID,
                          "backend '%s' reads the model's weights from host memory, and they were "
                          "released",
                          ops->name);
    s = ops->create(model, cfg, state, err);
    if (s != DEVIO_OK)
        *state = NULL;
    return s;
}

void devio_backend_destroy(const devio_backend_ops *ops, void *state)
{
    if (ops && state)
        ops->destroy(state);
}

uint32_t devio_backend_kv_blocks_fit(const devio_backend_ops *ops, const devio_model *model,
                                     const devio_backend_config *cfg)
{
    return ops->kv_blocks_fit ? ops->kv_blocks_fit(model, cfg) : 0;
}

void devio_backend_info_get(const devio_backend_ops *ops, void *state, devio_device_info *out)
{
    ops->info(state, out);
}

devio_status devio_backend_submit(const devio_backend_ops *ops, void *state,
                                  const devio_backend_config *cfg, const devio_batch *batch,
                                  devio_error *err)
{
    if (!state)
        return devio_fail(err, DEVIO_E_TORN_DOWN, "backend released");
    devio_status s = devio_batch_check(cfg, batch, err);
    if (s != DEVIO_OK)
        return s;
    return ops->submit(state, batch, err);
}

devio_status devio_backend_wait(const devio_backend_ops *ops, void *state,
                                const devio_batch *batch, devio_error *err)
{
    if (!state)
        return devio_fail(err, DEVIO_E_TORN_DOWN, "backend released");
    return ops->wait(state, batch, err);
}

bool devio_backend_has_adapters(const devio_backend_ops *ops) { return ops->adapter_add; }
bool devio_backend_has_device_logits(const devio_backend_ops *ops) { return ops->logits_read; }
bool devio_backend_has_sample(const devio_backend_ops *ops) { return ops->sample; }
bool devio_backend_has_ssm(const devio_backend_ops *ops) { return ops->ssm_copy; }

static bool ssm_ref_ok(const devio_backend_config *cfg, devio_ssm_ref r)
{
    return r.index < (r.snapshot ? cfg->ssm_snapshots : cfg->ssm_slots);
}

bool devio_backend_has_state_io(const devio_backend_ops *ops) { return ops->state_read; }

uint64_t devio_state_part_bytes(const devio_backend_config *cfg, uint32_t kv_elem,
                                devio_state_part part)
{
    const devio_model_shape *sh = cfg->shape;
    if (part == DEVIO_STATE_SSM)
        return sh->slot_floats * sizeof(float);
    return (uint64_t)cfg->block_size * sh->kv_dim * kv_elem;
}

/* what within cfg: an attention layer and a block of the pool, or a slot. */
static devio_status state_ref_ok(const devio_backend_ops *ops, const devio_backend_config *cfg,
                                 devio_state_ref what, devio_error *err)
{
    if (!ops->state_read)
        return devio_fail(err, DEVIO_E_UNSUPPORTED,
                          "backend '%s' cannot read or write a sequence's state", name_of(ops));
    const devio_model_shape *sh = cfg->shape;
    bool ok = what.part == DEVIO_STATE_SSM ? sh->n_mixers > 0 && ssm_ref_ok(cfg, what.ssm)
              : what.part == DEVIO_STATE_K || what.part == DEVIO_STATE_V
                  ? what.layer < sh->n_attn && what.block < cfg->kv_blocks
                  : false;
    if (!ok)
        return devio_fail(err, DEVIO_E_INVALID,
                          "state part %d (layer %u, block %u) is out of range", (int)what.part,
                          what.layer, what.block);
    return DEVIO_OK;
}

devio_status devio_backend_state_read(const devio_backend_ops *ops, void *state,
                                      const devio_backend_config *cfg, devio_state_ref what,
                                      void *dst, devio_error *err)
{
    devio_status s = state_ref_ok(ops, cfg, what, err);
    return s != DEVIO_OK ? s : ops->state_read(state, what, dst, err);
}

devio_status devio_backend_state_write(const devio_backend_ops *ops, void *state,
                                       const devio_backend_config *cfg, devio_state_ref what,
                                       const void *src, devio_error *err)
{
    devio_status s = state_ref_ok(ops, cfg, what, err);
    return s != DEVIO_OK ? s : ops->state_write(state, what, src, err);
}

devio_status devio_backend_ssm_copy(const devio_backend_ops *ops, void *state,
                                    const devio_backend_config *cfg, devio_ssm_ref dst,
                                    devio_ssm_ref src, devio_error *err)
{
    if (!ops->ssm_copy)
        return devio_fail(err, DEVIO_E_UNSUPPORTED, "backend '%s' keeps no recurrent state",
                          name_of(ops));
    if (!ssm_ref_ok(cfg, dst) || !ssm_ref_ok(cfg, src) ||
        (dst.snapshot == src.snapshot && dst.index == src.index))
        return devio_fail(err, DEVIO_E_INVALID, "state copy %s %u <- %s %u is out of range",
                          dst.snapshot ? "snapshot" : "slot", dst.index,
                          src.snapshot ? "snapshot" : "slot", src.index);
    return ops->ssm_copy(state, dst, src, err);
}

devio_status devio_backend_adapter_add(const devio_backend_ops *ops, void *state, uint32_t slot,
                                       uint32_t generation, const devio_adapter *a,
                                       devio_error *err)
{
    if (!ops->adapter_add)
        return devio_fail(err, DEVIO_E_UNSUPPORTED, "backend '%s' does not run LoRA adapters",
                          name_of(ops));
    return ops->adapter_add(state, slot, generation, a, err);
}

void devio_backend_adapter_remove(const devio_backend_ops *ops, void *state, uint32_t slot,
                                  uint32_t generation)
{
    if (ops->adapter_remove)
        ops->adapter_remove(state, slot, generation);
}

devio_status devio_backend_logits_read(const devio_backend_ops *ops, void *state, uint32_t slot,
                                       float *dst, devio_error *err)
{
    if (!ops->logits_read)
        return devio_fail(err, DEVIO_E_DEVICE, "backend '%s' keeps no logits of its own",
                          name_of(ops));
    return ops->logits_read(state, slot, dst, err);
}

devio_status devio_backend_sample(const devio_backend_ops *ops, void *state,
                                  const devio_batch *batch, devio_error *err)
{
    if (!ops->sample)
        return devio_fail(err, DEVIO_E_UNSUPPORTED, "backend '%s' does not sample",
                          name_of(ops));
    return ops->sample(state, batch, err);
}

/* ---- the batch check ------------------------------------------------------ */

static devio_status check_row(const devio_backend_config *cfg, const devio_batch *b, uint32_t r,
                              uint32_t tok_start, devio_error *err)
{
    const devio_batch_row *row = &b->rows[r];
    if (row->n_tokens == 0 || row->tok_start != tok_start ||
        row->n_tokens > b->n_tokens - tok_start || !row->blocks ||
        row->pos0 > cfg->max_seq_len || row->n_tokens > cfg->max_seq_len - row->pos0)
        return devio_fail_at(err, DEVIO_E_INVALID, "row", r, "row %u lies outside the batch", r);
    uint32_t end = row->pos0 + row->n_tokens;
    /* With a sliding window W, an entry may be released (the core gave its
     * block back) when every position of it lies below the first key of
     * the row's first token, pos0 + 1 - W: no token of the row reads it. */
    uint64_t w = cfg->shape->window, bs = cfg->block_size;
    uint64_t first_key = w > 0 && (uint64_t)row->pos0 + 1 > w ? (uint64_t)row->pos0 + 1 - w : 0;
    for (uint32_t i = 0; i < (end + cfg->block_size - 1) / cfg->block_size; i++) {
        if (row->blocks[i] == DEVIO_KV_BLOCK_RELEASED && (uint64_t)(i + 1) * bs <= first_key)
            continue;
        if (row->blocks[i] == DEVIO_KV_BLOCK_RELEASED)
            return devio_fail_at(err, DEVIO_E_INVALID, "row", r,
                                 "row %u: block table entry %u was released, but the row reads "
                                 "positions from %llu",
                                 r, i, (unsigned long long)first_key);
        if (row->blocks[i] >= cfg->kv_blocks)
            return devio_fail_at(err, DEVIO_E_INVALID, "row", r, "row %u names KV block %u", r,
                                 row->blocks[i]);
    }
    if (row->adapter < -1 || (row->adapter >= 0 && (uint32_t)row->adapter >= cfg->adapter_slots))
        return devio_fail_at(err, DEVIO_E_INVALID, "row", r, "row %u names adapter slot %d", r,
                             row->adapter);
    if (row->ssm_slot < -1 || (row->ssm_slot >= 0 && (uint32_t)row->ssm_slot >= cfg->ssm_slots) ||
        (cfg->shape->n_mixers > 0 && row->ssm_slot < 0))
        return devio_fail_at(err, DEVIO_E_INVALID, "row", r, "row %u names state slot %d", r,
                             row->ssm_slot);
    uint32_t n_snap = devio_snapshots_of(row->snapshot, row->n_tokens);
    if (row->snapshot > DEVIO_SNAP_EACH || (n_snap && (row->ssm_slot < 0 || !row->snap_slots)))
        return devio_fail_at(err, DEVIO_E_INVALID, "row", r, "row %u asks a bad snapshot", r);
    for (uint32_t i = 0; i < n_snap; i++)
        if (row->snap_slots[i] < 0 || (uint32_t)row->snap_slots[i] >= cfg->ssm_snapshots)
            return devio_fail_at(err, DEVIO_E_INVALID, "row", r,
                                 "row %u names snapshot slot %d", r, row->snap_slots[i]);
    for (uint32_t i = 0; i < row->n_tokens; i++) {
        uint32_t t = tok_start + i;
        if (b->tok_row[t] != r || b->tok_pos[t] != row->pos0 + i)
            return devio_fail_at(err, DEVIO_E_INVALID, "row", r,
                                 "token %u does not match row %u's positions", t, r);
    }
    return DEVIO_OK;
}

devio_status devio_batch_check(const devio_backend_config *cfg, const devio_batch *b,
                               devio_error *err)
{
    const devio_model_shape *m = cfg->shape;
    if (b->n_tokens > cfg->max_batch_tokens || b->n_rows > cfg->max_rows ||
        b->n_samples > b->n_rows || b->n_out > b->n_tokens)
        return devio_fail(err, DEVIO_E_TOO_LARGE,
                          "batch of %u tokens in %u rows is over the backend's limits",
                          b->n_tokens, b->n_rows);
    if (b->n_tokens && (!b->tokens || !b->tok_pos || !b->tok_row || !b->rows))
        return devio_fail(err, DEVIO_E_INVALID, "batch lacks its token arrays");
    uint32_t tok = 0;
    for (uint32_t r = 0; r < b->n_rows; r++) {
        devio_status s = check_row(cfg, b, r, tok, err);
        if (s != DEVIO_OK)
            return s;
        tok += b->rows[r].n_tokens;
    }
    if (tok != b->n_tokens)
        return devio_fail(err, DEVIO_E_INVALID, "%u of the batch's %u tokens belong to no row",
                          b->n_tokens - tok, b->n_tokens);
    for (uint32_t t = 0; t < b->n_tokens; t++)
        if (b->tokens[t] < 0 || (uint32_t)b->tokens[t] >= m->vocab)
            return devio_fail(err, DEVIO_E_INVALID, "token id %d outside the vocabulary",
                              b->tokens[t]);
    for (uint32_t i = 0; i < b->n_out; i++)
        if (b->out_tok[i] >= b->n_tokens || (i > 0 && b->out_tok[i] <= b->out_tok[i - 1]) ||
            b->out_row[i] >= cfg->logits_rows)
            return devio_fail(err, DEVIO_E_INVALID, "logits output %u is out of order or range",
                              i);
    for (uint32_t c = 0; c < b->n_copies; c++)
        if (b->copy_src[c] >= cfg->kv_blocks || b->copy_dst[c] >= cfg->kv_blocks)
            return devio_fail(err, DEVIO_E_INVALID, "block copy %u names a block outside the pool",
                              c);
    for (uint32_t i = 0; i < b->n_samples; i++)
        if (b->samples[i].row >= b->n_rows || b->samples[i].logits_row >= cfg->logits_rows)
            return devio_fail(err, DEVIO_E_INVALID, "sample %u names a row or slot out of range",
                              i);
    return DEVIO_OK;
}
