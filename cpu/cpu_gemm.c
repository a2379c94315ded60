/* cpu_gemm.c - the cpu backend's projections under fast numerics (ref/ref_gemm.h's functions,
 * built in place of the reference's in every path of the cpu backend, cpu/isa.bzl).
 *
 * A quantized weight (every type of device/numerics/quant.h) is split once at load into int8
 * quants and the scales (and offsets) of its groups, row by row; each token's activations are
 * rounded per block of 32 to int16 with one binary32 scale (the largest magnitude maps to
 * 32767); a dot product is then, per block, an exact integer sum of 32 products scaled by the
 * weight's and the activation's scales:
 *
 *   y[o] = sum over blocks b of  S[o][b] * (sx[b] * d[o][b])  (+ M[o][b] * (sx[b] * sum xq[b]))
 *
 * with d the integer dot of the block (taken in units of 16, each with its group's S: Q6_K's
 * groups are 16). Those are
 * other numbers than the reference's: fast numerics, held to the reference by tolerance
 * (tests/conformance/tolerance.py). Activations rounded to 8 bits, as other engines round
 * them, do not meet that rule here: on SmolLM2-135M-Instruct's Q4_1 file the logits were up to
 * 6.2% off (median 1.3%) and the greedy token disagreed at 1.5% of 65 positions, and every type
 * of the conformance suites' tiny models was 1.0-1.9% off; rounded to 16 bits they hold.
 * Weights of F32, F16 and BF16 keep the reference's own
 * projections (cpu_strict.h), which already run at the memory's speed on one token.
 *
 * Every output is computed whole by one job, and a token's row never depends on the other
 * tokens of the batch: the bits are the same for any batch, chunking and thread count; they
 * differ between paths (AVX2 sums eight lanes, the baseline one).
 *
 * Ownership: a packed weight (a ref_panels) owns data (int8 quants, [m][k32 * 32], zero past
 * n up to whole sweeps of 128), qscale and qoffset ([m][k32 * 2] binary32, one per unit of 16
 * elements; qoffset NULL without offsets); k32 counts the padded width, qgroups is 2. */
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
/* Tokens one weight row is read for at once. */
#define TOK_TILE 4u
/* Tokens from which rounding the activations is spread over the pool. */
#define XQ_PARALLEL_TOKENS 32u
/* A unit is 16 elements with one scale (a Q6_K group, half of any other
 * type's group of 32); a row is padded with zeros to whole groups of 8
 * units (128 elements), the width the kernels sweep. */
#define UNIT 16u
#define SWEEP 128u

static bool fast(const ref_panels *w)
{
    return devio_dtype_quantized(w->dtype);
}

/* A packed row's width in elements: whole sweeps. */
static uint32_t width_of(uint32_t n)
{
    return (n + SWEEP - 1u) / SWEEP * SWEEP;
}

/* ---- packing --------------------------------------------------------------- */

typedef struct pack_job {
    ref_panels *p;
    const void *w;
    uint32_t rows_per_job;
} pack_job;

static void pack_rows(void *ctx, uint32_t job, uint32_t thread)
{
    (void)thread;
    const pack_job *j = ctx;
    ref_panels *p = j->p;
    uint32_t t = devio_dtype_ggml(p->dtype), blk = devio_quant_block(t);
    uint32_t gs = devio_quant_group(t), width = p->k32 * 32u, units = width / UNIT;
    size_t row_bytes = (size_t)devio_dtype_row_bytes(p->dtype, p->n);
    uint32_t o1 = (job + 1) * j->rows_per_job < p->m ? (job + 1) * j->rows_per_job : p->m;
    for (uint32_t o = job * j->rows_per_job; o < o1; o++) {
        int8_t *dst = (int8_t *)p->data + (size_t)o * width;
        float *sc = p->qscale + (size_t)o * units;
        float *of = p->qoffset ? p->qoffset + (size_t)o * units : NULL;
        for (uint32_t k0 = 0; k0 < p->n; k0 += blk) {
            int8_t q[256];
            float S[16], M[16] = {0};
            devio_quant_split(t, (const uint8_t *)j->w + o * row_bytes +
                                     k0 / blk * devio_quant_block_bytes(t), q, S, M);
            memcpy(dst + k0, q, blk);
            /* Each unit takes its group's scale (and offset): a group of 32
             * gives both its units the same. */
            for (uint32_t u = 0; u < blk / UNIT; u++) {
                sc[k0 / UNIT + u] = S[u * UNIT / gs];
                if (of)
                    of[k0 / UNIT + u] = M[u * UNIT / gs];
            }
        }
    }
}

