/* state_stream.h - the state stream of docs/state.md as the core's files share it: the header
 * and its fields, the walk over the stream's units, the byte helpers, and the export and import
 * cursors (state_io.c the format, state_export.c and state_import.c the cursors, state_park.c
 * the park and restore effects). The stream's K and V rows are position-major, whatever block
 * size or block table either device has; each side walks them in blocks of its own size. Private
 * to device/core; functions that take a device expect its lock held unless they say otherwise. */
#ifndef DEVIO_STATE_STREAM_H
#define DEVIO_STATE_STREAM_H

#include <stdbool.h>
#include <stdint.h>

#include "common/sum64.h"
#include "device/core/core.h"

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

static inline void st_put32(uint8_t *b, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        b[i] = (uint8_t)(v >> (8 * i));
}

static inline void st_put64(uint8_t *b, uint64_t v)
{
    st_put32(b, (uint32_t)v);
    st_put32(b + 4, (uint32_t)(v >> 32));
}

static inline uint32_t st_get32(const uint8_t *b)
{
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

static inline uint64_t st_get64(const uint8_t *b)
{
    return st_get32(b) | (uint64_t)st_get32(b + 4) << 32;
}

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

struct devio_import {
    devio_device *d;
    uint64_t max_bytes;
    st_header h;
    st_plan p;
    st_cursor c;
    dv_seq *q;         /* the entry held under DV_SEQ_IMPORTING, NULL before the header */
    dv_seq *target;    /* restore: the parked sequence's own entry, else NULL */
    bool locked;       /* the caller holds the device lock and nothing is in flight */
    uint32_t *snaps;   /* the snapshot slots taken, in the stream's order */
    uint32_t n_snaps;  /* of them taken */
    uint8_t *rows, *raw;
    uint64_t n;        /* bytes of the current unit gathered in rows */
    devio_sum64 sum;
    devio_status failed; /* DEVIO_OK until a call fails */
    devio_error why;
    bool live;         /* finished: the sequence is the device's */
};

/* ---- the walk (state_io.c) ----------------------------------------------- */

/* Positions [r0, r1) of block entry b that the stream holds. */
void st_block_rows(const st_plan *p, uint32_t b, uint32_t *r0, uint32_t *r1);
/* Bytes of the unit c stands on. */
uint64_t st_unit_bytes(const st_plan *p, const st_cursor *c);
/* c on to the next unit, past the empty sections; U_END after the checksum. */
void st_next_unit(const st_plan *p, st_cursor *c);
/* The walk of a stream with header h on device d (its block size). */
st_plan st_plan_of(const devio_device *d, const st_header *h);
/* Bytes of the whole stream p describes. */
uint64_t st_stream_bytes(const st_plan *p);

/* ---- the header (state_io.c) --------------------------------------------- */

void st_header_encode(const st_header *h, uint8_t *b);
void st_header_decode(const uint8_t *b, st_header *h);
/* What d writes in a header: its model, numerics, KV element, producer and shape. */
void st_header_own(devio_device *d, st_header *h);
/* A header's ST_HEADER bytes at b against d and the limit max_bytes (0: none); fills h, p. */
devio_status st_header_check(devio_device *d, const uint8_t *b, uint64_t max_bytes,
                             st_header *h, st_plan *p, devio_error *err);

/* ---- units (state_io.c) --------------------------------------------------- */

/* One block's K or V half as the backend keeps it ([n_kv][bs][hd]) <-> rows [r0, r1) of the
 * stream ([position][n_kv * hd]), elem bytes an element. */
void st_rows_move(const devio_device *d, uint8_t *raw, uint8_t *rows, uint32_t r0, uint32_t r1,
                  uint32_t elem, bool to_rows);
/* The snapshot slots q owns, by length ascending, into out (at most ssm_snapshots). */
uint32_t st_owned_snaps(const devio_device *d, const dv_seq *q, uint32_t *out);
/* Buffers for a unit: the stream's side (rows) and the backend's (raw); false when out of
 * memory (whatever was made is in *rows and *raw, for free). */
bool st_unit_buffers(const devio_device *d, uint8_t **rows, uint8_t **raw);

/* ---- the cursors' inner steps (state_export.c, state_import.c) ----------- */

/* Fill x's header and walk for sequence q (with its snapshots when `snapshots`). */
void st_export_begin(devio_export *x, devio_device *d, dv_seq *q, bool snapshots);
/* Make x's current unit in x->rows (nothing in flight). */
devio_status st_export_unit(devio_export *x, devio_error *err);
/* Feed n bytes to m; with m->locked the caller holds the lock and nothing is in flight. */
devio_status st_import_feed(devio_import *m, const void *buf, size_t n, devio_error *err);
/* Give back everything m holds: for a restore, its target back to parked. */
void st_import_drop(devio_import *m);

#endif
