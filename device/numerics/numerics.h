/* device/numerics/numerics.h: the binary32 math all devio backends share: exp, log, sin, cos, tanh, ..., the 32-lane reductions, f16/bf16.
 * Never calls libm, uses double or lets a multiply-add fuse: the same input gives the same bits in C, wasm32 and CUDA. */
/* long because it is the one self-contained definition C, wasm32 and CUDA include whole (DEVIO_NUM_FN); the
 * f16/bf16 conversions at the end use its private bit helpers, and the accuracy table below is part of the contract. */
#ifndef DEVIO_NUMERICS_H
#define DEVIO_NUMERICS_H

/*
 * Everything here is built from binary32 + - * /, sqrt, integer and bit
 * operations, each rounded to nearest-even on its own, so every platform that
 * implements IEEE 754 binary32 without contraction computes the same bits.
 * Build C with -ffp-contract=off and never with -ffast-math; nvcc compiles
 * the device side through __fadd_rn/__fmul_rn (never contracted), and the host
 * side of a .cu needs -Xcompiler -ffp-contract=off like plain C.
 *
 * Accuracy: error against double-precision libm, in ulps of the binary32
 * nearest the true value. Measured over all 2^32 inputs (and over the sweeps
 * of tests/numerics_test.c, which asserts the bounds in brackets); every
 * result is within 1 ulp of the correctly rounded one:
 *   devio_expf    0.771 ulp  [1]  (0.70 for normal results)
 *   devio_logf    0.840 ulp  [1]  subnormal inputs included
 *   devio_log1pf  0.865 ulp  [1]
 *   devio_sinf    0.785 ulp  [2]  every finite x, no range limit: see below
 *   devio_cosf    0.787 ulp  [2]
 *   devio_tanhf   0.809 ulp  [2]
 * Compositions, on the test's sweeps: devio_sigmoidf 2.21 ulp [2.5],
 * devio_siluf 2.62 ulp [3] (while sigmoid is a normal float),
 * devio_rsqrtf 1.47 ulp [1.5], devio_powf_pos see the function.
 *
 * Special values: a NaN input comes back unchanged (the same bits, so no
 * platform-specific NaN propagation leaks out); a NaN made here from a
 * non-NaN input (log(-1), sin(inf), ...) is the quiet NaN 0x7fc00000.
 * Compositions (sigmoid, silu, powf_pos) pass NaNs through ordinary
 * arithmetic, whose NaN payload differs between platforms: canonicalise
 * NaN before hashing.
 */

#include <float.h>
#include <stdint.h>
#include <string.h>

/* Refuse builds that would quietly change the bits: fast-math reorders and
 * drops the exact-error tricks used below, and excess precision (x87)
 * rounds twice. -ffp-contract cannot be detected; the build must say off. */
#if defined(__FAST_MATH__)
#error "device/numerics/numerics.h must not be built with -ffast-math"
#endif
#if !defined(__CUDACC__) && defined(FLT_EVAL_METHOD) && FLT_EVAL_METHOD != 0
#error "device/numerics/numerics.h needs float arithmetic evaluated in float (FLT_EVAL_METHOD 0)"
#endif

#if defined(__CUDACC__)
#define DEVIO_NUM_FN static inline __host__ __device__
#else
#define DEVIO_NUM_FN static inline
#endif

/* One rounding per operation. In CUDA device code the _rn intrinsics are
 * never contracted into FMA; in C -ffp-contract=off gives the same. */
#if defined(__CUDA_ARCH__)
#define DEVIO_ADD(a, b) __fadd_rn((a), (b))
#define DEVIO_SUB(a, b) __fsub_rn((a), (b))
#define DEVIO_MUL(a, b) __fmul_rn((a), (b))
#define DEVIO_DIV(a, b) __fdiv_rn((a), (b))
#else
#define DEVIO_ADD(a, b) ((a) + (b))
#define DEVIO_SUB(a, b) ((a) - (b))
#define DEVIO_MUL(a, b) ((a) * (b))
#define DEVIO_DIV(a, b) ((a) / (b))
#endif

#if !defined(__CUDA_ARCH__) && (defined(__SSE__) || defined(_M_X64))
/* sqrtss directly: __builtin_sqrtf would call libm's sqrtf for negative
 * inputs (errno) unless the build says -fno-math-errno. */
#include <xmmintrin.h>
#endif

/* ---- bits ---------------------------------------------------------------- */

/* The binary32 encoding of x. */
DEVIO_NUM_FN uint32_t devio_num_bits(float x)
{
#if defined(__CUDA_ARCH__)
    return __float_as_uint(x);
#else
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
#endif
}

