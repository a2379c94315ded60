/* numerics_vec.h - devio_expf (and the SiLU gate built on it) over arrays,
 * eight values at a time, bit for bit what device/numerics/numerics.h's scalar
 * functions give each of them: the same
 * operations in the same order on 8-float generic vectors, with every value
 * outside the range where that is exact (NaN, x < -87, x > 88, where the
 * scalar function takes another branch) recomputed by devio_expf itself.
 * C only (not CUDA device code); header only, so each translation unit
 * vectorises for its own target. Allocates nothing. */
#ifndef DEVIO_NUMERICS_VEC_H
#define DEVIO_NUMERICS_VEC_H

#include <stdint.h>
#include <string.h>

#include "device/numerics/numerics.h"

/* The 8-float vectors never cross a call that is not inlined, so GCC's note
 * that their ABI differs without AVX says nothing here. (GCC reports it at
 * the end of the translation unit, so it stays off for the includer.) */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

typedef float devio_v8f __attribute__((vector_size(32)));
typedef int32_t devio_v8i __attribute__((vector_size(32)));

/* 2^k exactly for -126 <= k <= 127 in every lane. */
static inline __attribute__((always_inline)) devio_v8f devio_v8_pow2(devio_v8i k)
{
    devio_v8i bits = (k + 127) << 23;
    devio_v8f f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* devio_expf(x) for eight x in [-87, 88], where k stays in [-126, 127] and
 * devio_num_scale is one multiply by 2^k. */
static inline __attribute__((always_inline)) devio_v8f devio_v8_expf_normal(devio_v8f x)
{
    devio_v8f kf = (x * DEVIO_NUM_INV_LN2 + DEVIO_NUM_ROUNDER) - DEVIO_NUM_ROUNDER;
    devio_v8f t = x - kf * DEVIO_NUM_LN2_HI;
    devio_v8f kl = kf * DEVIO_NUM_LN2_LO;
    devio_v8f r = t - kl;
    devio_v8f rl = (t - r) - kl;
    devio_v8f q = (devio_v8f){0} + DEVIO_NUM_EXP_Q4;
    q = q * r + DEVIO_NUM_EXP_Q3;
    q = q * r + DEVIO_NUM_EXP_Q2;
    q = q * r + DEVIO_NUM_EXP_Q1;
    q = q * r + DEVIO_NUM_EXP_Q0;
    devio_v8f s = 1.0f + r;
    devio_v8f c = (1.0f - s) + r;
    devio_v8f tail = c + (rl + (r * r) * q);
    devio_v8f y = s + tail;
    return y * devio_v8_pow2(__builtin_convertvector(kf, devio_v8i));
}

/* dst[i] = devio_expf(src[i] - m) for i < n; dst may be src. */
static inline void devio_expf_sub_n(float *dst, const float *src, float m, uint32_t n)
{
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        devio_v8f x;
        memcpy(&x, src + i, sizeof x);
        x = x - m;
        devio_v8i ok = (x >= -87.0f) & (x <= 88.0f); /* false for NaN */
        devio_v8f e = devio_v8_expf_normal(x);
        for (int j = 0; j < 8; j++)
            if (!ok[j])
                e[j] = devio_expf(x[j]);
        memcpy(dst + i, &e, sizeof e);
    }
    for (; i < n; i++)
        dst[i] = devio_expf(src[i] - m);
}

/* dst[i] = devio_siluf(a[i]) * b[i] for i < n, the SwiGLU gate: the scalar
 * composition's operations in its order, x * (1 / (1 + exp(-x))) then the
 * product with b, so every bit is the scalar's; exp(-x) outside [-87, 88]
 * (and NaN) is recomputed by devio_expf. dst may be a or b. */
static inline void devio_silu_mul_n(float *dst, const float *a, const float *b, uint32_t n)
{
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        devio_v8f x, g;
        memcpy(&x, a + i, sizeof x);
        memcpy(&g, b + i, sizeof g);
        devio_v8f nx = -x;
        devio_v8i ok = (nx >= -87.0f) & (nx <= 88.0f); /* false for NaN */
        devio_v8f e = devio_v8_expf_normal(nx);
        for (int j = 0; j < 8; j++)
            if (!ok[j])
                e[j] = devio_expf(nx[j]);
        devio_v8f y = (x * (1.0f / (1.0f + e))) * g;
        memcpy(dst + i, &y, sizeof y);
    }
    for (; i < n; i++)
        dst[i] = devio_siluf(a[i]) * b[i];
}

#endif
