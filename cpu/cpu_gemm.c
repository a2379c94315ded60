/* cpu_gemm.c - the cpu backend's projections under fast numerics (ref/ref_gemm.h's functions,
 * built in place of the reference's in every path of the cpu backend, cpu/isa.bzl);
 * long because the kernels of every form (decode, wide tiles, the baseline's) share
 * static inline helpers that must inline into each, and a run's jobs drive them all.
 *
 * A quantized weight (every type of device/numerics/quant.h) is split once at load (cpu_pack.c,
 * devio_quant_split) into small integer quants q and, per group of its elements (16 for Q6_K,
 * else 32), a scale S and an offset M, both kept as binary16: y = S * q + M. The quants
 * are kept unsigned (q + quant_shift) in the bits the type has (cpu_layout.h's pack_kind):
 * 4-bit types two a byte, as the file does; 5- and 6-bit types as a plane of 4 bits and one
 * of 1 or 2; Q8_0 one int8 an element. So a decode step streams about the file's bytes.
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
 * fit binary16, take the reference's projection code (cpu_strict.h), built here with fused
 * multiply-adds (cpu/isa.bzl).
 *
 * A batch's whole fours of tokens (a prefill's chunk, a decode batch of four or more) take
 * wide tiles on AVX2: a four's rows widened once to int16 (widen4), then two rows by four tokens
 * at a time by vpmaddwd with the activations' int16, 16 products an instruction and no
 * unpacking in the loop; the tokens left over, and a decode of one token, take dots4.
 *
 * Every output is computed whole by one job, and a token's row never depends on the other
 * tokens of the batch (a wide tile of four tokens sums each as a single token is
 * summed: the units' integer sums are exact whichever instructions make them, and the floats
 * made from them are the same operations in the same order): the bits are the same for any
 * batch, chunking and thread count; they differ between paths (AVX2 sums eight lanes, the
 * baseline one).
 *
 * Ownership: a packed weight (a ref_panels) owns data (the quants, [m][width / 128] sweeps of
 * sweep_bytes each, zero past n up to whole sweeps of 128, a last sweep of at most 64
 * elements kept as a half tail (cpu_layout.h), rows interleaved in fours a sweep at a time),
 * qscale and qoffset (binary16 S and M, [m][width / group], in float-sized storage; qoffset
 * NULL without offsets); k32 is width / 32 and qgroups the group size. */
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

/* A block's kn (<= 32) values rounded by their largest magnitude (v[i] 0
 * from kn on); the largest magnitude is returned. */
static float round_block(const float *x, uint32_t kn, int32_t *v)
{
#if defined(__AVX2__)
    if (kn == 32u) {
        /* The scalar form's numbers: |x| by the sign bit cleared, the
         * largest by max (a NaN left out, as the comparison leaves it), the
         * product rounded to nearest even by cvtps (nearbyintf's). */
        const __m256 abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
        __m256 m = _mm256_setzero_ps();
        for (int i = 0; i < 4; i++)
            m = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + 8 * i), abs), m);
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
        const float amax = _mm_cvtss_f32(h);
        const __m256 id = _mm256_set1_ps(amax > 0.0f ? (float)XQ_MAX / amax : 0.0f);
        for (int i = 0; i < 4; i++) {
            __m256i r = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * i), id));
            r = _mm256_max_epi32(_mm256_min_epi32(r, _mm256_set1_epi32(XQ_MAX)),
                                 _mm256_set1_epi32(-XQ_MAX));
            _mm256_storeu_si256((__m256i *)(void *)(v + 8 * i), r);
        }
        return amax;
    }
#endif
    float amax = 0.0f;
    for (uint32_t i = 0; i < kn; i++) {
        float a = x[i] < 0.0f ? -x[i] : x[i];
        amax = a > amax ? a : amax;
    }
    float id = amax > 0.0f ? (float)XQ_MAX / amax : 0.0f;
    for (uint32_t i = 0; i < 32u; i++) {
        int r = i < kn ? (int)nearbyintf(x[i] * id) : 0;
        v[i] = r > XQ_MAX ? XQ_MAX : r < -XQ_MAX ? -XQ_MAX : r;
    }
    return amax;
}

