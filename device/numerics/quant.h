/* quant.h - the value of every element of GGUF's block-quantized weight types in binary32, as
 * devio defines it (device/numerics/numspec.h, "Quantized weights"; docs/numerics.md): the scales are
 * widened from f16 exactly, the quants are small integers (exact in binary32), and each
 * multiply, add and subtract is rounded once, in the order written below. Every backend forms
 * a weight this way and then follows the lane rule as for 16-bit weights, so the bits are the
 * same everywhere. Header-only (host and CUDA device code), like numerics.h; never allocates. */
#ifndef DEVIO_QUANT_H
#define DEVIO_QUANT_H

#include <stdint.h>

#include "device/numerics/numerics.h"

/* ggml's numbering of the types below (device/model/gguf.h names them too). */
enum {
    DEVIO_QT_Q4_0 = 2,
    DEVIO_QT_Q4_1 = 3,
    DEVIO_QT_Q5_0 = 6,
    DEVIO_QT_Q5_1 = 7,
    DEVIO_QT_Q8_0 = 8,
    DEVIO_QT_Q4_K = 12,
    DEVIO_QT_Q5_K = 13,
    DEVIO_QT_Q6_K = 14,
};

DEVIO_NUM_FN uint16_t devio_q_u16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (uint16_t)p[1] << 8);
}

DEVIO_NUM_FN float devio_q_f16(const uint8_t *p)
{
    return devio_f16_to_f32(devio_q_u16(p));
}

/* Q8_0, 32 elements in 34 bytes: f16 d, int8 q[32]. y = d * q. */
DEVIO_NUM_FN void devio_dequant_q8_0(const uint8_t *b, float *y)
{
    float d = devio_q_f16(b);
    for (int j = 0; j < 32; j++)
        y[j] = DEVIO_MUL(d, (float)(int8_t)b[2 + j]);
}

/* Q4_0 and Q4_1, 32 elements: f16 d (Q4_1: then f16 m), 16 bytes of
 * nibbles, element j < 16 the low nibble of byte j and element j + 16 its
 * high nibble. Q4_0: y = d * (q - 8); Q4_1: y = (d * q) + m. */
DEVIO_NUM_FN void devio_dequant_q4(const uint8_t *b, int with_min, float *y)
{
    float d = devio_q_f16(b), m = with_min ? devio_q_f16(b + 2) : 0.0f;
    const uint8_t *qs = b + (with_min ? 4 : 2);
    for (int j = 0; j < 16; j++) {
        int lo = qs[j] & 0xF, hi = qs[j] >> 4;
        if (with_min) {
            y[j] = DEVIO_ADD(DEVIO_MUL(d, (float)lo), m);
            y[j + 16] = DEVIO_ADD(DEVIO_MUL(d, (float)hi), m);
        } else {
            y[j] = DEVIO_MUL(d, (float)(lo - 8));
            y[j + 16] = DEVIO_MUL(d, (float)(hi - 8));
        }
    }
}

/* Q5_0 and Q5_1, 32 elements: f16 d (Q5_1: then f16 m), a little-endian
 * uint32 qh of fifth bits (bit j for element j), 16 bytes of nibbles as in
 * Q4. Q5_0: y = d * (q - 16); Q5_1: y = (d * q) + m. */
DEVIO_NUM_FN void devio_dequant_q5(const uint8_t *b, int with_min, float *y)
{
    float d = devio_q_f16(b), m = with_min ? devio_q_f16(b + 2) : 0.0f;
    const uint8_t *h = b + (with_min ? 4 : 2), *qs = h + 4;
    uint32_t qh = (uint32_t)h[0] | (uint32_t)h[1] << 8 | (uint32_t)h[2] << 16 |
                  (uint32_t)h[3] << 24;
    for (int j = 0; j < 16; j++) {
        int lo = (qs[j] & 0xF) | (int)((qh >> j) & 1u) << 4;
        int hi = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1u) << 4;
        if (with_min) {
            y[j] = DEVIO_ADD(DEVIO_MUL(d, (float)lo), m);
            y[j + 16] = DEVIO_ADD(DEVIO_MUL(d, (float)hi), m);
        } else {
            y[j] = DEVIO_MUL(d, (float)(lo - 16));
            y[j + 16] = DEVIO_MUL(d, (float)(hi - 16));
        }
    }
}

