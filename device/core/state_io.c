/* state_io.c - a sequence's state exported and imported: the stream docs/state.md defines,
 * written by an export cursor and read by an import cursor, one unit at a time (the header,
 * a thousand tokens, the K or V rows of one block of one attention layer, a state slot, a
 * snapshot, the checksum: common/sum64.h, fast enough not to slow a move), so that neither side ever holds a long sequence's state whole.
 * The stream's K and V rows are position-major, whatever block size or block table either
 * device has; each side walks them in blocks of its own size.
 *
 * Locking: every unit that reads or writes the backend is made under the device lock with no
 * step in flight (dv_drain), as the backend seam asks. An exported sequence is pinned (dv_seq
 * pins) until its cursor closes. An import holds its sequence table entry, blocks and slots
 * under the id DV_SEQ_IMPORTING, invisible to everything else, until it finishes; a failure
 * at any point gives all of it back. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/sum64.h"
#include "device/core/core.h"
#include "device/status.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the state stream holds the cache's bytes as they are: little-endian targets only"
#endif

#define ST_MAGIC "DEVIOSEQ"
#define ST_VERSION 1u
#define ST_HEADER 160u
#define ST_SUM 8u
#define ST_TOKENS 1024u /* tokens a unit */
#define ST_HAS_SLOT 1u  /* flags: the state slot follows the K and V */

/* The header's fields (docs/state.md gives their offsets). */
typedef struct st_header {
    uint8_t fingerprint[32];
    uint32_t numerics, kv_elem;
    char producer[32];
    uint32_t n_attn, kv_dim;
    uint64_t slot_floats;
    uint32_t len, kv_from, flags, n_snaps;
    uint64_t total;
} st_header;

/* What the walk over the units needs: the header's counts and this device's block size. */
typedef struct st_plan {
    uint32_t len, kv_from, n_attn, bs, first_block, end_block, n_snaps;
    uint64_t row_bytes, slot_bytes;
    bool has_slot;
} st_plan;

typedef enum { U_HEADER, U_TOKENS, U_KV, U_SLOT, U_SNAP, U_SUM, U_END } st_unit;

typedef struct st_cursor {
    st_unit kind;
    uint32_t tok;                /* U_TOKENS: the unit's first token */
    uint32_t layer, half, block; /* U_KV: attention ordinal, 0 K 1 V, block entry */
    uint32_t snap;               /* U_SNAP */
} st_cursor;

/* ---- the walk ----------------------------------------------------------- */

/* Positions [r0, r1) of block entry b that the stream holds. */
static void block_rows(const st_plan *p, uint32_t b, uint32_t *r0, uint32_t *r1)
{
    uint32_t lo = b * p->bs, hi = lo + p->bs;
    *r0 = lo > p->kv_from ? lo : p->kv_from;
    *r1 = hi < p->len ? hi : p->len;
}

static uint64_t unit_bytes(const st_plan *p, const st_cursor *c)
{
    uint32_t r0, r1;
    switch (c->kind) {
    case U_HEADER: return ST_HEADER;
    case U_TOKENS: return (uint64_t)(p->len - c->tok < ST_TOKENS ? p->len - c->tok : ST_TOKENS) * 4u;
    case U_KV: block_rows(p, c->block, &r0, &r1); return (uint64_t)(r1 - r0) * p->row_bytes;
    case U_SLOT: return p->slot_bytes;
    case U_SNAP: return 8u + p->slot_bytes;
    case U_SUM: return ST_SUM;
    default: return 0;
    }
}

/* Skip the sections that are empty. */
static void settle(const st_plan *p, st_cursor *c)
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

static void next_unit(const st_plan *p, st_cursor *c)
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
    settle(p, c);
}

static st_plan plan_of(const devio_device *d, const st_header *h)
{
    uint32_t bs = d->cfg.block_size;
    return (st_plan){.len = h->len, .kv_from = h->kv_from, .n_attn = h->n_attn, .bs = bs,
                     .first_block = h->kv_from / bs, .end_block = (h->len + bs - 1) / bs,
                     .n_snaps = h->n_snaps, .row_bytes = (uint64_t)h->kv_dim * h->kv_elem,
                     .slot_bytes = h->slot_floats * sizeof(float),
                     .has_slot = (h->flags & ST_HAS_SLOT) != 0};
}