int ref_panels_pack(ref_panels *p, devio_pool *pool, const void *w, devio_dtype dt, uint32_t m,
                    uint32_t n)
{
    if (!devio_dtype_quantized(dt))
        return ref_strict_panels_pack(p, pool, w, dt, m, n);
    memset(p, 0, sizeof *p);
    uint32_t t = devio_dtype_ggml(dt), width = width_of(n);
    size_t qbytes = (size_t)m * width, nsc = (size_t)m * (width / UNIT);
    void *data = NULL;
    if (posix_memalign(&data, 64, qbytes ? qbytes : 64) != 0)
        return -1;
    memset(data, 0, qbytes);
    *p = (ref_panels){.data = data, .dtype = dt, .m = m, .n = n, .k32 = width / 32u,
                      .qgroups = 2u};
    p->qscale = calloc(nsc ? nsc : 1, sizeof(float));
    p->qoffset = devio_quant_has_offset(t) ? calloc(nsc ? nsc : 1, sizeof(float)) : NULL;
    if (!p->qscale || (devio_quant_has_offset(t) && !p->qoffset)) {
        ref_panels_free(p);
        return -1;
    }
    p->bytes = qbytes + nsc * sizeof(float) * (p->qoffset ? 2u : 1u);
    pack_job j = {.p = p, .w = w, .rows_per_job = 64};
    devio_pool_run(pool, (m + j.rows_per_job - 1) / j.rows_per_job, pack_rows, &j);
    return 0;
}

void ref_panels_free(ref_panels *p)
{
    ref_strict_panels_free(p); /* the same three buffers, whoever packed them */
}

/* ---- activations ------------------------------------------------------------- */

/* Where a run's rounded activations are, in the work's xpack: per token
 * `width` int16 quants, then per token and unit the scale of the unit's
 * block of 32 and that scale times the unit's sum of quants (what an
 * offset multiplies). */
typedef struct xq_view {
    int16_t *q;
    float *scale;
    float *offset_x;
    uint32_t width;
} xq_view;

static size_t xq_floats(uint32_t tokens, uint32_t width)
{
    return (size_t)tokens * (width * sizeof(int16_t) / sizeof(float) + 2u * (width / UNIT));
}

size_t ref_gemm_xpack_floats(uint32_t max_tokens, uint32_t max_n)
{
    size_t strict = ref_strict_gemm_xpack_floats(max_tokens, max_n);
    size_t mine = xq_floats(max_tokens, width_of(max_n));
    return strict > mine ? strict : mine;
}

static xq_view xq_at(float *xpack, uint32_t tokens, uint32_t width)
{
    int16_t *q = (int16_t *)xpack;
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
    uint32_t n = mm->w->n, width = j->v.width, units = width / UNIT;
    int16_t *q = j->v.q + (size_t)t * width;
    float *us = j->v.scale + (size_t)t * units, *uo = j->v.offset_x + (size_t)t * units;
    for (uint32_t k0 = 0; k0 < width; k0 += 32u) {
        uint32_t kn = k0 >= n ? 0 : n - k0 < 32u ? n - k0 : 32u;
        float amax = 0.0f;
        for (uint32_t i = 0; i < kn; i++)
            amax = fmaxf(amax, fabsf(x[k0 + i]));
        float id = amax > 0.0f ? 32767.0f / amax : 0.0f, sx = amax / 32767.0f;
        int sum[2] = {0, 0};
        for (uint32_t i = 0; i < 32u; i++) {
            int v = i < kn ? (int)lrintf(x[k0 + i] * id) : 0;
            v = v > 32767 ? 32767 : v < -32767 ? -32767 : v;
            q[k0 + i] = (int16_t)v;
            sum[i / UNIT] += v;
        }
        for (uint32_t h = 0; h < 2u; h++) {
            us[k0 / UNIT + h] = sx;
            uo[k0 / UNIT + h] = sx * (float)sum[h];
        }
    }
}

/* ---- dot products -------------------------------------------------------------- */

#if defined(__AVX2__)
/* The integer dot of one unit: 16 weights (int8, widened) by 16
 * activations (int16), as eight partial sums of two products each. */
static inline __m256i unit_dot(const int8_t *w, const int16_t *x)
{
    __m256i wv = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)w));
    return _mm256_madd_epi16(wv, _mm256_loadu_si256((const __m256i *)x));
}

