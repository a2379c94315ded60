/* cpu_gemm.c - the cpu backend's projections under fast numerics (ref/ref_gemm.h's functions,
 * built in place of the reference's in every path of the cpu backend, cpu/isa.bzl).
 *
 * A quantized weight (every type of device/numerics/quant.h) is split once at load (cpu_pack.c,
 * devio_quant_split) into small integer quants q and, per group of its elements (16 for Q6_K,
 * else 32), a scale S and an offset M, both kept as binary16: y = S * q + M. The quants
 * are kept unsigned (q + quant_shift) in the bits the type has (cpu_layout.h's pack_kind):
 * 4-bit types two a byte, as the file does (Q4_0's q - 8 becomes q with M = -8 S, M not
 * stored but made from S as it is used); 5- and 6-bit types as a plane of 4 bits and one of 1 or 2;
 * Q8_0 one int8 an element. So a decode step streams about the file's bytes.
 * Each token's activations are rounded per block of 32 to integers of 15 bits with one binary32
 * scale (the largest magnitude maps to 16255), kept as two bytes, v = 128 hi + lo; a dot
 * product is then, per unit of 16 elements, an exact integer sum (unsigned 4- and 6-bit quants
 * by the two bytes, vpmaddubsw, less the shift times the unit's sum of v; int8 quants widened,
 * by the int16 integers, vpmaddwd; the quants stored in an order that leaves unit k's sum in
 * lane k: lane_pos, i8_pos) scaled by the weight's and the activation's scales:
 *
 *   y[o] = sum over units u of (S[u] * sx[u]) * d[o][u]
 *        + sum over groups g of M[g] * (sx[g] * sum xq[g])
 *
 * Those are other numbers than the reference's: fast numerics, held to the reference by
 * tolerance (tests/conformance/tolerance.py). Activations rounded to 8 bits, as other engines
 * round them, do not meet that rule here: on SmolLM2-135M-Instruct's Q4_1 file the logits
 * were up to 6.2% off (median 1.3%) and the greedy token disagreed at 1.5% of 65 positions, and
 * every type of the conformance suites' tiny models was 1.0-1.9% off; rounded to 15 bits they
 * hold (0.04% on that file). Weights of F32, F16 and BF16, and a weight whose scales do not
 * fit binary16, keep the reference's own projections (cpu_strict.h).
 *
 * Every output is computed whole by one job, and a token's row never depends on the other
 * tokens of the batch (a tile of four tokens sums each as a single token is summed): the bits
 * are the same for any batch, chunking and thread count; they differ between paths (AVX2 sums
 * eight lanes, the baseline one).
 *
 * Ownership: a packed weight (a ref_panels) owns data (the quants, [m][width / 128] sweeps of
 * sweep_bytes each, zero past n up to whole sweeps of 128, rows interleaved in fours a
 * sweep at a time), qscale and qoffset (binary16 S and M, [m][width / group], in float-sized
 * storage; qoffset NULL without offsets); k32 is width / 32 and qgroups the group size. */
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "cpu/cpu_layout.h"
#include "cpu/cpu_strict.h"
#include "device/model/model.h"
#include "device/numerics/numerics.h"
#include "device/numerics/numerics_vec.h"
#include "device/numerics/quant.h"
#include "ref/ref_gemm.h"

/* Output rows per job at least, and jobs per thread in a region. */
#define ROWS_MIN 4u
#define JOBS_PER_THREAD 4u
/* Tokens from which rounding the activations is spread over the pool. */
#define XQ_PARALLEL_TOKENS 32u

/* ---- activations ------------------------------------------------------------- */

/* Each token's activations, rounded per block of 32 to integers v of at
 * most XQ_MAX in magnitude, are kept as two signed bytes in the sweeps'
 * lane order, v = 128 hi + lo (hi in -127..126, lo in 0..127): a byte
 * product's pair sum with 4-bit quants then fits int16 with room to add a
 * sweep's four. The same integers are kept as int16 too, for int8 quants.
 * Where a run's are, in the work's xpack: per token `width` bytes hi, then
 * `width` bytes lo, then `width` int16 (i8_pos's order); per token and
 * unit the scale of the unit's block; per token and block that scale times
 * the block's sum of v (what an offset multiplies); per token and unit the
 * unit's sum of v (what a quant_shift multiplies). */
