/* cpu_layout.h - where the cpu backend's packed weights and rounded activations keep each value
 * (cpu/cpu_gemm.c packs, rounds and multiplies by these): sweeps of 128 elements, rows in fours,
 * the order of the quants within a sweep. Static inline functions only; included by cpu_gemm.c.
 * Ownership: every function reads a ref_panels it borrows. */
#ifndef DEVIO_CPU_LAYOUT_H
#define DEVIO_CPU_LAYOUT_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

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

/* How a type's quants are kept, each as q + quant_shift, which is then
 * unsigned: PK_NIB 4 bits, two a byte; PK_FIVE and PK_SIX 5 and 6 bits,
 * their low 4 bits as PK_NIB's and after them a plane of their high bit
 * (one) or bits (two); PK_I8 one int8 a byte (Q8_0). So a step streams 4.5
 * to 7 bits a weight, about the file's (4.5 to 6.6), not a widened form. */
typedef enum { PK_NIB, PK_FIVE, PK_SIX, PK_I8 } pack_kind;

static inline pack_kind kind_of(devio_dtype d)
{
    switch (d) {
    case DEVIO_Q4_0:
    case DEVIO_Q4_1:
    case DEVIO_Q4_K:
        return PK_NIB;
    case DEVIO_Q5_0:
    case DEVIO_Q5_1:
    case DEVIO_Q5_K:
        return PK_FIVE;
    case DEVIO_Q6_K:
        return PK_SIX;
    default:
        return PK_I8;
    }
}

/* What is added to a type's q (device/numerics/quant.h's split form) to
 * keep it unsigned: Q4_0's 8, Q5_0's 16 and Q6_K's 32, each taken back out
 * of each unit's integer sum as the activations' sum over the unit times
 * the shift (the other types' q are unsigned already). */
static inline int quant_shift(devio_dtype d)
{
    return d == DEVIO_Q4_0 ? 8 : d == DEVIO_Q5_0 ? 16 : d == DEVIO_Q6_K ? 32 : 0;
}

/* Bytes of quants one row has in a sweep, and its binary16 scales there
 * (offsets: one per group of 32, four a sweep). */
