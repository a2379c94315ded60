/* state_io.c - the state stream's format (docs/state.md, state_stream.h): the walk over its
 * units, the header written and checked, and the helpers a unit needs. The cursors are
 * state_export.c's and state_import.c's; parking is state_park.c's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/core/state_stream.h"
#include "device/status.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the state stream holds the cache's bytes as they are: little-endian targets only"
#endif

/* ---- the walk ----------------------------------------------------------- */

/* Positions [r0, r1) of block entry b that the stream holds. */
void st_block_rows(const st_plan *p, uint32_t b, uint32_t *r0, uint32_t *r1)
{
    uint32_t lo = b * p->bs, hi = lo + p->bs;
    *r0 = lo > p->kv_from ? lo : p->kv_from;
    *r1 = hi < p->len ? hi : p->len;
}

uint64_t st_unit_bytes(const st_plan *p, const st_cursor *c)
{
    uint32_t r0, r1;
    switch (c->kind) {
    case U_HEADER: return ST_HEADER;
    case U_TOKENS: {
        uint32_t left = p->len - c->tok;
        return (uint64_t)(left < ST_TOKENS ? left : ST_TOKENS) * 4u;
    }
    case U_KV: st_block_rows(p, c->block, &r0, &r1); return (uint64_t)(r1 - r0) * p->row_bytes;
    case U_SLOT: return p->slot_bytes;
    case U_SNAP: return 8u + p->slot_bytes;
    case U_SUM: return ST_SUM;
    default: return 0;
    }
}

/* Skip the sections that are empty. */
static void st_settle(const st_plan *p, st_cursor *c)
{
    if (c->kind == U_TOKENS && c->tok >= p->len)
        *c = (st_cursor){.kind = U_KV, .block = p->first_block};
    if (c->kind == U_KV && (p->n_attn == 0 || p->first_block >= p->end_block))
        c->kind = U_SLOT;
    if (c->kind == U_SLOT && !p->has_slot)
        *c = (st_cursor){.kind = U_SNAP};
    if (c->kind == U_SNAP && c->snap >= p->n_snaps)
        c->kind = U_SUM;
}

void st_next_unit(const st_plan *p, st_cursor *c)
{
    switch (c->kind) {
    case U_HEADER: *c = (st_cursor){.kind = U_TOKENS}; break;
    case U_TOKENS: c->tok += ST_TOKENS; break;
    case U_KV:
        if (++c->block < p->end_block)
            break;
        c->block = p->first_block;
        if (++c->half < 2)
            break;
        c->half = 0;
        if (++c->layer < p->n_attn)
            break;
        c->kind = U_SLOT;
        break;
    case U_SLOT: *c = (st_cursor){.kind = U_SNAP}; break;
    case U_SNAP: c->snap++; break;
    default: c->kind = U_END; return;
    }
    st_settle(p, c);
}

st_plan st_plan_of(const devio_device *d, const st_header *h)
{
    uint32_t bs = d->cfg.block_size;
    return (st_plan){.len = h->len, .kv_from = h->kv_from, .n_attn = h->n_attn, .bs = bs,
                     .first_block = h->kv_from / bs, .end_block = (h->len + bs - 1) / bs,
                     .n_snaps = h->n_snaps, .row_bytes = (uint64_t)h->kv_dim * h->kv_elem,
                     .slot_bytes = h->slot_floats * sizeof(float),
                     .has_slot = (h->flags & ST_HAS_SLOT) != 0};
}

/* Bytes of the whole stream the plan describes. */
uint64_t st_stream_bytes(const st_plan *p)
{
    uint64_t kv = (uint64_t)(p->len - p->kv_from) * p->row_bytes * 2u * p->n_attn;
    return ST_HEADER + (uint64_t)p->len * 4u + kv + (p->has_slot ? p->slot_bytes : 0) +
           (uint64_t)p->n_snaps * (8u + p->slot_bytes) + ST_SUM;
}

/* ---- the header ---------------------------------------------------------- */

