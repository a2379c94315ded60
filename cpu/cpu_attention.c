/* cpu_attention.c - the cpu backend's attention under fast numerics (ref_attention_run of
 * ref/ref_kernels.h, built in place of ref/ref_attention.c in every path, cpu/isa.bzl).
 *
 * A job is a tile: up to TILE_ROWS query rows, the heads of one KV group (or part of it) for
 * a few consecutive tokens of one sequence, which read the same keys. Keys are taken in
 * blocks of KEY_BLOCK at absolute positions (0, 32, 64, ...), each block's K rows widened
 * from binary16 once and transposed (a dimension's 32 keys side by side) and its V rows
 * widened once, for every row of the tile. Scores are then broadcast multiply-adds with no
 * horizontal sum, and the softmax is taken online (a running maximum, the sum and the output
 * rescaled when the maximum grows), so no buffer grows with the sequence.
 *
 * A row's numbers depend on its own query, its own keys and the absolute block boundaries
 * only: keys of the tile outside a row's range are given weight exactly zero, never a score.
 * So a token's output is the same bits whatever tile, batch, chunking or thread count it
 * runs in; they differ between paths (on AVX2 each product is fused into its add, as the
 * whole backend is built with -ffp-contract=fast, cpu/isa.bzl; the baseline has no FMA).
 * The reference's own attention (ref/ref_attention.c) is the definition these are held to
 * by tolerance (tests/conformance/tolerance.py).
 *
 * Scratch: the thread's ref_scratch.wide (ref_scratch_wide_floats leaves room for a tile) and
 * rows; never allocates. */
#include <stdbool.h>
#include <string.h>

#include "device/numerics/numerics.h"
#include "device/numerics/numerics_vec.h"
#include "ref/pool.h"
#include "ref/ref_kernels.h"
#include "ref/ref_kv.h"
#include "ref/ref_vec.h"

#define KEY_BLOCK 32u  /* keys a block: NV vectors of scores */
#define TILE_ROWS 16u  /* query rows a tile at most */

static ALWAYS_INLINE vf bcast(float x)
{
    return (vf){0} + x;
}

/* *p in every lane, straight from memory where AVX has the load (one instruction, not a
 * scalar load and a shuffle; the same numbers, as a sum that starts at +0 never reads -0). */
static ALWAYS_INLINE vf bcast_at(const float *p)
{
#if VL == 8 && defined(__AVX__)
    return (vf)_mm256_broadcast_ss(p);
#else
    return bcast(*p);
#endif
}

/* One tile's buffers, carved from the thread's scratch. Floats: kt [hd][KEY_BLOCK] (the
 * block's keys transposed), vw [KEY_BLOCK][hp] (its values), q [rows][hd] (queries times the
 * scale), sc [rows][KEY_BLOCK] (scores, then weights), o [rows][hp] (output sums), m and l
 * [rows] (running maximum and sum). */
typedef struct tile {
    const ref_attention *a;
    uint32_t hd, hp, n_rows;
    const size_t *rows;     /* key ulo + i's row offset at rows[i] */
    uint32_t ulo, uhi;      /* the tile's keys [ulo, uhi) */
    uint32_t lo[TILE_ROWS]; /* row r's keys [lo[r], hi[r]) */
    uint32_t hi[TILE_ROWS];
    float *kt, *vw, *q, *sc, *o, *m, *l;
} tile;

static uint32_t pad_vl(uint32_t n)
{
    return (n + VL - 1) / VL * VL;
}

#if VL == 8 && defined(__F16C__)
/* Eight keys' dimensions [d, d + 8) from binary16 rows into kt's eight rows d.. (columns
 * c..c+8): widened, then an 8 x 8 transpose. */