/* A block's rounded values (the block from element k0 of the row) put in
 * their places: hi and lo in lane_pos's, as int16 in i8_pos's; *sum is
 * their sum, *half the first 16's. */
static void place_block(const int32_t *vs, uint32_t k0, int8_t *hi, int8_t *lo, int16_t *x16,
                        int *sum, int *half)
{
    uint32_t base = k0 / SWEEP * SWEEP;
#if defined(__AVX2__)
    uint32_t b = k0 % SWEEP / 32u;
    /* Elements 0-15 (A, the unit 2b) and 16-31 (B, unit 2b + 1) as int16;
     * interleaved by 32 bits, A's pair p then B's is the 8 bytes i8_pos
     * keeps at pair p's place; the bytes of A's four q then B's are lane_pos's
     * 8 bytes of chunk q. */
    const __m128i *v = (const __m128i *)(const void *)vs;
    __m128i a0 = _mm_packs_epi32(_mm_loadu_si128(v), _mm_loadu_si128(v + 1));
    __m128i a1 = _mm_packs_epi32(_mm_loadu_si128(v + 2), _mm_loadu_si128(v + 3));
    __m128i b0 = _mm_packs_epi32(_mm_loadu_si128(v + 4), _mm_loadu_si128(v + 5));
    __m128i b1 = _mm_packs_epi32(_mm_loadu_si128(v + 6), _mm_loadu_si128(v + 7));
    const __m128i w[4] = {_mm_unpacklo_epi32(a0, b0), _mm_unpackhi_epi32(a0, b0),
                          _mm_unpacklo_epi32(a1, b1), _mm_unpackhi_epi32(a1, b1)};
    for (int k = 0; k < 4; k++) {
        _mm_storel_epi64((__m128i *)(void *)(x16 + base + (2 * k) * 16 + 4 * b), w[k]);
        _mm_storel_epi64((__m128i *)(void *)(x16 + base + (2 * k + 1) * 16 + 4 * b),
                         _mm_unpackhi_epi64(w[k], w[k]));
    }
    const __m128i m127 = _mm_set1_epi16(127);
    __m128i ha = _mm_packs_epi16(_mm_srai_epi16(a0, 7), _mm_srai_epi16(a1, 7));
    __m128i hb = _mm_packs_epi16(_mm_srai_epi16(b0, 7), _mm_srai_epi16(b1, 7));
    __m128i la = _mm_packs_epi16(_mm_and_si128(a0, m127), _mm_and_si128(a1, m127));
    __m128i lb = _mm_packs_epi16(_mm_and_si128(b0, m127), _mm_and_si128(b1, m127));
    const __m128i hs[2] = {_mm_unpacklo_epi32(ha, hb), _mm_unpackhi_epi32(ha, hb)};
    const __m128i ls[2] = {_mm_unpacklo_epi32(la, lb), _mm_unpackhi_epi32(la, lb)};
    for (int k = 0; k < 2; k++) {
        _mm_storel_epi64((__m128i *)(void *)(hi + base + (2 * k) * 32 + 8 * b), hs[k]);
        _mm_storel_epi64((__m128i *)(void *)(hi + base + (2 * k + 1) * 32 + 8 * b),
                         _mm_unpackhi_epi64(hs[k], hs[k]));
        _mm_storel_epi64((__m128i *)(void *)(lo + base + (2 * k) * 32 + 8 * b), ls[k]);
        _mm_storel_epi64((__m128i *)(void *)(lo + base + (2 * k + 1) * 32 + 8 * b),
                         _mm_unpackhi_epi64(ls[k], ls[k]));
    }
    __m128i sa = _mm_add_epi32(_mm_add_epi32(_mm_loadu_si128(v), _mm_loadu_si128(v + 1)),
                               _mm_add_epi32(_mm_loadu_si128(v + 2), _mm_loadu_si128(v + 3)));
    __m128i sb = _mm_add_epi32(_mm_add_epi32(_mm_loadu_si128(v + 4), _mm_loadu_si128(v + 5)),
                               _mm_add_epi32(_mm_loadu_si128(v + 6), _mm_loadu_si128(v + 7)));
    __m128i s2 = _mm_hadd_epi32(sa, sb);
    s2 = _mm_hadd_epi32(s2, s2); /* A's sum, B's, A's, B's */
    *half = _mm_cvtsi128_si32(s2);
    *sum = *half + _mm_extract_epi32(s2, 1);
#else
    int s = 0;
    *half = 0;
    for (uint32_t i = 0; i < 32u; i++) {
        int v = vs[i];
        uint32_t e = k0 % SWEEP + i;
        hi[base + lane_pos(e)] = (int8_t)((v - (v & 127)) / 128);
        lo[base + lane_pos(e)] = (int8_t)(v & 127);
        x16[base + i8_pos(e)] = (int16_t)v;
        s += v;
        if (i == UNIT - 1u)
            *half = s;
    }
    *sum = s;
#endif
}

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
        int32_t vs[32];
        float amax = round_block(x + k0, kn, vs), sx = amax / (float)XQ_MAX;
        int sum, half;
        place_block(vs, k0, hi, lo, x16, &sum, &half);
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
 * four rows' (NULL: none). */
