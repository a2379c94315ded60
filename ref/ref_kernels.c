/* ref_kernels.c - matmul, rmsnorm, RoPE, attention and the SiLU gate of the
 * reference backend, in the operation order ref_kernels.h defines. Never
 * fuses a multiply into an add, never calls libm, never allocates per call.
 *
 * Vectorisation uses GCC/clang generic vectors, so the same source becomes
 * AVX-512 natively and simd128 on wasm32; the only instruction-set code is
 * the F16C half conversion, which is exact and so changes no number.
 *
 * long because the widening, the reductions, matmul and attention all build
 * on this file's private vector types and always-inline helpers (VL, vf, ldv,
 * fold_lanes, widen_*): split, they would need a header of their own. */
#include "ref/ref_kernels.h"

#include <stdlib.h>
#include <string.h>

#include "device/numerics.h"

/* The wide vectors never cross a non-inlined call boundary in a way that
 * matters (every helper is static), so GCC's note that their ABI differs
 * without AVX-512 is noise. */
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

#if defined(__F16C__)
#include <immintrin.h>
#endif

/* Register blocking of the projection kernel: MK_R weight rows times MK_T
 * tokens (MK_T <= 3), NV accumulators each. AVX-512: 24 of 32 registers;
 * AVX: 12 of 16; 4-float vectors (16 registers): one dot, 8 registers.
 * -DMK_R=r -DMK_T=t overrides it (the numbers never depend on it). */
#ifndef MK_R
#if VL == 16
#define MK_R 4
#define MK_T 3
#elif VL == 8
#define MK_R 1
#define MK_T 3
#else
#define MK_R 1
#define MK_T 1
#endif
#endif
/* Floats of token rows (256 KiB) kept hot in L2 while a weight tile is
 * swept over them. */
#define TOKEN_BLOCK_FLOATS 65536u
/* Up to this many tokens, weights are widened in registers (see
 * matmul_rows); DIRECT_ROWS rows are swept together so their weights are
 * still in L1 for the second and later token groups. */
#define DIRECT_MAX_TOKENS 12u
#define DIRECT_ROWS 16u
/* Weights read from the model are prefetched this many rows ahead (two
 * register blocks, or 8 rows when blocks are narrower). */
#define PREFETCH_ROWS (2u * (MK_R > 4 ? MK_R : 4))
/* Keys ahead whose K or V row is prefetched in attention. */
#define KV_PREFETCH 8u
/* Jobs per thread in a projection region: enough to even out the threads
 * at the end of a region, few enough that claiming stays negligible. */
#define JOBS_PER_THREAD 8u

_Static_assert((MK_R & (MK_R - 1)) == 0 && MK_T >= 1 && MK_T <= 3,
               "MK_R a power of two, MK_T 1..3");

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

