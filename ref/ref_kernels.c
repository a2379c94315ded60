/* ref_kernels.c - widening, the lane reductions, rmsnorm, RoPE and attention
 * of the reference backend, in the operation order ref_kernels.h defines.
 * Never fuses a multiply into an add, never calls libm, never allocates per
 * call. The projections are ref_gemm.c; the vector vocabulary both use is
 * ref_vec.h (generic vectors: the same source becomes AVX-512, AVX2, SSE2,
 * NEON or simd128, and the numbers do not depend on which). */
#include "ref/ref_kernels.h"

#include <stdlib.h>
#include <string.h>

#include "device/numerics/numerics.h"
#include "device/numerics/numerics_vec.h"
#include "device/numerics/quant.h"
#include "ref/ref_kv.h"
#include "ref/ref_vec.h"

/* Keys ahead whose K or V row is prefetched in attention. */
#define KV_PREFETCH 8u

void ref_widen(devio_dtype dt, const void *src, float *dst, size_t n)
{
    size_t i = 0;
    if (devio_dtype_quantized(dt)) { /* whole blocks: an embedding row */
        devio_dequant_row(devio_dtype_ggml(dt), src, dst, n);
        return;
    }
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

/* ---- attention --------------------------------------------------------- */

/* lane_dot(q, k, hd) with q zero padded to a multiple of 32 and k (a row
 * of the K cache, ref_kv.h) read only inside [0, hd): the tail of k is
 * copied into kbuf (zero padded). */
static ALWAYS_INLINE float dot_qk(const float *q, const ref_kv *k, uint32_t hd, float *kbuf)
{
    /* Unrolled over the vectors so the accumulators stay in registers (a
     * rolled loop keeps them on the stack, one store-to-load per chunk). */
    vf acc[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; v++)
        acc[v] = (vf){0};
    uint32_t i = 0;
    for (; i + 32 <= hd; i += 32)
#pragma GCC unroll 8
        for (int v = 0; v < NV; v++)
            acc[v] = acc[v] + ldv(q + i + v * VL) * ref_kv_ldv(k + i + v * VL);
    if (i < hd) {
        for (uint32_t j = 0; j < hd - i; j++)
            kbuf[j] = ref_kv_get(k + i + j);
#pragma GCC unroll 8
        for (int v = 0; v < NV; v++)
            acc[v] = acc[v] + ldv(q + i + v * VL) * ldv(kbuf + v * VL);
    }
    return fold_lanes(acc);
}

static ALWAYS_INLINE void prefetch_row(const ref_kv *p, uint32_t n)
{
    for (uint32_t c = 0; c < n; c += 64u / sizeof(ref_kv)) /* one 64-byte line */
        __builtin_prefetch(p + c);
}

/* Floats [c, c + NC * VL) of lane sum out = sum of e_k * v_k over the keys
 * k0, k0 + 32, ... below n_keys, added in that order from +0. */
static ALWAYS_INLINE void pv_lane(int NC, const ref_kv *v_cache, const size_t *rows,
                                  const float *sc, uint32_t k0, uint32_t n_keys, uint32_t c,
                                  float *out)
{
    vf acc[8];
#pragma GCC unroll 8
    for (int i = 0; i < NC; i++)
        acc[i] = (vf){0};
    for (uint32_t k = k0; k < n_keys; k += 32) {
        const ref_kv *v = v_cache + rows[k] + c;
        if (k + 32u * 2u < n_keys)
            __builtin_prefetch(v_cache + rows[k + 64] + c);
        vf e = (vf){0} + sc[k];
#pragma GCC unroll 8
        for (int i = 0; i < NC; i++)
            acc[i] = acc[i] + e * ref_kv_ldv(v + i * VL);
    }
#pragma GCC unroll 8
    for (int i = 0; i < NC; i++)
        stv(out + c + i * VL, acc[i]);
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

    /* Where each key's row of this head is, in the K pool and the V pool
     * alike (the keys of a head are contiguous inside a block, blocks lie
     * anywhere): walked once, so no key costs a division. */
    size_t *rows = s->rows;
    for (uint32_t k = 0, blk = j0 / bs, off = j0 % bs; k < n_keys; k++) {
        rows[k] = (((size_t)blocks[blk] * n_kv + kvh) * bs + off) * hd;
        if (++off == bs) {
            off = 0;
            blk++;
        }
    }
    /* Rows KV_PREFETCH keys ahead are asked for explicitly: the hardware
     * cannot guess the next block. */
    for (uint32_t k = 0; k < n_keys; k++) {
        if (k + KV_PREFETCH < n_keys)
            prefetch_row(a->k_cache + rows[k + KV_PREFETCH], hd);
        sc[k] = dot_qk(s->qbuf, a->k_cache + rows[k], hd, s->kbuf) * a->scale;
    }
    float m = sc[0];
    for (uint32_t k = 1; k < n_keys; k++)
        m = sc[k] > m ? sc[k] : m;
    devio_expf_sub_n(sc, sc, m, n_keys);
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

    /* acc[l] (hd floats) is lane l of the sum over keys j = l mod 32, each
     * lane summed whole before the next: its keys j, j + 32, ... in
     * increasing j, NC vectors of the head at a time in registers. */
    float *acc = s->acc;
    uint32_t lanes = j0 == 0 && n_keys < 32 ? n_keys : 32;
    uint32_t hv = hd - hd % VL;
    for (uint32_t l = 0; l < lanes; l++) {
        uint32_t k0 = (l - j0) & 31u; /* the first key of lane l */
        float *al = acc + (size_t)l * hd;
        uint32_t c = 0;
        for (; c + 8 * VL <= hv; c += 8 * VL)
            pv_lane(8, a->v_cache, rows, sc, k0, n_keys, c, al);
        for (; c + 2 * VL <= hv; c += 2 * VL)
            pv_lane(2, a->v_cache, rows, sc, k0, n_keys, c, al);
        for (; c < hv; c += VL)
            pv_lane(1, a->v_cache, rows, sc, k0, n_keys, c, al);
        for (; c < hd; c++) {
            float x = 0.0f;
            for (uint32_t k = k0; k < n_keys; k += 32)
                x = x + sc[k] * ref_kv_get(a->v_cache + rows[k] + c);
            al[c] = x;
        }
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
    /* Head-major: the jobs that follow each other read the same head's keys
     * and values, which then stay in cache for all the batch's tokens. */
    uint32_t h = job / g->a->n_tok;
    uint32_t t = job % g->a->n_tok;
    ref_attention_one(g->a, t, h, &g->scratch[thread]);
}

void ref_attention_run(devio_pool *pool, ref_scratch *scratch, const ref_attention *a)
{
    attn_region g = {.a = a, .scratch = scratch};
    devio_pool_run(pool, a->n_tok * a->n_heads, attn_job, &g);
}

/* ---- scratch ----------------------------------------------------------- */

int ref_scratch_init(ref_scratch *s, uint32_t max_seq_len, uint32_t head_dim, uint32_t max_k)
{
    memset(s, 0, sizeof *s);
    s->part = malloc((size_t)REF_GEMM_PART_FLOATS * sizeof(float));
    s->scores = malloc((size_t)(max_seq_len ? max_seq_len : 1) * sizeof(float));
    s->rows = malloc((size_t)(max_seq_len ? max_seq_len : 1) * sizeof(size_t));
    s->acc = malloc((size_t)32 * head_dim * sizeof(float));
    s->qbuf = calloc(ref_pad32(head_dim) + 32, sizeof(float));
    s->kbuf = calloc(32, sizeof(float));
    if (posix_memalign((void **)&s->wide, 64, (size_t)2 * 16 * ref_pad32(max_k ? max_k : 1) *
                                                   sizeof(float)) != 0)
        s->wide = NULL;
    if (!s->part || !s->scores || !s->rows || !s->acc || !s->qbuf || !s->kbuf || !s->wide) {
        ref_scratch_fini(s);
        return -1;
    }
    return 0;
}

void ref_scratch_fini(ref_scratch *s)
{
    free(s->part);
    free(s->scores);
    free(s->rows);
    free(s->acc);
    free(s->qbuf);
    free(s->kbuf);
    free(s->wide);
    memset(s, 0, sizeof *s);
}
