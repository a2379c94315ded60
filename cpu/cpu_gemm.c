/* cpu_gemm.c - the cpu backend's projections under fast numerics (ref/ref_gemm.h's functions,
 * built in place of the reference's in every path of the cpu backend, cpu/isa.bzl).
 *
 * A quantized weight (every type of device/numerics/quant.h) is split once at load
 * (devio_quant_split) into small integer quants q and, per group of its elements (16 for
 * Q6_K, else 32), a scale S and an offset M, both kept as binary16: y = S * q + M. Types of 4
 * bits keep two quants a byte, as the file does (Q4_0's q - 8 becomes q with M = -8 S), so a
 * decode step streams about the file's bytes; the others keep one int8 quant an element.
 * Each token's activations are rounded per block of 32 to int16 with one binary32 scale (the
 * largest magnitude maps to 32767); a dot product is then, per unit of 16 elements, an exact
 * integer sum scaled by the weight's and the activation's scales:
 *
 *   y[o] = sum over units u of (S[u] * sx[u]) * d[o][u]
 *        + sum over groups g of M[g] * (sx[g] * sum xq[g])
 *
 * Those are other numbers than the reference's: fast numerics, held to the reference by
 * tolerance (tests/conformance/tolerance.py). Activations rounded to 8 bits, as other engines
 * round them, do not meet that rule here: on SmolLM2-135M-Instruct's Q4_1 file the logits
 * were up to 6.2% off (median 1.3%) and the greedy token disagreed at 1.5% of 65 positions, and
 * every type of the conformance suites' tiny models was 1.0-1.9% off; rounded to 16 bits they
 * hold. Weights of F32, F16 and BF16, and a weight whose scales do not fit binary16, keep the
 * reference's own projections (cpu_strict.h).
 *
 * Every output is computed whole by one job, and a token's row never depends on the other
 * tokens of the batch: the bits are the same for any batch, chunking and thread count; they
 * differ between paths (AVX2 sums eight lanes, the baseline one).
 *
 * Ownership: a packed weight (a ref_panels) owns data (the quants, [m][width] or, 4 bits,
 * [m][width / 2] bytes, zero past n up to whole sweeps of 128), qscale and qoffset (binary16
 * S and M, [m][width / group], in float-sized storage; qoffset NULL without offsets); k32 is
 * width / 32 and qgroups the group size. */
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "cpu/cpu_strict.h"
#include "device/model/model.h"
#include "device/numerics/numerics.h"
#include "device/numerics/quant.h"
#include "ref/ref_gemm.h"

/* Output rows per job at least, and jobs per thread in a region. */
#define ROWS_MIN 4u
#define JOBS_PER_THREAD 4u
/* Tokens from which four rows are widened once for all of them (the
 * thread's scratch, ref_scratch.wide, holds two such fours). */
#define WIDEN_MIN_TOKENS 2u
/* Tokens from which rounding the activations is spread over the pool. */
#define XQ_PARALLEL_TOKENS 32u
/* A unit is 16 elements (a Q6_K group, half of any other type's group of
 * 32); a row is padded with zeros to whole sweeps of 8 units (128
 * elements), the width the kernels sweep. */
#define UNIT 16u
#define SWEEP 128u

/* Whether w was packed by ref_panels_pack below (a quantized weight whose
 * scales fit binary16), not by the reference's (qgroups 1 or 2 there). */
static bool fast(const ref_panels *w)
{
    return devio_dtype_quantized(w->dtype) && w->qgroups >= UNIT;
}

/* A packed row's width in elements: whole sweeps. */
static uint32_t width_of(uint32_t n)
{
    return (n + SWEEP - 1u) / SWEEP * SWEEP;
}

/* Whether the type keeps two quants a byte (its q in 0..15 after the shift). */
static bool nibbles(uint32_t t)
{
    return t == DEVIO_QT_Q4_0 || t == DEVIO_QT_Q4_1 || t == DEVIO_QT_Q4_K;
}

/* Bytes of quants one row has in a sweep, and its binary16 scales there
 * (offsets: one per group of 32, four a sweep). */