static inline uint32_t sweep_bytes(const ref_panels *p)
{
    pack_kind k = kind_of(p->dtype);
    return k == PK_NIB    ? SWEEP / 2u
           : k == PK_FIVE ? SWEEP / 2u + SWEEP / 8u
           : k == PK_SIX  ? SWEEP / 2u + SWEEP / 4u
                          : SWEEP;
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

/* Whether a row's last sweep holds at most 64 elements (units 0-3: n 576
 * of SmolLM2 is 4.5 sweeps). Then only the bytes of those units are kept
 * for it, tail_bytes of them (tail_byte's places), and a step streams the
 * file's bytes, not 11% more of zeros; a kernel expands the tail back to a
 * whole sweep (expand_tail) before it reads it. The K-quants' rows are
 * whole sweeps. */
static inline bool half_tail(const ref_panels *p)
{
    return p->n % SWEEP != 0 && p->n % SWEEP <= SWEEP / 2u && kind_of(p->dtype) != PK_SIX;
}

/* Where a whole sweep's byte b is kept in a half tail, or -1 when it holds
 * only units 4-7: the low planes' bytes 0-15 and 32-47 (lane_pos: units 0-3
 * are a chunk's first 16 bytes, and byte i holds positions i and 64 + i),
 * PK_FIVE's plane of high bits (64-79) after them, and int8 quants' low 8
 * bytes of each group of 16 (i8_pos). */
static inline int tail_byte(pack_kind k, uint32_t b)
{
    if (k == PK_I8)
        return b % 16u < 8u ? (int)(b / 16u * 8u + b % 16u) : -1;
    if (b >= 64u)
        return (int)(b - 32u);
    return b % 32u < 16u ? (int)(b / 32u * 16u + b % 32u) : -1;
}

static inline uint32_t tail_bytes(const ref_panels *p)
{
    return half_tail(p) ? sweep_bytes(p) / 2u + (kind_of(p->dtype) == PK_FIVE ? 8u : 0u)
                        : sweep_bytes(p);
}

/* Bytes of quants one row keeps: whole sweeps, the last perhaps a half tail. */
static inline size_t row_quant_bytes(const ref_panels *p)
{
    return (size_t)(sweeps_of(p) - 1u) * sweep_bytes(p) + tail_bytes(p);
}

/* Rows are kept in fours, each four's sweeps side by side (row 0's sweep s,
 * row 1's, row 2's, row 3's, then sweep s + 1): a four is one stream, as a
 * step reads it. Row o's quants of sweep s (of tail_bytes for the last): */
static inline uint8_t *quants_at(const ref_panels *p, uint32_t o, uint32_t s)
{
    uint32_t sb = sweep_bytes(p), last = s + 1u == sweeps_of(p) ? tail_bytes(p) : sb;
    return (uint8_t *)p->data + (size_t)(o / 4u) * 4u * row_quant_bytes(p) +
           (size_t)s * 4u * sb + (o % 4u) * last;
}

/* A half tail's kept bytes at t as the whole sweep they are part of, at w
 * (sweep_bytes; zeros where units 4-7 would be): tail_byte's places read
 * back, a run of them at a time. */
static inline void expand_tail(const ref_panels *p, const uint8_t *t, uint8_t *w)
{
    pack_kind k = kind_of(p->dtype);
    memset(w, 0, sweep_bytes(p));
    if (k == PK_I8) {
        for (uint32_t g = 0; g < 8u; g++)
            memcpy(w + 16u * g, t + 8u * g, 8u);
        return;
    }
    memcpy(w, t, 16u);
    memcpy(w + 32u, t + 16u, 16u);
    if (k == PK_FIVE)
        memcpy(w + 64u, t + 32u, 16u);
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
 * low nibble, position 64 + i in its high nibble; PK_SIX keeps position p's
 * two high bits in byte 64 + p % 32 of the sweep, at bits 2 (p / 32), so
 * that chunk c's are one shift and a mask away from bits 4 and 5; PK_FIVE
 * keeps position p's high bit in byte 64 + p % 16, at bit p / 32 for
 * p % 32 below 16 and bit 4 + p / 32 above: the 16 bytes loaded into both
 * halves of a register, chunk c's bits are one shift a half away from bit
 * 4 (high_pos). */
static inline uint32_t lane_pos(uint32_t e)
{
    return (e % UNIT) / 4u * 32u + e / UNIT * 4u + e % 4u;
}

/* int8 quants are widened to int16 and summed in pairs (vpmaddwd), so a
 * unit's elements fill a lane two at a time: a group of 16 (one 16-byte
 * load, widened to a register of int16) holds elements 2j and 2j + 1 of each
 * unit, unit by unit, and a sweep's eight groups summed leave unit k in lane
 * k. Element e's place in a sweep of int8 quants, of the activations as
 * int16 beside them, and of any type's quants widened to int16 for a batch
 * of tokens (cpu_gemm.c's wide tiles): */
static inline uint32_t i8_pos(uint32_t e)
{
    return (e % UNIT) / 2u * 16u + e / UNIT * 2u + e % 2u;
}

/* PK_SIX: the byte (after the 64 of low bits) and the lowest bit of
 * position p's two high bits. */
static inline uint32_t high6_byte(uint32_t p)
{
    return 64u + p % 32u;
}

static inline uint32_t high6_bit(uint32_t p)
{
    return 2u * (p / 32u);
}

/* PK_FIVE: the byte (after the 64 of low bits) and the bit of position p's
 * high bit. */
static inline uint32_t high5_byte(uint32_t p)
{
    return 64u + p % 16u;
}

static inline uint32_t high5_bit(uint32_t p)
{
    return p / 32u + (p % 32u >= 16u ? 4u : 0u);
}

/* Where element e of a sweep sits among a weight's quants. */
static inline uint32_t quant_pos(pack_kind k, uint32_t e)
{
    return k == PK_I8 ? i8_pos(e) : lane_pos(e);
}

#endif