void st_header_encode(const st_header *h, uint8_t *b)
{
    memset(b, 0, ST_HEADER);
    memcpy(b, ST_MAGIC, 8);
    st_put32(b + 8, ST_VERSION);
    st_put32(b + 12, ST_HEADER);
    memcpy(b + 16, h->fingerprint, 32);
    st_put32(b + 48, h->numerics);
    st_put32(b + 52, h->kv_elem);
    memcpy(b + 56, h->producer, 32);
    st_put32(b + 88, h->n_attn);
    st_put32(b + 92, h->kv_dim);
    st_put64(b + 96, h->slot_floats);
    st_put32(b + 104, h->len);
    st_put32(b + 108, h->kv_from);
    st_put32(b + 112, h->flags);
    st_put32(b + 116, h->n_snaps);
    st_put64(b + 120, h->total);
}

void st_header_decode(const uint8_t *b, st_header *h)
{
    memcpy(h->fingerprint, b + 16, 32);
    h->numerics = st_get32(b + 48);
    h->kv_elem = st_get32(b + 52);
    memcpy(h->producer, b + 56, 32);
    h->producer[31] = '\0';
    h->n_attn = st_get32(b + 88);
    h->kv_dim = st_get32(b + 92);
    h->slot_floats = st_get64(b + 96);
    h->len = st_get32(b + 104);
    h->kv_from = st_get32(b + 108);
    h->flags = st_get32(b + 112);
    h->n_snaps = st_get32(b + 116);
    h->total = st_get64(b + 120);
}

/* What this device writes in a header: its model, numerics, KV element and producer. */
void st_header_own(devio_device *d, st_header *h)
{
    memset(h, 0, sizeof *h);
    memcpy(h->fingerprint, dv_fingerprint(d), 32);
    bool fast = d->cfg.numerics == DEVIO_NUMERICS_FAST;
    h->numerics = fast ? 1u : 0u;
    h->kv_elem = d->kv_elem;
    if (fast) {
        /* Fast numerics are a backend's own: its name and its path or GPU. */
        devio_device_info di = {0};
        devio_backend_info_get(d->ops, d->backend, &di);
        const char *path = di.path[0] ? di.path : di.compute_capability;
        snprintf(h->producer, sizeof h->producer, "%s%s%s", d->ops->name, path[0] ? "/" : "",
                 path);
    }
    h->n_attn = d->shape.n_attn;
    h->kv_dim = d->shape.kv_dim;
    h->slot_floats = d->shape.slot_floats;
}

const uint8_t *dv_fingerprint(devio_device *d)
{
    if (!d->has_fingerprint) {
        devio_model_fingerprint(d->model, d->fingerprint);
        d->has_fingerprint = true;
    }
    return d->fingerprint;
}