static uint32_t sweep_bytes(const ref_panels *p)
{
    return nibbles(devio_dtype_ggml(p->dtype)) ? SWEEP / 2u : SWEEP;
}

static uint32_t sweep_scales_n(const ref_panels *p)
{
    return SWEEP / p->qgroups;
}

#define SWEEP_OFFSETS (SWEEP / 32u)

static uint32_t sweeps_of(const ref_panels *p)
{
    return p->k32 * 32u / SWEEP;
}

/* Rows are kept in fours, each four's sweeps side by side (row 0's sweep s,
 * row 1's, row 2's, row 3's, then sweep s + 1): a four is one stream, as a
 * step reads it. Row o's quants of sweep s: */
static uint8_t *quants_at(const ref_panels *p, uint32_t o, uint32_t s)
{
    uint32_t sb = sweep_bytes(p);
    return (uint8_t *)p->data + ((size_t)(o / 4u) * sweeps_of(p) + s) * 4u * sb + (o % 4u) * sb;
}

/* Row o's `per` binary16 values of sweep s in the array at base. */
static uint16_t *halves_at(const ref_panels *p, const float *base, uint32_t per, uint32_t o,
                           uint32_t s)
{
    return (uint16_t *)(void *)base + ((size_t)(o / 4u) * sweeps_of(p) + s) * 4u * per +
           (o % 4u) * per;
}

/* ---- packing --------------------------------------------------------------- */

typedef struct pack_job {
    ref_panels *p;
    const void *w;
    uint32_t rows_per_job;
    int *overflow; /* set by any job that met a scale past binary16 */
} pack_job;

/* x as binary16; false when it is not finite there. */
static bool put_half(uint16_t *dst, float x)
{
    *dst = devio_f32_to_f16_rne(x);
    return (*dst & 0x7c00u) != 0x7c00u;
}

static void pack_rows(void *ctx, uint32_t job, uint32_t thread)
{
    (void)thread;
    const pack_job *j = ctx;
    ref_panels *p = j->p;
    uint32_t t = devio_dtype_ggml(p->dtype), blk = devio_quant_block(t), gs = p->qgroups;
    uint32_t sn = sweep_scales_n(p);
    bool nib = nibbles(t);
    size_t src_bytes = (size_t)devio_dtype_row_bytes(p->dtype, p->n);
    uint32_t o1 = (job + 1) * j->rows_per_job < p->m ? (job + 1) * j->rows_per_job : p->m;
    bool ok = true;
    for (uint32_t o = job * j->rows_per_job; o < o1; o++) {
        for (uint32_t k0 = 0; k0 < p->n; k0 += blk) {
            int8_t q[256];
            float S[16], M[16] = {0};
            devio_quant_split(t, (const uint8_t *)j->w + o * src_bytes +
                                     k0 / blk * devio_quant_block_bytes(t), q, S, M);
            int shift = t == DEVIO_QT_Q4_0 ? 8 : 0; /* Q4_0's q - 8 as q with M = -8 S */
            for (uint32_t g = 0; g < blk / gs; g++) {
                uint32_t k = k0 + g * gs;
                ok = put_half(halves_at(p, p->qscale, sn, o, k / SWEEP) + k % SWEEP / gs, S[g]) &&
                     ok;
                if (p->qoffset)
                    ok = put_half(halves_at(p, p->qoffset, SWEEP_OFFSETS, o, k / SWEEP) +
                                      k % SWEEP / 32u,
                                  shift ? -8.0f * S[g] : M[g]) &&
                         ok;
            }
            /* Per block of 32 elements: one byte each, or (4 bits) byte i
             * holding element i (low) and element i + 16 (high). */
            for (uint32_t b = 0; b < blk; b += 32u) {
                uint32_t k = k0 + b;
                uint8_t *dst = quants_at(p, o, k / SWEEP) + (nib ? k % SWEEP / 2u : k % SWEEP);
                for (uint32_t i = 0; i < (nib ? 16u : 32u); i++)
                    dst[i] = nib ? (uint8_t)((q[b + i] + shift) | ((q[b + 16u + i] + shift) << 4))
                                 : (uint8_t)q[b + i];
            }
        }
    }
    if (!ok)
        __atomic_store_n(j->overflow, 1, __ATOMIC_RELAXED);
}