#define XQ_MAX 16255

typedef struct xq_view {
    int8_t *hi, *lo;
    int16_t *x16; /* the same integers as int16, in i8_pos's order */
    float *scale;
    float *offset_x;
    int32_t *usum;
    uint32_t width;
} xq_view;

static size_t xq_floats(uint32_t tokens, uint32_t width)
{
    return (size_t)tokens * (4u * width / sizeof(float) + 2u * width / UNIT + width / 32u);
}

size_t ref_gemm_xpack_floats(uint32_t max_tokens, uint32_t max_n)
{
    size_t strict = ref_strict_gemm_xpack_floats(max_tokens, max_n);
    size_t mine = xq_floats(max_tokens, width_of(max_n));
    return strict > mine ? strict : mine;
}

static xq_view xq_at(float *xpack, uint32_t tokens, uint32_t width)
{
    int8_t *hi = (int8_t *)(void *)xpack;
    int16_t *x16 = (int16_t *)(void *)(hi + (size_t)2 * tokens * width);
    float *scale = xpack + (size_t)tokens * (4u * width / sizeof(float));
    float *offset_x = scale + (size_t)tokens * (width / UNIT);
    return (xq_view){.hi = hi, .lo = hi + (size_t)tokens * width, .x16 = x16, .scale = scale,
                     .offset_x = offset_x,
                     .usum = (int32_t *)(void *)(offset_x + (size_t)tokens * (width / 32u)),
                     .width = width};
}

typedef struct xq_job {
    const ref_matmul *mm;
    xq_view v;
} xq_job;

/* Token t's row: each block of 32 rounded by its largest magnitude. */
static void round_token(void *ctx, uint32_t t, uint32_t thread)
{
    (void)thread;
    const xq_job *j = ctx;
    const ref_matmul *mm = j->mm;
    const float *x = mm->x + (size_t)t * mm->ldx;
    uint32_t n = mm->w->n, width = j->v.width;
    int8_t *hi = j->v.hi + (size_t)t * width, *lo = j->v.lo + (size_t)t * width;
    int16_t *x16 = j->v.x16 + (size_t)t * width;
    float *us = j->v.scale + (size_t)t * (width / UNIT);
    float *uo = j->v.offset_x + (size_t)t * (width / 32u);
    int32_t *usum = j->v.usum + (size_t)t * (width / UNIT);
    for (uint32_t k0 = 0; k0 < width; k0 += 32u) {
        uint32_t kn = k0 >= n ? 0 : n - k0 < 32u ? n - k0 : 32u;
        float amax = 0.0f;
        for (uint32_t i = 0; i < kn; i++) {
            float a = x[k0 + i] < 0.0f ? -x[k0 + i] : x[k0 + i];
            amax = a > amax ? a : amax;
        }
        float id = amax > 0.0f ? (float)XQ_MAX / amax : 0.0f, sx = amax / (float)XQ_MAX;
        int sum = 0, half = 0;
        int8_t h[32], l[32];
        int16_t w16[32];
        for (uint32_t i = 0; i < 32u; i++) {
            int v = i < kn ? (int)nearbyintf(x[k0 + i] * id) : 0;
            v = v > XQ_MAX ? XQ_MAX : v < -XQ_MAX ? -XQ_MAX : v;
            h[i] = (int8_t)((v - (v & 127)) / 128);
            l[i] = (int8_t)(v & 127);
            w16[i] = (int16_t)v;
            sum += v;
            if (i == UNIT - 1u)
                half = sum;
        }
        /* Four neighbouring elements keep their order in both layouts. */
        uint32_t base = k0 / SWEEP * SWEEP;
        for (uint32_t g = 0; g < 32u; g += 4u) {
            uint32_t e = k0 % SWEEP + g;
            memcpy(hi + base + lane_pos(e), h + g, 4);
            memcpy(lo + base + lane_pos(e), l + g, 4);
            memcpy(x16 + base + i8_pos(e), w16 + g, 4 * sizeof(int16_t));
        }
        us[k0 / UNIT] = us[k0 / UNIT + 1u] = sx;
        usum[k0 / UNIT] = half;
        usum[k0 / UNIT + 1u] = sum - half;
        uo[k0 / 32u] = sx * (float)sum;
    }
}