/* The eight units' dots of one sweep, unit k's sum in lane k. */
static inline __m256i sweep_dots(const int8_t *w, const int16_t *x)
{
    __m256i s01 = _mm256_hadd_epi32(unit_dot(w, x), unit_dot(w + 16, x + 16));
    __m256i s23 = _mm256_hadd_epi32(unit_dot(w + 32, x + 32), unit_dot(w + 48, x + 48));
    __m256i s45 = _mm256_hadd_epi32(unit_dot(w + 64, x + 64), unit_dot(w + 80, x + 80));
    __m256i s67 = _mm256_hadd_epi32(unit_dot(w + 96, x + 96), unit_dot(w + 112, x + 112));
    __m256i s0123 = _mm256_hadd_epi32(s01, s23), s4567 = _mm256_hadd_epi32(s45, s67);
    return _mm256_add_epi32(_mm256_permute2x128_si256(s0123, s4567, 0x20),
                            _mm256_permute2x128_si256(s0123, s4567, 0x31));
}

static inline float hsum(__m256 v)
{
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}
#endif

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

/* The dot products of weight row o with tn (<= TOK_TILE) tokens from t0:
 * per unit u, S[u] * sx[u] * dot[u] (+ M[u] * sx[u] * sum x[u]). */
static void row_dots(const ref_panels *w, uint32_t o, const xq_view *v, uint32_t t0, uint32_t tn,
                     float *out)
{
    const uint32_t width = v->width;
    const uint32_t units = width / UNIT - (gemm_broken() && width > SWEEP ? SWEEP / UNIT : 0u);
    const int8_t *wq = (const int8_t *)w->data + (size_t)o * width;
    const float *S = w->qscale + (size_t)o * (width / UNIT);
    const float *M = w->qoffset ? w->qoffset + (size_t)o * (width / UNIT) : NULL;
    for (uint32_t i = 0; i < tn; i++) {
        const uint32_t t = t0 + i;
        const int16_t *xq = v->q + (size_t)t * width;
        const float *us = v->scale + (size_t)t * (width / UNIT);
        const float *uo = v->offset_x + (size_t)t * (width / UNIT);
#if defined(__AVX2__)
        __m256 acc = _mm256_setzero_ps(), off = _mm256_setzero_ps();
        for (uint32_t u = 0; u < units; u += 8u) {
            __m256 d = _mm256_cvtepi32_ps(sweep_dots(wq + u * UNIT, xq + u * UNIT));
            __m256 sc = _mm256_mul_ps(_mm256_loadu_ps(S + u), _mm256_loadu_ps(us + u));
            acc = _mm256_fmadd_ps(d, sc, acc);
            if (M)
                off = _mm256_fmadd_ps(_mm256_loadu_ps(M + u), _mm256_loadu_ps(uo + u), off);
        }
        out[i] = hsum(acc) + hsum(off);
#else
        float acc = 0.0f, off = 0.0f;
        for (uint32_t u = 0; u < units; u++) {
            const int8_t *a = wq + u * UNIT;
            const int16_t *c = xq + u * UNIT;
            int d = 0;
            for (uint32_t k = 0; k < UNIT; k++)
                d += (int)a[k] * (int)c[k];
            acc += (S[u] * us[u]) * (float)d;
            if (M)
                off += M[u] * uo[u];
        }
        out[i] = acc + off;
#endif
    }
}

/* ---- a run ------------------------------------------------------------------------ */

typedef struct run_job {
    const ref_matmul *mm;
    uint32_t count;
    xq_view v;
    uint32_t job_start[5]; /* each projection's first job; [count] the total */
    uint32_t rows_per_job[4];
} run_job;

static float *out_row(const ref_matmul *mm, uint32_t t)
{
    return mm->y_rows ? mm->y_rows[t] : mm->y + (size_t)t * mm->ldy;
}

static void store(const ref_matmul *mm, uint32_t o, uint32_t t, float dot, float dot2)
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
    (void)thread;
    const run_job *r = ctx;
    uint32_t k = 0;
    while (job >= r->job_start[k + 1])
        k++;
    const ref_matmul *mm = &r->mm[k];
    uint32_t o0 = (job - r->job_start[k]) * r->rows_per_job[k];
    uint32_t o1 = o0 + r->rows_per_job[k] < mm->w->m ? o0 + r->rows_per_job[k] : mm->w->m;
    float d[TOK_TILE], d2[TOK_TILE] = {0};
    for (uint32_t o = o0; o < o1; o++)
        for (uint32_t t0 = 0; t0 < mm->n_tok; t0 += TOK_TILE) {
            uint32_t tn = mm->n_tok - t0 < TOK_TILE ? mm->n_tok - t0 : TOK_TILE;
            row_dots(mm->w, o, &r->v, t0, tn, d);
            if (mm->epi == REF_EPI_SILU_MUL)
                row_dots(mm->w2, o, &r->v, t0, tn, d2);
            for (uint32_t i = 0; i < tn; i++)
                store(mm, o, t0 + i, d[i], d2[i]);
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