/* The float whose binary32 encoding is u. */
DEVIO_NUM_FN float devio_num_float(uint32_t u)
{
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
#endif
}

/* Correctly rounded square root (IEEE 754 requires it of every platform). */
DEVIO_NUM_FN float devio_num_sqrt(float x)
{
#if defined(__CUDA_ARCH__)
    return __fsqrt_rn(x);
#elif defined(__SSE__) || defined(_M_X64)
    return _mm_cvtss_f32(_mm_sqrt_ss(_mm_set_ss(x)));
#else
    /* wasm32: f32.sqrt. Elsewhere add -fno-math-errno to keep libm out. */
    return __builtin_sqrtf(x);
#endif
}

/* a*b + c as two rounded operations, never one fused one. */
DEVIO_NUM_FN float devio_num_mad(float a, float b, float c)
{
    return DEVIO_ADD(DEVIO_MUL(a, b), c);
}

/* 2^n for -126 <= n <= 127, exact. */
DEVIO_NUM_FN float devio_num_pow2(int32_t n)
{
    return devio_num_float((uint32_t)(n + 127) << 23);
}

/* y * 2^k for -190 <= k <= 128 with one rounding: the first multiply is
 * exact, so a subnormal or overflowing result is rounded only once more. */
DEVIO_NUM_FN float devio_num_scale(float y, int32_t k)
{
    if (k > 127)
        return DEVIO_MUL(DEVIO_MUL(y, devio_num_pow2(127)), devio_num_pow2(k - 127));
    if (k < -126)
        return DEVIO_MUL(DEVIO_MUL(y, devio_num_pow2(k + 64)), devio_num_pow2(-64));
    return DEVIO_MUL(y, devio_num_pow2(k));
}

#define DEVIO_NUM_INF 0x7f800000u
#define DEVIO_NUM_QNAN 0x7fc00000u

/* ln 2 in two parts: LN2_HI has 16 significant bits, so k*LN2_HI is exact
 * for |k| < 256; LN2_LO is the float nearest ln 2 - LN2_HI. */
#define DEVIO_NUM_LN2_HI 0.693145752f
#define DEVIO_NUM_LN2_LO 1.42860677e-06f

/* ---- exp --------------------------------------------------------------- */

/*
 * e^x = (hi + lo) * 2^k for -104 <= x <= 89, returning k. x = k ln2 + r with
 * k the integer nearest x/ln2 and |r| <= ln2/2 (+ a hair), r kept as r + rl;
 * e^r = 1 + r + r^2 Q(r) with Q a degree-4 minimax fit of (e^r - 1 - r)/r^2
 * on |r| <= 0.347 (rounded coefficients; error of r^2 Q relative to e^r
 * below 2^-28.2). 1 + r is split exactly, so hi is rounded once, and lo is
 * what that rounding dropped (for callers that need more than a float).
 */
#define DEVIO_NUM_EXP_Q4 0.00138404011f
#define DEVIO_NUM_EXP_Q3 0.00836934894f
#define DEVIO_NUM_EXP_Q2 0.0416680835f
#define DEVIO_NUM_EXP_Q1 0.166665152f
#define DEVIO_NUM_EXP_Q0 0.49999994f
/* x / ln2 to the nearest integer by the 1.5 * 2^23 trick (below). */
#define DEVIO_NUM_INV_LN2 1.44269502f
#define DEVIO_NUM_ROUNDER 12582912.0f

DEVIO_NUM_FN int32_t devio_num_exp_core(float x, float *hi, float *lo)
{
    /* Nearest integer to x/ln2: adding and removing 1.5*2^23 rounds to an
     * integer under round-to-nearest-even; |x/ln2| < 151 keeps it exact. */
    float kf = DEVIO_SUB(DEVIO_ADD(DEVIO_MUL(x, DEVIO_NUM_INV_LN2), DEVIO_NUM_ROUNDER),
                         DEVIO_NUM_ROUNDER);
    /* x - k*LN2_HI is exact (the two are close and k*LN2_HI has few bits);
     * the second step rounds, and rl keeps what it rounded away (Fast2Sum). */
    float t = DEVIO_SUB(x, DEVIO_MUL(kf, DEVIO_NUM_LN2_HI));
    float kl = DEVIO_MUL(kf, DEVIO_NUM_LN2_LO);
    float r = DEVIO_SUB(t, kl);
    float rl = DEVIO_SUB(DEVIO_SUB(t, r), kl);
    float q = DEVIO_NUM_EXP_Q4;
    q = devio_num_mad(q, r, DEVIO_NUM_EXP_Q3);
    q = devio_num_mad(q, r, DEVIO_NUM_EXP_Q2);
    q = devio_num_mad(q, r, DEVIO_NUM_EXP_Q1);
    q = devio_num_mad(q, r, DEVIO_NUM_EXP_Q0);
    float s = DEVIO_ADD(1.0f, r);
    float c = DEVIO_ADD(DEVIO_SUB(1.0f, s), r); /* 1 + r == s + c exactly */
    float tail = DEVIO_ADD(c, DEVIO_ADD(rl, DEVIO_MUL(DEVIO_MUL(r, r), q)));
    float y = DEVIO_ADD(s, tail);
    *hi = y;
    *lo = DEVIO_SUB(tail, DEVIO_SUB(y, s)); /* y + lo == s + tail exactly */
    return (int32_t)kf;
}