/* ---- dot products -------------------------------------------------------------- */

/* DEVIO_CPU_GEMM_BREAK=1 breaks every dot product on purpose (its last
 * sweep of 128 elements left out): the negative control of the tolerance
 * check (tests/python/fast_numerics_check.py --negative), which must catch
 * it. Read once; never set where numbers matter. */
static int gemm_broken(void)
{
    static int broken = -1;
    if (broken < 0) {
        const char *e = getenv("DEVIO_CPU_GEMM_BREAK");
        broken = e && e[0] == '1';
    }
    return broken;
}

/* Sweeps a dot product sums: the padded width's, less the last when broken
 * on purpose. */
static inline uint32_t sweeps_used(const ref_panels *w)
{
    uint32_t n = sweeps_of(w);
    return n - (gemm_broken() && n > 1u ? 1u : 0u);
}

/* Row o's binary16 offsets of its first sweep, a sweep's four after every
 * four rows' (NULL: none), each to be multiplied by *mul: Q4_0's are its
 * scales times -8, exactly (that factor goes on the activations' term,
 * which a power of two scales exactly, so the product is M's). */
static inline const uint16_t *offsets_of(const ref_panels *w, uint32_t o, float *mul)
{
    *mul = 1.0f;
    if (w->qoffset)
        return halves_at(w, w->qoffset, SWEEP_OFFSETS, o, 0);
    if (w->dtype != DEVIO_Q4_0)
        return NULL;
    *mul = -8.0f; /* groups of 32: four scales a sweep, as offsets are kept */
    return halves_at(w, w->qscale, SWEEP_OFFSETS, o, 0);
}

#if defined(__AVX2__)
static inline __m256i ld(const void *p)
{
    return _mm256_loadu_si256((const __m256i *)p);
}

/* Unit k's integer dot product of a row's sweep of quants at w (as kept,
 * q + quant_shift) with a token's activations there, in lane k. Unsigned
 * quants of 4 to 6 bits by the activations' two bytes (hi, lo, in
 * lane_pos's order): byte products summed in pairs (vpmaddubsw), within
 * int16 over a sweep's four chunks for 4 and 5 bits (31 * 127 * 8) and over
 * two for 6 (63 * 127 * 4), then in fours (vpmaddwd). int8 quants widened to
 * int16 by the activations as int16 (x16, in i8_pos's order): products
 * summed in pairs (vpmaddwd), then neighbouring lanes (vphaddd). */
