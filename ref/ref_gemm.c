/* ref_gemm.c - projections of the reference backend (ref_gemm.h): weight
 * panels packed at load, activations packed per run, and a micro-kernel
 * that keeps a tile of 16 outputs x TN tokens of one lane in registers.
 *
 * Why lane-major: the lane rule sums lane l's terms (k = l, l + 32, ...) in
 * increasing k and only then folds the 32 lanes. A register then holds one
 * lane of VL different outputs rather than VL lanes of one output, so one
 * weight load serves TN tokens and one broadcast of x serves 16 outputs:
 * the tile is 16 x TN outputs in 16 / VL x TN registers instead of the
 * 32 / VL registers every single output needs when its lanes share a
 * register. Each product is rounded before it is added (-ffp-contract=off),
 * so the numbers are ref_lane_dot's, for every VL and every TN. */
#include "ref/ref_gemm.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "device/numerics/numerics.h"
#include "device/numerics/numerics_vec.h"
#include "device/numerics/quant.h"
#include "ref/ref_vec.h"

/* Vectors per panel row of 16 outputs, the token group G (tokens whose x is
 * packed together, the largest tile) and the accumulator registers a tile
 * may take: AVX-512 32 registers, AVX 16, 4-float vectors 16 (SSE2, NEON
 * and simd128 are held to 16). */
#define PV ((int)REF_PANEL_ROWS / VL)
#if VL == 16
#define G 12
#define MAX_ACC 24
#elif VL == 8
#define G 6
#define MAX_ACC 12
#else
#define G 2
#define MAX_ACC 8
#endif
_Static_assert(G <= 12, "REF_GEMM_PART_FLOATS holds tiles of up to 12 tokens");

/* Packed activations per token block (192 KiB): they stay in L2 while every
 * panel of a job is swept over them. */
#define XBLOCK_FLOATS 49152u
/* Jobs per thread in a projection region: enough to even out the threads
 * at the end of a region, few enough that claiming stays negligible. */
#define JOBS_PER_THREAD 8u
/* How far ahead of a one-token read a 16-bit panel is prefetched. */
#define PREFETCH_BYTES 2048u
/* Token groups in a block from which a 16-bit panel is widened once for
 * the block rather than in the kernel's loop for every group. */
#define WIDEN_MIN_GROUPS 3u
/* Token groups from which packing x is itself spread over the pool. */
#define XPACK_PARALLEL_GROUPS 4u

static ALWAYS_INLINE vf splat(float x)
{
    vf v;
    for (int i = 0; i < VL; i++)
        v[i] = x;
    return v;
}

/* Bytes per element of a panel: int8 for the quantized types. */
static size_t esize(devio_dtype dt)
{
    return dt == DEVIO_F32 ? 4u : devio_dtype_quantized(dt) ? 1u : 2u;
}

/* Index of element (row r, column k) in a panel of k32 steps (ref_gemm.h). */
static size_t panel_at(uint32_t k32, uint32_t k, uint32_t r)
{
    uint32_t lane = k % 32u, kk = k / 32u;
    return ((((size_t)(lane / REF_LANE_QUAD) * k32 + kk) * REF_LANE_QUAD + lane % REF_LANE_QUAD) *
            REF_PANEL_ROWS) + r;
}

/* ---- packing ----------------------------------------------------------- */

typedef struct pack_job {
    ref_panels *p;
    const void *w;
} pack_job;

static void pack_panel(void *ctx, uint32_t panel, uint32_t thread)
{
    (void)thread;
    const pack_job *j = ctx;
    const ref_panels *p = j->p;
    size_t esz = esize(p->dtype);
    size_t per = (size_t)REF_PANEL_ROWS * p->k32 * 32u;
    char *dst = (char *)p->data + (size_t)panel * per * esz;
    const char *src = j->w;
    size_t i = 0;
    for (uint32_t q = 0; q < 32; q += REF_LANE_QUAD)
        for (uint32_t kk = 0; kk < p->k32; kk++)
            for (uint32_t k = kk * 32u + q; k < kk * 32u + q + REF_LANE_QUAD; k++)
                for (uint32_t r = 0; r < REF_PANEL_ROWS; r++, i++) {
                    uint32_t o = panel * REF_PANEL_ROWS + r;
                    if (o < p->m && k < p->n)
                        memcpy(dst + i * esz, src + ((size_t)o * p->n + k) * esz, esz);
                    else
                        memset(dst + i * esz, 0, esz);
                }
}