static ALWAYS_INLINE vf widen_bf16(const uint16_t *p)
{
    vh h = *(const vh_mem *)p;
    vu u = __builtin_convertvector(h, vu) << 16;
    return (vf)u;
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

static float widen1_f16(uint16_t h)
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

static float widen1_bf16(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

void ref_widen(devio_dtype dt, const void *src, float *dst, size_t n)
{
    size_t i = 0;
    if (dt == DEVIO_F32) {
        memcpy(dst, src, n * sizeof(float));
        return;
    }
    const uint16_t *h = src;
    if (dt == DEVIO_BF16) {
        for (; i + VL <= n; i += VL)
            stv(dst + i, widen_bf16(h + i));
        for (; i < n; i++)
            dst[i] = widen1_bf16(h[i]);
    } else {
        for (; i + VL <= n; i += VL)
            stv(dst + i, widen_f16(h + i));
        for (; i < n; i++)
            dst[i] = widen1_f16(h[i]);
    }
}

/* ---- reductions -------------------------------------------------------- */

float ref_lane_dot(const float *a, const float *b, uint32_t n)
{
    vf acc[NV];
    for (int v = 0; v < NV; v++)
        acc[v] = (vf){0};
    uint32_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int v = 0; v < NV; v++)
            acc[v] = acc[v] + ldv(a + i + v * VL) * ldv(b + i + v * VL);
    if (i < n) {
        /* The tail as one more chunk with zero terms in the missing lanes. */
        float ta[32] = {0}, tb[32] = {0};
        memcpy(ta, a + i, (n - i) * sizeof(float));
        memcpy(tb, b + i, (n - i) * sizeof(float));
        for (int v = 0; v < NV; v++)
            acc[v] = acc[v] + ldv(ta + v * VL) * ldv(tb + v * VL);
    }
    return fold_lanes(acc);
}

float ref_lane_sum(const float *x, uint32_t n)
{
    vf acc[NV];
    for (int v = 0; v < NV; v++)
        acc[v] = (vf){0};
    uint32_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int v = 0; v < NV; v++)
            acc[v] = acc[v] + ldv(x + i + v * VL);
    if (i < n) {
        float t[32] = {0};
        memcpy(t, x + i, (n - i) * sizeof(float));
        for (int v = 0; v < NV; v++)
            acc[v] = acc[v] + ldv(t + v * VL);
    }
    return fold_lanes(acc);
}

/* ---- rmsnorm and RoPE -------------------------------------------------- */

void ref_rmsnorm(float *y, const float *x, const float *w, uint32_t d, float eps)
{
    float ss = ref_lane_dot(x, x, d);
    float r = devio_rsqrtf(ss / (float)d + eps);
    for (uint32_t i = 0; i < d; i++)
        y[i] = w[i] * (x[i] * r);
}

void ref_rope(float *x, uint32_t n_heads, uint32_t hd, uint32_t rd, const float *cos_row,
              const float *sin_row)
{
    uint32_t half = rd / 2;
    for (uint32_t h = 0; h < n_heads; h++) {
        float *p = x + (size_t)h * hd;
        for (uint32_t i = 0; i < half; i++) {
            float a = p[i], b = p[i + half];
            float c = cos_row[i], s = sin_row[i];
            p[i] = a * c - b * s;
            p[i + half] = b * c + a * s;
        }
    }
}

/* ---- projections ------------------------------------------------------- */

/* VL weights from element i of a row of dtype dt, widened. */
static ALWAYS_INLINE vf ldw(int dt, const void *w, size_t i)
{
    if (dt == DEVIO_F32)
        return ldv((const float *)w + i);
    if (dt == DEVIO_BF16)
        return widen_bf16((const uint16_t *)w + i);
    return widen_f16((const uint16_t *)w + i);
}

/* R weight rows of dtype dt (stride ldw elements) times T token rows
 * (stride ldx floats), over n_pad elements, a multiple of 32 within the
 * rows of both operands (zeros past the real length).
 * out[r * T + t] = lane_dot(w_r, x_t). Constant R, T and dt after inlining
 * let the NV*R*T accumulators live in registers. pf != 0: prefetch the
 * weights pf bytes ahead of each row read. */
static ALWAYS_INLINE void mk_dots(int dt, int R, int T, const void *w, size_t ldw_, const float *x,
                                  size_t ldx, uint32_t n_pad, size_t pf, float *out)
{
    const size_t esz = dt == DEVIO_F32 ? 4u : 2u;
    vf acc[MK_R][3][NV];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++)