static inline __attribute__((always_inline)) __m256i unit_dots(const uint8_t *w,
                                                                const pack_kind kind,
                                                                const int8_t *hi,
                                                                const int8_t *lo,
                                                                const int16_t *x16)
{
    if (kind == PK_I8) {
        __m256i a = _mm256_setzero_si256(), b = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            __m256i wa = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w + 32 * c)));
            __m256i wb =
                _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w + 32 * c + 16)));
            a = _mm256_add_epi32(a, _mm256_madd_epi16(wa, ld(x16 + 32 * c)));
            b = _mm256_add_epi32(b, _mm256_madd_epi16(wb, ld(x16 + 32 * c + 16)));
        }
        return _mm256_hadd_epi32(a, b);
    }
    const __m256i low = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    const __m256i top = _mm256_set1_epi8(0x30);
    const __m256i hb = kind == PK_SIX    ? ld(w + 64)
                       : kind == PK_FIVE ? _mm256_broadcastsi128_si256(
                                               _mm_loadu_si128((const __m128i *)(w + 64)))
                                         : _mm256_setzero_si256();
    __m256i h = _mm256_setzero_si256(), l = h, h32 = h, l32 = h;
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        /* chunk k: bytes 32 (k % 2) on, low nibbles for k < 2, high else */
        __m256i raw = ld(w + 32 * (k % 2));
        __m256i c = _mm256_and_si256(k < 2 ? raw : _mm256_srli_epi16(raw, 4), low);
        if (kind == PK_SIX) {
            /* its high bits, 2k and 2k + 1 of each byte, moved to 4 and 5 */
            __m256i b = k == 0   ? _mm256_slli_epi16(hb, 4)
                        : k == 1 ? _mm256_slli_epi16(hb, 2)
                        : k == 2 ? hb
                                 : _mm256_srli_epi16(hb, 2);
            c = _mm256_or_si256(c, _mm256_and_si256(b, top));
        }
        if (kind == PK_FIVE) {
            /* its high bit, k in the low half's bytes and 4 + k in the high
             * half's, moved to 4 (a count of 32 gives zero) */
            __m256i b = _mm256_or_si256(
                _mm256_sllv_epi32(hb, _mm256_setr_epi32(4 - k, 4 - k, 4 - k, 4 - k, 32, 32, 32,
                                                        32)),
                _mm256_srlv_epi32(hb, _mm256_setr_epi32(32, 32, 32, 32, k, k, k, k)));
            c = _mm256_or_si256(c, _mm256_and_si256(b, _mm256_set1_epi8(0x10)));
        }
        h = _mm256_add_epi16(h, _mm256_maddubs_epi16(c, ld(hi + 32 * k)));
        l = _mm256_add_epi16(l, _mm256_maddubs_epi16(c, ld(lo + 32 * k)));
        if (kind == PK_SIX && k % 2 == 1) {
            h32 = _mm256_add_epi32(h32, _mm256_madd_epi16(h, ones));
            l32 = _mm256_add_epi32(l32, _mm256_madd_epi16(l, ones));
            h = l = _mm256_setzero_si256();
        }
    }
    if (kind != PK_SIX) {
        h32 = _mm256_madd_epi16(h, ones);
        l32 = _mm256_madd_epi16(l, ones);
    }
    return _mm256_add_epi32(_mm256_slli_epi32(h32, 7), l32);
}

/* Whether a kind keeps quants past 4 bits, shifted by quant_shift. */
static inline bool high_bits(pack_kind kind)
{
    return kind == PK_FIVE || kind == PK_SIX;
}

/* What a sweep's eight unit sums of quants kept shifted (PK_FIVE, PK_SIX) lose to
 * be the quants' own: the shift times the activations' sum over each unit. */
static inline __m256i unshift(const int32_t *usum, const __m256i shift)
{
    return _mm256_mullo_epi32(_mm256_loadu_si256((const __m256i *)(const void *)usum), shift);
}

/* The scales of one sweep's eight units from a row's binary16 scales there:
 * their own (groups of 16) or each group of 32's twice. */
static inline __m256 unit_scales(const uint16_t *S, uint32_t gs)
{
    if (gs == UNIT)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)S));
    __m128 s4 = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(const void *)S));
    return _mm256_permutevar8x32_ps(_mm256_castps128_ps256(s4),
                                    _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3));
}

/* Four rows' sums folded together, their offsets' sums added. */
static inline void store4(const __m256 *acc, const __m128 *off, float *out)
{
    __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(acc[0], acc[1]), _mm256_hadd_ps(acc[2], acc[3]));
    __m128 sums = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    __m128 offs = _mm_hadd_ps(_mm_hadd_ps(off[0], off[1]), _mm_hadd_ps(off[2], off[3]));
    _mm_storeu_ps(out, _mm_add_ps(sums, offs));
}

/* How far ahead of a four's sweep its stream is prefetched. */
#define PREFETCH_BYTES 2048u

/* The dot products of the four rows from o (a multiple of four) with token
 * t: the four's stream read in order, each sweep's activations once. Built
 * once for each form of quants and scales (kind, gs constant), so that the
 * four accumulators stay in registers. */