int ref_panels_pack(ref_panels *p, devio_pool *pool, const void *w, devio_dtype dt, uint32_t m,
                    uint32_t n)
{
    if (!devio_dtype_quantized(dt))
        return ref_strict_panels_pack(p, pool, w, dt, m, n);
    memset(p, 0, sizeof *p);
    uint32_t t = devio_dtype_ggml(dt), width = width_of(n), gs = devio_quant_group(t);
    bool offsets = devio_quant_has_offset(t) || t == DEVIO_QT_Q4_0;
    *p = (ref_panels){.dtype = dt, .m = m, .n = n, .k32 = width / 32u, .qgroups = gs};
    /* Rows in whole fours: the last four's missing rows are zeros. */
    size_t rows = (size_t)(m + 3u) / 4u * 4u, sweeps = sweeps_of(p);
    size_t qbytes = rows * sweeps * sweep_bytes(p);
    size_t sc_floats = (rows * sweeps * sweep_scales_n(p) + 1u) / 2u; /* binary16 pairs */
    size_t of_floats = rows * sweeps * SWEEP_OFFSETS / 2u;
    if (posix_memalign(&p->data, 64, qbytes ? qbytes : 64) != 0) {
        p->data = NULL;
        return -1;
    }
    memset(p->data, 0, qbytes);
    p->qscale = calloc(sc_floats ? sc_floats : 1, sizeof(float));
    p->qoffset = offsets ? calloc(of_floats ? of_floats : 1, sizeof(float)) : NULL;
    if (!p->qscale || (offsets && !p->qoffset)) {
        ref_panels_free(p);
        return -1;
    }
    p->bytes = qbytes + (sc_floats + (p->qoffset ? of_floats : 0u)) * sizeof(float);
    int overflow = 0;
    pack_job j = {.p = p, .w = w, .rows_per_job = 64, .overflow = &overflow};
    devio_pool_run(pool, (m + j.rows_per_job - 1) / j.rows_per_job, pack_rows, &j);
    if (!overflow)
        return 0;
    /* A scale past binary16's range: this weight keeps the reference's form. */
    ref_panels_free(p);
    return ref_strict_panels_pack(p, pool, w, dt, m, n);
}

void ref_panels_free(ref_panels *p)
{
    ref_strict_panels_free(p); /* the same three buffers, whoever packed them */
}

/* ---- activations ------------------------------------------------------------- */

/* Where a run's rounded activations are, in the work's xpack: per token
 * `width` int16 quants, then per token and unit the scale of the unit's
 * block of 32, then per token and block that scale times the block's sum
 * of quants (what an offset multiplies). */
typedef struct xq_view {
    int16_t *q;
    float *scale;
    float *offset_x;
    uint32_t width;
} xq_view;

static size_t xq_floats(uint32_t tokens, uint32_t width)
{
    return (size_t)tokens * (width * sizeof(int16_t) / sizeof(float) + width / UNIT + width / 32u);
}

size_t ref_gemm_xpack_floats(uint32_t max_tokens, uint32_t max_n)
{
    size_t strict = ref_strict_gemm_xpack_floats(max_tokens, max_n);
    size_t mine = xq_floats(max_tokens, width_of(max_n));
    return strict > mine ? strict : mine;
}

static xq_view xq_at(float *xpack, uint32_t tokens, uint32_t width)
{
    int16_t *q = (int16_t *)(void *)xpack;
    float *scale = xpack + (size_t)tokens * (width * sizeof(int16_t) / sizeof(float));
    return (xq_view){.q = q, .scale = scale, .offset_x = scale + (size_t)tokens * (width / UNIT),
                     .width = width};
}

typedef struct xq_job {
    const ref_matmul *mm;
    xq_view v;
} xq_job;