/* The 6-bit scale and min of sub-block j (0..7) of a Q4_K or Q5_K block
 * from its 12 packed bytes: j < 4 in the low 6 bits of bytes j and j + 4;
 * else the low nibbles (scale) and high nibbles (min) of byte j + 4, with
 * their top two bits in the high bits of bytes j - 4 and j. */
DEVIO_NUM_FN void devio_q_scale_min_k(const uint8_t *s, int j, int *sc, int *mn)
{
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* Q4_K and Q5_K, 256 elements in 8 sub-blocks of 32: f16 d, f16 dmin, 12
 * bytes of scales and mins, (Q5_K: 32 bytes qh,) 128 bytes of nibbles.
 * Chunk c (0..3) of 64: elements 64c + l take the low nibble of byte
 * 32c + l with sub-block 2c, elements 64c + 32 + l its high nibble with
 * sub-block 2c + 1; Q5_K adds 16 when bit 2c (or 2c + 1) of qh[l] is set.
 * d1 = d * sc, m1 = dmin * mn, y = (d1 * q) - m1. */
DEVIO_NUM_FN void devio_dequant_qk(const uint8_t *b, int five, float *y)
{
    float d = devio_q_f16(b), dmin = devio_q_f16(b + 2);
    const uint8_t *s = b + 4, *qh = b + 16, *qs = b + (five ? 48 : 16);
    for (int c = 0; c < 4; c++)
        for (int half = 0; half < 2; half++) {
            int sc, mn;
            devio_q_scale_min_k(s, 2 * c + half, &sc, &mn);
            float d1 = DEVIO_MUL(d, (float)sc), m1 = DEVIO_MUL(dmin, (float)mn);
            for (int l = 0; l < 32; l++) {
                int q = half ? qs[32 * c + l] >> 4 : qs[32 * c + l] & 0xF;
                if (five && ((qh[l] >> (2 * c + half)) & 1))
                    q += 16;
                y[64 * c + 32 * half + l] = DEVIO_SUB(DEVIO_MUL(d1, (float)q), m1);
            }
        }
}

/* Q6_K, 256 elements: 128 bytes ql (low nibbles), 64 bytes qh (2 high bits
 * each), 16 int8 scales (one per 16 elements), f16 d last. Half h (0, 1) of
 * 128 elements reads ql + 64h, qh + 32h, scales + 8h; for l < 32 its
 * elements l, l + 32, l + 64, l + 96 take ql[l] low, ql[l + 32] low, ql[l]
 * high, ql[l + 32] high, with bits 0-1, 2-3, 4-5, 6-7 of qh[l] above them,
 * minus 32, and the scale of their 16. y = (d * sc) * q. */
DEVIO_NUM_FN void devio_dequant_q6_k(const uint8_t *b, float *y)
{
    float d = devio_q_f16(b + 208);
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;
        const int8_t *sc = (const int8_t *)(b + 192 + 8 * h);
        float *out = y + 128 * h;
        for (int l = 0; l < 32; l++) {
            int q[4] = {(ql[l] & 0xF) | ((qh[l] >> 0) & 3) << 4,
                        (ql[l + 32] & 0xF) | ((qh[l] >> 2) & 3) << 4,
                        (ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4,
                        (ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4};
            for (int k = 0; k < 4; k++) {
                float d1 = DEVIO_MUL(d, (float)sc[l / 16 + 2 * k]);
                out[l + 32 * k] = DEVIO_MUL(d1, (float)(q[k] - 32));
            }
        }
    }
}

/* Elements per block of type t (32 or 256), 0 for a type not defined here. */
DEVIO_NUM_FN uint32_t devio_quant_block(uint32_t t)
{
    switch (t) {
    case DEVIO_QT_Q4_0: case DEVIO_QT_Q4_1: case DEVIO_QT_Q5_0: case DEVIO_QT_Q5_1:
    case DEVIO_QT_Q8_0:
        return 32;
    case DEVIO_QT_Q4_K: case DEVIO_QT_Q5_K: case DEVIO_QT_Q6_K:
        return 256;
    default:
        return 0;
    }
}

/* Bytes of one block of type t, 0 for a type not defined here. */
DEVIO_NUM_FN uint32_t devio_quant_block_bytes(uint32_t t)
{
    switch (t) {
    case DEVIO_QT_Q4_0: return 18;
    case DEVIO_QT_Q4_1: return 20;
    case DEVIO_QT_Q5_0: return 22;
    case DEVIO_QT_Q5_1: return 24;
    case DEVIO_QT_Q8_0: return 34;
    case DEVIO_QT_Q4_K: return 144;
    case DEVIO_QT_Q5_K: return 176;
    case DEVIO_QT_Q6_K: return 210;
    default: return 0;
    }
}

/* One block of type t at b into y[devio_quant_block(t)]. */
DEVIO_NUM_FN void devio_dequant_block(uint32_t t, const uint8_t *b, float *y)
{
    switch (t) {
    case DEVIO_QT_Q8_0: devio_dequant_q8_0(b, y); break;
    case DEVIO_QT_Q4_0: devio_dequant_q4(b, 0, y); break;
    case DEVIO_QT_Q4_1: devio_dequant_q4(b, 1, y); break;
    case DEVIO_QT_Q5_0: devio_dequant_q5(b, 0, y); break;
    case DEVIO_QT_Q5_1: devio_dequant_q5(b, 1, y); break;
    case DEVIO_QT_Q4_K: devio_dequant_qk(b, 0, y); break;
    case DEVIO_QT_Q5_K: devio_dequant_qk(b, 1, y); break;
    case DEVIO_QT_Q6_K: devio_dequant_q6_k(b, y); break;
    default: break;
    }
}

/* n elements (a whole number of blocks) of type t from src into y. */
DEVIO_NUM_FN void devio_dequant_row(uint32_t t, const uint8_t *src, float *y, uint64_t n)
{
    uint32_t blk = devio_quant_block(t), bytes = devio_quant_block_bytes(t);
    for (uint64_t i = 0; blk && i + blk <= n; i += blk, src += bytes)
        devio_dequant_block(t, src, y + i);
}

/* Elements that share one scale in the split form below: 16 for Q6_K, 32
 * for the others (a Q4_K/Q5_K sub-block, or a whole 32-element block). */
DEVIO_NUM_FN uint32_t devio_quant_group(uint32_t t)
{
    return t == DEVIO_QT_Q6_K ? 16u : 32u;
}

/* Whether the split form has an offset: y = S * q + M rather than S * q. */
DEVIO_NUM_FN int devio_quant_has_offset(uint32_t t)
{
    return t == DEVIO_QT_Q4_1 || t == DEVIO_QT_Q5_1 || t == DEVIO_QT_Q4_K || t == DEVIO_QT_Q5_K;
}

/* One block in a form that kernels widen cheaply and exactly: per element
 * an integer q[i] (-32..31 or 0..31), per group g of devio_quant_group(t)
 * elements a scale S[g] and, when devio_quant_has_offset(t), an offset
 * M[g], such that MUL(S, q) (then ADD(., M)) is devio_dequant_block's value
 * bit for bit: Q4_0 q - 8 and S = d; Q5_0 q - 16; Q8_0 q; Q4_1, Q5_1 S = d,
 * M = m; Q4_K, Q5_K S = d * sc, M = -(dmin * mn) (x - m1 is x + -m1
 * exactly); Q6_K q - 32 and S = d * sc. */
DEVIO_NUM_FN void devio_quant_split(uint32_t t, const uint8_t *b, int8_t *q, float *S, float *M)
{
    uint32_t blk = devio_quant_block(t);
    if (t == DEVIO_QT_Q4_K || t == DEVIO_QT_Q5_K) {
        int five = t == DEVIO_QT_Q5_K;
        float d = devio_q_f16(b), dmin = devio_q_f16(b + 2);
        const uint8_t *s = b + 4, *qh = b + 16, *qs = b + (five ? 48 : 16);
        for (int c = 0; c < 4; c++)
            for (int half = 0; half < 2; half++) {
                int sc, mn, g = 2 * c + half;
                devio_q_scale_min_k(s, g, &sc, &mn);
                S[g] = DEVIO_MUL(d, (float)sc);
                M[g] = -DEVIO_MUL(dmin, (float)mn);
                for (int l = 0; l < 32; l++) {
                    int v = half ? qs[32 * c + l] >> 4 : qs[32 * c + l] & 0xF;
                    if (five && ((qh[l] >> g) & 1))
                        v += 16;
                    q[32 * g + l] = (int8_t)v;
                }
            }
        return;
    }
    if (t == DEVIO_QT_Q6_K) {
        float d = devio_q_f16(b + 208);
        const int8_t *sc = (const int8_t *)(b + 192);
        for (int g = 0; g < 16; g++)
            S[g] = DEVIO_MUL(d, (float)sc[g]);
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;
            for (int l = 0; l < 32; l++) {
                int8_t *o = q + 128 * h + l;
                o[0] = (int8_t)(((ql[l] & 0xF) | ((qh[l] >> 0) & 3) << 4) - 32);
                o[32] = (int8_t)(((ql[l + 32] & 0xF) | ((qh[l] >> 2) & 3) << 4) - 32);
                o[64] = (int8_t)(((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32);
                o[96] = (int8_t)(((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32);
            }
        }
        return;
    }
    /* The 32-element types: one group. */
    S[0] = devio_q_f16(b);
    if (t == DEVIO_QT_Q8_0) {
        for (uint32_t j = 0; j < blk; j++)
            q[j] = (int8_t)b[2 + j];
        return;
    }
    int with_min = t == DEVIO_QT_Q4_1 || t == DEVIO_QT_Q5_1;
    if (with_min)
        M[0] = devio_q_f16(b + 2);
    const uint8_t *h = b + (with_min ? 4 : 2);
    int five = t == DEVIO_QT_Q5_0 || t == DEVIO_QT_Q5_1;
    const uint8_t *qs = five ? h + 4 : h;
    uint32_t qh = five ? ((uint32_t)h[0] | (uint32_t)h[1] << 8 | (uint32_t)h[2] << 16 |
                          (uint32_t)h[3] << 24)
                       : 0u;
    int bias = with_min ? 0 : five ? 16 : 8;
    for (int j = 0; j < 16; j++) {
        q[j] = (int8_t)(((qs[j] & 0xF) | (int)((qh >> j) & 1u) << 4) - bias);
        q[j + 16] = (int8_t)(((qs[j] >> 4) | (int)((qh >> (j + 16)) & 1u) << 4) - bias);
    }
}

/* Element j of the block of type t at b, in the split form's terms:
 * devio_quant_split's MUL(S, q) (then ADD(., M)) for that one element, so
 * devio_dequant_block's value bit for bit. For kernels that widen one
 * element per lane (the CUDA projections); the scales are decoded again for
 * every element. */
DEVIO_NUM_FN float devio_quant_elem(uint32_t t, const uint8_t *b, uint32_t j)
{
    if (t == DEVIO_QT_Q4_K || t == DEVIO_QT_Q5_K) {
        int g = (int)(j >> 5), l = (int)(j & 31u), sc, mn;
        const uint8_t *qs = b + (t == DEVIO_QT_Q5_K ? 48 : 16);
        int q = (g & 1) ? qs[32 * (g >> 1) + l] >> 4 : qs[32 * (g >> 1) + l] & 0xF;
        if (t == DEVIO_QT_Q5_K && ((b[16 + l] >> g) & 1))
            q += 16;
        devio_q_scale_min_k(b + 4, g, &sc, &mn);
        float S = DEVIO_MUL(devio_q_f16(b), (float)sc);
        return DEVIO_ADD(DEVIO_MUL(S, (float)q), -DEVIO_MUL(devio_q_f16(b + 2), (float)mn));
    }
    if (t == DEVIO_QT_Q6_K) {
        uint32_t h = j >> 7, k = (j >> 5) & 3u, l = j & 31u;
        const uint8_t *ql = b + 64 * h + (k & 1u) * 32, *qh = b + 128 + 32 * h;
        int q = ((k >> 1) ? ql[l] >> 4 : ql[l] & 0xF) | ((qh[l] >> (2 * k)) & 3) << 4;
        float S = DEVIO_MUL(devio_q_f16(b + 208), (float)(int8_t)b[192 + (j >> 4)]);
        return DEVIO_MUL(S, (float)(q - 32));
    }
    float d = devio_q_f16(b);
    if (t == DEVIO_QT_Q8_0)
        return DEVIO_MUL(d, (float)(int8_t)b[2 + j]);
    int with_min = t == DEVIO_QT_Q4_1 || t == DEVIO_QT_Q5_1;
    int five = t == DEVIO_QT_Q5_0 || t == DEVIO_QT_Q5_1;
    const uint8_t *h = b + (with_min ? 4 : 2), *qs = five ? h + 4 : h;
    uint32_t jj = j & 15u;
    int q = j < 16 ? qs[jj] & 0xF : qs[jj] >> 4;
    if (five)
        q |= ((h[j >> 3] >> (j & 7u)) & 1) << 4;
    if (with_min)
        return DEVIO_ADD(DEVIO_MUL(d, (float)q), devio_q_f16(b + 2));
    return DEVIO_MUL(d, (float)(q - (five ? 16 : 8)));
}

#endif