static ALWAYS_INLINE void transpose8(const ref_kv *const k[8], uint32_t d, float *kt, uint32_t c)
{
    __m256 r[8];
    for (int i = 0; i < 8; i++)
        r[i] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(k[i] + d)));
    __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    float *o = kt + (size_t)d * KEY_BLOCK + c;
    _mm256_storeu_ps(o + 0 * KEY_BLOCK, _mm256_permute2f128_ps(s0, s4, 0x20));
    _mm256_storeu_ps(o + 1 * KEY_BLOCK, _mm256_permute2f128_ps(s1, s5, 0x20));
    _mm256_storeu_ps(o + 2 * KEY_BLOCK, _mm256_permute2f128_ps(s2, s6, 0x20));
    _mm256_storeu_ps(o + 3 * KEY_BLOCK, _mm256_permute2f128_ps(s3, s7, 0x20));
    _mm256_storeu_ps(o + 4 * KEY_BLOCK, _mm256_permute2f128_ps(s0, s4, 0x31));
    _mm256_storeu_ps(o + 5 * KEY_BLOCK, _mm256_permute2f128_ps(s1, s5, 0x31));
    _mm256_storeu_ps(o + 6 * KEY_BLOCK, _mm256_permute2f128_ps(s2, s6, 0x31));
    _mm256_storeu_ps(o + 7 * KEY_BLOCK, _mm256_permute2f128_ps(s3, s7, 0x31));
}
#endif

/* The block of keys [kb, kb + KEY_BLOCK): K transposed into kt (keys outside [klo, khi)
 * repeat the nearest key inside, so every column holds a number), V of [klo, khi) into vw. */
static void load_block(tile *T, uint32_t kb, uint32_t klo, uint32_t khi)
{
    const ref_attention *a = T->a;
    uint32_t hd = T->hd;
    const ref_kv *k[KEY_BLOCK];
    for (uint32_t i = 0; i < KEY_BLOCK; i++) {
        uint32_t j = kb + i < klo ? klo : kb + i >= khi ? khi - 1 : kb + i;
        k[i] = a->k_cache + T->rows[j - T->ulo];
    }
    uint32_t d = 0;
#if VL == 8 && defined(__F16C__)
    for (; d + 8 <= hd; d += 8)
        for (uint32_t c = 0; c < KEY_BLOCK; c += 8)
            transpose8(k + c, d, T->kt, c);
#endif
    for (; d < hd; d++)
        for (uint32_t i = 0; i < KEY_BLOCK; i++)
            T->kt[(size_t)d * KEY_BLOCK + i] = ref_kv_get(k[i] + d);

    for (uint32_t j = klo; j < khi; j++) {
        const ref_kv *v = a->v_cache + T->rows[j - T->ulo];
        float *w = T->vw + (size_t)(j - kb) * T->hp;
        uint32_t c = 0;
        for (; c + VL <= hd; c += VL)
            stv(w + c, ref_kv_ldv(v + c));
        for (; c < hd; c++)
            w[c] = ref_kv_get(v + c);
        for (; c < T->hp; c++)
            w[c] = 0.0f;
    }
}

/* Query rows a pass of rows_madd takes at most: on AVX2 three rows by four vectors keep
 * twelve sums, three broadcasts and the loaded vector in its sixteen registers, and each
 * loaded vector feeds three multiply-adds; narrower vectors (eight of them a row of scores)
 * take two. */
#define PASS_ROWS (NV <= 4 ? 3 : 2)

/* For NR rows (1 to PASS_ROWS) and NC vectors: y_r[0, NC * VL) = (y_r if add, else 0) + the sum
 * over j in [j0, j1) of a_r[j] times b[j * ldb ..], in increasing j, the NC vectors of every
 * row in registers; row r's a at a + r * lda, its y at y + r * ldy. Each row's operations are
 * the same whatever NR: its bits do not depend on the rows beside it. Scores are that over the
 * dimensions (a = the queries, b = the keys transposed), outputs over the keys (a = the
 * weights, b = the values). */