static inline __attribute__((always_inline)) void
dots4_of(const ref_panels *w, uint32_t o, const xq_view *v, uint32_t t, float *out,
         const pack_kind kind, const uint32_t gs)
{
    const uint32_t width = v->width, sb = sweep_bytes(w);
    const uint32_t sn = SWEEP / gs, n = sweeps_used(w);
    const int32_t *usum = v->usum + (size_t)t * (width / UNIT);
    const __m256i shift = _mm256_set1_epi32(high_bits(kind) ? quant_shift(w->dtype) : 0);
    const int8_t *xh = v->hi + (size_t)t * width, *xl = v->lo + (size_t)t * width;
    const int16_t *x16 = v->x16 + (size_t)t * width;
    const float *us = v->scale + (size_t)t * (width / UNIT);
    const float *uo = v->offset_x + (size_t)t * (width / 32u);
    const uint8_t *q = quants_at(w, o, 0);
    const uint16_t *S = halves_at(w, w->qscale, sn, o, 0);
    float m8;
    const uint16_t *M = offsets_of(w, o, &m8);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (uint32_t s = 0; s < n; s++, q += 4u * sb, S += 4u * sn) {
        const __m256 xs = _mm256_loadu_ps(us + s * 8u);
        const int8_t *h = xh + s * SWEEP, *l = xl + s * SWEEP;
        const int16_t *x = x16 + s * SWEEP;
        const __m256i sub = high_bits(kind) ? unshift(usum + s * 8u, shift) : shift;
        for (uint32_t b = 0; b < 4u * sb; b += 64u)
            _mm_prefetch((const char *)(q + PREFETCH_BYTES + b), _MM_HINT_T0);
#define ROW(k, acc)                                                                          \
    acc = _mm256_fmadd_ps(                                                                   \
        _mm256_cvtepi32_ps(_mm256_sub_epi32(unit_dots(q + (k) * sb, kind, h, l, x), sub)),   \
        _mm256_mul_ps(unit_scales(S + (k) * sn, gs), xs), acc)
        ROW(0, a0);
        ROW(1, a1);
        ROW(2, a2);
        ROW(3, a3);
#undef ROW
    }
    /* The offsets' terms: a small stream of their own, after the quants'. */
    __m128 f0 = _mm_setzero_ps(), f1 = f0, f2 = f0, f3 = f0;
    for (uint32_t s = 0; M && s < n; s++, M += 4u * SWEEP_OFFSETS) {
        const __m128 xo = _mm_mul_ps(_mm_loadu_ps(uo + s * 4u), _mm_set1_ps(m8));
#define OFF(k) _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(const void *)(M + (k) * 4u)))
        f0 = _mm_fmadd_ps(OFF(0), xo, f0);
        f1 = _mm_fmadd_ps(OFF(1), xo, f1);
        f2 = _mm_fmadd_ps(OFF(2), xo, f2);
        f3 = _mm_fmadd_ps(OFF(3), xo, f3);
#undef OFF
    }
    const __m128 off[4] = {f0, f1, f2, f3};
    const __m256 acc[4] = {a0, a1, a2, a3};
    store4(acc, off, out);
}

/* Tokens a tile of one row takes at once (n_tok of at least TILE_TOKENS). */
#define TILE_TOKENS 4u

/* Row o's dot products with the four tokens from t0: each sweep's quants
 * read (and 4-bit ones unpacked) once for the four. The same bits as
 * dots4 gives each token: the same sums in the same order, and store4's
 * fold, which is lane-wise, over the tokens' sums instead of the rows'. */