#pragma GCC unroll 8
            for (int v = 0; v < NV; v++)
                acc[r][t][v] = (vf){0};
    for (uint32_t k = 0; k < n_pad; k += 32) {
        /* x is loaded where it is used (the compiler keeps it in a register
         * across rows): staged in an array, clang turns the loads into a
         * block copy, a call on wasm32. */
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            /* One 64-byte line of 32 half-width weights per row and step
             * (two for f32, where the second line is covered by the
             * hardware's adjacent-line prefetch). */
            if (pf)
                __builtin_prefetch((const char *)w + ((size_t)r * ldw_ + k) * esz + pf);
#pragma GCC unroll 8
            for (int v = 0; v < NV; v++) {
                vf wv = ldw(dt, w, (size_t)r * ldw_ + k + v * VL);
#pragma GCC unroll 4
                for (int t = 0; t < T; t++)
                    acc[r][t][v] = acc[r][t][v] + wv * ldv(x + (size_t)t * ldx + k + v * VL);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++)
            out[r * T + t] = fold_lanes(acc[r][t]);
}

typedef void (*mk_fn)(const void *w, size_t ldw, const float *x, size_t ldx, uint32_t n_pad,
                      size_t pf, float *out);

/* mk_<dtype>_<rows>_<tokens>: "blk" is MK_R rows, "one" a single row. */
#define MK_DEF(DT, NAME, ROWS, R, T)                                                         \
    static void mk_##NAME##_##ROWS##_##T(const void *w, size_t ldw, const float *x,          \
                                         size_t ldx, uint32_t n_pad, size_t pf, float *out)  \
    {                                                                                        \
        mk_dots(DT, R, T, w, ldw, x, ldx, n_pad, pf, out);                                   \
    }
#define MK_DEF_ALL(DT, NAME)                                                                 \
    MK_DEF(DT, NAME, blk, MK_R, 1)                                                           \
    MK_DEF(DT, NAME, blk, MK_R, 2)                                                           \
    MK_DEF(DT, NAME, blk, MK_R, 3)                                                           \
    MK_DEF(DT, NAME, one, 1, 1)                                                              \
    MK_DEF(DT, NAME, one, 1, 2)                                                              \
    MK_DEF(DT, NAME, one, 1, 3)
MK_DEF_ALL(DEVIO_F32, f32)
MK_DEF_ALL(DEVIO_BF16, bf16)
MK_DEF_ALL(DEVIO_F16, f16)

/* [dtype][rows == MK_R][tokens - 1] */
static const mk_fn mk_table[3][2][3] = {
    [DEVIO_F32] = {{mk_f32_one_1, mk_f32_one_2, mk_f32_one_3},
                   {mk_f32_blk_1, mk_f32_blk_2, mk_f32_blk_3}},
    [DEVIO_BF16] = {{mk_bf16_one_1, mk_bf16_one_2, mk_bf16_one_3},
                    {mk_bf16_blk_1, mk_bf16_blk_2, mk_bf16_blk_3}},
    [DEVIO_F16] = {{mk_f16_one_1, mk_f16_one_2, mk_f16_one_3},
                   {mk_f16_blk_1, mk_f16_blk_2, mk_f16_blk_3}},
};

/* out[r * tn + t] for rn <= MK_R rows and tn <= MK_T tokens. */
static void block_dots(devio_dtype dt, uint32_t rn, uint32_t tn, const void *w, size_t ldw,
                       const float *x, size_t ldx, uint32_t n_pad, size_t pf, float *out)
{
    if (rn == MK_R) {
        mk_table[dt][1][tn - 1](w, ldw, x, ldx, n_pad, pf, out);
        return;
    }
    size_t esz = dt == DEVIO_F32 ? 4u : 2u;
    for (uint32_t r = 0; r < rn; r++)
        mk_table[dt][0][tn - 1]((const char *)w + (size_t)r * ldw * esz, ldw, x, ldx, n_pad, pf,
                                out + (size_t)r * tn);
}

/* Widen rows [r0, r0 + rn) of an [m, n] weight into dst with stride n_pad,
 * zeros in [n, n_pad). */