static ALWAYS_INLINE void rows_madd(int NR, int NC, bool add, const float *a, size_t lda,
                                    const float *b, size_t ldb, uint32_t j0, uint32_t j1,
                                    float *y, size_t ldy)
{
    vf acc[3][NV > 4 ? NV : 4]; /* NR <= PASS_ROWS <= 3; NC is NV (scores) or at most 4 */
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 8
        for (int i = 0; i < NC; i++)
            acc[r][i] = add ? ldv(y + r * ldy + i * VL) : (vf){0};
    for (uint32_t j = j0; j < j1; j++) {
        const float *bj = b + (size_t)j * ldb;
        vf w[3];
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++)
            w[r] = bcast_at(a + r * lda + j);
#pragma GCC unroll 8
        for (int i = 0; i < NC; i++) {
            vf x = ldv(bj + i * VL);
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++)
                acc[r][i] = acc[r][i] + w[r] * x;
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 8
        for (int i = 0; i < NC; i++)
            stv(y + r * ldy + i * VL, acc[r][i]);
}

/* Scores of NR rows (1 to PASS_ROWS) from r against the block's KEY_BLOCK keys. */
static ALWAYS_INLINE void scores_rows(const tile *T, int NR, uint32_t r)
{
    rows_madd(NR, NV, false, T->q + (size_t)r * T->hd, T->hd, T->kt, KEY_BLOCK, 0, T->hd,
              T->sc + (size_t)r * KEY_BLOCK, KEY_BLOCK);
}

/* Row r's scores of the block [kb, kb + KEY_BLOCK) made weights: exp(s - m) over the row's
 * keys, zero for every other key, the running maximum, sum and output brought up to date. */
static void softmax_row(tile *T, uint32_t r, uint32_t kb, uint32_t klo, uint32_t khi)
{
    float *s = T->sc + (size_t)r * KEY_BLOCK;
    uint32_t lo = T->lo[r] > klo ? T->lo[r] : klo;
    uint32_t hi = T->hi[r] < khi ? T->hi[r] : khi;
    if (lo >= hi) {
        memset(s, 0, KEY_BLOCK * sizeof(float));
        return;
    }
    /* Outside the row's keys: no score (for the maximum), then weight zero (for the sum). */
    for (uint32_t j = kb; j < lo; j++)
        s[j - kb] = -__builtin_inff();
    for (uint32_t j = hi; j < kb + KEY_BLOCK; j++)
        s[j - kb] = -__builtin_inff();
    vf mv = ldv(s);
#pragma GCC unroll 8
    for (int v = 1; v < NV; v++) {
        vf x = ldv(s + v * VL);
        vi gt = x > mv;
        mv = (vf)(((vi)x & gt) | ((vi)mv & ~gt));
    }
    float bm = mv[0];
    for (int i = 1; i < VL; i++)
        bm = mv[i] > bm ? mv[i] : bm;
    if (T->l[r] == 0.0f) {
        T->m[r] = bm;
    } else if (bm > T->m[r]) {
        float c = devio_expf(T->m[r] - bm);
        T->m[r] = bm;
        T->l[r] = T->l[r] * c;
        float *o = T->o + (size_t)r * T->hp;
        for (uint32_t i = 0; i < T->hp; i += VL)
            stv(o + i, ldv(o + i) * c);
    }
    devio_expf_sub_n(s + (lo - kb), s + (lo - kb), T->m[r], hi - lo);
    memset(s, 0, (lo - kb) * sizeof(float));
    memset(s + (hi - kb), 0, (kb + KEY_BLOCK - hi) * sizeof(float));
    vf zv[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; v++)
        zv[v] = ldv(s + v * VL);
    T->l[r] = T->l[r] + fold_lanes(zv);
}

/* o[r..r+NR) += weights times values over keys [j0, j1) of the block, NC vectors of the
 * head from c. */
static ALWAYS_INLINE void pv_rows(const tile *T, int NR, int NC, uint32_t r, uint32_t c,
                                  uint32_t j0, uint32_t j1)
{
    rows_madd(NR, NC, true, T->sc + (size_t)r * KEY_BLOCK, KEY_BLOCK, T->vw + c, T->hp, j0, j1,
              T->o + (size_t)r * T->hp + c, T->hp);
}