/*
 * e^x, from devio_num_exp_core scaled by 2^k. Overflow gives +inf
 * (x > 88.7228394); results below 2^-126 are rounded once more into the
 * subnormals (at most one extra half-ulp there), below 2^-150 give +0;
 * exp(-inf) = +0, exp(+inf) = +inf.
 */
DEVIO_NUM_FN float devio_expf(float x)
{
    if (x != x)
        return x;
    if (x > 89.0f)
        return devio_num_float(DEVIO_NUM_INF);
    if (x < -104.0f)
        return 0.0f;
    float hi, lo;
    int32_t k = devio_num_exp_core(x, &hi, &lo);
    return devio_num_scale(hi, k);
}

/* ---- log, log1p ---------------------------------------------------------- */

/*
 * log(1+f) for 1+f = m in [sqrt(1/2), sqrt(2)) as f - hfsq + s*(hfsq + T):
 * with s = f/(2+f), log(m) = 2 atanh(s) = 2s + s T(s^2), and since
 * 2s = f - hfsq + s*hfsq (hfsq = f*f/2) the leading f stays exact and the
 * rounding of s only touches small terms. T(z) = z*(t1 + z*(t2 + z*t3)) is a
 * minimax fit of (2 atanh(sqrt z)/sqrt z - 2) on z <= 0.1716^2 (max error
 * 2^-30.2, halved in the result). Returns the sum e*ln2 + log(m) + extra,
 * where extra (tiny) is added in the low part and e*LN2_HI + f is formed
 * exactly (Fast2Sum) so only the final addition rounds at full size.
 */
DEVIO_NUM_FN float devio_num_log_core(int32_t e, float f, float extra)
{
    float s = DEVIO_DIV(f, DEVIO_ADD(2.0f, f));
    float z = DEVIO_MUL(s, s);
    float tz = 0.298716068f;
    tz = devio_num_mad(tz, z, 0.399775654f);
    tz = devio_num_mad(tz, z, 0.666667759f);
    tz = DEVIO_MUL(tz, z);
    float hfsq = DEVIO_MUL(DEVIO_MUL(0.5f, f), f);
    float ef = (float)e;
    float lo = DEVIO_ADD(DEVIO_MUL(ef, DEVIO_NUM_LN2_LO),
                         DEVIO_ADD(DEVIO_MUL(s, DEVIO_ADD(hfsq, tz)), extra));
    float hi = DEVIO_MUL(ef, DEVIO_NUM_LN2_HI); /* exact: |e| < 256 */
    /* hi + f with its rounding error: |hi| >= |f| whenever hi != 0. */
    float sum = DEVIO_ADD(hi, f);
    float err = DEVIO_ADD(DEVIO_SUB(hi, sum), f);
    return DEVIO_ADD(sum, DEVIO_SUB(err, DEVIO_SUB(hfsq, lo)));
}

/* Splits finite positive normal x into 2^e * (1+f) with 1+f in
 * [sqrt(1/2), sqrt(2)); f is exact. */
DEVIO_NUM_FN float devio_num_log_split(float x, int32_t *e)
{
    uint32_t u = devio_num_bits(x);
    uint32_t m = (u & 0x007fffffu) | 0x3f800000u; /* m in [1, 2) */
    *e += (int32_t)(u >> 23) - 127;
    if (m > 0x3fb504f3u) { /* m > sqrt(2): use m/2 */
        m -= 0x00800000u;
        *e += 1;
    }
    return DEVIO_SUB(devio_num_float(m), 1.0f); /* exact (Sterbenz) */
}

/* Natural logarithm. log(+-0) = -inf, log(x<0) = NaN, log(+inf) = +inf,
 * log(1) = +0; subnormal x is scaled by 2^25 first (exact). */
DEVIO_NUM_FN float devio_logf(float x)
{
    if (x != x)
        return x;
    if (x < 0.0f)
        return devio_num_float(DEVIO_NUM_QNAN);
    if (x == 0.0f)
        return devio_num_float(0xff800000u);
    if (devio_num_bits(x) == DEVIO_NUM_INF)
        return x;
    int32_t e = 0;
    if (devio_num_bits(x) < 0x00800000u) {
        x = DEVIO_MUL(x, 33554432.0f); /* 2^25 */
        e = -25;
    }
    float f = devio_num_log_split(x, &e);
    return devio_num_log_core(e, f, 0.0f);
}