static void widen_tile(const ref_matmul *mm, const void *w, uint32_t r0, uint32_t rn,
                       uint32_t n_pad, float *dst)
{
    size_t esz = mm->dtype == DEVIO_F32 ? 4u : 2u;
    size_t row_bytes = (size_t)mm->n * esz;
    for (uint32_t r = 0; r < rn; r++) {
        const char *src = (const char *)w + (size_t)(r0 + r) * row_bytes;
        float *d = dst + (size_t)r * n_pad;
        /* Ask for the row PREFETCH_ROWS ahead: a plain sequential read
         * stalls on every miss here, prefetched it runs near the machine's
         * bandwidth. Reaching past the weight is harmless (a prefetch never
         * faults). */
        const char *ahead = src + (size_t)PREFETCH_ROWS * row_bytes;
        for (size_t b = 0; b < row_bytes; b += 64)
            __builtin_prefetch(ahead + b);
        ref_widen(mm->dtype, src, d, mm->n);
        for (uint32_t i = mm->n; i < n_pad; i++)
            d[i] = 0.0f;
    }
}

static void epilogue(const ref_matmul *mm, uint32_t o0, uint32_t rn, uint32_t t0, uint32_t tn,
                     const float *d1, const float *d2)
{
    for (uint32_t t = 0; t < tn; t++) {
        float *y = mm->y_rows ? mm->y_rows[t0 + t] : mm->y + (size_t)(t0 + t) * mm->ldy;
        for (uint32_t r = 0; r < rn; r++) {
            float d = d1[r * tn + t];
            uint32_t o = o0 + r;
            switch (mm->epi) {
            case REF_EPI_STORE:
                y[o] = d;
                break;
            case REF_EPI_BIAS:
                y[o] = d + mm->bias[o];
                break;
            case REF_EPI_ADD:
                y[o] = y[o] + d;
                break;
            case REF_EPI_ADD_SCALED:
                y[o] = y[o] + d * mm->scale;
                break;
            case REF_EPI_SILU_MUL:
                y[o] = devio_siluf(d) * d2[r * tn + t];
                break;
            }
        }
    }
}

/* Rows [r, r + rt) of the weights (wa, and wb for the fused gate/up), of
 * dtype dt and row stride ldw elements, against tokens [t0, t1). */
static void sweep(const ref_matmul *mm, devio_dtype dt, const void *wa, const void *wb,
                  size_t ldw, uint32_t r, uint32_t rt, uint32_t t0, uint32_t t1, uint32_t n_pad,
                  int prefetch)
{
    size_t esz = dt == DEVIO_F32 ? 4u : 2u;
    /* Weights straight from the model are prefetched PREFETCH_ROWS rows
     * ahead: the hardware stream detector loses track of rows read side by
     * side within one page. */
    size_t pf = prefetch ? (size_t)PREFETCH_ROWS * ldw * esz : 0;
    for (uint32_t t = t0; t < t1; t += MK_T) {
        uint32_t tn = t + MK_T < t1 ? MK_T : t1 - t;
        const float *x = mm->x + (size_t)t * mm->ldx;
        for (uint32_t rr = 0; rr < rt; rr += MK_R) {
            uint32_t rn = rr + MK_R < rt ? MK_R : rt - rr;
            size_t off = (size_t)rr * ldw * esz;
            float d1[MK_R * MK_T], d2[MK_R * MK_T];
            block_dots(dt, rn, tn, (const char *)wa + off, ldw, x, mm->ldx, n_pad, pf, d1);
            if (wb)
                block_dots(dt, rn, tn, (const char *)wb + off, ldw, x, mm->ldx, n_pad, pf, d2);
            epilogue(mm, r + rr, rn, t, tn, d1, d2);
        }
    }
}

/* Output rows [r0, r1) of one projection for every token.
 * Few tokens: the kernel widens weights in registers straight from the
 * model (one pass over memory, nothing staged). More tokens: a tile of rows
 * is widened once into scratch and swept over blocks of tokens, so the
 * widening is paid once per TOKEN_BLOCK rather than once per MK_T tokens.
 * Rows whose length is not a multiple of 32 always go through the tile,
 * which is zero padded. */