/* Rows [r, r + NR) through the block's values: their keys [j0, j1) relative to kb. */
static ALWAYS_INLINE void pv_block(const tile *T, int NR, uint32_t r, uint32_t j0, uint32_t j1)
{
    uint32_t c = 0;
    for (; c + 4 * VL <= T->hp; c += 4 * VL)
        pv_rows(T, NR, 4, r, c, j0, j1);
    for (; c < T->hp; c += VL)
        pv_rows(T, NR, 1, r, c, j0, j1);
}

/* Keys [j0, j1) of rows [r, r + nr) relative to kb (the union of theirs: a row's weights are
 * zero outside its own, and adding a zero product leaves its sums as they are), within
 * [klo, khi). */
static void rows_range(const tile *T, uint32_t r, uint32_t nr, uint32_t kb, uint32_t klo,
                       uint32_t khi, uint32_t *j0, uint32_t *j1)
{
    uint32_t lo = T->lo[r], hi = T->hi[r];
    for (uint32_t i = 1; i < nr; i++) {
        lo = T->lo[r + i] < lo ? T->lo[r + i] : lo;
        hi = T->hi[r + i] > hi ? T->hi[r + i] : hi;
    }
    lo = lo > klo ? lo : klo;
    hi = hi < khi ? hi : khi;
    *j0 = lo - kb;
    *j1 = hi > lo ? hi - kb : lo - kb;
}

static void run_block(tile *T, uint32_t kb)
{
    uint32_t klo = kb > T->ulo ? kb : T->ulo;
    uint32_t khi = kb + KEY_BLOCK < T->uhi ? kb + KEY_BLOCK : T->uhi;
    load_block(T, kb, klo, khi);
    /* Passes of PASS_ROWS rows, each count built alone (NR constant in rows_madd). */
    for (uint32_t r = 0; r < T->n_rows; r += PASS_ROWS) {
        uint32_t nr = T->n_rows - r < PASS_ROWS ? T->n_rows - r : PASS_ROWS;
        if (nr == 3)
            scores_rows(T, 3, r);
        else if (nr == 2)
            scores_rows(T, 2, r);
        else
            scores_rows(T, 1, r);
    }
    for (uint32_t r = 0; r < T->n_rows; r++)
        softmax_row(T, r, kb, klo, khi);
    for (uint32_t r = 0; r < T->n_rows; r += PASS_ROWS) {
        uint32_t nr = T->n_rows - r < PASS_ROWS ? T->n_rows - r : PASS_ROWS, j0, j1;
        rows_range(T, r, nr, kb, klo, khi, &j0, &j1);
        if (j0 == j1)
            continue;
        if (nr == 3)
            pv_block(T, 3, r, j0, j1);
        else if (nr == 2)
            pv_block(T, 2, r, j0, j1);
        else
            pv_block(T, 1, r, j0, j1);
    }
}

/* The tile of tokens [t0, t0 + nt) and heads [h0, h0 + nh) of one KV group, on scratch s. */
static void run_tile(const ref_attention *a, uint32_t t0, uint32_t nt, uint32_t h0, uint32_t nh,
                     ref_scratch *s)
{
    uint32_t hd = a->head_dim, hp = pad_vl(hd);
    uint32_t kvh = h0 / (a->n_heads / a->n_kv_heads);
    tile T = {.a = a, .hd = hd, .hp = hp, .n_rows = nt * nh, .rows = s->rows};
    T.ulo = ref_attention_first_key(a, a->tok_pos[t0]);
    T.uhi = a->tok_pos[t0 + nt - 1] + 1;
    float *f = s->wide;
    T.kt = f, f += (size_t)hd * KEY_BLOCK;
    T.vw = f, f += (size_t)KEY_BLOCK * hp;
    T.q = f, f += (size_t)TILE_ROWS * hd;
    T.sc = f, f += (size_t)TILE_ROWS * KEY_BLOCK;
    T.o = f, f += (size_t)TILE_ROWS * hp;
    T.m = f, f += TILE_ROWS;
    T.l = f;

    for (uint32_t i = 0; i < nt; i++)
        for (uint32_t j = 0; j < nh; j++) {
            uint32_t r = i * nh + j, pos = a->tok_pos[t0 + i];
            T.lo[r] = ref_attention_first_key(a, pos);
            T.hi[r] = pos + 1;
            const float *q = a->q + (size_t)(t0 + i) * a->ldq + (size_t)(h0 + j) * hd;
            float *qs = T.q + (size_t)r * hd;
            uint32_t d = 0;
            for (; d + VL <= hd; d += VL)
                stv(qs + d, ldv(q + d) * a->scale);
            for (; d < hd; d++)
                qs[d] = q[d] * a->scale;
            memset(T.o + (size_t)r * hp, 0, hp * sizeof(float));
            T.m[r] = 0.0f;
            T.l[r] = 0.0f;
        }

    ref_attention_rows(a, a->tok_blocks[t0], kvh, T.ulo, T.uhi - T.ulo, s->rows);

    for (uint32_t kb = T.ulo - T.ulo % KEY_BLOCK; kb < T.uhi; kb += KEY_BLOCK)
        run_block(&T, kb);

    for (uint32_t i = 0; i < nt; i++)
        for (uint32_t j = 0; j < nh; j++) {
            uint32_t r = i * nh + j;
            const float *o = T.o + (size_t)r * hp;
            float *out = a->out + (size_t)(t0 + i) * a->ldo + (size_t)(h0 + j) * hd;
            uint32_t d = 0;
            for (; d + VL <= hd; d += VL)
                stv(out + d, ldv(o + d) / T.l[r]);
            for (; d < hd; d++)
                out[d] = o[d] / T.l[r];
        }
}