static inline __attribute__((always_inline)) void
tile_of(const ref_panels *w, uint32_t o, const xq_view *v, uint32_t t0, float *out,
        const pack_kind kind, const uint32_t gs)
{
    const uint32_t width = v->width, sb = sweep_bytes(w);
    const uint32_t sn = SWEEP / gs, n = sweeps_used(w), per = width / UNIT;
    const int32_t *usum = v->usum + (size_t)t0 * per;
    const __m256i shift = _mm256_set1_epi32(high_bits(kind) ? quant_shift(w->dtype) : 0);
    const int8_t *xh = v->hi + (size_t)t0 * width, *xl = v->lo + (size_t)t0 * width;
    const int16_t *x16 = v->x16 + (size_t)t0 * width;
    const float *us = v->scale + (size_t)t0 * per;
    const float *uo = v->offset_x + (size_t)t0 * (width / 32u);
    const uint8_t *q = quants_at(w, o, 0);
    const uint16_t *S = halves_at(w, w->qscale, sn, o, 0);
    /* Sums in named registers, not an array: an array whose address store4
     * takes stays in memory through the loop. */
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (uint32_t s = 0; s < n; s++, q += 4u * sb, S += 4u * sn) {
        const __m256 sc = unit_scales(S, gs);
#define TOK(k, acc)                                                                           \
    acc = _mm256_fmadd_ps(                                                                    \
        _mm256_cvtepi32_ps(_mm256_sub_epi32(                                                  \
            unit_dots(q, kind, xh + (size_t)(k) * width + s * SWEEP,                          \
                      xl + (size_t)(k) * width + s * SWEEP,                                   \
                      x16 + (size_t)(k) * width + s * SWEEP),                                 \
            high_bits(kind) ? unshift(usum + (size_t)(k) * per + s * 8u, shift) : shift)),    \
        _mm256_mul_ps(sc, _mm256_loadu_ps(us + (size_t)(k) * per + s * 8u)), acc)
        TOK(0, a0);
        TOK(1, a1);
        TOK(2, a2);
        TOK(3, a3);
#undef TOK
    }
    float m8;
    const uint16_t *M = offsets_of(w, o, &m8);
    const uint32_t po = width / 32u;
    __m128 f0 = _mm_setzero_ps(), f1 = f0, f2 = f0, f3 = f0;
    for (uint32_t s = 0; M && s < n; s++, M += 4u * SWEEP_OFFSETS) {
        const __m128 m4 = _mm_mul_ps(
            _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(const void *)M)), _mm_set1_ps(m8));
        f0 = _mm_fmadd_ps(m4, _mm_loadu_ps(uo + s * 4u), f0);
        f1 = _mm_fmadd_ps(m4, _mm_loadu_ps(uo + po + s * 4u), f1);
        f2 = _mm_fmadd_ps(m4, _mm_loadu_ps(uo + 2u * po + s * 4u), f2);
        f3 = _mm_fmadd_ps(m4, _mm_loadu_ps(uo + 3u * po + s * 4u), f3);
    }
    const __m256 acc[4] = {a0, a1, a2, a3};
    const __m128 off[4] = {f0, f1, f2, f3};
    store4(acc, off, out);
}

/* dots4 (the four rows from o, token t) or, tiled, tile_of (row o, the
 * four tokens from t), each built once for every form of quants and scales. */
static void kernel4(bool tiled, const ref_panels *w, uint32_t o, const xq_view *v, uint32_t t,
                    float *out)
{
    /* The forms the types take: 4 bits by 32 (Q4_*), 5 bits by 32 (Q5_*), 6
     * bits by 16 (Q6_K), int8 by 32 (Q8_0). */
    const pack_kind kind = kind_of(w->dtype);
#define FORMS(f)                                                                      \
    (kind == PK_NIB    ? f(w, o, v, t, out, PK_NIB, 32u)                              \
     : kind == PK_I8   ? f(w, o, v, t, out, PK_I8, 32u)                               \
     : kind == PK_FIVE ? f(w, o, v, t, out, PK_FIVE, 32u)                             \
                       : f(w, o, v, t, out, PK_SIX, UNIT))
    if (tiled)
        FORMS(tile_of);
    else
        FORMS(dots4_of);
#undef FORMS
}
#else
/* Element e (0..127) of a row's sweep of quants: q (Q4_0's q + 8, its
 * offsets take the 8 back). */
static inline int quant(const uint8_t *q, pack_kind kind, int shift, uint32_t e)
{
    uint32_t at = quant_pos(kind, e);
    if (kind == PK_I8)
        return (int8_t)q[at];
    int u = (q[at % 64u] >> (at >= 64u ? 4 : 0)) & 15;
    if (kind == PK_NIB)
        return u;
    if (kind == PK_FIVE)
        return (u | ((q[high5_byte(at)] >> high5_bit(at)) & 1) << 4) - shift;
    return (u | ((q[high6_byte(at)] >> high6_bit(at)) & 3) << 4) - shift;
}