static void matmul_rows(const ref_matmul *mm, uint32_t r0, uint32_t r1, ref_scratch *s)
{
    uint32_t n_pad = ref_pad32(mm->n);
    uint32_t nw = mm->epi == REF_EPI_SILU_MUL ? 2u : 1u;
    uint32_t tb = (TOKEN_BLOCK_FLOATS / n_pad) / MK_T * MK_T;
    if (tb < MK_T)
        tb = MK_T;
    size_t esz = mm->dtype == DEVIO_F32 ? 4u : 2u;
    int direct = mm->n % 32u == 0 && (mm->dtype == DEVIO_F32 || mm->n_tok <= DIRECT_MAX_TOKENS);
    if (direct) {
        for (uint32_t t0 = 0; t0 < mm->n_tok; t0 += tb) {
            uint32_t t1 = t0 + tb < mm->n_tok ? t0 + tb : mm->n_tok;
            uint32_t rt = DIRECT_ROWS;
            for (uint32_t r = r0; r < r1; r += rt) {
                if (rt > r1 - r)
                    rt = r1 - r;
                size_t off = (size_t)r * mm->n * esz;
                sweep(mm, mm->dtype, (const char *)mm->w + off,
                      nw == 2 ? (const char *)mm->w2 + off : NULL, mm->n, r, rt, t0, t1, n_pad,
                      1);
            }
        }
        return;
    }
    uint32_t tr = (s->tile_floats / (n_pad * nw)) & ~(uint32_t)(MK_R - 1);
    if (tr < MK_R)
        tr = MK_R;
    for (uint32_t t0 = 0; t0 < mm->n_tok; t0 += tb) {
        uint32_t t1 = t0 + tb < mm->n_tok ? t0 + tb : mm->n_tok;
        for (uint32_t r = r0; r < r1; r += tr) {
            uint32_t rt = r + tr < r1 ? tr : r1 - r;
            widen_tile(mm, mm->w, r, rt, n_pad, s->tile);
            if (nw == 2)
                widen_tile(mm, mm->w2, r, rt, n_pad, s->tile + s->tile_floats);
            sweep(mm, DEVIO_F32, s->tile, nw == 2 ? s->tile + s->tile_floats : NULL, n_pad, r,
                  rt, t0, t1, n_pad, 0);
        }
    }
}

typedef struct mm_region {
    ref_matmul *mm;
    uint32_t count;
    uint32_t job_start[5]; /* job_start[k] = first job of mm[k]; [count] = total */
    ref_scratch *scratch;
} mm_region;

static void mm_job(void *ctx, uint32_t job, uint32_t thread)
{
    mm_region *g = ctx;
    uint32_t k = 0;
    while (job >= g->job_start[k + 1])
        k++;
    const ref_matmul *mm = &g->mm[k];
    uint32_t r0 = (job - g->job_start[k]) * mm->rows_per_job;
    uint32_t r1 = r0 + mm->rows_per_job < mm->m ? r0 + mm->rows_per_job : mm->m;
    matmul_rows(mm, r0, r1, &g->scratch[thread]);
}

void ref_matmul_run(devio_pool *pool, ref_scratch *scratch, ref_matmul *mm, uint32_t count)
{
    mm_region g = {.mm = mm, .count = count, .scratch = scratch};
    uint32_t threads = devio_pool_threads(pool);
    uint32_t total = 0;
    if (count > 4)
        count = 4;
    for (uint32_t k = 0; k < count; k++) {
        /* Rows per job: a multiple of the register block, about
         * JOBS_PER_THREAD jobs per thread over this projection. */
        uint32_t want = threads * JOBS_PER_THREAD;
        uint32_t rpj = (mm[k].m + want - 1) / want;
        rpj = (rpj + MK_R - 1) / MK_R * MK_R;
        if (rpj == 0)
            rpj = MK_R;
        mm[k].rows_per_job = rpj;
        g.job_start[k] = total;
        total += (mm[k].m + rpj - 1) / rpj;
    }
    g.job_start[count] = total;
    g.count = count;
    devio_pool_run(pool, total, mm_job, &g);
}