/*
 * log(1 + x), accurate near 0: u = 1 + x is rounded, and the rounding error
 * c (exact, by Fast2Sum in whichever order has the larger operand first) is
 * added back as c/u, the first-order term of log(u + c) - log(u).
 * log1p(-1) = -inf, x < -1 gives NaN, log1p(+inf) = +inf; |x| < 2^-25
 * returns x itself (the correctly rounded answer; keeps -0 and subnormals).
 */
DEVIO_NUM_FN float devio_log1pf(float x)
{
    if (x != x)
        return x;
    if (x < -1.0f)
        return devio_num_float(DEVIO_NUM_QNAN);
    if (x == -1.0f)
        return devio_num_float(0xff800000u);
    if (devio_num_bits(x) == DEVIO_NUM_INF)
        return x;
    if ((devio_num_bits(x) & 0x7fffffffu) < 0x33000000u) /* |x| < 2^-25 */
        return x;
    float u = DEVIO_ADD(1.0f, x);
    float c;
    if (x < 1.0f && x > -1.0f)
        c = DEVIO_SUB(x, DEVIO_SUB(u, 1.0f));
    else
        c = DEVIO_SUB(1.0f, DEVIO_SUB(u, x));
    int32_t e = 0;
    float f = devio_num_log_split(u, &e);
    return devio_num_log_core(e, f, DEVIO_DIV(c, u));
}

/* ---- sin, cos ------------------------------------------------------------ */

/* Number of leading zero bits of a nonzero 64-bit value. */
DEVIO_NUM_FN uint32_t devio_num_clz64(uint64_t v)
{
    uint32_t n = 0;
    if (!(v >> 32)) { n += 32; v <<= 32; }
    if (!(v >> 48)) { n += 16; v <<= 16; }
    if (!(v >> 56)) { n += 8; v <<= 8; }
    if (!(v >> 60)) { n += 4; v <<= 4; }
    if (!(v >> 62)) { n += 2; v <<= 2; }
    if (!(v >> 63)) { n += 1; }
    return n;
}

/* High 64 bits of the 128-bit product a*b. */
DEVIO_NUM_FN uint64_t devio_num_mulhi64(uint64_t a, uint64_t b)
{
    uint64_t al = a & 0xffffffffu, ah = a >> 32;
    uint64_t bl = b & 0xffffffffu, bh = b >> 32;
    uint64_t ll = al * bl, lh = al * bh, hl = ah * bl, hh = ah * bh;
    uint64_t mid = (ll >> 32) + (lh & 0xffffffffu) + (hl & 0xffffffffu);
    return hh + (lh >> 32) + (hl >> 32) + (mid >> 32);
}

/*
 * Exact reduction for ax >= 96 up to FLT_MAX (Payne-Hanek style, integers
 * only): ax = M * 2^s with M a 24-bit integer, and ax*(2/pi) mod 4 is
 * M * B mod 2^96 in units of 2^-94, where B is the 96-bit window of 2/pi's
 * bits that can still reach the fraction (higher bits only add multiples
 * of 4). The 2/pi bits dropped below the window perturb the fraction by
 * < 2^-70, and at most 2^-48 relative is lost turning it into rh + rl,
 * far below what the nearest float to a multiple of pi/2 needs.
 */