static inline const uint16_t *offsets_of(const ref_panels *w, uint32_t o)
{
    return w->qoffset ? halves_at(w, w->qoffset, SWEEP_OFFSETS, o, 0) : NULL;
}

#if defined(__AVX2__)
static inline __m256i ld(const void *p)
{
    return _mm256_loadu_si256((const __m256i *)p);
}

/* The high-bit plane of a row's sweep of quants at w (PK_FIVE's 16 bytes
 * in both halves, PK_SIX's 32), for chunk_quants. */
static inline __m256i high_plane(const uint8_t *w, const pack_kind kind, const bool tail)
{
    return kind == PK_SIX    ? ld(w + 64)
           : kind == PK_FIVE ? _mm256_broadcastsi128_si256(
                                   _mm_loadu_si128((const __m128i *)(w + (tail ? 32 : 64))))
                             : _mm256_setzero_si256();
}

/* Bytes 32 c .. 32 c + 31 of a sweep's low plane at w: of a half tail
 * (cpu_layout.h) its 16 kept, units 4-7's zero. */
static inline __m256i low_chunk(const uint8_t *w, const int c, const bool tail)
{
    return tail ? _mm256_zextsi128_si256(_mm_loadu_si128((const __m128i *)(w + 16 * c)))
                : ld(w + 32 * c);
}

/* Chunk k (0..3) of a row's sweep of unsigned quants at w, as kept (q +
 * quant_shift), one a byte in lane_pos's order; hb is high_plane's. */
static inline __attribute__((always_inline)) __m256i
chunk_quants(const uint8_t *w, const pack_kind kind, const __m256i hb, const int k, const bool tail)
{
    /* bytes 32 (k % 2) on, low nibbles for k < 2, high else */
    __m256i raw = low_chunk(w, k % 2, tail);
    __m256i c = _mm256_and_si256(k < 2 ? raw : _mm256_srli_epi16(raw, 4), _mm256_set1_epi8(0x0f));
    if (kind == PK_SIX) {
        /* its high bits, 2k and 2k + 1 of each byte, moved to 4 and 5 */
        __m256i b = k == 0   ? _mm256_slli_epi16(hb, 4)
                    : k == 1 ? _mm256_slli_epi16(hb, 2)
                    : k == 2 ? hb
                             : _mm256_srli_epi16(hb, 2);
        c = _mm256_or_si256(c, _mm256_and_si256(b, _mm256_set1_epi8(0x30)));
    }
    if (kind == PK_FIVE) {
        /* its high bit, k in the low half's bytes and 4 + k in the high
         * half's, moved to 4 (a count of 32 gives zero) */
        __m256i b = _mm256_or_si256(
            _mm256_sllv_epi32(hb, _mm256_setr_epi32(4 - k, 4 - k, 4 - k, 4 - k, 32, 32, 32, 32)),
            _mm256_srlv_epi32(hb, _mm256_setr_epi32(32, 32, 32, 32, k, k, k, k)));
        c = _mm256_or_si256(c, _mm256_and_si256(b, _mm256_set1_epi8(0x10)));
    }
    return c;
}