/* A quantized panel: each row's blocks split (devio_quant_split) into int8
 * quants at their panel places and the scales (offsets) of its groups. */
static void pack_qpanel(void *ctx, uint32_t panel, uint32_t thread)
{
    (void)thread;
    const pack_job *j = ctx;
    const ref_panels *p = j->p;
    uint32_t t = devio_dtype_ggml(p->dtype), blk = devio_quant_block(t);
    uint32_t gs = devio_quant_group(t), ng = p->qgroups, k32 = p->k32;
    size_t row_bytes = (size_t)devio_dtype_row_bytes(p->dtype, p->n);
    int8_t *dst = (int8_t *)p->data + (size_t)panel * REF_PANEL_ROWS * k32 * 32u;
    size_t sbase = (size_t)panel * k32 * ng * REF_PANEL_ROWS;
    for (uint32_t r = 0; r < REF_PANEL_ROWS; r++) {
        uint32_t o = panel * REF_PANEL_ROWS + r;
        for (uint32_t k0 = 0; k0 < k32 * 32u; k0 += blk) {
            int8_t q[256] = {0};
            float S[16] = {0}, M[16] = {0};
            if (o < p->m && k0 < p->n)
                devio_quant_split(t, (const uint8_t *)j->w + o * row_bytes + k0 / blk * devio_quant_block_bytes(t), q, S, M);
            for (uint32_t i = 0; i < blk && k0 + i < k32 * 32u; i++)
                dst[panel_at(k32, k0 + i, r)] = q[i];
            for (uint32_t g = 0; g < blk / gs && (k0 + g * gs) / 32u < k32; g++) {
                uint32_t k = k0 + g * gs;
                size_t at = sbase + ((size_t)(k / 32u) * ng + (k % 32u) / gs) * REF_PANEL_ROWS + r;
                p->qscale[at] = S[g];
                if (p->qoffset)
                    p->qoffset[at] = M[g];
            }
        }
    }
}

/* VL int8 quants at p as binary32 (exact): a sign-extending load and one
 * conversion. Without AVX2 through GCC's generic vectors (which, given a
 * vector of int8, convert element by element). */
typedef int8_t vq __attribute__((vector_size(VL)));
static ALWAYS_INLINE vf ldq(const int8_t *p)
{
#if VL == 16 && defined(__AVX512F__)
    return (vf)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
#elif VL == 8 && defined(__AVX2__)
    return (vf)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
#else
    vq q;
    memcpy(&q, p, sizeof q);
    return __builtin_convertvector(__builtin_convertvector(q, vi), vf);
#endif
}

/* What the micro-kernel reads weights from: a panel of dtype F32, BF16 or
 * F16, or a quantized panel (int8 quants) with the scales (and offsets) of
 * its groups (qscale_at). */
typedef struct wsrc {
    const void *pan;
    const float *qs, *qo; /* quantized: [k32][groups][16 rows]; qo NULL without offsets */
    uint32_t qgroups;
} wsrc;

/* Panel p of the quantized w: its quants and its scales (and offsets). */
static wsrc qsrc(const ref_panels *w, uint32_t p)
{
    size_t sbase = (size_t)p * w->k32 * w->qgroups * REF_PANEL_ROWS;
    return (wsrc){.pan = (const int8_t *)w->data + (size_t)p * REF_PANEL_ROWS * w->k32 * 32u,
                  .qs = w->qscale + sbase,
                  .qo = w->qoffset ? w->qoffset + sbase : NULL,
                  .qgroups = w->qgroups};
}