/* Token t's row: each block of 32 rounded to int16 by its largest magnitude. */
static void round_token(void *ctx, uint32_t t, uint32_t thread)
{
    (void)thread;
    const xq_job *j = ctx;
    const ref_matmul *mm = j->mm;
    const float *x = mm->x + (size_t)t * mm->ldx;
    uint32_t n = mm->w->n, width = j->v.width;
    int16_t *q = j->v.q + (size_t)t * width;
    float *us = j->v.scale + (size_t)t * (width / UNIT);
    float *uo = j->v.offset_x + (size_t)t * (width / 32u);
    for (uint32_t k0 = 0; k0 < width; k0 += 32u) {
        uint32_t kn = k0 >= n ? 0 : n - k0 < 32u ? n - k0 : 32u;
        float amax = 0.0f;
        for (uint32_t i = 0; i < kn; i++) {
            float a = x[k0 + i] < 0.0f ? -x[k0 + i] : x[k0 + i];
            amax = a > amax ? a : amax;
        }
        float id = amax > 0.0f ? 32767.0f / amax : 0.0f, sx = amax / 32767.0f;
        int sum = 0;
        for (uint32_t i = 0; i < 32u; i++) {
            int v = i < kn ? (int)nearbyintf(x[k0 + i] * id) : 0;
            v = v > 32767 ? 32767 : v < -32767 ? -32767 : v;
            q[k0 + i] = (int16_t)v;
            sum += v;
        }
        us[k0 / UNIT] = us[k0 / UNIT + 1u] = sx;
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

#if defined(__AVX2__)
/* One unit's dot: 16 quants (widened to int16) by 16 activations, as
 * eight partial sums of two products each. */
static inline __m256i unit_dot(__m256i w16, const int16_t *x)
{
    return _mm256_madd_epi16(w16, _mm256_loadu_si256((const __m256i *)(const void *)x));
}

/* Eight units' partial sums folded to one sum a lane, unit k in lane k. */
static inline __m256i fold8(__m256i d0, __m256i d1, __m256i d2, __m256i d3, __m256i d4,
                            __m256i d5, __m256i d6, __m256i d7)
{
    __m256i s0123 = _mm256_hadd_epi32(_mm256_hadd_epi32(d0, d1), _mm256_hadd_epi32(d2, d3));
    __m256i s4567 = _mm256_hadd_epi32(_mm256_hadd_epi32(d4, d5), _mm256_hadd_epi32(d6, d7));
    return _mm256_add_epi32(_mm256_permute2x128_si256(s0123, s4567, 0x20),
                            _mm256_permute2x128_si256(s0123, s4567, 0x31));
}

static inline __m256i w8(const uint8_t *p)
{
    return _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)p));
}

/* One sweep of int8 quants (128 bytes). */
static inline __m256i sweep_i8(const uint8_t *w, const int16_t *x)
{
    return fold8(unit_dot(w8(w), x), unit_dot(w8(w + 16), x + 16),
                 unit_dot(w8(w + 32), x + 32), unit_dot(w8(w + 48), x + 48),
                 unit_dot(w8(w + 64), x + 64), unit_dot(w8(w + 80), x + 80),
                 unit_dot(w8(w + 96), x + 96), unit_dot(w8(w + 112), x + 112));
}

/* One sweep of 4-bit quants (64 bytes): per block of 32, the low nibbles
 * are its first unit, the high its second. */
static inline __m256i sweep_nib(const uint8_t *w, const int16_t *x)
{
    const __m256i low = _mm256_set1_epi8(0x0f);
    __m256i b01 = _mm256_loadu_si256((const __m256i *)(const void *)w);
    __m256i b23 = _mm256_loadu_si256((const __m256i *)(const void *)(w + 32));
    __m256i l01 = _mm256_and_si256(b01, low);
    __m256i h01 = _mm256_and_si256(_mm256_srli_epi16(b01, 4), low);
    __m256i l23 = _mm256_and_si256(b23, low);
    __m256i h23 = _mm256_and_si256(_mm256_srli_epi16(b23, 4), low);
#define U(v, hi) \
    _mm256_cvtepu8_epi16(hi ? _mm256_extracti128_si256(v, 1) : _mm256_castsi256_si128(v))
    return fold8(unit_dot(U(l01, 0), x), unit_dot(U(h01, 0), x + 16),
                 unit_dot(U(l01, 1), x + 32), unit_dot(U(h01, 1), x + 48),
                 unit_dot(U(l23, 0), x + 64), unit_dot(U(h23, 0), x + 80),
                 unit_dot(U(l23, 1), x + 96), unit_dot(U(h23, 1), x + 112));
#undef U
}

