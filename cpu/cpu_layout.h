/* cpu_layout.h - where the cpu backend's packed weights and rounded activations keep each value
 * (cpu/cpu_gemm.c packs, rounds and multiplies by these): sweeps of 128 elements, rows in fours,
 * the order of the quants within a sweep. Static inline functions only; included by cpu_gemm.c.
 * Ownership: every function reads a ref_panels it borrows. */
#ifndef DEVIO_CPU_LAYOUT_H
#define DEVIO_CPU_LAYOUT_H

#include <stdbool.h>
#include <stdint.h>

#include "device/model/model.h"
#include "device/numerics/quant.h"
#include "ref/ref_gemm.h"

/* A unit is 16 elements (a Q6_K group, half of any other type's group of
 * 32); a row is padded with zeros to whole sweeps of 8 units (128
 * elements), the width the kernels sweep. */
#define UNIT 16u
#define SWEEP 128u

/* Whether w was packed by cpu_gemm.c's ref_panels_pack (a quantized weight whose
 * scales fit binary16), not by the reference's (qgroups 1 or 2 there). */
static inline bool fast(const ref_panels *w)
{
    return devio_dtype_quantized(w->dtype) && w->qgroups >= UNIT;
}

/* A packed row's width in elements: whole sweeps. */
static inline uint32_t width_of(uint32_t n)
{
    return (n + SWEEP - 1u) / SWEEP * SWEEP;
}

/* Whether the type keeps two quants a byte (its q in 0..15 after the shift). */
static inline bool nibbles(uint32_t t)
{
    return t == DEVIO_QT_Q4_0 || t == DEVIO_QT_Q4_1 || t == DEVIO_QT_Q4_K;
}

/* The same of a weight's dtype, without a call (the kernels ask per four). */
static inline bool nib_dtype(devio_dtype d)
{
    return d == DEVIO_Q4_0 || d == DEVIO_Q4_1 || d == DEVIO_Q4_K;
}

/* Bytes of quants one row has in a sweep, and its binary16 scales there
 * (offsets: one per group of 32, four a sweep). */
static inline uint32_t sweep_bytes(const ref_panels *p)
{
    return nib_dtype(p->dtype) ? SWEEP / 2u : SWEEP;
}

static inline uint32_t sweep_scales_n(const ref_panels *p)
{
    return SWEEP / p->qgroups;
}

#define SWEEP_OFFSETS (SWEEP / 32u)

static inline uint32_t sweeps_of(const ref_panels *p)
{
    return p->k32 * 32u / SWEEP;
}

/* Rows are kept in fours, each four's sweeps side by side (row 0's sweep s,
 * row 1's, row 2's, row 3's, then sweep s + 1): a four is one stream, as a
 * step reads it. Row o's quants of sweep s: */
static inline uint8_t *quants_at(const ref_panels *p, uint32_t o, uint32_t s)
{
    uint32_t sb = sweep_bytes(p);
    return (uint8_t *)p->data + ((size_t)(o / 4u) * sweeps_of(p) + s) * 4u * sb + (o % 4u) * sb;
}

/* Row o's `per` binary16 values of sweep s in the array at base. */
static inline uint16_t *halves_at(const ref_panels *p, const float *base, uint32_t per, uint32_t o,
                           uint32_t s)
{
    return (uint16_t *)(void *)base + ((size_t)(o / 4u) * sweeps_of(p) + s) * 4u * per +
           (o % 4u) * per;
}

/* Where element e (0..127) of a sweep sits in the sweep's lane order: in
 * chunk (e % 16) / 4 of 32, at lane e / 16 (its unit), byte e % 4. A
 * 32-byte chunk then holds four elements of each of the eight units, and
 * an integer dot product that sums four neighbouring bytes into a 32-bit
 * lane (vpmaddubsw then vpmaddwd) leaves unit k's sum in lane
 * k: no horizontal folds. 4-bit quants keep position i (0..63) in byte i's
 * low nibble, position 64 + i in its high nibble. */
static inline uint32_t lane_pos(uint32_t e)
{
    return (e % UNIT) / 4u * 32u + e / UNIT * 4u + e % 4u;
}

/* int8 quants are widened to int16 and summed in pairs (vpmaddwd), so a
 * unit's four elements of a chunk fill two lanes; their chunks keep the
 * units in the order 0 1 4 5 2 3 6 7, so that adding neighbouring lanes of
 * the first halves' sums and of the second halves' (vphaddd) leaves unit k
 * in lane k again. Element e's place in a sweep of int8 quants, and of the
 * activations as int16 beside them: */
static inline uint32_t i8_pos(uint32_t e)
{
    static const uint8_t slot[8] = {0, 1, 4, 5, 2, 3, 6, 7};
    return (e % UNIT) / 4u * 32u + slot[e / UNIT] * 4u + e % 4u;
}

/* Where element e of a sweep sits among a weight's quants. */
static inline uint32_t quant_pos(bool nib, uint32_t e)
{
    return nib ? lane_pos(e) : i8_pos(e);
}

#endif