/* Where the 16 rows' scales of step kk and lane are in a wsrc's qs (qo). */
static ALWAYS_INLINE size_t qscale_at(const wsrc *q, uint32_t kk, uint32_t lane)
{
    return ((size_t)kk * q->qgroups + (q->qgroups == 2 ? lane / 16u : 0u)) * REF_PANEL_ROWS;
}

/* A quantized panel widened into dst as a binary32 panel (the same order):
 * S * q (+ M), each element's value (device/numerics/quant.h), VL rows at a time. */
static void widen_qpanel(const ref_panels *p, uint32_t panel, float *dst)
{
    const wsrc src = qsrc(p, panel);
    const int8_t *q = src.pan;
    size_t at = 0; /* storage order: [lane quads][k32][4 lanes][16 rows] */
    for (uint32_t lq = 0; lq < 32u / REF_LANE_QUAD; lq++)
        for (uint32_t kk = 0; kk < p->k32; kk++)
            for (uint32_t li = 0; li < REF_LANE_QUAD; li++, at += REF_PANEL_ROWS) {
                size_t sat = qscale_at(&src, kk, lq * REF_LANE_QUAD + li);
                for (uint32_t v = 0; v < REF_PANEL_ROWS; v += VL) {
                    vf w = ldv(src.qs + sat + v) * ldq(q + at + v);
                    if (src.qo)
                        w = w + ldv(src.qo + sat + v);
                    stv(dst + at + v, w);
                }
            }
}

int ref_panels_pack(ref_panels *p, devio_pool *pool, const void *w, devio_dtype dt, uint32_t m,
                    uint32_t n)
{
    memset(p, 0, sizeof *p);
    uint32_t panels = (m + REF_PANEL_ROWS - 1) / REF_PANEL_ROWS;
    uint32_t k32 = (n + 31u) / 32u;
    size_t bytes = (size_t)panels * REF_PANEL_ROWS * k32 * 32u * esize(dt);
    void *data = NULL;
    if (posix_memalign(&data, 64, bytes ? bytes : 64) != 0)
        return -1;
    *p = (ref_panels){.data = data, .dtype = dt, .m = m, .n = n, .k32 = k32, .bytes = bytes};
    pack_job j = {.p = p, .w = w};
    uint32_t t = devio_dtype_ggml(dt);
    if (!t) {
        devio_pool_run(pool, panels, pack_panel, &j);
        return 0;
    }
    p->qgroups = 32u / devio_quant_group(t);
    size_t nsc = (size_t)panels * k32 * p->qgroups * REF_PANEL_ROWS;
    p->qscale = malloc(nsc * sizeof(float));
    p->qoffset = devio_quant_has_offset(t) ? malloc(nsc * sizeof(float)) : NULL;
    if (!p->qscale || (devio_quant_has_offset(t) && !p->qoffset)) {
        ref_panels_free(p);
        return -1;
    }
    p->bytes += nsc * sizeof(float) * (p->qoffset ? 2u : 1u);
    devio_pool_run(pool, panels, pack_qpanel, &j);
    return 0;
}

void ref_panels_free(ref_panels *p)
{
    free(p->data);
    free(p->qscale);
    free(p->qoffset);
    memset(p, 0, sizeof *p);
}

size_t ref_gemm_xpack_floats(uint32_t max_tokens, uint32_t max_n)
{
    size_t groups = (max_tokens + G - 1) / G;
    return (groups ? groups : 1) * G * ref_pad32(max_n);
}

/* Group g of x in lane-major order: [32 lanes][k32 steps][tn tokens], tn
 * the group's tokens (G but in the last group), zeros past n. */
static void pack_x_group(const ref_matmul *mm, uint32_t k32, uint32_t g, float *xpack)
{
    float *out = xpack + (size_t)g * G * k32 * 32u;
    uint32_t n = mm->w->n, t0 = g * G;
    uint32_t tn = mm->n_tok - t0 < G ? mm->n_tok - t0 : G;
    const float *x = mm->x + (size_t)t0 * mm->ldx;
    for (uint32_t l = 0; l < 32; l++)
        for (uint32_t kk = 0; kk < k32; kk++, out += tn) {
            uint32_t k = kk * 32u + l;
            for (uint32_t t = 0; t < tn; t++)
                out[t] = k < n ? x[(size_t)t * mm->ldx + k] : 0.0f;
        }
}