#endif

/* Sweeps a dot product sums: the padded width's, less the last when broken
 * on purpose. */
static uint32_t sweeps_used(const ref_panels *w)
{
    uint32_t n = sweeps_of(w);
    return n - (gemm_broken() && n > 1u ? 1u : 0u);
}

/* A quant of unit j (0..7) of a row's sweep, element i (0..15). */
static inline int quant(const uint8_t *q, bool nib, uint32_t j, uint32_t i)
{
    return nib ? (q[(j / 2u) * 16u + i] >> (j % 2u ? 4 : 0)) & 15 : (int)(int8_t)q[j * UNIT + i];
}

#if defined(__AVX2__)
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

/* One row's sweep: its eight units' dots d, scaled (the same operations
 * whichever form the quants were read from, so that both give the same bits). */
static inline void sweep_acc(__m256i d, __m256 sc, __m256 xs, __m256 *acc)
{
    *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), _mm256_mul_ps(sc, xs), *acc);
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
#define PREFETCH_BYTES 1024u

/* The dot products of the four rows from o (a multiple of four) with token
 * t: the four's stream read in order, each sweep's activations once. */
static void dots4(const ref_panels *w, uint32_t o, const xq_view *v, uint32_t t, float *out)
{
    const uint32_t width = v->width, gs = w->qgroups, sb = sweep_bytes(w);
    const uint32_t sn = sweep_scales_n(w), n = sweeps_used(w);
    const bool nib = nibbles(devio_dtype_ggml(w->dtype));
    const int16_t *xq = v->q + (size_t)t * width;
    const float *us = v->scale + (size_t)t * (width / UNIT);
    const float *uo = v->offset_x + (size_t)t * (width / 32u);
    const uint8_t *q = quants_at(w, o, 0);
    const uint16_t *S = halves_at(w, w->qscale, sn, o, 0);
    const uint16_t *M = w->qoffset ? halves_at(w, w->qoffset, SWEEP_OFFSETS, o, 0) : NULL;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                     _mm256_setzero_ps()};
    __m128 off[4] = {_mm_setzero_ps(), _mm_setzero_ps(), _mm_setzero_ps(), _mm_setzero_ps()};
    for (uint32_t s = 0; s < n; s++, q += 4u * sb, S += 4u * sn) {
        const __m256 xs = _mm256_loadu_ps(us + s * 8u);
        const int16_t *x = xq + s * SWEEP;
        _mm_prefetch((const char *)(q + PREFETCH_BYTES), _MM_HINT_T0);
        _mm_prefetch((const char *)(q + PREFETCH_BYTES + 64u), _MM_HINT_T0);
        for (uint32_t k = 0; k < 4u; k++) {
            __m256i d = nib ? sweep_nib(q + k * sb, x) : sweep_i8(q + k * sb, x);
            sweep_acc(d, unit_scales(S + k * sn, gs), xs, &acc[k]);
        }
        if (M) {
            const __m128 xo = _mm_loadu_ps(uo + s * 4u);
            for (uint32_t k = 0; k < 4u; k++)
                off[k] = _mm_fmadd_ps(_mm_cvtph_ps(_mm_loadl_epi64(
                                          (const __m128i *)(const void *)(M + k * 4u))),
                                      xo, off[k]);
            M += 4u * SWEEP_OFFSETS;
        }
    }
    store4(acc, off, out);
}

/* Four rows from o widened once for many tokens: their quants as int16
 * ([4][width]), their unit scales and group offsets as binary32. */
