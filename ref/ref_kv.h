/* ref_kv.h - what one element of the KV cache is, how K and V rows are written into it and
 * how attention reads them. The reference keeps binary32: its numbers are the definition's, and
 * these helpers are then a copy and a plain load. A build that defines REF_KV_F16 (the cpu
 * backend, fast numerics: cpu/isa.bzl) keeps binary16 instead, half the memory and half the
 * bytes a decode step's attention reads: each value rounded to nearest even as it is written,
 * widened exactly as it is read. The element type, ref_kv, is ref_kernels.h's. Static inline
 * only, for the sources that write or read the cache (ref_step.c, ref_attention.c, cpu/cpu_attention.c); owns
 * nothing. */
#ifndef DEVIO_REF_KV_H
#define DEVIO_REF_KV_H

#include <stdint.h>
#include <string.h>

#include "device/numerics/numerics.h"
#include "ref/ref_kernels.h"
#include "ref/ref_vec.h"

#if defined(REF_KV_F16)
#if defined(__F16C__)
#include <immintrin.h>
#endif

static inline void ref_kv_put(ref_kv *dst, const float *src, uint32_t n)
{
    uint32_t i = 0;
#if defined(__F16C__)
    for (; i + 8u <= n; i += 8u)
        _mm_storeu_si128((__m128i *)(void *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; i < n; i++)
        dst[i] = devio_f32_to_f16_rne(src[i]);
}

static ALWAYS_INLINE vf ref_kv_ldv(const ref_kv *p)
{
    return widen_f16(p);
}

static inline float ref_kv_get(const ref_kv *p)
{
    return widen1_f16(*p);
}
#else
static inline void ref_kv_put(ref_kv *dst, const float *src, uint32_t n)
{
    memcpy(dst, src, n * sizeof(float));
}

static ALWAYS_INLINE vf ref_kv_ldv(const ref_kv *p)
{
    return ldv(p);
}

static inline float ref_kv_get(const ref_kv *p)
{
    return *p;
}
#endif

#endif