typedef struct xpack_job {
    const ref_matmul *mm;
    uint32_t k32;
    float *xpack;
} xpack_job;

static void xpack_run(void *ctx, uint32_t g, uint32_t thread)
{
    (void)thread;
    const xpack_job *j = ctx;
    pack_x_group(j->mm, j->k32, g, j->xpack);
}

/* ---- the micro-kernel -------------------------------------------------- */

/* Pseudo-dtypes of the micro-kernel for a quantized panel, widened in
 * registers as S * q (MK_QO: then + M), device/numerics/quant.h's value. */
enum { MK_Q = 100, MK_QO = 101 };

/* One panel (16 outputs) against the TN tokens of a packed group xp, over all
 * k32 steps: part[l][t][r] (stride G * 16 per lane) is lane l of output r
 * for token t, and after the fold part[0][t][r] is the dot product. Two
 * lanes run side by side when their tiles fit the registers together, so
 * that short tiles still keep several additions in flight. */
static ALWAYS_INLINE void panel_dots(int dt, int TN, const wsrc *src, uint32_t k32,
                                     const float *xp, float *part)
{
    const bool quant = dt == MK_Q || dt == MK_QO;
    const void *pan = src->pan;
    const size_t esz = dt == DEVIO_F32 ? 4u : quant ? 1u : 2u;
    /* A quantized panel's scales (and offsets) are the same for the lanes
     * of a block (LB divides 16, Q6_K's group of 16 lanes): loaded once per
     * step for all of them. (8 lanes side by side measured slower than 4.) */
    const int LB = 4 * TN * PV <= MAX_ACC ? 4 : 2 * TN * PV <= MAX_ACC ? 2 : 1;
    for (uint32_t l = 0; l < 32; l += (uint32_t)LB) {
        vf acc[4][G][PV];
#pragma GCC unroll 4
        for (int b = 0; b < LB; b++)
#pragma GCC unroll 12
            for (int t = 0; t < TN; t++)
#pragma GCC unroll 4
                for (int v = 0; v < PV; v++)
                    acc[b][t][v] = (vf){0};
        for (uint32_t kk = 0; kk < k32; kk++) {
            vf S[PV], M[PV];
            if (quant) {
                size_t sat = qscale_at(src, kk, l);
#pragma GCC unroll 4
                for (int v = 0; v < PV; v++) {
                    S[v] = ldv(src->qs + sat + v * VL);
                    M[v] = dt == MK_QO ? ldv(src->qo + sat + v * VL) : (vf){0};
                }
            }
#pragma GCC unroll 4
            for (int b = 0; b < LB; b++) {
                uint32_t lane = l + (uint32_t)b;
                size_t step = (size_t)lane * k32 + kk;
                size_t at = (((size_t)(lane / REF_LANE_QUAD) * k32 + kk) * REF_LANE_QUAD +
                             lane % REF_LANE_QUAD) * REF_PANEL_ROWS;
                /* One token, 16-bit weights: the kernel outruns the
                 * hardware's prefetch of the panel stream; ask ahead. */
                if (TN == 1 && dt != DEVIO_F32 && b == 0)
                    for (uint32_t c = 0; c < (uint32_t)LB * REF_PANEL_ROWS * esz; c += 64)
                        __builtin_prefetch((const char *)pan + at * esz + PREFETCH_BYTES + c);
                const float *xs = xp + step * TN;
                vf w[PV];
                if (quant) {
#pragma GCC unroll 4
                    for (int v = 0; v < PV; v++) {
                        w[v] = S[v] * ldq((const int8_t *)pan + at + v * VL);
                        if (dt == MK_QO)
                            w[v] = w[v] + M[v];
                    }
                } else {
#pragma GCC unroll 4
                    for (int v = 0; v < PV; v++)
                        w[v] = ldw(dt, pan, at + v * VL);
                }
#pragma GCC unroll 12
                for (int t = 0; t < TN; t++) {
                    vf xb = splat(xs[t]);
#pragma GCC unroll 4
                    for (int v = 0; v < PV; v++)
                        acc[b][t][v] = acc[b][t][v] + w[v] * xb;
                }
            }
        }
#pragma GCC unroll 4
        for (int b = 0; b < LB; b++)
#pragma GCC unroll 12
            for (int t = 0; t < TN; t++)
#pragma GCC unroll 4
                for (int v = 0; v < PV; v++)
                    stv(part + ((size_t)(l + b) * G + t) * REF_PANEL_ROWS + v * VL,
                        acc[b][t][v]);
    }
    /* The fold of the lane rule (lane l += lane l + w for w = 16 .. 1),
     * one column of VL values at a time: the first step from memory, the
     * rest in registers. */
    for (uint32_t c = 0; c < (uint32_t)TN * REF_PANEL_ROWS; c += VL) {
        vf r[16];
#pragma GCC unroll 16
        for (int l = 0; l < 16; l++)
            r[l] = ldv(part + (size_t)l * G * REF_PANEL_ROWS + c) +
                   ldv(part + (size_t)(l + 16) * G * REF_PANEL_ROWS + c);
#pragma GCC unroll 8
        for (int w = 8; w >= 1; w /= 2)
#pragma GCC unroll 8
            for (int l = 0; l < w; l++)
                r[l] = r[l] + r[l + w];
        stv(part + c, r[0]);
    }
}