typedef struct wide4 {
    int16_t *q;
    float *S, *M; /* [4][width / 16], [4][width / 32]; M NULL without offsets */
    uint32_t width;
} wide4;

/* Bytes a wide4 takes for rows of `width`. */
static size_t wide4_bytes(uint32_t width)
{
    return (size_t)4 * width * sizeof(int16_t) +
           (size_t)4 * (width / UNIT + width / 32u) * sizeof(float);
}

static wide4 widen4(const ref_panels *w, uint32_t o, void *mem)
{
    const uint32_t width = w->k32 * 32u, gs = w->qgroups, sn = sweep_scales_n(w);
    const uint32_t sb = sweep_bytes(w);
    const bool nib = nibbles(devio_dtype_ggml(w->dtype));
    wide4 x = {.q = mem, .width = width};
    x.S = (float *)(void *)(x.q + (size_t)4 * width);
    x.M = w->qoffset ? x.S + (size_t)4 * (width / UNIT) : NULL;
    const __m256i low = _mm256_set1_epi8(0x0f);
    for (uint32_t k = 0; k < 4u; k++)
        for (uint32_t s = 0; s < sweeps_of(w); s++) {
            const uint8_t *q = quants_at(w, o + k, s);
            int16_t *dst = x.q + (size_t)k * width + s * SWEEP;
            /* The units in order, as sweep_nib and sweep_i8 read them. */
            for (uint32_t c = 0; c < sb; c += 32u) {
                __m256i b = _mm256_loadu_si256((const __m256i *)(const void *)(q + c));
                __m256i u[4];
                if (nib) {
                    __m256i l = _mm256_and_si256(b, low);
                    __m256i h = _mm256_and_si256(_mm256_srli_epi16(b, 4), low);
                    u[0] = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(l));
                    u[1] = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(h));
                    u[2] = _mm256_cvtepu8_epi16(_mm256_extracti128_si256(l, 1));
                    u[3] = _mm256_cvtepu8_epi16(_mm256_extracti128_si256(h, 1));
                } else {
                    u[0] = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(b));
                    u[1] = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(b, 1));
                }
                for (uint32_t j = 0; j < (nib ? 4u : 2u); j++, dst += UNIT)
                    _mm256_storeu_si256((__m256i *)(void *)dst, u[j]);
            }
            _mm256_storeu_ps(x.S + (size_t)k * (width / UNIT) + s * 8u,
                             unit_scales(halves_at(w, w->qscale, sn, o + k, s), gs));
            if (x.M)
                _mm_storeu_ps(x.M + (size_t)k * (width / 32u) + s * 4u,
                              _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(const void *)
                                                               halves_at(w, w->qoffset,
                                                                         SWEEP_OFFSETS, o + k, s))));
        }
    return x;
}

/* dots4 over rows widened by widen4: the same sums, without unpacking the
 * quants again for every token. */
static void dots4_wide(const ref_panels *w, const wide4 *wd, const xq_view *v, uint32_t t,
                       float *out)
{
    const uint32_t width = v->width, n = sweeps_used(w), per = width / UNIT;
    const int16_t *xq = v->q + (size_t)t * width;
    const float *us = v->scale + (size_t)t * per;
    const float *uo = v->offset_x + (size_t)t * (width / 32u);
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                     _mm256_setzero_ps()};
    __m128 off[4] = {_mm_setzero_ps(), _mm_setzero_ps(), _mm_setzero_ps(), _mm_setzero_ps()};
    for (uint32_t s = 0; s < n; s++) {
        const __m256 xs = _mm256_loadu_ps(us + s * 8u);
        const int16_t *x = xq + s * SWEEP;
        for (uint32_t k = 0; k < 4u; k++) {
            const int16_t *q = wd->q + (size_t)k * width + s * SWEEP;
#define WD(j) \
    unit_dot(_mm256_loadu_si256((const __m256i *)(const void *)(q + 16 * (j))), x + 16 * (j))
            __m256i d = fold8(WD(0), WD(1), WD(2), WD(3), WD(4), WD(5), WD(6), WD(7));
#undef WD
            sweep_acc(d, _mm256_loadu_ps(wd->S + (size_t)k * per + s * 8u), xs, &acc[k]);
        }
        for (uint32_t k = 0; wd->M && k < 4u; k++)
            off[k] = _mm_fmadd_ps(_mm_loadu_ps(wd->M + (size_t)k * (width / 32u) + s * 4u),
                                  _mm_loadu_ps(uo + s * 4u), off[k]);
    }
    store4(acc, off, out);
}
#endif