/* ---- attention --------------------------------------------------------- */

/* lane_dot(q, k, hd) with q zero padded to a multiple of 32 and k read only
 * inside [0, hd): the tail of k is copied into kbuf (zero padded). */
static ALWAYS_INLINE float dot_qk(const float *q, const float *k, uint32_t hd, float *kbuf)
{
    vf acc[NV];
    for (int v = 0; v < NV; v++)
        acc[v] = (vf){0};
    uint32_t i = 0;
    for (; i + 32 <= hd; i += 32)
        for (int v = 0; v < NV; v++)
            acc[v] = acc[v] + ldv(q + i + v * VL) * ldv(k + i + v * VL);
    if (i < hd) {
        memcpy(kbuf, k + i, (hd - i) * sizeof(float));
        for (int v = 0; v < NV; v++)
            acc[v] = acc[v] + ldv(q + i + v * VL) * ldv(kbuf + v * VL);
    }
    return fold_lanes(acc);
}

/* The keys of one head are contiguous inside a block but blocks lie
 * anywhere, so the row KV_PREFETCH keys ahead is asked for explicitly. */
static ALWAYS_INLINE const float *kv_row(const float *cache, const uint32_t *blocks, uint32_t j,
                                         uint32_t bs, uint32_t n_kv, uint32_t kvh, uint32_t hd)
{
    return cache + (((size_t)blocks[j / bs] * n_kv + kvh) * bs + j % bs) * hd;
}

static ALWAYS_INLINE void prefetch_row(const float *p, uint32_t n)
{
    for (uint32_t c = 0; c < n; c += 16) /* 16 floats = one 64-byte line */
        __builtin_prefetch(p + c);
}

void ref_attention_one(const ref_attention *a, uint32_t t, uint32_t h, ref_scratch *s)
{
    uint32_t hd = a->head_dim;
    uint32_t bs = a->block_size;
    uint32_t pos = a->tok_pos[t];
    /* Keys j0 .. pos: all of them, or the last `window` (rule 6). Scores sit
     * at sc[j - j0]; every sum still runs in lane j mod 32. */
    uint32_t j0 = a->window && pos + 1 > a->window ? pos + 1 - a->window : 0;
    uint32_t n_keys = pos + 1 - j0;
    const uint32_t *blocks = a->tok_blocks[t];
    uint32_t n_kv = a->n_kv_heads;
    uint32_t kvh = h / (a->n_heads / n_kv);
    float *sc = s->scores;

    /* qbuf and kbuf keep zeros past hd from their allocation. */
    memcpy(s->qbuf, a->q + (size_t)t * a->ldq + (size_t)h * hd, hd * sizeof(float));

    for (uint32_t k = 0; k < n_keys; k++) {
        uint32_t j = j0 + k;
        const float *key = kv_row(a->k_cache, blocks, j, bs, n_kv, kvh, hd);
        if (k + KV_PREFETCH < n_keys)
            prefetch_row(kv_row(a->k_cache, blocks, j + KV_PREFETCH, bs, n_kv, kvh, hd), hd);
        sc[k] = dot_qk(s->qbuf, key, hd, s->kbuf) * a->scale;
    }
    float m = sc[0];
    for (uint32_t k = 1; k < n_keys; k++)
        m = sc[k] > m ? sc[k] : m;
    for (uint32_t k = 0; k < n_keys; k++)
        sc[k] = devio_expf(sc[k] - m);
    float z;
    if (j0 == 0) {
        z = ref_lane_sum(sc, n_keys);
    } else {
        /* Lane j mod 32 of the absolute index: lanes start at +0 and add
         * their terms in increasing j. */
        float p[32] = {0};
        for (uint32_t k = 0; k < n_keys; k++)
            p[(j0 + k) & 31u] = p[(j0 + k) & 31u] + sc[k];
        z = devio_lane_fold(p);
    }

    /* acc[l] (hd floats) is lane l of the sum over keys j = l mod 32. */
    float *acc = s->acc;
    uint32_t lanes = j0 == 0 && n_keys < 32 ? n_keys : 32;
    memset(acc, 0, (size_t)lanes * hd * sizeof(float));
    uint32_t hv = hd - hd % VL;
    for (uint32_t k = 0; k < n_keys; k++) {
        uint32_t j = j0 + k;
        const float *v = kv_row(a->v_cache, blocks, j, bs, n_kv, kvh, hd);
        if (k + KV_PREFETCH < n_keys)
            prefetch_row(kv_row(a->v_cache, blocks, j + KV_PREFETCH, bs, n_kv, kvh, hd), hd);
        float *al = acc + (size_t)(j & 31u) * hd;
        float e = sc[k];
        vf ev = (vf){0} + e;
        uint32_t c = 0;
        for (; c < hv; c += VL)
            stv(al + c, ldv(al + c) + ev * ldv(v + c));
        for (; c < hd; c++)
            al[c] = al[c] + e * v[c];
    }
    /* Lanes at or past n_keys would hold +0, which changes no sum (a lane
     * sum is never -0): they are neither cleared nor added, which keeps
     * short sequences cheap. */
    for (uint32_t w = 16; w >= 1; w /= 2) {
        for (uint32_t l = 0; l < w; l++) {
            if (l + w >= lanes)
                continue;
            float *dst = acc + (size_t)l * hd;
            const float *src = acc + (size_t)(l + w) * hd;
            uint32_t c = 0;
            for (; c < hv; c += VL)
                stv(dst + c, ldv(dst + c) + ldv(src + c));
            for (; c < hd; c++)
                dst[c] = dst[c] + src[c];
        }
    }
    float *o = a->out + (size_t)t * a->ldo + (size_t)h * hd;
    for (uint32_t c = 0; c < hd; c++)
        o[c] = acc[c] / z;
}