/* Unit k's integer dot product of a row's sweep of quants at w (as kept,
 * q + quant_shift) with a token's activations there, in lane k. Unsigned
 * quants of 4 to 6 bits by the activations' two bytes (hi, lo, in
 * lane_pos's order): byte products summed in pairs (vpmaddubsw), within
 * int16 over a sweep's four chunks for 4 and 5 bits (31 * 127 * 8) and over
 * two for 6 (63 * 127 * 4), then in fours (vpmaddwd). int8 quants widened to
 * int16 by the activations as int16 (x16, in i8_pos's order): products
 * summed in pairs (vpmaddwd), a group of 16 at a time. */
static inline __attribute__((always_inline)) __m256i
unit_dots(const uint8_t *w, const pack_kind kind, const int8_t *hi, const int8_t *lo,
          const int16_t *x16, const bool tail)
{
    if (kind == PK_I8) {
        __m256i a = _mm256_setzero_si256(), b = _mm256_setzero_si256();
        /* group j's 16 bytes, or a half tail's 8 kept (units 0-3) */
#define GROUP(j)                                                                             \
    _mm256_cvtepi8_epi16(tail ? _mm_loadl_epi64((const __m128i *)(w + 8 * (j)))               \
                              : _mm_loadu_si128((const __m128i *)(w + 16 * (j))))
#pragma GCC unroll 4
        for (int j = 0; j < 8; j += 2) {
            __m256i wa = GROUP(j);
            __m256i wb = GROUP(j + 1);
#undef GROUP
            a = _mm256_add_epi32(a, _mm256_madd_epi16(wa, ld(x16 + 16 * j)));
            b = _mm256_add_epi32(b, _mm256_madd_epi16(wb, ld(x16 + 16 * j + 16)));
        }
        return _mm256_add_epi32(a, b);
    }
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i hb = high_plane(w, kind, tail);
    __m256i h = _mm256_setzero_si256(), l = h, h32 = h, l32 = h;
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        const __m256i c = chunk_quants(w, kind, hb, k, tail);
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

/* What a sweep's eight unit sums of quants kept shifted (a quant_shift, a
 * type's `shifted` form) lose to be the quants' own: the shift times the
 * activations' sum over each unit. */
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
         const pack_kind kind, const uint32_t gs, const bool shifted)
{
    const uint32_t width = v->width, sb = sweep_bytes(w);
    const uint32_t sn = SWEEP / gs, n = sweeps_used(w);
    const int32_t *usum = v->usum + (size_t)t * (width / UNIT);
    const __m256i shift = _mm256_set1_epi32(quant_shift(w->dtype));
    const int8_t *xh = v->hi + (size_t)t * width, *xl = v->lo + (size_t)t * width;
    const int16_t *x16 = v->x16 + (size_t)t * width;
    const float *us = v->scale + (size_t)t * (width / UNIT);
    const float *uo = v->offset_x + (size_t)t * (width / 32u);
    const uint8_t *q = quants_at(w, o, 0);
    const uint16_t *S = halves_at(w, w->qscale, sn, o, 0);
    const uint16_t *M = offsets_of(w, o);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    /* Sweep s, its rows rb bytes apart (a half tail's when tail). */
#define SWEEP4(s, rb, tail)                                                                   \
    do {                                                                                      \
        const __m256 xs = _mm256_loadu_ps(us + (s) * 8u);                                     \
        const int8_t *h = xh + (s) * SWEEP, *l = xl + (s) * SWEEP;                            \
        const int16_t *x = x16 + (s) * SWEEP;                                                 \
        const __m256i sub =                                                                   \
            shifted ? unshift(usum + (s) * 8u, shift) : _mm256_setzero_si256();               \
        for (uint32_t b = 0; b < 4u * (rb); b += 64u)                                         \
            _mm_prefetch((const char *)(q + PREFETCH_BYTES + b), _MM_HINT_T0);                \
        ROW(0, a0, rb, tail);                                                                 \
        ROW(1, a1, rb, tail);                                                                 \
        ROW(2, a2, rb, tail);                                                                 \
        ROW(3, a3, rb, tail);                                                                 \
    } while (0)
#define ROW(k, acc, rb, tail)                                                                 \
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(                               \
                              unit_dots(q + (k) * (rb), kind, h, l, x, tail), sub)),          \
                          _mm256_mul_ps(unit_scales(S + (k) * sn, gs), xs), acc)
    /* Whole sweeps, then a half tail read in place (cpu_layout.h's half_tail). */
    const uint32_t whole = half_tail(w) && n == sweeps_of(w) ? n - 1u : n;
    for (uint32_t s = 0; s < whole; s++, q += 4u * sb, S += 4u * sn)
        SWEEP4(s, sb, false);
    if (whole < n)
        SWEEP4(whole, tail_bytes(w), true);