/* The header against this device; fills *p. */
devio_status st_header_check(devio_device *d, const uint8_t *b, uint64_t max_bytes,
                                 st_header *h, st_plan *p, devio_error *err)
{
    if (memcmp(b, ST_MAGIC, 8) != 0)
        return devio_fail(err, DEVIO_E_INVALID, "not a sequence state (no DEVIOSEQ magic)");
    if (st_get32(b + 8) != ST_VERSION || st_get32(b + 12) != ST_HEADER)
        return devio_fail(err, DEVIO_E_INVALID,
                          "sequence state format version %u; this devio reads version %u",
                          st_get32(b + 8), ST_VERSION);
    st_header_decode(b, h);
    st_header own;
    st_header_own(d, &own);
    if (memcmp(h->fingerprint, own.fingerprint, 32) != 0)
        return devio_fail(err, DEVIO_E_INVALID,
                          "the state is of another model (its fingerprint differs)");
    if (h->numerics != own.numerics || h->kv_elem != own.kv_elem)
        return devio_fail(err, DEVIO_E_INVALID,
                          "the state has %s numerics with %u-byte KV elements; this device "
                          "computes %s with %u",
                          h->numerics ? "fast" : "strict", h->kv_elem,
                          own.numerics ? "fast" : "strict", own.kv_elem);
    if (strcmp(h->producer, own.producer) != 0)
        return devio_fail(err, DEVIO_E_INVALID,
                          "the state's fast numbers are %s's; this device's are %s's",
                          h->producer, own.producer);
    if (h->n_attn != own.n_attn || h->kv_dim != own.kv_dim || h->slot_floats != own.slot_floats)
        return devio_fail(err, DEVIO_E_INVALID, "the state's shape is not this model's");
    bool hybrid = d->hybrid;
    if (h->len > d->cfg.max_seq_len || h->kv_from > h->len ||
        (h->kv_from && !d->shape.window) || h->flags & ~ST_HAS_SLOT ||
        (hybrid && h->len > 0) != ((h->flags & ST_HAS_SLOT) != 0) ||
        (!hybrid && h->n_snaps) || h->n_snaps > h->len)
        return devio_fail(err, DEVIO_E_INVALID,
                          "the state's header is inconsistent (length %u, keys from %u, flags %u,"
                          " %u snapshots) for this device (max_seq_len %u)",
                          h->len, h->kv_from, h->flags, h->n_snaps, d->cfg.max_seq_len);
    if (h->kv_from % d->cfg.block_size)
        return devio_fail(err, DEVIO_E_UNSUPPORTED,
                          "the state's keys start at %u, not a whole block of %u positions "
                          "(a sliding window released blocks of another size)",
                          h->kv_from, d->cfg.block_size);
    *p = st_plan_of(d, h);
    if (h->total != st_stream_bytes(p))
        return devio_fail(err, DEVIO_E_INVALID, "the state says %llu bytes; its header makes %llu",
                          (unsigned long long)h->total, (unsigned long long)st_stream_bytes(p));
    if (max_bytes && h->total > max_bytes)
        return devio_fail(err, DEVIO_E_TOO_LARGE, "the state is %llu bytes, over the limit of %llu",
                          (unsigned long long)h->total, (unsigned long long)max_bytes);
    return DEVIO_OK;
}

/* One block's K or V half as the backend keeps it ([n_kv][bs][hd]) <-> rows [r0, r1) of the
 * stream ([position][n_kv * hd]), elem bytes an element. */
void st_rows_move(const devio_device *d, uint8_t *raw, uint8_t *rows, uint32_t r0,
                      uint32_t r1, uint32_t elem, bool to_rows)
{
    uint32_t bs = d->cfg.block_size, hd = d->shape.head_dim, n_kv = d->shape.n_kv_heads;
    size_t head = (size_t)hd * elem;
    for (uint32_t r = r0; r < r1; r++)
        for (uint32_t g = 0; g < n_kv; g++) {
            uint8_t *a = raw + ((size_t)g * bs + r % bs) * head;
            uint8_t *b = rows + ((size_t)(r - r0) * n_kv + g) * head;
            memcpy(to_rows ? b : a, to_rows ? a : b, head);
        }
}

/* The snapshot slots q owns, by length ascending, into out (at most n). */
uint32_t st_owned_snaps(const devio_device *d, const dv_seq *q, uint32_t *out)
{
    uint32_t n = 0;
    int32_t owner = (int32_t)(q - d->seqs);
    for (uint32_t i = 0; i < d->bcfg.ssm_snapshots; i++) {
        if (d->snap_owner[i] != owner)
            continue;
        uint32_t k = n++;
        while (k > 0 && d->snap_len[out[k - 1]] > d->snap_len[i]) {
            out[k] = out[k - 1];
            k--;
        }
        out[k] = i;
    }
    return n;
}

/* Buffers for a unit: the stream's side (rows) and the backend's (raw). */
bool st_unit_buffers(const devio_device *d, uint8_t **rows, uint8_t **raw)
{
    uint64_t part = devio_state_part_bytes(&d->bcfg, d->kv_elem, DEVIO_STATE_K);
    uint64_t slot = d->shape.slot_floats * sizeof(float) + 8u;
    uint64_t n = part > slot ? part : slot;
    if (n < (uint64_t)ST_TOKENS * 4u)
        n = (uint64_t)ST_TOKENS * 4u;
    *rows = malloc((size_t)n);
    *raw = malloc((size_t)(part ? part : 1));
    return *rows && *raw;
}