typedef struct attn_region {
    const ref_attention *a;
    ref_scratch *scratch;
} attn_region;

static void attn_job(void *ctx, uint32_t job, uint32_t thread)
{
    attn_region *g = ctx;
    uint32_t t = job / g->a->n_heads;
    uint32_t h = job % g->a->n_heads;
    ref_attention_one(g->a, t, h, &g->scratch[thread]);
}

void ref_attention_run(devio_pool *pool, ref_scratch *scratch, const ref_attention *a)
{
    attn_region g = {.a = a, .scratch = scratch};
    devio_pool_run(pool, a->n_tok * a->n_heads, attn_job, &g);
}

/* ---- scratch ----------------------------------------------------------- */

int ref_scratch_init(ref_scratch *s, uint32_t max_in, uint32_t max_seq_len, uint32_t head_dim)
{
    memset(s, 0, sizeof *s);
    uint32_t tf = 4u * ref_pad32(max_in);
    s->tile_floats = tf > REF_TILE_FLOATS ? tf : REF_TILE_FLOATS;
    s->tile = malloc((size_t)2 * s->tile_floats * sizeof(float));
    s->scores = malloc((size_t)(max_seq_len ? max_seq_len : 1) * sizeof(float));
    s->acc = malloc((size_t)32 * head_dim * sizeof(float));
    s->qbuf = calloc(ref_pad32(head_dim) + 32, sizeof(float));
    s->kbuf = calloc(32, sizeof(float));
    if (!s->tile || !s->scores || !s->acc || !s->qbuf || !s->kbuf) {
        ref_scratch_fini(s);
        return -1;
    }
    return 0;
}

void ref_scratch_fini(ref_scratch *s)
{
    free(s->tile);
    free(s->scores);
    free(s->acc);
    free(s->qbuf);
    free(s->kbuf);
    memset(s, 0, sizeof *s);
}