#undef ROW
#undef SWEEP4
    /* The offsets' terms: a small stream of their own, after the quants'. */
    __m128 f0 = _mm_setzero_ps(), f1 = f0, f2 = f0, f3 = f0;
    for (uint32_t s = 0; M && s < n; s++, M += 4u * SWEEP_OFFSETS) {
        const __m128 xo = _mm_loadu_ps(uo + s * 4u);
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

/* Tokens a wide tile takes at once: a batch of at least this many takes wide tiles. */
#define TILE_TOKENS 4u

typedef struct off4 {
    __m128 f[4];
} off4;

/* Row o's offsets' terms for the four tokens from t0 (zeros without offsets). */
static inline off4 tile_offsets(const ref_panels *w, uint32_t o, const xq_view *v, uint32_t t0)
{
    const uint32_t po = v->width / 32u, n = sweeps_used(w);
    const float *uo = v->offset_x + (size_t)t0 * po;
    const uint16_t *M = offsets_of(w, o);
    __m128 f0 = _mm_setzero_ps(), f1 = f0, f2 = f0, f3 = f0;
    for (uint32_t s = 0; M && s < n; s++, M += 4u * SWEEP_OFFSETS) {
        const __m128 m4 = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(const void *)M));
        f0 = _mm_fmadd_ps(m4, _mm_loadu_ps(uo + s * 4u), f0);
        f1 = _mm_fmadd_ps(m4, _mm_loadu_ps(uo + po + s * 4u), f1);
        f2 = _mm_fmadd_ps(m4, _mm_loadu_ps(uo + 2u * po + s * 4u), f2);
        f3 = _mm_fmadd_ps(m4, _mm_loadu_ps(uo + 3u * po + s * 4u), f3);
    }
    return (off4){{f0, f1, f2, f3}};
}

/* dots4_of (the four rows from o, token t), built once for every form of quants and scales. */
static void dots4(const ref_panels *w, uint32_t o, const xq_view *v, uint32_t t, float *out)
{
    /* The forms the types take: 4 bits by 32, shifted (Q4_0) or not (Q4_1,
     * Q4_K), 5 bits by 32, shifted (Q5_0) or not (Q5_1, Q5_K), 6 bits by 16,
     * shifted (Q6_K), int8 by 32 (Q8_0). */
    const pack_kind kind = kind_of(w->dtype);
    const bool sh = quant_shift(w->dtype) != 0;
    if (kind == PK_NIB)
        sh ? dots4_of(w, o, v, t, out, PK_NIB, 32u, true)
           : dots4_of(w, o, v, t, out, PK_NIB, 32u, false);
    else if (kind == PK_I8)
        dots4_of(w, o, v, t, out, PK_I8, 32u, false);
    else if (kind == PK_FIVE)
        sh ? dots4_of(w, o, v, t, out, PK_FIVE, 32u, true)
           : dots4_of(w, o, v, t, out, PK_FIVE, 32u, false);
    else
        dots4_of(w, o, v, t, out, PK_SIX, UNIT, true);
}

/* How many tokens' activations a four's widened rows meet before the next
 * four's (a block's x16 stays in the second-level cache: 64 tokens of 1536
 * elements are 192 KiB). Wide tiles pay from a batch of four tokens on: the
 * rows are widened once for all of them, where dots4 unpacks them for each
 * (SmolLM2 q8_0 and q4_0, decode batch 4: 1.3x, batch 8: 1.2x against tiles
 * of four by dots of bytes, which they replace). */
#define WIDE_BLOCK 64u