/* The dot product of row o with token t alone (the baseline path's). */
static float dots1(const ref_panels *w, uint32_t o, const xq_view *v, uint32_t t)
{
    const uint32_t width = v->width, gs = w->qgroups, sn = sweep_scales_n(w), n = sweeps_used(w);
    const pack_kind kind = kind_of(w->dtype);
    const int shift = quant_shift(w->dtype);
    const int8_t *xh = v->hi + (size_t)t * width, *xl = v->lo + (size_t)t * width;
    const float *us = v->scale + (size_t)t * (width / UNIT);
    const float *uo = v->offset_x + (size_t)t * (width / 32u);
    float acc = 0.0f, off = 0.0f, m8;
    const uint16_t *M = offsets_of(w, o, &m8);
    for (uint32_t s = 0; s < n; s++) {
        const uint8_t *q = quants_at(w, o, s);
        const uint16_t *S = halves_at(w, w->qscale, sn, o, s);
        for (uint32_t j = 0; j < SWEEP / UNIT; j++) {
            int d = 0;
            for (uint32_t i = 0; i < UNIT; i++) {
                uint32_t at = lane_pos(j * UNIT + i);
                d += quant(q, kind, shift, j * UNIT + i) *
                     (128 * xh[s * SWEEP + at] + xl[s * SWEEP + at]);
            }
            acc += (devio_f16_to_f32(S[j * UNIT / gs]) * us[s * 8u + j]) * (float)d;
        }
        for (uint32_t g = 0; M && g < SWEEP_OFFSETS; g++)
            off += devio_f16_to_f32(M[s * 4u * SWEEP_OFFSETS + g]) * (m8 * uo[s * 4u + g]);
    }
    return acc + off;
}
#endif

/* The dot products of rows o..o+nr-1 (nr <= 4, o a multiple of four) with
 * token t; a four is computed whole even when its last rows are padding. */
static void row_dots(const ref_panels *w, uint32_t o, uint32_t nr, const xq_view *v, uint32_t t,
                     float *out)
{
#if defined(__AVX2__)
    (void)nr;
    kernel4(false, w, o, v, t, out);
#else
    for (uint32_t k = 0; k < nr; k++)
        out[k] = dots1(w, o + k, v, t);
#endif
}

/* ---- a run ------------------------------------------------------------------------ */

typedef struct run_job {
    const ref_matmul *mm;
    uint32_t count;
    xq_view v;
    uint32_t job_start[5]; /* each projection's first job; [count] the total */
    uint32_t rows_per_job[4];
} run_job;

static inline float *out_row(const ref_matmul *mm, uint32_t t)
{
    return mm->y_rows ? mm->y_rows[t] : mm->y + (size_t)t * mm->ldy;
}

static inline void store(const ref_matmul *mm, uint32_t o, uint32_t t, float dot, float dot2)
{
    float *y = out_row(mm, t) + o;
    switch (mm->epi) {
    case REF_EPI_STORE:
        *y = dot;
        break;
    case REF_EPI_BIAS:
        *y = dot + mm->bias[o];
        break;
    case REF_EPI_ADD:
        *y = *y + dot;
        break;
    case REF_EPI_ADD_SCALED:
        *y = *y + dot * mm->scale;
        break;
    case REF_EPI_SILU_MUL:
        *y = devio_siluf(dot) * dot2;
        break;
    }
}

/* Four outputs: each d[k] stored as store does, SiLU's four at once (the
 * vector form gives the scalar's bits, numerics_vec.h). */
static inline void store4_outs(const ref_matmul *mm, const uint32_t *o, const uint32_t *t,
                               uint32_t n, float *d, const float *d2)
{
    if (mm->epi == REF_EPI_SILU_MUL) {
        float g[8] = {0}, u[8] = {0};
        memcpy(g, d, 4 * sizeof(float));
        memcpy(u, d2, 4 * sizeof(float));
        devio_silu_mul_n(g, g, u, 8);
        for (uint32_t k = 0; k < n; k++)
            out_row(mm, t[k])[o[k]] = g[k];
        return;
    }
    for (uint32_t k = 0; k < n; k++)
        store(mm, o[k], t[k], d[k], d2[k]);
}