/* Bytes of the whole stream the plan describes. */
static uint64_t stream_bytes(const st_plan *p)
{
    uint64_t kv = (uint64_t)(p->len - p->kv_from) * p->row_bytes * 2u * p->n_attn;
    return ST_HEADER + (uint64_t)p->len * 4u + kv + (p->has_slot ? p->slot_bytes : 0) +
           (uint64_t)p->n_snaps * (8u + p->slot_bytes) + ST_SUM;
}

/* ---- the header ---------------------------------------------------------- */

static void put32(uint8_t *b, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        b[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *b, uint64_t v)
{
    put32(b, (uint32_t)v);
    put32(b + 4, (uint32_t)(v >> 32));
}

static uint32_t get32(const uint8_t *b)
{
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

static uint64_t get64(const uint8_t *b) { return get32(b) | (uint64_t)get32(b + 4) << 32; }

static void header_encode(const st_header *h, uint8_t *b)
{
    memset(b, 0, ST_HEADER);
    memcpy(b, ST_MAGIC, 8);
    put32(b + 8, ST_VERSION);
    put32(b + 12, ST_HEADER);
    memcpy(b + 16, h->fingerprint, 32);
    put32(b + 48, h->numerics);
    put32(b + 52, h->kv_elem);
    memcpy(b + 56, h->producer, 32);
    put32(b + 88, h->n_attn);
    put32(b + 92, h->kv_dim);
    put64(b + 96, h->slot_floats);
    put32(b + 104, h->len);
    put32(b + 108, h->kv_from);
    put32(b + 112, h->flags);
    put32(b + 116, h->n_snaps);
    put64(b + 120, h->total);
}

static void header_decode(const uint8_t *b, st_header *h)
{
    memcpy(h->fingerprint, b + 16, 32);
    h->numerics = get32(b + 48);
    h->kv_elem = get32(b + 52);
    memcpy(h->producer, b + 56, 32);
    h->producer[31] = '\0';
    h->n_attn = get32(b + 88);
    h->kv_dim = get32(b + 92);
    h->slot_floats = get64(b + 96);
    h->len = get32(b + 104);
    h->kv_from = get32(b + 108);
    h->flags = get32(b + 112);
    h->n_snaps = get32(b + 116);
    h->total = get64(b + 120);
}

/* What this device writes in a header: its model, numerics, KV element and producer. */
static void header_own(devio_device *d, st_header *h)
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
static devio_status header_check(devio_device *d, const uint8_t *b, uint64_t max_bytes,
                                 st_header *h, st_plan *p, devio_error *err)
{
    if (memcmp(b, ST_MAGIC, 8) != 0)
        return devio_fail(err, DEVIO_E_INVALID, "not a sequence state (no DEVIOSEQ magic)");
    if (get32(b + 8) != ST_VERSION || get32(b + 12) != ST_HEADER)
        return devio_fail(err, DEVIO_E_INVALID,
                          "sequence state format version %u; this devio reads version %u",
                          get32(b + 8), ST_VERSION);
    header_decode(b, h);
    st_header own;
    header_own(d, &own);
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
    *p = plan_of(d, h);
    if (h->total != stream_bytes(p))
        return devio_fail(err, DEVIO_E_INVALID, "the state says %llu bytes; its header makes %llu",
                          (unsigned long long)h->total, (unsigned long long)stream_bytes(p));
    if (max_bytes && h->total > max_bytes)
        return devio_fail(err, DEVIO_E_TOO_LARGE, "the state is %llu bytes, over the limit of %llu",
                          (unsigned long long)h->total, (unsigned long long)max_bytes);
    return DEVIO_OK;
}

/* One block's K or V half as the backend keeps it ([n_kv][bs][hd]) <-> rows [r0, r1) of the
 * stream ([position][n_kv * hd]), elem bytes an element. */
static void rows_move(const devio_device *d, uint8_t *raw, uint8_t *rows, uint32_t r0,
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
static uint32_t owned_snaps(const devio_device *d, const dv_seq *q, uint32_t *out)
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
static bool unit_buffers(const devio_device *d, uint8_t **rows, uint8_t **raw)
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

/* ---- export -------------------------------------------------------------- */

struct devio_export {
    devio_device *d;
    dv_seq *q;
    st_header h;
    st_plan p;
    st_cursor c;
    uint32_t *snaps; /* snapshot slots exported, by length */
    uint8_t *rows, *raw;
    uint64_t n, off; /* bytes of the current unit in rows, and those given out */
    devio_sum64 sum;
};

devio_status devio_export_open(devio_device *d, uint64_t seq, bool snapshots, devio_export **out,
                               uint64_t *bytes, devio_error *err)
{
    *out = NULL;
    devio_export *x = calloc(1, sizeof *x);
    if (!x || !(x->snaps = calloc(d->bcfg.ssm_snapshots + 1u, sizeof *x->snaps)) ||
        !unit_buffers(d, &x->rows, &x->raw)) {
        devio_export_close(x);
        return devio_fail(err, DEVIO_E_NOMEM, "out of memory for an export");
    }
    devio_status s = DEVIO_OK;
    dv_lock(d);
    dv_seq *q = d->torn_down ? NULL : dv_seq_find(d, seq);
    if (d->torn_down)
        s = devio_fail(err, DEVIO_E_TORN_DOWN, "device torn down");
    else if (!devio_backend_has_state_io(d->ops))
        s = devio_fail(err, DEVIO_E_UNSUPPORTED, "backend '%s' cannot read a sequence's state",
                       d->ops->name);
    else if (!q)
        s = devio_fail_at(err, DEVIO_E_UNKNOWN_SEQ, "seq", (int64_t)seq, "no sequence %llu",
                          (unsigned long long)seq);
    else if (q->busy) {
        s = devio_fail_at(err, DEVIO_E_SEQ_BUSY, "ticket", (int64_t)q->busy,
                          "sequence %llu is busy in ticket %llu", (unsigned long long)seq,
                          (unsigned long long)q->busy);
        if (err)
            err->ticket = q->busy;
    } else if (q->state_lost)
        s = devio_fail_at(err, DEVIO_E_DEVICE, "seq", (int64_t)seq,
                          "sequence %llu lost its state in a failed step", (unsigned long long)seq);
    if (s == DEVIO_OK) {
        header_own(d, &x->h);
        x->h.len = q->len;
        x->h.kv_from = q->n_released * d->cfg.block_size;
        x->h.flags = q->ssm_slot >= 0 ? ST_HAS_SLOT : 0u;
        x->h.n_snaps = snapshots && d->hybrid ? owned_snaps(d, q, x->snaps) : 0u;
        x->p = plan_of(d, &x->h);
        x->h.total = stream_bytes(&x->p);
        q->pins++;
        x->q = q;
    }
    dv_unlock(d);
    if (s != DEVIO_OK) {
        devio_export_close(x);
        return s;
    }
    x->d = d;
    x->c = (st_cursor){.kind = U_HEADER};
    devio_sum64_init(&x->sum, 0);
    *bytes = x->h.total;
    *out = x;
    return DEVIO_OK;
}

/* Make the cursor's unit in x->rows (lock held, nothing in flight). */
static devio_status export_unit(devio_export *x, devio_error *err)
{
    devio_device *d = x->d;
    const dv_seq *q = x->q;
    const st_cursor *c = &x->c;
    devio_status s = DEVIO_OK;
    x->n = unit_bytes(&x->p, c);
    if (c->kind == U_HEADER) {
        header_encode(&x->h, x->rows);
    } else if (c->kind == U_TOKENS) {
        for (uint32_t i = 0; i < x->n / 4u; i++)
            put32(x->rows + 4u * i, (uint32_t)q->toks[c->tok + i]);
    } else if (c->kind == U_KV) {
        devio_state_ref w = {.part = c->half ? DEVIO_STATE_V : DEVIO_STATE_K, .layer = c->layer,
                             .block = q->blocks[c->block]};
        uint32_t r0, r1;
        block_rows(&x->p, c->block, &r0, &r1);
        s = devio_backend_state_read(d->ops, d->backend, &d->bcfg, w, x->raw, err);
        rows_move(d, x->raw, x->rows, r0, r1, x->h.kv_elem, true);
    } else if (c->kind == U_SLOT || c->kind == U_SNAP) {
        uint8_t *at = x->rows;
        devio_ssm_ref r = {.snapshot = false, .index = (uint32_t)q->ssm_slot};
        if (c->kind == U_SNAP) {
            r = (devio_ssm_ref){.snapshot = true, .index = x->snaps[c->snap]};
            put32(at, d->snap_len[r.index]);
            put32(at + 4, 0);
            at += 8;
        }
        devio_state_ref w = {.part = DEVIO_STATE_SSM, .ssm = r};
        s = devio_backend_state_read(d->ops, d->backend, &d->bcfg, w, at, err);
    } else if (c->kind == U_SUM) {
        put64(x->rows, devio_sum64_final(&x->sum));
        return DEVIO_OK;
    }
    if (s == DEVIO_OK)
        devio_sum64_update(&x->sum, x->rows, (size_t)x->n);
    return s;
}

devio_status devio_export_read(devio_export *x, void *buf, size_t cap, size_t *n,
                               devio_error *err)
{
    *n = 0;
    while (*n < cap) {
        if (x->off == x->n) {
            if (x->c.kind == U_END)
                break;
            devio_device *d = x->d;
            dv_lock(d);
            devio_status s = d->torn_down ? devio_fail(err, DEVIO_E_TORN_DOWN, "device torn down")
                                          : DEVIO_OK;
            if (s == DEVIO_OK) {
                dv_drain(d);
                s = export_unit(x, err);
            }
            dv_unlock(d);
            if (s != DEVIO_OK)
                return s;
            x->off = 0;
            next_unit(&x->p, &x->c);
        }
        size_t k = (size_t)(x->n - x->off) < cap - *n ? (size_t)(x->n - x->off) : cap - *n;
        memcpy((uint8_t *)buf + *n, x->rows + x->off, k);
        x->off += k;
        *n += k;
    }
    return DEVIO_OK;
}

void devio_export_close(devio_export *x)
{
    if (!x)
        return;
    if (x->q) {
        dv_lock(x->d);
        x->q->pins--;
        dv_unlock(x->d);
    }
    free(x->snaps);
    free(x->rows);
    free(x->raw);
    free(x);
}

/* ---- import -------------------------------------------------------------- */

struct devio_import {
    devio_device *d;
    uint64_t max_bytes;
    st_header h;
    st_plan p;
    st_cursor c;
    dv_seq *q;         /* the entry held under DV_SEQ_IMPORTING, NULL before the header */
    uint32_t *snaps;   /* the snapshot slots taken, in the stream's order */
    uint32_t n_snaps;  /* of them taken */
    uint8_t *rows, *raw;
    uint64_t n;        /* bytes of the current unit gathered in rows */
    devio_sum64 sum;
    devio_status failed; /* DEVIO_OK until a call fails */
    devio_error why;
    bool live;         /* finished: the sequence is the device's */
};

devio_status devio_import_open(devio_device *d, uint64_t max_bytes, devio_import **out,
                               devio_error *err)
{
    *out = NULL;
    if (!devio_backend_has_state_io(d->ops))
        return devio_fail(err, DEVIO_E_UNSUPPORTED, "backend '%s' cannot write a sequence's state",
                          d->ops->name);
    devio_import *m = calloc(1, sizeof *m);
    if (!m || !(m->snaps = calloc(d->bcfg.ssm_snapshots + 1u, sizeof *m->snaps)) ||
        !unit_buffers(d, &m->rows, &m->raw)) {
        devio_import_close(m);
        return devio_fail(err, DEVIO_E_NOMEM, "out of memory for an import");
    }
    m->d = d;
    m->max_bytes = max_bytes;
    m->c = (st_cursor){.kind = U_HEADER};
    devio_sum64_init(&m->sum, 0);
    *out = m;
    return DEVIO_OK;
}

/* Give back everything m holds (lock held). */
static void import_drop(devio_import *m)
{
    devio_device *d = m->d;
    dv_seq *q = m->q;
    if (!q)
        return;
    for (uint32_t i = q->n_released; i < q->n_blocks; i++)
        devio_kv_pool_unref(&d->pool, q->blocks[i]);
    if (q->ssm_slot >= 0)
        dv_ssm_slot_put(d, q);
    for (uint32_t i = 0; i < m->n_snaps; i++)
        dv_snap_put(d, m->snaps[i]);
    free(q->toks);
    *q = (dv_seq){.blocks = q->blocks, .ssm_slot = -1};
    m->q = NULL;
    m->n_snaps = 0;
}

/* Take everything the header asks for (lock held): a table entry, the blocks, the slots. */
static devio_status import_reserve(devio_import *m, devio_error *err)
{
    devio_device *d = m->d;
    const st_plan *p = &m->p;
    dv_seq *q = NULL;
    for (uint32_t i = 0; i < d->cfg.max_seqs && !q; i++)
        if (!d->seqs[i].id)
            q = &d->seqs[i];
    uint32_t blocks = p->end_block - p->first_block;
    if (!q)
        return devio_fail_at(err, DEVIO_E_OUT_OF_SEQS, "max_seqs", d->cfg.max_seqs,
                             "all %u sequence slots are in use", d->cfg.max_seqs);
    if (blocks > d->pool.n_free)
        return devio_fail_at(err, DEVIO_E_OUT_OF_KV_BLOCKS, "needed", blocks,
                             "the state needs %u KV blocks; %u are free", blocks, d->pool.n_free);
    if (p->has_slot && d->n_ssm_free == 0)
        return devio_fail_at(err, DEVIO_E_OUT_OF_SSM_SLOTS, "ssm_slots", d->bcfg.ssm_slots,
                             "all %u SSM state slots are in use", d->bcfg.ssm_slots);
    if (p->n_snaps > d->n_snap_free)
        return devio_fail_at(err, DEVIO_E_OUT_OF_SNAPSHOTS, "needed", p->n_snaps,
                             "the state has %u snapshots; %u snapshot slots are free", p->n_snaps,
                             d->n_snap_free);
    if (!dv_seq_toks_reserve(d, q, p->len))
        return devio_fail(err, DEVIO_E_NOMEM, "out of memory for the token record");
    q->id = DV_SEQ_IMPORTING;
    q->len = p->len;
    q->n_blocks = p->end_block;
    q->n_released = p->first_block;
    q->busy = 0;
    q->pins = 0;
    q->state_lost = false;
    q->ssm_slot = -1;
    for (uint32_t i = 0; i < q->n_blocks; i++)
        q->blocks[i] = i < q->n_released ? DEVIO_KV_BLOCK_RELEASED : devio_kv_pool_take(&d->pool);
    m->q = q;
    if (p->has_slot)
        dv_ssm_slot_take(d, q);
    for (; m->n_snaps < p->n_snaps; m->n_snaps++)
        m->snaps[m->n_snaps] = dv_snap_take(d, q, 0);
    return DEVIO_OK;
}

/* Take in the unit gathered in m->rows (lock held, nothing in flight). */
static devio_status import_unit(devio_import *m, devio_error *err)
{
    devio_device *d = m->d;
    const st_cursor *c = &m->c;
    if (c->kind == U_HEADER) {
        devio_status s = header_check(d, m->rows, m->max_bytes, &m->h, &m->p, err);
        return s != DEVIO_OK ? s : import_reserve(m, err);
    }
    dv_seq *q = m->q;
    if (c->kind == U_TOKENS) {
        for (uint32_t i = 0; i < m->n / 4u; i++) {
            uint32_t t = get32(m->rows + 4u * i);
            if (t >= d->vocab)
                return devio_fail(err, DEVIO_E_INVALID,
                                  "the state's token %u at position %u is outside the "
                                  "vocabulary", t, c->tok + i);
            q->toks[c->tok + i] = (int32_t)t;
        }
        return DEVIO_OK;
    }
    if (c->kind == U_KV) {
        uint32_t r0, r1;
        block_rows(&m->p, c->block, &r0, &r1);
        memset(m->raw, 0, (size_t)devio_state_part_bytes(&d->bcfg, d->kv_elem, DEVIO_STATE_K));
        rows_move(d, m->raw, m->rows, r0, r1, m->h.kv_elem, false);
        devio_state_ref w = {.part = c->half ? DEVIO_STATE_V : DEVIO_STATE_K, .layer = c->layer,
                             .block = q->blocks[c->block]};
        return devio_backend_state_write(d->ops, d->backend, &d->bcfg, w, m->raw, err);
    }
    if (c->kind == U_SLOT || c->kind == U_SNAP) {
        const uint8_t *at = m->rows;
        devio_ssm_ref r = {.snapshot = false, .index = (uint32_t)q->ssm_slot};
        if (c->kind == U_SNAP) {
            uint32_t len = get32(at), prev = c->snap ? d->snap_len[m->snaps[c->snap - 1]] : 0;
            if (len == 0 || len > q->len || len <= prev || get32(at + 4) != 0)
                return devio_fail(err, DEVIO_E_INVALID,
                                  "the state's snapshot %u is at length %u (after %u, of %u)",
                                  c->snap, len, prev, q->len);
            r = (devio_ssm_ref){.snapshot = true, .index = m->snaps[c->snap]};
            d->snap_len[r.index] = len;
            at += 8;
        }
        devio_state_ref w = {.part = DEVIO_STATE_SSM, .ssm = r};
        return devio_backend_state_write(d->ops, d->backend, &d->bcfg, w, at, err);
    }
    if (devio_sum64_final(&m->sum) != get64(m->rows))
        return devio_fail(err, DEVIO_E_INVALID,
                          "the state's checksum does not match its bytes (altered or cut)");
    return DEVIO_OK;
}

/* Record a failure: everything given back, every later call refused the same way. */
static devio_status import_fail(devio_import *m, devio_status s, const devio_error *err)
{
    m->failed = s;
    if (err)
        m->why = *err;
    else
        devio_fail(&m->why, s, "the import failed");
    dv_lock(m->d);
    import_drop(m);
    dv_unlock(m->d);
    return s;
}

devio_status devio_import_write(devio_import *m, const void *buf, size_t n, devio_error *err)
{
    devio_error local;
    devio_error *e = err ? err : &local;
    if (m->failed != DEVIO_OK) {
        *e = m->why;
        return m->failed;
    }
    const uint8_t *in = buf;
    while (n > 0) {
        if (m->c.kind == U_END)
            return import_fail(m, devio_fail(e, DEVIO_E_INVALID,
                                             "bytes past the end of the state (%llu bytes)",
                                             (unsigned long long)m->h.total),
                               e);
        uint64_t need = unit_bytes(&m->p, &m->c);
        size_t k = (size_t)(need - m->n) < n ? (size_t)(need - m->n) : n;
        memcpy(m->rows + m->n, in, k);
        m->n += k;
        in += k;
        n -= k;
        if (m->n < need)
            break;
        if (m->c.kind != U_SUM)
            devio_sum64_update(&m->sum, m->rows, (size_t)need);
        devio_device *d = m->d;
        dv_lock(d);
        devio_status s = d->torn_down ? devio_fail(e, DEVIO_E_TORN_DOWN, "device torn down")
                                      : DEVIO_OK;
        if (s == DEVIO_OK) {
            if (m->c.kind != U_HEADER && m->c.kind != U_TOKENS && m->c.kind != U_SUM)
                dv_drain(d);
            s = import_unit(m, e);
        }
        dv_unlock(d);
        if (s != DEVIO_OK)
            return import_fail(m, s, e);
        m->n = 0;
        next_unit(&m->p, &m->c);
    }
    return DEVIO_OK;
}

devio_status devio_import_finish(devio_import *m, uint64_t *seq, devio_error *err)
{
    if (m->failed != DEVIO_OK) {
        if (err)
            *err = m->why;
        return m->failed;
    }
    if (m->c.kind != U_END) {
        devio_error local;
        devio_error *e = err ? err : &local;
        return import_fail(m, devio_fail(e, DEVIO_E_INVALID, "the state was cut short%s",
                                         m->c.kind == U_HEADER ? " (no whole header)" : ""),
                           e);
    }
    devio_device *d = m->d;
    dv_lock(d);
    m->q->id = dv_new_seq_id(d);
    *seq = m->q->id;
    m->live = true;
    dv_unlock(d);
    return DEVIO_OK;
}

void devio_import_close(devio_import *m)
{
    if (!m)
        return;
    if (m->d && !m->live) {
        dv_lock(m->d);
        import_drop(m);
        dv_unlock(m->d);
    }
    free(m->snaps);
    free(m->rows);
    free(m->raw);
    free(m);
}