/* One row's sweep of quants at q widened to int16 at d, each its type's
 * quant q (as kept, less the shift sh), in i8_pos's order. */
static inline __attribute__((always_inline)) void
widen_sweep(const uint8_t *q, const pack_kind kind, const __m256i sh, int16_t *d)
{
    if (kind == PK_I8) {
        for (int j = 0; j < 8; j++)
            _mm256_storeu_si256(
                (__m256i *)(void *)(d + 16 * j),
                _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(q + 16 * j))));
        return;
    }
    /* A chunk's bytes, unit u's elements 4k..4k+3 at 4u (units 0-3 in the
     * low half, 4-7 in the high): each half's elements 4k and 4k + 1 to its
     * low eight bytes, 4k + 2 and 4k + 3 to its high eight; then the halves'
     * low eights together (group 2k in i8_pos's order), and high eights. */
    const __m256i pick = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, 0,
                                          1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
    const __m256i hb = high_plane(q, kind, false);
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        __m256i p = _mm256_permute4x64_epi64(
            _mm256_shuffle_epi8(chunk_quants(q, kind, hb, k, false), pick), 0xd8);
        __m256i g0 = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(p));
        __m256i g1 = _mm256_cvtepu8_epi16(_mm256_extracti128_si256(p, 1));
        _mm256_storeu_si256((__m256i *)(void *)(d + 32 * k), _mm256_sub_epi16(g0, sh));
        _mm256_storeu_si256((__m256i *)(void *)(d + 32 * k + 16), _mm256_sub_epi16(g1, sh));
    }
}

/* The four rows from o widened: dst[r * width + sweep * SWEEP + i8_pos(e)]. */
static void widen4(const ref_panels *w, uint32_t o, uint32_t width, int16_t *dst)
{
    const pack_kind kind = kind_of(w->dtype);
    const uint32_t sb = sweep_bytes(w), n = sweeps_of(w);
    const __m256i sh = _mm256_set1_epi16((short)quant_shift(w->dtype));
    const uint8_t *q = quants_at(w, o, 0);
    const bool ht = half_tail(w);
    for (uint32_t s = 0; s < n; s++)
        for (uint32_t r = 0; r < 4u; r++) {
            int16_t *d = dst + (size_t)r * width + (size_t)s * SWEEP;
            uint8_t whole[SWEEP];
            const uint8_t *qs = q;
            if (ht && s + 1u == n) {
                expand_tail(w, q, whole);
                qs = whole;
            }
            /* The kind known only here: widening is a small part of a batch's
             * time, so one form serves every kind. */
            widen_sweep(qs, kind, sh, d);
            q += s + 1u == n ? tail_bytes(w) : sb;
        }
}

/* Rows o and o + 1 (widened at w16, a row every width) with the four tokens
 * from t0: out[4 r + k] row o + r's product with token t0 + k. Each unit's
 * integer sum is the same integer the other kernels take (vpmaddwd of the
 * widened quants by x16, eight groups a sweep), the floats are made from it
 * as dots4_of makes them for each token: the same bits. */