DEVIO_NUM_FN uint32_t devio_num_reduce_big(float ax, float *rh, float *rl)
{
    /* 2/pi = sum over j >= 1 of W[j] * 2^(-32 j); W[0] = 0 lets the window
     * start above the binary point for small s. */
    const uint32_t W[8] = {0x00000000u, 0xa2f9836eu, 0x4e441529u, 0xfc2757d1u,
                           0xf534ddc0u, 0xdb629599u, 0x3c439041u, 0xfe5163abu};
    uint32_t u = devio_num_bits(ax);
    int32_t s = (int32_t)(u >> 23) - 150;
    uint64_t M = (u & 0x007fffffu) | 0x00800000u;
    /* The window starts at bit index s-1 of 2/pi, i.e. bit s+30 counted
     * from the top of W[0]. */
    uint32_t g = (uint32_t)(s + 30);
    uint32_t w = g >> 5, sh = g & 31u;
    uint32_t B[3];
    for (uint32_t i = 0; i < 3; i++) {
        uint64_t pair = ((uint64_t)W[w + i] << 32) | W[w + i + 1];
        B[2 - i] = (uint32_t)(pair >> (32u - sh));
    }
    uint64_t p = M * B[0];
    uint32_t q0 = (uint32_t)p;
    p = M * B[1] + (p >> 32);
    uint32_t q1 = (uint32_t)p;
    p = M * B[2] + (p >> 32);
    uint32_t q2 = (uint32_t)p;
    uint32_t k = q2 >> 30;
    /* Fraction f = F * 2^-94 with F = (q2 & 0x3fffffff):q1:q0; for
     * f >= 1/2 use f - 1 and the next quadrant. */
    uint64_t hi = ((uint64_t)(q2 & 0x3fffffffu) << 32) | q1;
    uint64_t lo = (uint64_t)q0 << 32;
    int neg = (q2 >> 29) & 1u;
    if (neg) {
        k += 1;
        uint64_t borrow = lo != 0;
        lo = 0 - lo;
        hi = ((uint64_t)1 << 62) - hi - borrow;
    }
    /* Normalise the 128-bit hi:lo (value f * 2^126) to a 64-bit mantissa. */
    uint32_t lz;
    uint64_t n;
    if (!hi && !lo) { /* not reached by any float; keeps the shifts defined */
        *rh = 0.0f;
        *rl = 0.0f;
        return k & 3u;
    }
    if (hi) {
        lz = devio_num_clz64(hi);
        n = lz ? (hi << lz) | (lo >> (64 - lz)) : hi;
    } else {
        lz = 64 + devio_num_clz64(lo);
        n = lo << (lz - 64);
    }
    /* f = n * 2^(-62-lz); r = f * pi/2 with pi/2 = PIO2 * 2^-62. */
    uint64_t rq = devio_num_mulhi64(n, 0x6487ed5110b4611au); /* r = rq * 2^(-60-lz) */
    uint32_t b = 63 - devio_num_clz64(rq);                    /* 61 or 62 */
    int32_t ex = (int32_t)b - 60 - (int32_t)lz;               /* r in [2^(ex), 2^(ex+1)) */
    float h = (float)(uint32_t)(rq >> (b - 23));              /* 24 bits, exact */
    float l = (float)(uint32_t)((rq >> (b - 47)) & 0xffffffu);
    h = DEVIO_MUL(h, devio_num_pow2(ex - 23));
    l = DEVIO_MUL(l, devio_num_pow2(ex - 47));
    float hr = DEVIO_ADD(h, l); /* round the pair to nearest */
    float lr = DEVIO_SUB(l, DEVIO_SUB(hr, h));
    if (neg) {
        hr = -hr;
        lr = -lr;
    }
    *rh = hr;
    *rl = lr;
    return k & 3u;
}

/*
 * Reduces finite ax >= 0 to ax = k*pi/2 + (rh + rl), |rh + rl| <= pi/4 (+ a
 * hair), and returns k mod 4. ax <= pi/4: no reduction. ax < 96: Cody-Waite
 * with pi/2 in three parts P1 + P2 + P3 (18, 18 and 24 bits; P1 + P2 + P3
 * is within 2^-63.4 of pi/2): k <= 61 has 6 bits, so k*P1 and k*P2 are
 * exact, ax - k*P1 is exact, the second subtraction is made exact with
 * TwoSum, and only the tiny k*P3 rounds. That stays below 2^-57 absolute
 * error, against 2^-26.3 for the closest float to a multiple of pi/2 there.
 * Larger ax (RoPE angles run to thousands of radians) take
 * devio_num_reduce_big, exact for every finite float.
 */
DEVIO_NUM_FN uint32_t devio_num_reduce_pio2(float ax, float *rh, float *rl)
{
    if (ax <= 0.785398163f) {
        *rh = ax;
        *rl = 0.0f;
        return 0;
    }
    if (ax >= 96.0f)
        return devio_num_reduce_big(ax, rh, rl);
    float kf = DEVIO_SUB(DEVIO_ADD(DEVIO_MUL(ax, 0.636619747f), 12582912.0f), 12582912.0f);
    float t = DEVIO_SUB(ax, DEVIO_MUL(kf, 1.57079315f));
    float a = DEVIO_MUL(kf, 3.17493686e-06f);
    /* TwoSum: t - a == d + de exactly, whatever their sizes. */
    float d = DEVIO_SUB(t, a);
    float tv = DEVIO_ADD(d, a);
    float av = DEVIO_SUB(tv, d);
    float de = DEVIO_ADD(DEVIO_SUB(t, tv), DEVIO_SUB(av, a));
    float lo = DEVIO_SUB(de, DEVIO_MUL(kf, 2.56334407e-12f));
    float h = DEVIO_ADD(d, lo);
    *rh = h;
    *rl = DEVIO_SUB(lo, DEVIO_SUB(h, d));
    return (uint32_t)(int32_t)kf & 3u;
}

