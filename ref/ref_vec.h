/* ref_vec.h - the reference backend's private vector vocabulary: the
 * register width VL, the 32 lanes of the reduction rule as NV = 32 / VL
 * vectors, unaligned loads and stores, the lane fold, and exact widening of
 * bf16 and f16. Included only by ref/ sources that vectorise (ref_kernels.c,
 * ref_gemm.c, and ref_kv.h's readers); everything here is static and inlined, so each translation
 * unit is compiled for its own target. Allocates nothing; owns nothing. */
#ifndef DEVIO_REF_VEC_H
#define DEVIO_REF_VEC_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "device/backend/backend.h"

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

/* Vector width VL (floats) follows the widest registers the build has:
 * GCC splits wider generic vectors badly (accumulators end up in memory).
 * The 32 lanes of the reduction rule are NV = 32 / VL vectors: vector i
 * holds lanes i*VL .. i*VL + VL - 1. The numbers do not depend on VL. */
#if defined(__AVX512F__)
#define VL 16
#elif defined(__AVX__)
#define VL 8
#else
#define VL 4 /* SSE2, simd128 (wasm32), NEON */
#endif
#define NV (32 / VL)

typedef float vf __attribute__((vector_size(VL * 4)));
typedef uint16_t vh __attribute__((vector_size(VL * 2)));
typedef uint32_t vu __attribute__((vector_size(VL * 4)));
typedef int32_t vi __attribute__((vector_size(VL * 4)));
/* Unaligned views of memory for loads and stores. Not memcpy: clang merges
 * neighbouring memcpy loads into one block copy, which on wasm32 is a call. */
typedef float vf_mem __attribute__((vector_size(VL * 4), aligned(4), may_alias));
typedef uint16_t vh_mem __attribute__((vector_size(VL * 2), aligned(2), may_alias));
typedef float v8f __attribute__((vector_size(32)));
typedef float v4f __attribute__((vector_size(16)));

#if defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#define ALWAYS_INLINE inline __attribute__((always_inline))

static ALWAYS_INLINE vf ldv(const float *p)
{
    return *(const vf_mem *)p;
}

static ALWAYS_INLINE void stv(float *p, vf v)
{
    *(vf_mem *)p = v;
}

/* The fold of the lane rule over a[0..NV) (overwritten). Steps w >= VL add
 * whole vectors; the last log2(VL) steps halve the first vector. */
static ALWAYS_INLINE float fold_lanes(vf *a)
{
    /* Constant steps rather than a `w /= 2` loop, which clang leaves rolled
     * (accumulators then live on the stack); same operations, same order. */
#if NV > 8
#error "fold_lanes: NV above 8"
#endif
#if NV >= 8
    for (int i = 0; i < 4; i++)
        a[i] = a[i] + a[i + 4];
#endif
#if NV >= 4
    for (int i = 0; i < 2; i++)
        a[i] = a[i] + a[i + 2];
#endif
#if NV >= 2
    a[0] = a[0] + a[1];
#endif
    vf s = a[0];
#if VL == 16
    v8f s8 = __builtin_shufflevector(s, s, 0, 1, 2, 3, 4, 5, 6, 7) +
             __builtin_shufflevector(s, s, 8, 9, 10, 11, 12, 13, 14, 15); /* w = 8 */
    v4f s4 = __builtin_shufflevector(s8, s8, 0, 1, 2, 3) +
             __builtin_shufflevector(s8, s8, 4, 5, 6, 7); /* w = 4 */
#elif VL == 8
    v4f s4 = __builtin_shufflevector(s, s, 0, 1, 2, 3) +
             __builtin_shufflevector(s, s, 4, 5, 6, 7); /* w = 4 */
#else
    v4f s4 = s;
#endif
    float r0 = s4[0] + s4[2]; /* w = 2 */
    float r1 = s4[1] + s4[3];
    return r0 + r1; /* w = 1 */
}

/* ---- widening ---------------------------------------------------------- */

/* bf16 to single is exact: the bits shifted up by 16. With AVX2 and
 * AVX-512 one zero-extending load does the widening (GCC otherwise splits
 * the generic conversion into 128-bit halves). */
static ALWAYS_INLINE vf widen_bf16(const uint16_t *p)
{
#if VL == 16 && defined(__AVX512F__)
    __m256i h;
    memcpy(&h, p, sizeof h);
    __m512i u = _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16);
    vf r;
    memcpy(&r, &u, sizeof r);
    return r;
#elif VL == 8 && defined(__AVX2__)
    __m128i h;
    memcpy(&h, p, sizeof h);
    __m256i u = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
    vf r;
    memcpy(&r, &u, sizeof r);
    return r;
#else
    vh h = *(const vh_mem *)p;
    vu u = __builtin_convertvector(h, vu) << 16;
    return (vf)u;
#endif
}

/* Exact half to single. With F16C the hardware conversion (exact by
 * definition); otherwise integer operations only, where subnormal halves
 * are m * 2^-24, made as an int-to-float conversion and a power-of-two
 * scale, so no subnormal float is ever an operand (no slow microcode path). */
static ALWAYS_INLINE vf widen_f16(const uint16_t *p)
{
#if VL == 16 && defined(__AVX512F__)
    __m256i h;
    memcpy(&h, p, sizeof h);
    __m512 f = _mm512_cvtph_ps(h);
    vf r;
    memcpy(&r, &f, sizeof r);
    return r;
#elif VL == 8 && defined(__F16C__)
    __m128i h;
    memcpy(&h, p, sizeof h);
    __m256 f = _mm256_cvtph_ps(h);
    vf r;
    memcpy(&r, &f, sizeof r);
    return r;
#else
    vh h16 = *(const vh_mem *)p;
    vu h = __builtin_convertvector(h16, vu);
    vu s = (h & 0x8000u) << 16;
    vu e = (h >> 10) & 0x1fu;
    vu m = h & 0x3ffu;
    vu normal = s | ((e + 112u) << 23) | (m << 13);
    vu special = s | 0x7f800000u | (m << 13);
    vf subf = __builtin_convertvector((vi)m, vf) * 0x1p-24f;
    vu sub = (vu)subf | s;
    vu is_sub = (vu)(e == 0u);
    vu is_special = (vu)(e == 31u);
    vu r = (is_sub & sub) | (~is_sub & ((is_special & special) | (~is_special & normal)));
    return (vf)r;
#endif
}

static inline float widen1_f16(uint16_t h)
{
    uint32_t s = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu;
    uint32_t m = h & 0x3ffu;
    uint32_t bits;
    if (e == 0) {
        float f = (float)m * 0x1p-24f;
        memcpy(&bits, &f, sizeof bits);
        bits |= s;
    } else if (e == 31) {
        bits = s | 0x7f800000u | (m << 13);
    } else {
        bits = s | ((e + 112u) << 23) | (m << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline float widen1_bf16(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* VL weights from element i of a row of dtype dt, widened. */
static ALWAYS_INLINE vf ldw(int dt, const void *w, size_t i)
{
    if (dt == DEVIO_F32)
        return ldv((const float *)w + i);
    if (dt == DEVIO_BF16)
        return widen_bf16((const uint16_t *)w + i);
    return widen_f16((const uint16_t *)w + i);
}

#endif