typedef void (*mk_fn)(const wsrc *w, uint32_t k32, const float *xp, float *part);

#define MK_DEF(DT, NAME, TN)                                                                 \
    static void mk_##NAME##_##TN(const wsrc *w, uint32_t k32, const float *xp, float *part)  \
    {                                                                                        \
        panel_dots(DT, TN, w, k32, xp, part);                                                \
    }
#if G == 12
#define MK_EACH(M, DT, NAME)                                                                 \
    M(DT, NAME, 1) M(DT, NAME, 2) M(DT, NAME, 3) M(DT, NAME, 4) M(DT, NAME, 5)               \
    M(DT, NAME, 6) M(DT, NAME, 7) M(DT, NAME, 8) M(DT, NAME, 9) M(DT, NAME, 10)              \
    M(DT, NAME, 11) M(DT, NAME, 12)
#define MK_ROW(NAME)                                                                         \
    {mk_##NAME##_1, mk_##NAME##_2, mk_##NAME##_3, mk_##NAME##_4, mk_##NAME##_5,              \
     mk_##NAME##_6, mk_##NAME##_7, mk_##NAME##_8, mk_##NAME##_9, mk_##NAME##_10,             \
     mk_##NAME##_11, mk_##NAME##_12}
#elif G == 6
#define MK_EACH(M, DT, NAME)                                                                 \
    M(DT, NAME, 1) M(DT, NAME, 2) M(DT, NAME, 3) M(DT, NAME, 4) M(DT, NAME, 5) M(DT, NAME, 6)
#define MK_ROW(NAME)                                                                         \
    {mk_##NAME##_1, mk_##NAME##_2, mk_##NAME##_3, mk_##NAME##_4, mk_##NAME##_5, mk_##NAME##_6}
#else
#define MK_EACH(M, DT, NAME) M(DT, NAME, 1) M(DT, NAME, 2)
#define MK_ROW(NAME) {mk_##NAME##_1, mk_##NAME##_2}
#endif
MK_EACH(MK_DEF, DEVIO_F32, f32)
MK_EACH(MK_DEF, DEVIO_BF16, bf16)
MK_EACH(MK_DEF, DEVIO_F16, f16)
MK_EACH(MK_DEF, MK_Q, q)
MK_EACH(MK_DEF, MK_QO, qo)

/* [kernel][tokens - 1]: F32, BF16 and F16 by their dtype, then the
 * quantized panels without and with offsets. */
enum { MK_ROW_Q = 3, MK_ROW_QO = 4 };
static const mk_fn mk_table[5][G] = {
    [DEVIO_F32] = MK_ROW(f32),
    [DEVIO_BF16] = MK_ROW(bf16),
    [DEVIO_F16] = MK_ROW(f16),
    [MK_ROW_Q] = MK_ROW(q),
    [MK_ROW_QO] = MK_ROW(qo),
};

/* ---- projections ------------------------------------------------------- */

/* Outputs o0 .. o0 + rn of tokens t0 .. t0 + tn from the folded tiles: one
 * loop per kind, so that each runs over contiguous floats (the SwiGLU gate
 * eight at a time, devio_silu_mul_n, the same bits as devio_siluf). */
static void epilogue(const ref_matmul *mm, uint32_t o0, uint32_t rn, uint32_t t0, uint32_t tn,
                     const float *d1, const float *d2)
{
    for (uint32_t t = 0; t < tn; t++) {
        float *y = (mm->y_rows ? mm->y_rows[t0 + t] : mm->y + (size_t)(t0 + t) * mm->ldy) + o0;
        const float *a = d1 + (size_t)t * REF_PANEL_ROWS, *b = d2 + (size_t)t * REF_PANEL_ROWS;
        switch (mm->epi) {
        case REF_EPI_STORE:
            memcpy(y, a, rn * sizeof *y);
            break;
        case REF_EPI_BIAS:
            for (uint32_t r = 0; r < rn; r++)
                y[r] = a[r] + mm->bias[o0 + r];
            break;
        case REF_EPI_ADD:
            for (uint32_t r = 0; r < rn; r++)
                y[r] = y[r] + a[r];
            break;
        case REF_EPI_ADD_SCALED:
            for (uint32_t r = 0; r < rn; r++)
                y[r] = y[r] + a[r] * mm->scale;
            break;
        case REF_EPI_SILU_MUL:
            devio_silu_mul_n(y, a, b, rn);
            break;
        }
    }
}

/* Panels [p0, p1) of one projection for every token: token blocks of
 * packed x that fit L2, each swept by every panel of the job in turn. */
static void matmul_panels(const ref_matmul *mm, uint32_t p0, uint32_t p1, ref_scratch *s,
                          const float *xpack)
{
    const ref_panels *w = mm->w;
    uint32_t k32 = w->k32;
    size_t group_floats = (size_t)G * k32 * 32u;
    size_t panel_bytes = (size_t)REF_PANEL_ROWS * k32 * 32u * esize(w->dtype);
    uint32_t n_groups = (mm->n_tok + G - 1) / G;
    uint32_t gb = (uint32_t)(XBLOCK_FLOATS / group_floats);
    if (gb == 0)
        gb = 1;
    float *d1 = s->part, *d2 = s->part + REF_GEMM_PART_FLOATS / 2;
    size_t panel_elems = (size_t)REF_PANEL_ROWS * k32 * 32u;
    for (uint32_t g0 = 0; g0 < n_groups; g0 += gb) {
        uint32_t g1 = g0 + gb < n_groups ? g0 + gb : n_groups;
        /* A 16-bit or quantized panel that serves several groups is widened
         * once into scratch and read as f32 from there: widening is exact, so
         * the numbers are the same, and the kernel's loop loses its
         * conversions. Fewer groups read it as it is (a quantized panel's
         * values formed in registers). */
        bool quant = devio_dtype_quantized(w->dtype);
        bool widen = w->dtype != DEVIO_F32 && g1 - g0 >= WIDEN_MIN_GROUPS;
        const mk_fn *mk = mk_table[widen ? DEVIO_F32 : !quant ? w->dtype
                                   : w->qoffset ? MK_ROW_QO : MK_ROW_Q];
        for (uint32_t p = p0; p < p1; p++) {
            wsrc wa = {.pan = (const char *)w->data + (size_t)p * panel_bytes};
            wsrc wb = {.pan = mm->w2 ? (const char *)mm->w2->data + (size_t)p * panel_bytes
                                     : NULL};
            if (quant && !widen) {
                wa = qsrc(w, p);
                if (wb.pan)
                    wb = qsrc(mm->w2, p);
            } else if (quant) {
                widen_qpanel(w, p, s->wide);
                wa.pan = s->wide;
                if (wb.pan) {
                    widen_qpanel(mm->w2, p, s->wide + panel_elems);
                    wb.pan = s->wide + panel_elems;
                }
            } else if (widen) {
                ref_widen(w->dtype, wa.pan, s->wide, panel_elems);
                wa.pan = s->wide;
                if (wb.pan) {
                    ref_widen(w->dtype, wb.pan, s->wide + panel_elems, panel_elems);
                    wb.pan = s->wide + panel_elems;
                }
            }
            uint32_t o0 = p * REF_PANEL_ROWS;
            uint32_t rn = w->m - o0 < REF_PANEL_ROWS ? w->m - o0 : REF_PANEL_ROWS;
            for (uint32_t g = g0; g < g1; g++) {
                uint32_t tn = mm->n_tok - g * G < G ? mm->n_tok - g * G : G;
                const float *xp = xpack + (size_t)g * group_floats;
                mk[tn - 1](&wa, k32, xp, d1);
                if (wb.pan)
                    mk[tn - 1](&wb, k32, xp, d2);
                epilogue(mm, o0, rn, g * G, tn, d1, d2);
            }
        }
    }
}

typedef struct mm_region {
    ref_matmul *mm;
    uint32_t job_start[5]; /* job_start[k] = first job of mm[k]; [count] = total */
    ref_scratch *scratch;
    const float *xpack;
} mm_region;

static void mm_job(void *ctx, uint32_t job, uint32_t thread)
{
    mm_region *g = ctx;
    uint32_t k = 0;
    while (job >= g->job_start[k + 1])
        k++;
    const ref_matmul *mm = &g->mm[k];
    uint32_t panels = (mm->w->m + REF_PANEL_ROWS - 1) / REF_PANEL_ROWS;
    uint32_t ppj = mm->rows_per_job / REF_PANEL_ROWS;
    uint32_t p0 = (job - g->job_start[k]) * ppj;
    uint32_t p1 = p0 + ppj < panels ? p0 + ppj : panels;
    matmul_panels(mm, p0, p1, &g->scratch[thread], g->xpack);
}

void ref_matmul_run(const ref_gemm_work *wk, ref_matmul *mm, uint32_t count)
{
    if (count == 0 || mm[0].n_tok == 0)
        return;
    if (count > 4)
        count = 4;
    /* x once for all: every projection of a run reads the same rows. */
    uint32_t k32 = mm[0].w->k32;
    uint32_t n_groups = (mm[0].n_tok + G - 1) / G;
    if (n_groups >= XPACK_PARALLEL_GROUPS) {
        xpack_job xj = {.mm = &mm[0], .k32 = k32, .xpack = wk->xpack};
        devio_pool_run(wk->pool, n_groups, xpack_run, &xj);
    } else {
        for (uint32_t g = 0; g < n_groups; g++)
            pack_x_group(&mm[0], k32, g, wk->xpack);
    }

    mm_region g = {.mm = mm, .scratch = wk->scratch, .xpack = wk->xpack};
    uint32_t threads = devio_pool_threads(wk->pool);
    uint32_t total = 0;
    for (uint32_t k = 0; k < count; k++) {
        /* Whole panels per job, about JOBS_PER_THREAD jobs per thread. */
        uint32_t panels = (mm[k].w->m + REF_PANEL_ROWS - 1) / REF_PANEL_ROWS;
        uint32_t want = threads * JOBS_PER_THREAD;
        uint32_t ppj = (panels + want - 1) / want;
        if (ppj == 0)
            ppj = 1;
        mm[k].rows_per_job = ppj * REF_PANEL_ROWS;
        g.job_start[k] = total;
        total += (panels + ppj - 1) / ppj;
    }
    g.job_start[count] = total;
    devio_pool_run(wk->pool, total, mm_job, &g);
}