/* sin(rh + rl) for |rh| <= pi/4: rh + rh^3 S(rh^2) + rl*cos(rh), with S a
 * degree-3 minimax fit of (sin r - r)/r^3 (max relative error 2^-32.6). */
DEVIO_NUM_FN float devio_num_sin_kernel(float rh, float rl)
{
    float z = DEVIO_MUL(rh, rh);
    float p = 2.83751319e-06f;
    p = devio_num_mad(p, z, -0.000198535112f);
    p = devio_num_mad(p, z, 0.00833338033f);
    p = devio_num_mad(p, z, -0.166666672f);
    p = DEVIO_MUL(DEVIO_MUL(rh, z), p);
    float corr = DEVIO_MUL(rl, DEVIO_SUB(1.0f, DEVIO_MUL(0.5f, z)));
    return DEVIO_ADD(rh, DEVIO_ADD(p, corr));
}

/* cos(rh + rl) for |rh| <= pi/4: 1 - z/2 + z^2 C(z) - rh*rl, z = rh^2, with
 * C a degree-2 minimax fit of (cos r - 1 + r^2/2)/r^4 (max relative error
 * 2^-33); 1 - z/2 is split exactly so only the last addition rounds big. */
DEVIO_NUM_FN float devio_num_cos_kernel(float rh, float rl)
{
    float z = DEVIO_MUL(rh, rh);
    float p = 2.44323273e-05f;
    p = devio_num_mad(p, z, -0.00138873095f);
    p = devio_num_mad(p, z, 0.0416666456f);
    p = DEVIO_MUL(DEVIO_MUL(z, z), p);
    float hz = DEVIO_MUL(0.5f, z);
    float w = DEVIO_SUB(1.0f, hz);
    float wc = DEVIO_SUB(DEVIO_SUB(1.0f, w), hz); /* 1 - hz == w + wc exactly */
    return DEVIO_ADD(w, DEVIO_ADD(wc, DEVIO_SUB(p, DEVIO_MUL(rh, rl))));
}

/*
 * sin x, within 0.79 ulp for every finite x: the reduction is Cody-Waite
 * below 96 and exact integer arithmetic above (RoPE angles of thousands of
 * radians and beyond), so there is no range past which accuracy degrades.
 * sin(+-0) = +-0, sin(+-inf) = NaN.
 */
DEVIO_NUM_FN float devio_sinf(float x)
{
    if (x != x)
        return x;
    uint32_t u = devio_num_bits(x);
    if ((u & 0x7fffffffu) == DEVIO_NUM_INF)
        return devio_num_float(DEVIO_NUM_QNAN);
    float ax = devio_num_float(u & 0x7fffffffu);
    float rh, rl;
    uint32_t q = devio_num_reduce_pio2(ax, &rh, &rl);
    float y = (q & 1u) ? devio_num_cos_kernel(rh, rl) : devio_num_sin_kernel(rh, rl);
    /* sin(-x) = -sin(x); quadrants 2 and 3 negate. */
    uint32_t flip = ((q >> 1) ^ (u >> 31)) & 1u;
    return flip ? -y : y;
}

/* cos x, same reduction and accuracy as devio_sinf; cos(+-inf) = NaN. */
DEVIO_NUM_FN float devio_cosf(float x)
{
    if (x != x)
        return x;
    uint32_t u = devio_num_bits(x);
    if ((u & 0x7fffffffu) == DEVIO_NUM_INF)
        return devio_num_float(DEVIO_NUM_QNAN);
    float ax = devio_num_float(u & 0x7fffffffu);
    float rh, rl;
    uint32_t q = devio_num_reduce_pio2(ax, &rh, &rl);
    float y = (q & 1u) ? devio_num_sin_kernel(rh, rl) : devio_num_cos_kernel(rh, rl);
    /* cos(r + pi/2) = -sin r, cos(r + pi) = -cos r, cos(r + 3pi/2) = sin r */
    uint32_t flip = ((q + 1u) >> 1) & 1u;
    return flip ? -y : y;
}

/* ---- tanh, sigmoid, silu ------------------------------------------------- */

/*
 * tanh x. |x| < 0.75: x + x^3 T(x^2), T a degree-6 minimax fit of
 * (tanh r - r)/r^3 (max relative error 2^-32.7). Up to 9.1:
 * 1 - 2/(e^{2|x|} + 1) with e^{2|x|} carried in two floats.
 * Beyond 9.1 the correctly rounded result is +-1. Odd: tanh(-0) = -0.
 */