#if !defined(__AVX2__)
/* The dot product of row o with token t alone (the baseline path's). */
static float dots1(const ref_panels *w, uint32_t o, const xq_view *v, uint32_t t)
{
    const uint32_t width = v->width, gs = w->qgroups, sn = sweep_scales_n(w), n = sweeps_used(w);
    const bool nib = nibbles(devio_dtype_ggml(w->dtype));
    const int16_t *xq = v->q + (size_t)t * width;
    const float *us = v->scale + (size_t)t * (width / UNIT);
    const float *uo = v->offset_x + (size_t)t * (width / 32u);
    float acc = 0.0f, off = 0.0f;
    for (uint32_t s = 0; s < n; s++) {
        const uint8_t *q = quants_at(w, o, s);
        const uint16_t *S = halves_at(w, w->qscale, sn, o, s);
        for (uint32_t j = 0; j < SWEEP / UNIT; j++) {
            const int16_t *c = xq + s * SWEEP + j * UNIT;
            int d = 0;
            for (uint32_t i = 0; i < UNIT; i++)
                d += quant(q, nib, j, i) * (int)c[i];
            acc += (devio_f16_to_f32(S[j * UNIT / gs]) * us[s * 8u + j]) * (float)d;
        }
        for (uint32_t g = 0; w->qoffset && g < SWEEP_OFFSETS; g++)
            off += devio_f16_to_f32(halves_at(w, w->qoffset, SWEEP_OFFSETS, o, s)[g]) *
                   uo[s * 4u + g];
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
    ref_scratch *scratch; /* each thread's: rows widened for many tokens */
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

static void run_rows(void *ctx, uint32_t job, uint32_t thread)
{
    (void)thread; /* the baseline path widens nothing */
    const run_job *r = ctx;
    uint32_t k = 0;
    while (job >= r->job_start[k + 1])
        k++;
    const ref_matmul *mm = &r->mm[k];
    uint32_t o0 = (job - r->job_start[k]) * r->rows_per_job[k];
    uint32_t o1 = o0 + r->rows_per_job[k] < mm->w->m ? o0 + r->rows_per_job[k] : mm->w->m;
    float d[4], d2[4] = {0};
    const bool silu = mm->epi == REF_EPI_SILU_MUL;
    /* Rows in fours from the job's start (a multiple of four), every token
     * for each four: their quants stay in the nearest cache meanwhile. */
    for (uint32_t o = o0; o < o1; o += 4u) {
        uint32_t nr = o1 - o < 4u ? o1 - o : 4u;
#if defined(__AVX2__)
        if (mm->n_tok >= WIDEN_MIN_TOKENS) {
            char *mem = (char *)(void *)r->scratch[thread].wide;
            wide4 a = widen4(mm->w, o, mem);
            wide4 b = silu ? widen4(mm->w2, o, mem + wide4_bytes(a.width)) : a;
            for (uint32_t t = 0; t < mm->n_tok; t++) {
                dots4_wide(mm->w, &a, &r->v, t, d);
                if (silu)
                    dots4_wide(mm->w2, &b, &r->v, t, d2);
                for (uint32_t k = 0; k < nr; k++)
                    store(mm, o + k, t, d[k], d2[k]);
            }
            continue;
        }
#endif
        for (uint32_t t = 0; t < mm->n_tok; t++) {
            row_dots(mm->w, o, nr, &r->v, t, d);
            if (silu)
                row_dots(mm->w2, o, nr, &r->v, t, d2);
            for (uint32_t k = 0; k < nr; k++)
                store(mm, o + k, t, d[k], d2[k]);
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
    r.scratch = wk->scratch;
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