typedef struct attn_plan {
    const ref_attention *a;
    ref_scratch *scratch;
    uint32_t group;   /* query heads a KV head */
    uint32_t heads;   /* query heads a job */
    uint32_t chunks;  /* jobs a group, for each tile */
    uint32_t tokens;  /* tokens a tile at most */
} attn_plan;

/* Token t continues the sequence of token t - 1 (the same block table, the next position). */
static bool continues(const ref_attention *a, uint32_t t)
{
    return t > 0 && a->tok_blocks[t] == a->tok_blocks[t - 1] &&
           a->tok_pos[t] == a->tok_pos[t - 1] + 1;
}

static void attn_job(void *ctx, uint32_t job, uint32_t thread)
{
    const attn_plan *p = ctx;
    const ref_attention *a = p->a;
    uint32_t per_tok = a->n_kv_heads * p->chunks;
    /* The last tokens first: in a prefill they have the most keys. */
    uint32_t t0 = a->n_tok - 1 - job / per_tok;
    /* A tile starts at a sequence's first token of the step or at a position that is a
     * multiple of the tile's tokens; its other tokens are nobody's job. */
    if (continues(a, t0) && a->tok_pos[t0] % p->tokens != 0)
        return;
    uint32_t nt = 1;
    while (t0 + nt < a->n_tok && nt < p->tokens && continues(a, t0 + nt) &&
           a->tok_pos[t0 + nt] % p->tokens != 0)
        nt++;
    uint32_t g = job % per_tok / p->chunks, c = job % p->chunks;
    uint32_t h0 = g * p->group + c * p->heads;
    uint32_t nh = p->group - c * p->heads < p->heads ? p->group - c * p->heads : p->heads;
    run_tile(a, t0, nt, h0, nh, &p->scratch[thread]);
}

void ref_attention_run(devio_pool *pool, ref_scratch *scratch, const ref_attention *a)
{
    attn_plan p = {.a = a, .scratch = scratch, .group = a->n_heads / a->n_kv_heads};
    p.heads = p.group < TILE_ROWS ? p.group : TILE_ROWS;
    /* Too few jobs to keep every thread busy (a decode step of a few tokens): a head a job,
     * each reading its keys itself. */
    if ((uint64_t)a->n_tok * a->n_kv_heads * ((p.group + p.heads - 1) / p.heads) <
        4u * devio_pool_threads(pool))
        p.heads = 1;
    p.chunks = (p.group + p.heads - 1) / p.heads;
    p.tokens = TILE_ROWS / p.heads;
    devio_pool_run(pool, a->n_tok * a->n_kv_heads * p.chunks, attn_job, &p);
}