DEVIO_NUM_FN float devio_tanhf(float x)
{
    if (x != x)
        return x;
    uint32_t u = devio_num_bits(x);
    float ax = devio_num_float(u & 0x7fffffffu);
    float y;
    if (ax < 0.75f) {
        /* On |x|, so the sign (and tanh(-0) = -0) comes out exact. */
        float z = DEVIO_MUL(ax, ax);
        float p = -0.000597097911f;
        p = devio_num_mad(p, z, 0.00290056597f);
        p = devio_num_mad(p, z, -0.00854469649f);
        p = devio_num_mad(p, z, 0.0217853319f);
        p = devio_num_mad(p, z, -0.0539560989f);
        p = devio_num_mad(p, z, 0.133332491f);
        p = devio_num_mad(p, z, -0.333333313f);
        y = DEVIO_ADD(ax, DEVIO_MUL(DEVIO_MUL(ax, z), p));
    } else if (ax > 9.1f) {
        y = 1.0f;
    } else {
        /* E = e^{2|x|} = eh + el (k <= 27: the scaling is exact), then
         * D = E + 1 = dh + dl, q = 2/D = qh - qh*dl/dh to first order, and
         * 1 - qh split exactly: only the quotient and the last add round. */
        float eh, el;
        int32_t k = devio_num_exp_core(DEVIO_ADD(ax, ax), &eh, &el);
        eh = DEVIO_MUL(eh, devio_num_pow2(k));
        el = DEVIO_MUL(el, devio_num_pow2(k));
        float dh = DEVIO_ADD(eh, 1.0f);
        float dl = DEVIO_ADD(DEVIO_SUB(1.0f, DEVIO_SUB(dh, eh)), el);
        float qh = DEVIO_DIV(2.0f, dh);
        float a = DEVIO_SUB(1.0f, qh);
        float ac = DEVIO_SUB(DEVIO_SUB(1.0f, a), qh); /* 1 - qh == a + ac */
        y = DEVIO_ADD(a, DEVIO_ADD(ac, DEVIO_MUL(qh, DEVIO_DIV(dl, dh))));
    }
    return (u >> 31) ? -y : y;
}

/* Logistic sigmoid, exactly 1 / (1 + devio_expf(-x)) in this order, so
 * every backend gets these bits: two roundings after exp's (2.21 ulp max on
 * the test's sweeps). Below x = -88.7228317 exp(-x) overflows and the result
 * is +0 (the true value there is about 2^-128 or less, a subnormal). */
DEVIO_NUM_FN float devio_sigmoidf(float x)
{
    return DEVIO_DIV(1.0f, DEVIO_ADD(1.0f, devio_expf(-x)));
}

/* SiLU (swish), exactly x * devio_sigmoidf(x): one more rounding (2.62 ulp
 * while sigmoid is a normal float, x > -87.34; below that sigmoid's
 * subnormal rounding, times |x|, dominates). -0 for x < -88.7228317, and,
 * like the formula in PyTorch, silu(-inf) = -inf * 0 = NaN. */
DEVIO_NUM_FN float devio_siluf(float x)
{
    return DEVIO_MUL(x, devio_sigmoidf(x));
}

/* Softplus as PyTorch defines it (beta 1, threshold 20): x itself above 20,
 * else devio_log1pf(devio_expf(x)). Two functions of at most 1 ulp each;
 * log1p damps exp's error, so the result stays within 2 ulp (asserted on
 * the test's sweep). softplus(-inf) = +0, softplus(+inf) = +inf. */
DEVIO_NUM_FN float devio_softplusf(float x)
{
    if (x > 20.0f)
        return x;
    return devio_log1pf(devio_expf(x));
}

/* ---- rsqrt, pow --------------------------------------------------------- */

/* 1 / sqrt(x) as two correctly rounded operations (up to 1.5 ulp, the same
 * bits everywhere; never a hardware reciprocal-square-root estimate).
 * rsqrt(+0) = +inf, rsqrt(-0) = -inf, rsqrt(x<0) = NaN, rsqrt(+inf) = +0. */
DEVIO_NUM_FN float devio_rsqrtf(float x)
{
    return DEVIO_DIV(1.0f, devio_num_sqrt(x));
}

/* b^e for b > 0, exactly devio_expf(e * devio_logf(b)). The rounding of
 * e*log(b) is magnified by |e log b|: the error is within 1 + 2.6 |e ln b|
 * ulp (tested; that is 35 ulp for theta = 500000 and e near -1). It is
 * meant for host-side tables such as the RoPE inverse frequencies
 * theta^(-2i/d), where what matters is that every backend shares the bits. */
DEVIO_NUM_FN float devio_powf_pos(float b, float e)
{
    return devio_expf(DEVIO_MUL(e, devio_logf(b)));
}