static void run_rows(void *ctx, uint32_t job, uint32_t thread)
{
    (void)thread;
    const run_job *r = ctx;
    uint32_t k = 0;
    while (job >= r->job_start[k + 1])
        k++;
    const ref_matmul *mm = &r->mm[k];
    uint32_t o0 = (job - r->job_start[k]) * r->rows_per_job[k];
    uint32_t o1 = o0 + r->rows_per_job[k] < mm->w->m ? o0 + r->rows_per_job[k] : mm->w->m;
    float d[4] = {0}, d2[4] = {0};
    const bool silu = mm->epi == REF_EPI_SILU_MUL;
    /* Rows in fours from the job's start (a multiple of four), every token
     * for each four: their quants stay in the nearest cache meanwhile. */
    for (uint32_t o = o0; o < o1; o += 4u) {
        uint32_t nr = o1 - o < 4u ? o1 - o : 4u, t = 0;
#if defined(__AVX2__)
        /* Whole tiles of tokens a row at a time; their activations stay in
         * the nearest cache for the four's rows. */
        for (; t + TILE_TOKENS <= mm->n_tok; t += TILE_TOKENS)
            for (uint32_t k = 0; k < nr; k++) {
                kernel4(true, mm->w, o + k, &r->v, t, d);
                if (silu)
                    kernel4(true, mm->w2, o + k, &r->v, t, d2);
                const uint32_t os[4] = {o + k, o + k, o + k, o + k};
                const uint32_t ts[4] = {t, t + 1, t + 2, t + 3};
                store4_outs(mm, os, ts, TILE_TOKENS, d, d2);
            }
#endif
        for (; t < mm->n_tok; t++) {
            row_dots(mm->w, o, nr, &r->v, t, d);
            if (silu)
                row_dots(mm->w2, o, nr, &r->v, t, d2);
            const uint32_t os[4] = {o, o + 1, o + 2, o + 3}, ts[4] = {t, t, t, t};
            store4_outs(mm, os, ts, nr, d, d2);
        }
    }
}

/* Whether projection mm takes the fast kernels (every weight it reads quantized). */
static bool fast_mm(const ref_matmul *mm)
{
    return fast(mm->w) && (mm->epi != REF_EPI_SILU_MUL || fast(mm->w2));
}

void ref_matmul_run(const ref_gemm_work *wk, ref_matmul *mm, uint32_t count)
{
    if (count == 0 || mm[0].n_tok == 0)
        return;
    if (count > 4)
        count = 4;
    run_job r = {.count = 0};
    ref_matmul fm[4];
    for (uint32_t k = 0; k < count; k++) {
        if (fast_mm(&mm[k]))
            fm[r.count++] = mm[k];
        else
            ref_strict_matmul_run(wk, &mm[k], 1);
    }
    if (r.count == 0)
        return;
    /* Every projection of a run reads the same rows of x: rounded once. */
    uint32_t n_tok = fm[0].n_tok, width = fm[0].w->k32 * 32u;
    xq_job xj = {.mm = &fm[0], .v = xq_at(wk->xpack, n_tok, width)};
    if (n_tok >= XQ_PARALLEL_TOKENS)
        devio_pool_run(wk->pool, n_tok, round_token, &xj);
    else
        for (uint32_t t = 0; t < n_tok; t++)
            round_token(&xj, t, 0);
    r.mm = fm;
    r.v = xj.v;
    uint32_t want = devio_pool_threads(wk->pool) * JOBS_PER_THREAD, total = 0;
    for (uint32_t k = 0; k < r.count; k++) {
        uint32_t m = fm[k].w->m, per = (m + want - 1) / want;
        per = (per + ROWS_MIN - 1) / ROWS_MIN * ROWS_MIN;
        r.rows_per_job[k] = per;
        r.job_start[k] = total;
        total += (m + per - 1) / per;
    }
    r.job_start[r.count] = total;
    devio_pool_run(wk->pool, total, run_rows, &r);
}