static inline __attribute__((always_inline)) void
wide_tile_of(const ref_panels *w, const int16_t *w16, uint32_t o, const xq_view *v, uint32_t t0,
             float *out, const uint32_t gs)
{
    const uint32_t width = v->width, sn = SWEEP / gs, n = sweeps_used(w), per = width / UNIT;
    const int16_t *x16 = v->x16 + (size_t)t0 * width;
    const float *us = v->scale + (size_t)t0 * per;
    const uint16_t *S0 = halves_at(w, w->qscale, sn, o, 0);
    const uint16_t *S1 = halves_at(w, w->qscale, sn, o + 1u, 0);
    __m256 f00 = _mm256_setzero_ps(), f01 = f00, f02 = f00, f03 = f00;
    __m256 f10 = f00, f11 = f00, f12 = f00, f13 = f00;
    for (uint32_t s = 0; s < n; s++) {
        const int16_t *p0 = w16 + s * SWEEP, *p1 = p0 + width;
        const int16_t *x0 = x16 + s * SWEEP, *x1 = x0 + width, *x2 = x1 + width, *x3 = x2 + width;
        __m256i a00 = _mm256_setzero_si256(), a01 = a00, a02 = a00, a03 = a00;
        __m256i a10 = a00, a11 = a00, a12 = a00, a13 = a00;
#pragma GCC unroll 2
        for (uint32_t j = 0; j < SWEEP; j += 16u) {
            const __m256i w0 = ld(p0 + j), w1 = ld(p1 + j);
#define TOK(xk, r0, r1)                                                                \
    do {                                                                               \
        const __m256i v = ld(xk + j);                                                  \
        r0 = _mm256_add_epi32(r0, _mm256_madd_epi16(w0, v));                           \
        r1 = _mm256_add_epi32(r1, _mm256_madd_epi16(w1, v));                           \
    } while (0)
            TOK(x0, a00, a10);
            TOK(x1, a01, a11);
            TOK(x2, a02, a12);
            TOK(x3, a03, a13);
#undef TOK
            /* The sums stay in registers, a group at a time: without this
             * the compiler makes the sweep's 64 products first and spills
             * them (integer sums may be reordered), at half the speed. */
            __asm__("" : "+x"(a00), "+x"(a01), "+x"(a02), "+x"(a03), "+x"(a10), "+x"(a11),
                    "+x"(a12), "+x"(a13));
        }
        const __m256 sc0 = unit_scales(S0 + s * 4u * sn, gs);
        const __m256 sc1 = unit_scales(S1 + s * 4u * sn, gs);
#define FL(k, r0, r1, g0, g1)                                                             \
    do {                                                                                   \
        const __m256 xs = _mm256_loadu_ps(us + (size_t)(k) * per + s * 8u);              \
        g0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(r0), _mm256_mul_ps(sc0, xs), g0);         \
        g1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(r1), _mm256_mul_ps(sc1, xs), g1);         \
    } while (0)
        FL(0, a00, a10, f00, f10);
        FL(1, a01, a11, f01, f11);
        FL(2, a02, a12, f02, f12);
        FL(3, a03, a13, f03, f13);
#undef FL
    }
    const __m256 acc0[4] = {f00, f01, f02, f03}, acc1[4] = {f10, f11, f12, f13};
    store4(acc0, tile_offsets(w, o, v, t0).f, out);
    store4(acc1, tile_offsets(w, o + 1u, v, t0).f, out + 4);
}

