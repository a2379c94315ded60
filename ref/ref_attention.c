/* ref_attention.c - attention (rule 6) of the reference backend, in the operation order
 * ref_kernels.h defines: one (token, head) a job, each key's score a lane dot product, each
 * output a sum over 32 lanes of keys. The cpu backend builds its own in its place
 * (cpu/cpu_attention.c). Never fuses a multiply into an add, never calls libm, never allocates. */
#include "ref/ref_kernels.h"

#include <string.h>

#include "device/numerics/numerics.h"
#include "device/numerics/numerics_vec.h"
#include "ref/ref_kv.h"
#include "ref/ref_vec.h"

/* Keys ahead whose K or V row is prefetched in attention. */
#define KV_PREFETCH 8u

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
    uint32_t pos = a->tok_pos[t];
    /* Keys j0 .. pos: all of them, or the last `window` (rule 6). Scores sit
     * at sc[j - j0]; every sum still runs in lane j mod 32. */
    uint32_t j0 = ref_attention_first_key(a, pos);
    uint32_t n_keys = pos + 1 - j0;
    uint32_t kvh = h / (a->n_heads / a->n_kv_heads);
    float *sc = s->scores;

    /* qbuf and kbuf keep zeros past hd from their allocation. */
    memcpy(s->qbuf, a->q + (size_t)t * a->ldq + (size_t)h * hd, hd * sizeof(float));

    size_t *rows = s->rows;
    ref_attention_rows(a, a->tok_blocks[t], kvh, j0, n_keys, rows);
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