/* ---- the 32-lane reduction rule (device/numerics/numspec.h) -------------------------- */

/*
 * The scalar definition every vectorised or CUDA reduction must match bit
 * for bit: lane l (0..31) sums terms l, l+32, l+64, ... in increasing index
 * order starting from +0.0f, then lanes fold pairwise for w = 16, 8, 4, 2, 1:
 * p[l] = p[l] + p[l+w]; the result is p[0]. This is a warp reduction with
 * xor shuffles, and 8-wide SIMD on the CPU.
 */

/* Applies the fold to p in place (p is overwritten) and returns p[0]. */
DEVIO_NUM_FN float devio_lane_fold(float p[32])
{
    for (uint32_t w = 16; w >= 1; w >>= 1)
        for (uint32_t l = 0; l < w; l++)
            p[l] = DEVIO_ADD(p[l], p[l + w]);
    return p[0];
}

/* Sum of x[0..n) by the lane rule; x is borrowed, n may be 0 (gives +0). */
DEVIO_NUM_FN float devio_lane_sum(const float *x, uint32_t n)
{
    float p[32];
    for (uint32_t l = 0; l < 32; l++)
        p[l] = 0.0f;
    for (uint32_t i = 0; i < n; i++)
        p[i & 31u] = DEVIO_ADD(p[i & 31u], x[i]);
    return devio_lane_fold(p);
}

/* Dot product of a[0..n) and b[0..n) by the lane rule, each product rounded
 * to binary32 before it is added; a and b are borrowed. */
DEVIO_NUM_FN float devio_lane_dot(const float *a, const float *b, uint32_t n)
{
    float p[32];
    for (uint32_t l = 0; l < 32; l++)
        p[l] = 0.0f;
    for (uint32_t i = 0; i < n; i++)
        p[i & 31u] = DEVIO_ADD(p[i & 31u], DEVIO_MUL(a[i], b[i]));
    return devio_lane_fold(p);
}

/* ---- f16 / bf16 -------------------------------------------------------- */

/* IEEE binary16 to binary32: exact, subnormals normalised, +-inf kept, NaN
 * payload shifted up (a NaN stays a NaN). */
DEVIO_NUM_FN float devio_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu;
    uint32_t m = h & 0x3ffu;
    if (e == 0x1fu)
        return devio_num_float(sign | 0x7f800000u | (m << 13));
    if (e == 0) {
        if (m == 0)
            return devio_num_float(sign);
        /* m * 2^-24: shift the leading one up to bit 10. */
        e = 113;
        while (!(m & 0x400u)) {
            m <<= 1;
            e -= 1;
        }
        return devio_num_float(sign | (e << 23) | ((m & 0x3ffu) << 13));
    }
    return devio_num_float(sign | ((e + 112u) << 23) | (m << 13));
}

/* bfloat16 to binary32: the upper half of the encoding, exact. */
DEVIO_NUM_FN float devio_bf16_to_f32(uint16_t h)
{
    return devio_num_float((uint32_t)h << 16);
}

/* binary32 to bfloat16, round to nearest even; overflow rounds to +-inf,
 * a NaN stays a NaN (quiet bit forced, upper payload kept). */
DEVIO_NUM_FN uint16_t devio_f32_to_bf16_rne(float x)
{
    uint32_t u = devio_num_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* binary32 to IEEE binary16, round to nearest even, subnormal halves
 * included; |x| >= 65520 rounds to +-inf, a NaN stays a NaN (quiet bit
 * forced, upper payload kept). */
DEVIO_NUM_FN uint16_t devio_f32_to_f16_rne(float x)
{
    uint32_t u = devio_num_bits(x);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) /* 65520, halfway between 65504 and 2^16 */
        return (uint16_t)(sign | 0x7c00u);
    if (a >= 0x38800000u) { /* >= 2^-14: a normal half */
        uint32_t h = (a >> 13) - (112u << 10);
        uint32_t rest = a & 0x1fffu;
        if (rest > 0x1000u || (rest == 0x1000u && (h & 1u)))
            h += 1; /* a carry into the exponent is still right */
        return (uint16_t)(sign | h);
    }
    if (a <= 0x33000000u) /* <= 2^-25: rounds to zero (a tie goes even) */
        return (uint16_t)sign;
    /* A subnormal half: count units of 2^-24. */
    uint32_t shift = 126u - (a >> 23); /* 14 .. 24 */
    uint32_t m = (a & 0x007fffffu) | 0x00800000u;
    uint32_t h = m >> shift;
    uint32_t rest = m & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1u);
    if (rest > half || (rest == half && (h & 1u)))
        h += 1;
    return (uint16_t)(sign | h);
}

#endif /* DEVIO_NUMERICS_H */