/* wide_tile_of built once for each group size. */
static void wide_tile(const ref_panels *w, const int16_t *w16, uint32_t o, const xq_view *v,
                      uint32_t t0, float *out)
{
    if (w->qgroups == UNIT)
        wide_tile_of(w, w16, o, v, t0, out, UNIT);
    else
        wide_tile_of(w, w16, o, v, t0, out, 32u);
}
#else
/* Element e (0..127) of a row's sweep of quants: q. */
static inline int quant(const uint8_t *q, pack_kind kind, int shift, uint32_t e)
{
    uint32_t at = quant_pos(kind, e);
    if (kind == PK_I8)
        return (int8_t)q[at];
    int u = (q[at % 64u] >> (at >= 64u ? 4 : 0)) & 15;
    if (kind == PK_NIB)
        return u - shift;
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
    float acc = 0.0f, off = 0.0f;
    const uint16_t *M = offsets_of(w, o);
    uint8_t whole[SWEEP];
    for (uint32_t s = 0; s < n; s++) {
        const uint8_t *q = quants_at(w, o, s);
        if (half_tail(w) && s + 1u == sweeps_of(w)) {
            expand_tail(w, q, whole);
            q = whole;
        }
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
            off += devio_f16_to_f32(M[s * 4u * SWEEP_OFFSETS + g]) * uo[s * 4u + g];
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
    dots4(w, o, v, t, out);
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
    ref_scratch *scratch; /* one per thread: its `wide` holds a four's rows widened */
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

/* n (up to 8) outputs: each d[k] stored as store does, SiLU's all at once
 * (the vector form gives the scalar's bits, numerics_vec.h). */
static inline void store_outs(const ref_matmul *mm, const uint32_t *o, const uint32_t *t,
                              uint32_t n, float *d, const float *d2)
{
    if (mm->epi == REF_EPI_SILU_MUL) {
        float g[8] = {0}, u[8] = {0};
        memcpy(g, d, n * sizeof(float));
        memcpy(u, d2, n * sizeof(float));
        devio_silu_mul_n(g, g, u, 8);
        for (uint32_t k = 0; k < n; k++)
            out_row(mm, t[k])[o[k]] = g[k];
        return;
    }
    for (uint32_t k = 0; k < n; k++)
        store(mm, o[k], t[k], d[k], d2[k]);
}

#if defined(__AVX2__)
/* A batch's whole tiles of tokens (the first `tiles`) against rows o0..o1:
 * token blocks of WIDE_BLOCK, each meeting every four of the rows widened
 * (w16: the four's rows of w, then of w2 for SiLU's), wide tiles of two
 * rows by four tokens. */
static void run_wide(const run_job *r, const ref_matmul *mm, uint32_t o0, uint32_t o1,
                     uint32_t tiles, int16_t *w16)
{
    const uint32_t width = r->v.width;
    const bool silu = mm->epi == REF_EPI_SILU_MUL;
    int16_t *g16 = w16 + (size_t)4 * width;
    float d[8] = {0}, d2[8] = {0};
    for (uint32_t tb = 0; tb < tiles; tb += WIDE_BLOCK) {
        uint32_t te = tiles - tb < WIDE_BLOCK ? tiles : tb + WIDE_BLOCK;
        for (uint32_t o = o0; o < o1; o += 4u) {
            uint32_t nr = o1 - o < 4u ? o1 - o : 4u;
            widen4(mm->w, o, width, w16);
            if (silu)
                widen4(mm->w2, o, width, g16);
            for (uint32_t t = tb; t < te; t += TILE_TOKENS)
                for (uint32_t k = 0; k < nr; k += 2u) {
                    wide_tile(mm->w, w16 + (size_t)k * width, o + k, &r->v, t, d);
                    if (silu)
                        wide_tile(mm->w2, g16 + (size_t)k * width, o + k, &r->v, t, d2);
                    const uint32_t a = o + k, b = a + 1u;
                    const uint32_t os[8] = {a, a, a, a, b, b, b, b};
                    const uint32_t ts[8] = {t, t + 1, t + 2, t + 3, t, t + 1, t + 2, t + 3};
                    store_outs(mm, os, ts, k + 1u < nr ? 8u : 4u, d, d2);
                }
        }
    }
}
#endif

static void run_rows(void *ctx, uint32_t job, uint32_t thread)
{
    const run_job *r = ctx;
    uint32_t k = 0;
    while (job >= r->job_start[k + 1])
        k++;
    const ref_matmul *mm = &r->mm[k];
    uint32_t o0 = (job - r->job_start[k]) * r->rows_per_job[k];
    uint32_t o1 = o0 + r->rows_per_job[k] < mm->w->m ? o0 + r->rows_per_job[k] : mm->w->m;
    float d[4] = {0}, d2[4] = {0};
    const bool silu = mm->epi == REF_EPI_SILU_MUL;
    uint32_t t_from = 0; /* tokens the wide tiles took */
#if defined(__AVX2__)
    if (mm->n_tok >= TILE_TOKENS) {
        t_from = mm->n_tok / TILE_TOKENS * TILE_TOKENS;
        run_wide(r, mm, o0, o1, t_from, (int16_t *)(void *)r->scratch[thread].wide);
    }
#else
    (void)thread;
#endif
    /* Rows in fours from the job's start (a multiple of four), every token
     * for each four: their quants stay in the nearest cache meanwhile. */
    for (uint32_t o = o0; o < o1; o += 4u) {
        uint32_t nr = o1 - o < 4u ? o1 - o : 4u;
        for (uint32_t t = t_from; t < mm->n_tok; t++) {
            row_dots(mm->w, o, nr, &r->v, t, d);
            if (silu)
                row_dots(mm->w2, o, nr, &r->v, t, d2);
            const uint32_t os[4] = {o, o + 1, o + 2, o + 3}, ts[4] = {t, t, t, t};
            store_outs(mm, os, ts, nr, d, d2);
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
    r.scratch = wk->scratch;
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
