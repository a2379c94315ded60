/* ref_backend_test.c - the reference backend against a plain scalar forward
 * pass, and its invariances (batch, chunking, threads, block copies), bit for
 * bit. Never tolerates a difference: every comparison is memcmp.
 * long because the scalar oracle and the backend driver the cases share live here, beside the cases. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "device/backend/backend.h"
#include "device/model/model.h"
#include "device/numerics/numerics.h"
#include "device/backend/shape.h"
#include "ref/pool.h"
#include "ref/ref_backend.h"
#include "ref/ref_gemm.h"
#include "ref/ref_isa.h"
#include "ref/ref_kernels.h"

/* ---- random numbers and models in memory ------------------------------ */

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Uniform in [-1, 1). */
static float rng_unit(uint64_t *s)
{
    return (float)(rng_next(s) >> 40) * 0x1p-23f - 1.0f;
}

typedef struct tm_spec {
    uint32_t vocab, d, n_layers, n_heads, n_kv, hd, ffn;
    devio_dtype dtype;
    bool bias;
    uint64_t seed;
} tm_spec;

#define TM_MAX_BLOBS 64

typedef struct tmodel {
    devio_model m;
    devio_layer layers[4];
    void *blobs[TM_MAX_BLOBS];
    int n_blobs;
    uint64_t rng;
} tmodel;

static uint16_t f32_to_bf16_trunc(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (uint16_t)(u >> 16);
}

/* A half with the magnitude of roughly |v|, built from bits; one value in
 * sixteen is subnormal so that the exact widening of those is exercised. */
static uint16_t rand_f16(tmodel *tm, float scale)
{
    uint64_t r = rng_next(&tm->rng);
    uint16_t sign = (uint16_t)((r & 1u) << 15);
    uint16_t mant = (uint16_t)((r >> 1) & 0x3ffu);
    if (((r >> 11) & 15u) == 0)
        return sign | mant; /* subnormal */
    /* exponent so that the value is about scale * [0.125, 1). */
    int e = 15 - 1 - (int)((r >> 15) % 3u);
    int adj = 0;
    float t = scale;
    while (t < 0.5f && adj < 12) {
        t *= 2.0f;
        adj++;
    }
    e -= adj;
    if (e < 1)
        e = 1;
    return sign | (uint16_t)(e << 10) | mant;
}

static devio_tensor tm_tensor(tmodel *tm, devio_dtype dt, uint64_t rows, uint64_t cols, float center,
                              float scale)
{
    devio_tensor t = {.dtype = dt, .ndim = cols ? 2u : 1u, .shape = {rows, cols}};
    size_t n = (size_t)rows * (cols ? cols : 1);
    size_t esz = dt == DEVIO_F32 ? 4 : 2;
    void *p = malloc(n * esz);
    assert_non_null(p);
    assert_true(tm->n_blobs < TM_MAX_BLOBS);
    tm->blobs[tm->n_blobs++] = p;
    for (size_t i = 0; i < n; i++) {
        float v = center + scale * rng_unit(&tm->rng);
        if (dt == DEVIO_F32)
            ((float *)p)[i] = v;
        else if (dt == DEVIO_BF16)
            ((uint16_t *)p)[i] = f32_to_bf16_trunc(v);
        else if (center != 0.0f)
            ((uint16_t *)p)[i] = (uint16_t)(0x3c00u + (rng_next(&tm->rng) & 0x7fu)); /* ~1 */
        else
            ((uint16_t *)p)[i] = rand_f16(tm, scale);
    }
    t.data = p;
    return t;
}

static tmodel *tm_build(const tm_spec *sp)
{
    tmodel *tm = calloc(1, sizeof *tm);
    assert_non_null(tm);
    assert_true(sp->n_layers <= 4);
    tm->rng = sp->seed;
    devio_model_config *c = &tm->m.cfg;
    strcpy(c->architecture, "LlamaForCausalLM");
    c->vocab_size = sp->vocab;
    c->hidden_size = sp->d;
    c->intermediate_size = sp->ffn;
    c->n_layers = sp->n_layers;
    c->n_heads = sp->n_heads;
    c->n_kv_heads = sp->n_kv;
    c->head_dim = sp->hd;
    c->max_position_embeddings = 4096;
    c->rope_theta = 10000.0f;
    c->rotary_dim = c->head_dim;
    c->rms_norm_eps = 1e-5f;
    c->attention_bias = sp->bias;
    uint32_t d = sp->d, q = sp->n_heads * sp->hd, kv = sp->n_kv * sp->hd, f = sp->ffn;
    devio_dtype dt = sp->dtype;
    float sd = 1.0f / 8.0f;
    tm->m.embed = tm_tensor(tm, dt, sp->vocab, d, 0.0f, 1.0f);
    tm->m.norm = tm_tensor(tm, dt, d, 0, 1.0f, 0.1f);
    tm->m.lm_head = tm_tensor(tm, dt, sp->vocab, d, 0.0f, sd);
    for (uint32_t i = 0; i < sp->n_layers; i++) {
        devio_layer *l = &tm->layers[i];
        l->attn_norm = tm_tensor(tm, dt, d, 0, 1.0f, 0.1f);
        l->ffn_norm = tm_tensor(tm, dt, d, 0, 1.0f, 0.1f);
        l->wq = tm_tensor(tm, dt, q, d, 0.0f, 0.5f);
        l->wk = tm_tensor(tm, dt, kv, d, 0.0f, 0.5f);
        l->wv = tm_tensor(tm, dt, kv, d, 0.0f, sd);
        l->wo = tm_tensor(tm, dt, d, q, 0.0f, sd);
        l->w_gate = tm_tensor(tm, dt, f, d, 0.0f, sd);
        l->w_up = tm_tensor(tm, dt, f, d, 0.0f, sd);
        l->w_down = tm_tensor(tm, dt, d, f, 0.0f, sd);
        if (sp->bias) {
            l->bq = tm_tensor(tm, dt, q, 0, 0.0f, 0.5f);
            l->bk = tm_tensor(tm, dt, kv, 0, 0.0f, 0.5f);
            l->bv = tm_tensor(tm, dt, kv, 0, 0.0f, 0.5f);
        }
    }
    tm->m.layers = tm->layers;
    return tm;
}

static void tm_free(tmodel *tm)
{
    for (int i = 0; i < tm->n_blobs; i++)
        free(tm->blobs[i]);
    free(tm);
}

static const tm_spec SPEC_F32 = {.vocab = 256, .d = 64, .n_layers = 2, .n_heads = 4, .n_kv = 2,
                                 .hd = 16, .ffn = 128, .dtype = DEVIO_F32, .seed = 1};
static const tm_spec SPEC_BF16 = {.vocab = 256, .d = 64, .n_layers = 2, .n_heads = 4, .n_kv = 2,
                                  .hd = 16, .ffn = 128, .dtype = DEVIO_BF16, .seed = 2};
/* Biases, head_dim != d / heads, and widths that are not multiples of 32
 * (q_dim 72, ffn 100, vocab 250): every padded tail of the kernels. */
static const tm_spec SPEC_BIAS_F16 = {.vocab = 250, .d = 48, .n_layers = 2, .n_heads = 3,
                                      .n_kv = 1, .hd = 24, .ffn = 100, .dtype = DEVIO_F16,
                                      .bias = true, .seed = 3};

/* ---- the scalar oracle ------------------------------------------------ */

static float w_get(const devio_tensor *t, size_t i)
{
    if (t->dtype == DEVIO_F32)
        return ((const float *)t->data)[i];
    uint16_t h = ((const uint16_t *)t->data)[i];
    return t->dtype == DEVIO_BF16 ? devio_bf16_to_f32(h) : devio_f16_to_f32(h);
}

static void w_row(const devio_tensor *t, size_t row, size_t n, float *dst)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = w_get(t, row * n + i);
}

static void naive_rmsnorm(float *y, const float *x, const devio_tensor *w, uint32_t d, float eps)
{
    float ss = devio_lane_dot(x, x, d);
    float r = devio_rsqrtf(ss / (float)d + eps);
    for (uint32_t i = 0; i < d; i++)
        y[i] = w_get(w, i) * (x[i] * r);
}

/* y[o] = lane_dot(W[o], x) for o < m. */
static void naive_proj(float *y, const devio_tensor *w, const float *x, uint32_t m, uint32_t n,
                       float *rowbuf)
{
    for (uint32_t o = 0; o < m; o++) {
        w_row(w, o, n, rowbuf);
        y[o] = devio_lane_dot(rowbuf, x, n);
    }
}

/* The whole sequence toks[0..n), token by token, contiguous K and V.
 * logits[p * vocab ...] for every position p. */
static void naive_forward(const devio_model *m, const int32_t *toks, uint32_t n, float *logits)
{
    const devio_model_config *c = &m->cfg;
    uint32_t d = c->hidden_size, hd = c->head_dim, nh = c->n_heads, nkv = c->n_kv_heads;
    uint32_t q_dim = nh * hd, kv_dim = nkv * hd, f = c->intermediate_size, half = hd / 2;
    uint32_t maxw = d > q_dim ? d : q_dim;
    maxw = maxw > f ? maxw : f;
    float *K = calloc((size_t)c->n_layers * n * kv_dim, sizeof(float));
    float *V = calloc((size_t)c->n_layers * n * kv_dim, sizeof(float));
    float *x = calloc(d, sizeof(float)), *h = calloc(d, sizeof(float));
    float *q = calloc(q_dim, sizeof(float)), *k = calloc(kv_dim, sizeof(float));
    float *v = calloc(kv_dim, sizeof(float)), *o = calloc(q_dim, sizeof(float));
    float *g = calloc(f, sizeof(float)), *u = calloc(f, sizeof(float));
    float *y = calloc(maxw, sizeof(float)), *row = calloc(maxw, sizeof(float));
    float *sc = calloc(n, sizeof(float)), *tmp = calloc(n, sizeof(float));
    float *cs = calloc(half, sizeof(float)), *sn = calloc(half, sizeof(float));
    assert_true(K && V && x && h && q && k && v && o && g && u && y && row && sc && tmp && cs && sn);
    float scale = devio_rsqrtf((float)hd);

    for (uint32_t p = 0; p < n; p++) {
        for (uint32_t i = 0; i < half; i++) {
            float inv = 1.0f / devio_powf_pos(c->rope_theta, (float)(2 * i) / (float)hd);
            float ang = (float)p * inv;
            cs[i] = devio_cosf(ang);
            sn[i] = devio_sinf(ang);
        }
        w_row(&m->embed, (size_t)toks[p], d, x);
        for (uint32_t li = 0; li < c->n_layers; li++) {
            const devio_layer *l = &m->layers[li];
            naive_rmsnorm(h, x, &l->attn_norm, d, c->rms_norm_eps);
            naive_proj(q, &l->wq, h, q_dim, d, row);
            naive_proj(k, &l->wk, h, kv_dim, d, row);
            naive_proj(v, &l->wv, h, kv_dim, d, row);
            if (l->bq.data) {
                for (uint32_t i = 0; i < q_dim; i++)
                    q[i] = q[i] + w_get(&l->bq, i);
                for (uint32_t i = 0; i < kv_dim; i++) {
                    k[i] = k[i] + w_get(&l->bk, i);
                    v[i] = v[i] + w_get(&l->bv, i);
                }
            }
            for (uint32_t hh = 0; hh < nh + nkv; hh++) {
                float *vec = hh < nh ? q + hh * hd : k + (hh - nh) * hd;
                for (uint32_t i = 0; i < half; i++) {
                    float a = vec[i], b = vec[i + half];
                    vec[i] = a * cs[i] - b * sn[i];
                    vec[i + half] = b * cs[i] + a * sn[i];
                }
            }
            float *Kl = K + (size_t)li * n * kv_dim, *Vl = V + (size_t)li * n * kv_dim;
            memcpy(Kl + (size_t)p * kv_dim, k, kv_dim * sizeof(float));
            memcpy(Vl + (size_t)p * kv_dim, v, kv_dim * sizeof(float));
            for (uint32_t hh = 0; hh < nh; hh++) {
                uint32_t kvh = hh / (nh / nkv);
                for (uint32_t j = 0; j <= p; j++)
                    sc[j] = devio_lane_dot(q + hh * hd, Kl + (size_t)j * kv_dim + kvh * hd, hd) *
                            scale;
                float mx = sc[0];
                for (uint32_t j = 1; j <= p; j++)
                    mx = sc[j] > mx ? sc[j] : mx;
                for (uint32_t j = 0; j <= p; j++)
                    sc[j] = devio_expf(sc[j] - mx);
                float z = devio_lane_sum(sc, p + 1);
                for (uint32_t cc = 0; cc < hd; cc++) {
                    for (uint32_t j = 0; j <= p; j++)
                        tmp[j] = sc[j] * Vl[(size_t)j * kv_dim + kvh * hd + cc];
                    o[hh * hd + cc] = devio_lane_sum(tmp, p + 1) / z;
                }
            }
            naive_proj(y, &l->wo, o, d, q_dim, row);
            for (uint32_t i = 0; i < d; i++)
                x[i] = x[i] + y[i];
            naive_rmsnorm(h, x, &l->ffn_norm, d, c->rms_norm_eps);
            naive_proj(g, &l->w_gate, h, f, d, row);
            naive_proj(u, &l->w_up, h, f, d, row);
            for (uint32_t i = 0; i < f; i++)
                g[i] = devio_siluf(g[i]) * u[i];
            naive_proj(y, &l->w_down, g, d, f, row);
            for (uint32_t i = 0; i < d; i++)
                x[i] = x[i] + y[i];
        }
        naive_rmsnorm(h, x, &m->norm, d, c->rms_norm_eps);
        naive_proj(logits + (size_t)p * c->vocab_size, &m->lm_head, h, c->vocab_size, d, row);
    }
    free(K); free(V); free(x); free(h); free(q); free(k); free(v); free(o);
    free(g); free(u); free(y); free(row); free(sc); free(tmp); free(cs); free(sn);
}

/* ---- driving the backend ---------------------------------------------- */

#define T_BLOCK 16u
#define T_KV_BLOCKS 512u
#define T_MAX_TOK 512u
#define T_MAX_ROWS 64u
#define T_MAX_SEQ 256u
#define T_MAX_BLOCKS_PER_SEQ (T_MAX_SEQ / T_BLOCK)

/* The reference backend as the core drives it: created through the
 * wrappers with the shape, RoPE tables and a host logits arena of
 * T_MAX_TOK slots (output i of a step goes to slot i). */
typedef struct tbe {
    void *st;
    devio_backend_config cfg;
    devio_model_shape shape;
    float *rope_cos, *rope_sin, *logits;
} tbe;

static tbe *be_open(const devio_model *m, uint32_t threads)
{
    tbe *be = calloc(1, sizeof *be);
    devio_error err = {0};
    assert_non_null(be);
    assert_int_equal(devio_model_shape_get(m, &be->shape, &err), DEVIO_OK);
    assert_int_equal(devio_rope_tables(&m->cfg, be->shape.rotary_dim, T_MAX_SEQ,
                                       &be->rope_cos, &be->rope_sin, &err),
                     DEVIO_OK);
    be->logits = calloc((size_t)T_MAX_TOK * m->cfg.vocab_size, sizeof(float));
    assert_non_null(be->logits);
    be->cfg = (devio_backend_config){.kv_blocks = T_KV_BLOCKS, .block_size = T_BLOCK,
                                     .max_batch_tokens = T_MAX_TOK, .max_rows = T_MAX_ROWS,
                                     .max_seq_len = T_MAX_SEQ, .max_depth = 1,
                                     .threads = threads, .logits_rows = T_MAX_TOK,
                                     .shape = &be->shape, .rope_cos = be->rope_cos,
                                     .rope_sin = be->rope_sin, .logits_host = be->logits};
    assert_int_equal(devio_backend_create(&devio_ref_backend, m, &be->cfg, &be->st, &err),
                     DEVIO_OK);
    assert_non_null(be->st);
    return be;
}

static void be_close(tbe *be)
{
    devio_backend_destroy(&devio_ref_backend, be->st);
    free(be->rope_cos);
    free(be->rope_sin);
    free(be->logits);
    free(be);
}

/* A sequence as the core would hold it. */
typedef struct tseq {
    uint32_t blocks[T_MAX_BLOCKS_PER_SEQ];
    uint32_t len;
} tseq;

/* Blocks handed out from a shuffled list, so tables are never contiguous. */
typedef struct tblocks {
    uint32_t ids[T_KV_BLOCKS];
    uint32_t next;
} tblocks;

static void tblocks_init(tblocks *b, uint64_t seed)
{
    for (uint32_t i = 0; i < T_KV_BLOCKS; i++)
        b->ids[i] = i;
    for (uint32_t i = T_KV_BLOCKS - 1; i > 0; i--) {
        uint32_t j = (uint32_t)(rng_next(&seed) % (i + 1));
        uint32_t t = b->ids[i];
        b->ids[i] = b->ids[j];
        b->ids[j] = t;
    }
    b->next = 0;
}

static void tseq_init(tseq *s, tblocks *b)
{
    for (uint32_t i = 0; i < T_MAX_BLOCKS_PER_SEQ; i++) {
        assert_true(b->next < T_KV_BLOCKS);
        s->blocks[i] = b->ids[b->next++];
    }
    s->len = 0;
}

typedef struct tbatch {
    devio_batch_row rows[T_MAX_ROWS];
    int32_t tokens[T_MAX_TOK];
    uint32_t tok_pos[T_MAX_TOK], tok_row[T_MAX_TOK];
    uint32_t out_tok[T_MAX_TOK], out_row[T_MAX_TOK];
    float *out_dst[T_MAX_TOK]; /* where the logits of output i are copied */
    uint32_t copy_src[8], copy_dst[8];
    uint32_t n_rows, n_tok, n_out, n_copies;
} tbatch;

/* Append a row of n tokens of s; logits (n * vocab floats) receives the
 * positions p with p % every == every - 1 when not NULL. The sequence's
 * length advances. */
static void tb_add_some(tbatch *b, tseq *s, const int32_t *toks, uint32_t n, float *logits,
                        uint32_t vocab, uint32_t every)
{
    assert_true(b->n_rows < T_MAX_ROWS && b->n_tok + n <= T_MAX_TOK);
    b->rows[b->n_rows] = (devio_batch_row){.pos0 = s->len, .n_tokens = n,
                                           .tok_start = b->n_tok, .blocks = s->blocks,
                                           .adapter = -1, .ssm_slot = -1};
    for (uint32_t i = 0; i < n; i++) {
        b->tokens[b->n_tok] = toks[i];
        b->tok_pos[b->n_tok] = s->len + i;
        b->tok_row[b->n_tok] = b->n_rows;
        if (logits && (s->len + i) % every == every - 1) {
            b->out_dst[b->n_out] = logits + (size_t)i * vocab;
            b->out_row[b->n_out] = b->n_out;
            b->out_tok[b->n_out++] = b->n_tok;
        }
        b->n_tok++;
    }
    b->n_rows++;
    s->len += n;
}

/* Every position's logits. */
static void tb_add(tbatch *b, tseq *s, const int32_t *toks, uint32_t n, float *logits,
                   uint32_t vocab)
{
    tb_add_some(b, s, toks, n, logits, vocab, 1);
}

static devio_batch tb_batch(tbatch *b)
{
    return (devio_batch){.n_rows = b->n_rows, .rows = b->rows, .n_tokens = b->n_tok,
                         .tokens = b->tokens, .tok_pos = b->tok_pos, .tok_row = b->tok_row,
                         .n_out = b->n_out, .out_tok = b->out_tok, .out_row = b->out_row,
                         .n_copies = b->n_copies, .copy_src = b->copy_src,
                         .copy_dst = b->copy_dst};
}

/* Submit, wait, and copy each output's logits to where tb_add asked. */
static void tb_run(tbe *be, tbatch *b)
{
    devio_batch batch = tb_batch(b);
    devio_error err = {0};
    assert_int_equal(devio_backend_submit(&devio_ref_backend, be->st, &be->cfg, &batch, &err),
                     DEVIO_OK);
    assert_int_equal(devio_backend_wait(&devio_ref_backend, be->st, &batch, &err), DEVIO_OK);
    size_t vocab = be->shape.vocab;
    for (uint32_t i = 0; i < b->n_out; i++)
        memcpy(b->out_dst[i], be->logits + (size_t)b->out_row[i] * vocab,
               vocab * sizeof(float));
    memset(b, 0, sizeof *b);
}

/* One sequence in steps of the given sizes (0-terminated), logits of the
 * positions p with p % every == every - 1 into out (row p). */
static void run_chunked_some(const devio_model *m, uint32_t threads, const int32_t *toks,
                             const uint32_t *chunks, float *out, uint32_t every)
{
    tbe *st = be_open(m, threads);
    tblocks bl;
    tblocks_init(&bl, 77);
    tseq s;
    tseq_init(&s, &bl);
    tbatch *b = calloc(1, sizeof *b);
    assert_non_null(b);
    uint32_t vocab = m->cfg.vocab_size, at = 0;
    for (const uint32_t *c = chunks; *c; c++) {
        tb_add_some(b, &s, toks + at, *c, out + (size_t)at * vocab, vocab, every);
        tb_run(st, b);
        at += *c;
    }
    free(b);
    be_close(st);
}

static void run_chunked(const devio_model *m, uint32_t threads, const int32_t *toks,
                        const uint32_t *chunks, float *out)
{
    run_chunked_some(m, threads, toks, chunks, out, 1);
}

static void rand_tokens(int32_t *t, uint32_t n, uint32_t vocab, uint64_t seed)
{
    for (uint32_t i = 0; i < n; i++)
        t[i] = (int32_t)(rng_next(&seed) % vocab);
}

static void assert_finite(const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        assert_true(x[i] == x[i] && x[i] - x[i] == 0.0f);
}

/* ---- tests ------------------------------------------------------------- */

static void check_against_naive(const tm_spec *sp, uint32_t threads)
{
    tmodel *tm = tm_build(sp);
    enum { N = 44 };
    int32_t toks[N];
    rand_tokens(toks, N, sp->vocab, sp->seed + 100);
    size_t sz = (size_t)N * sp->vocab;
    float *want = calloc(sz, sizeof(float)), *got = calloc(sz, sizeof(float));
    assert_true(want && got);
    naive_forward(&tm->m, toks, N, want);
    assert_finite(want, sz);
    static const uint32_t chunks[] = {21, 1, 1, 1, 20, 0};
    run_chunked(&tm->m, threads, toks, chunks, got);
    for (uint32_t p = 0; p < N; p++)
        assert_memory_equal(got + (size_t)p * sp->vocab, want + (size_t)p * sp->vocab,
                            sp->vocab * sizeof(float));
    /* Logits of every third position only: the others stop after the last
     * layer's K and V, which must not change the ones that go on. */
    memset(got, 0, sz * sizeof(float));
    run_chunked_some(&tm->m, threads, toks, chunks, got, 3);
    for (uint32_t p = 2; p < N; p += 3)
        assert_memory_equal(got + (size_t)p * sp->vocab, want + (size_t)p * sp->vocab,
                            sp->vocab * sizeof(float));
    free(want);
    free(got);
    tm_free(tm);
}

static void test_naive_f32(void **unused)
{
    (void)unused;
    check_against_naive(&SPEC_F32, 1);
    check_against_naive(&SPEC_F32, 2);
}

static void test_naive_bf16(void **unused)
{
    (void)unused;
    check_against_naive(&SPEC_BF16, 2);
}

static void test_naive_bias_f16(void **unused)
{
    (void)unused;
    check_against_naive(&SPEC_BIAS_F16, 1);
    check_against_naive(&SPEC_BIAS_F16, 3);
}

/* One prefill vs chunks of 1, 7 and 16. */
static void test_chunk_invariance(void **unused)
{
    (void)unused;
    const tm_spec *specs[] = {&SPEC_BF16, &SPEC_BIAS_F16};
    for (int si = 0; si < 2; si++) {
        tmodel *tm = tm_build(specs[si]);
        uint32_t vocab = tm->m.cfg.vocab_size;
        enum { N = 49 };
        int32_t toks[N];
        rand_tokens(toks, N, vocab, 5);
        float *ref = calloc((size_t)N * vocab, sizeof(float));
        float *got = calloc((size_t)N * vocab, sizeof(float));
        assert_true(ref && got);
        static const uint32_t whole[] = {N, 0};
        run_chunked(&tm->m, 2, toks, whole, ref);
        assert_finite(ref, (size_t)N * vocab);
        static const uint32_t by1[] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                                       1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                                       1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0};
        static const uint32_t by7[] = {7, 7, 7, 7, 7, 7, 7, 0};
        static const uint32_t by16[] = {16, 16, 16, 1, 0};
        const uint32_t *plans[] = {by1, by7, by16};
        for (int pi = 0; pi < 3; pi++) {
            memset(got, 0, (size_t)N * vocab * sizeof(float));
            run_chunked(&tm->m, 2, toks, plans[pi], got);
            assert_memory_equal(got, ref, (size_t)N * vocab * sizeof(float));
        }
        free(ref);
        free(got);
        tm_free(tm);
    }
}

/* 32 sequences with histories of various lengths, then one mixed step
 * (prefill chunks and decodes); every row's logits of both steps go to
 * out[seq] (positions 0 .. len). Sequence 0 is the row under test. */
#define MIX_SEQS 32
#define MIX_MAXLEN 64

typedef struct mix_plan {
    uint32_t hist[MIX_SEQS], step[MIX_SEQS];
    int32_t toks[MIX_SEQS][MIX_MAXLEN];
} mix_plan;

static void mix_plan_make(mix_plan *p, uint32_t vocab)
{
    uint64_t s = 99;
    for (uint32_t i = 0; i < MIX_SEQS; i++) {
        p->hist[i] = 1 + (uint32_t)(rng_next(&s) % 40);
        p->step[i] = (i % 3 == 0) ? 1 + (uint32_t)(rng_next(&s) % 9) : 1; /* chunk or decode */
        rand_tokens(p->toks[i], MIX_MAXLEN, vocab, 1000 + i);
    }
    p->hist[0] = 30;
    p->step[0] = 5;
}

/* Run sequences [0, n_seqs) of the plan in two steps (histories, then the
 * mixed step), on a fresh backend; out[i] gets hist + step positions. */
static void mix_run(const devio_model *m, uint32_t threads, const mix_plan *p, uint32_t n_seqs,
                    uint64_t block_seed, float **out)
{
    uint32_t vocab = m->cfg.vocab_size;
    tbe *st = be_open(m, threads);
    tblocks bl;
    tblocks_init(&bl, block_seed);
    tseq *seqs = calloc(MIX_SEQS, sizeof *seqs);
    tbatch *b = calloc(1, sizeof *b);
    assert_true(seqs && b);
    for (uint32_t i = 0; i < n_seqs; i++)
        tseq_init(&seqs[i], &bl);
    /* Histories go in two batches, so the step-1 batches differ too. */
    for (uint32_t half = 0; half < 2; half++) {
        for (uint32_t i = half; i < n_seqs; i += 2)
            tb_add(b, &seqs[i], p->toks[i], p->hist[i], out[i], vocab);
        if (b->n_rows)
            tb_run(st, b);
    }
    /* The mixed step, in reverse order so row 0 is last in the batch. */
    for (uint32_t k = n_seqs; k-- > 0;)
        tb_add(b, &seqs[k], p->toks[k] + p->hist[k], p->step[k],
               out[k] + (size_t)p->hist[k] * vocab, vocab);
    tb_run(st, b);
    free(b);
    free(seqs);
    be_close(st);
}

static float **mix_alloc(uint32_t vocab)
{
    float **out = calloc(MIX_SEQS, sizeof *out);
    assert_non_null(out);
    for (uint32_t i = 0; i < MIX_SEQS; i++) {
        out[i] = calloc((size_t)MIX_MAXLEN * vocab, sizeof(float));
        assert_non_null(out[i]);
    }
    return out;
}

static void mix_free(float **out)
{
    for (uint32_t i = 0; i < MIX_SEQS; i++)
        free(out[i]);
    free(out);
}

static void test_batch_invariance(void **unused)
{
    (void)unused;
    tmodel *tm = tm_build(&SPEC_BF16);
    uint32_t vocab = tm->m.cfg.vocab_size;
    mix_plan *p = calloc(1, sizeof *p);
    assert_non_null(p);
    mix_plan_make(p, vocab);
    float **alone = mix_alloc(vocab), **mixed = mix_alloc(vocab);
    mix_run(&tm->m, 2, p, 1, 5, alone);
    mix_run(&tm->m, 2, p, MIX_SEQS, 6, mixed);
    size_t n0 = (size_t)(p->hist[0] + p->step[0]) * vocab;
    assert_finite(alone[0], n0);
    assert_memory_equal(alone[0], mixed[0], n0 * sizeof(float));
    /* And every other row equals that sequence alone. */
    for (uint32_t i = 1; i < MIX_SEQS; i += 7) {
        mix_plan q = *p;
        memcpy(q.toks[0], p->toks[i], sizeof q.toks[0]);
        q.hist[0] = p->hist[i];
        q.step[0] = p->step[i];
        float **one = mix_alloc(vocab);
        mix_run(&tm->m, 1, &q, 1, 8, one);
        assert_memory_equal(one[0], mixed[i], (size_t)(q.hist[0] + q.step[0]) * vocab * sizeof(float));
        mix_free(one);
    }
    mix_free(alone);
    mix_free(mixed);
    free(p);
    tm_free(tm);
}

static void test_thread_invariance(void **unused)
{
    (void)unused;
    tmodel *tm = tm_build(&SPEC_BIAS_F16);
    uint32_t vocab = tm->m.cfg.vocab_size;
    mix_plan *p = calloc(1, sizeof *p);
    assert_non_null(p);
    mix_plan_make(p, vocab);
    float **one = mix_alloc(vocab), **two = mix_alloc(vocab), **four = mix_alloc(vocab);
    mix_run(&tm->m, 1, p, MIX_SEQS, 5, one);
    mix_run(&tm->m, 2, p, MIX_SEQS, 5, two);
    mix_run(&tm->m, 4, p, MIX_SEQS, 9, four);
    for (uint32_t i = 0; i < MIX_SEQS; i++) {
        size_t n = (size_t)(p->hist[i] + p->step[i]) * vocab;
        assert_finite(one[i], n);
        assert_memory_equal(one[i], two[i], n * sizeof(float));
        assert_memory_equal(one[i], four[i], n * sizeof(float));
    }
    mix_free(one);
    mix_free(two);
    mix_free(four);
    free(p);
    tm_free(tm);
}

/* Fork by sharing blocks, then in one step copy the shared, partly filled
 * block for the fork (what the core does on the first write) and continue
 * both: each equals its plain sequence. */
static void test_block_copy(void **unused)
{
    (void)unused;
    tmodel *tm = tm_build(&SPEC_F32);
    uint32_t vocab = tm->m.cfg.vocab_size;
    tbe *st = be_open(&tm->m, 2);
    tblocks bl;
    tblocks_init(&bl, 3);
    tseq a, fork;
    tseq_init(&a, &bl);
    tseq_init(&fork, &bl);
    tbatch *b = calloc(1, sizeof *b);
    enum { P = 21, C = 6 };
    int32_t toks[P + C], toks2[P + C];
    rand_tokens(toks, P + C, vocab, 11);
    memcpy(toks2, toks, sizeof toks2);
    rand_tokens(toks2 + P, C, vocab, 12);
    float *lf = calloc((size_t)C * vocab, sizeof(float));
    float *lo = calloc((size_t)C * vocab, sizeof(float));
    float *all = calloc((size_t)(P + C) * vocab, sizeof(float));
    assert_true(b && lf && lo && all);

    tb_add(b, &a, toks, P, NULL, vocab);
    tb_run(st, b);
    /* The fork shares block 0 (full) and block 1 (positions 16..20); it
     * gets a fresh block 1, filled by the copy before any token runs. */
    uint32_t fresh = fork.blocks[1];
    fork = a;
    fork.blocks[1] = fresh;
    b->copy_src[0] = a.blocks[1];
    b->copy_dst[0] = fresh;
    b->n_copies = 1;
    tb_add(b, &a, toks2 + P, C, lo, vocab);
    tb_add(b, &fork, toks + P, C, lf, vocab);
    tb_run(st, b);
    be_close(st);

    uint32_t chunks[] = {P, C, 0};
    run_chunked(&tm->m, 1, toks, chunks, all);
    assert_memory_equal(lf, all + (size_t)P * vocab, (size_t)C * vocab * sizeof(float));
    run_chunked(&tm->m, 1, toks2, chunks, all);
    assert_memory_equal(lo, all + (size_t)P * vocab, (size_t)C * vocab * sizeof(float));
    /* The two continuations really differ, so a mixed-up block would show. */
    assert_memory_not_equal(lf, lo, (size_t)C * vocab * sizeof(float));
    free(all);
    free(b);
    free(lf);
    free(lo);
    tm_free(tm);
}

static devio_status submit(tbe *be, const devio_batch *b)
{
    devio_error err = {0};
    return devio_backend_submit(&devio_ref_backend, be->st, &be->cfg, b, &err);
}

static void test_bad_batches(void **unused)
{
    (void)unused;
    tmodel *tm = tm_build(&SPEC_F32);
    tbe *be = be_open(&tm->m, 1);
    tblocks bl;
    tblocks_init(&bl, 1);
    tseq s;
    tseq_init(&s, &bl);
    tbatch *tb = calloc(1, sizeof *tb);
    assert_non_null(tb);
    int32_t toks[2] = {1, 256}; /* 256 is outside the vocabulary */
    tb_add_some(tb, &s, toks, 2, NULL, 0, 1);
    devio_batch b = tb_batch(tb);
    devio_batch_row *row = &tb->rows[0];
    devio_error err = {0};
    assert_int_equal(submit(be, &b), DEVIO_E_INVALID);
    toks[1] = 3;
    tb->tokens[1] = 3;
    row->pos0 = T_MAX_SEQ - 1; /* would run past max_seq_len */
    assert_int_equal(submit(be, &b), DEVIO_E_INVALID);
    row->pos0 = 0;
    b.n_tokens = T_MAX_TOK + 1;
    assert_int_equal(submit(be, &b), DEVIO_E_TOO_LARGE);
    b.n_tokens = 2;
    row->n_tokens = 1; /* token 1 in no row */
    assert_int_equal(submit(be, &b), DEVIO_E_INVALID);
    row->n_tokens = 2;
    tb->tok_pos[1] = 5; /* a position the row does not have */
    assert_int_equal(submit(be, &b), DEVIO_E_INVALID);
    tb->tok_pos[1] = 1;
    row->adapter = 0; /* no adapter slots */
    assert_int_equal(submit(be, &b), DEVIO_E_INVALID);
    row->adapter = -1;
    tb->out_tok[0] = 1;
    tb->out_row[0] = T_MAX_TOK; /* logits slot past the arena */
    b.n_out = 1;
    assert_int_equal(submit(be, &b), DEVIO_E_INVALID);
    b.n_out = 0;
    assert_int_equal(submit(be, &b), DEVIO_OK);
    assert_int_equal(devio_backend_wait(&devio_ref_backend, be->st, &b, &err), DEVIO_OK);
    be_close(be);
    free(tb);

    /* A model with a wrong shape is refused before any backend sees it. */
    devio_model_shape shape;
    tm->layers[1].wk.shape[0] = 7;
    assert_int_equal(devio_model_shape_get(&tm->m, &shape, &err), DEVIO_E_MODEL);
    tm_free(tm);
}

static void test_lane_reductions(void **unused)
{
    (void)unused;
    uint64_t s = 42;
    float a[300], b[300];
    for (uint32_t n = 0; n <= 300; n++) {
        for (uint32_t i = 0; i < n; i++) {
            /* wide exponents, so that the order of the sum matters */
            a[i] = rng_unit(&s) * (float)(1u << (rng_next(&s) % 20));
            b[i] = rng_unit(&s);
            if (i % 17 == 5)
                b[i] = -0.0f;
        }
        float d1 = ref_lane_dot(a, b, n), d2 = devio_lane_dot(a, b, n);
        float s1 = ref_lane_sum(a, n), s2 = devio_lane_sum(a, n);
        assert_memory_equal(&d1, &d2, sizeof d1);
        assert_memory_equal(&s1, &s2, sizeof s1);
    }
    /* All terms -0: the rule starts at +0, so the sum is +0. */
    for (uint32_t i = 0; i < 40; i++)
        a[i] = -0.0f;
    float z = ref_lane_sum(a, 40), pz = 0.0f;
    assert_memory_equal(&z, &pz, sizeof z);
}

static void test_widen_all_halves(void **unused)
{
    (void)unused;
    uint16_t *h = malloc(65536 * sizeof *h);
    float *f = malloc(65536 * sizeof *f);
    assert_true(h && f);
    for (uint32_t i = 0; i < 65536; i++)
        h[i] = (uint16_t)i;
    ref_widen(DEVIO_F16, h, f, 65536);
    uint32_t nans = 0;
    for (uint32_t i = 0; i < 65536; i++) {
        float w = devio_f16_to_f32((uint16_t)i);
        if (w != w) {
            /* A NaN stays a NaN; its quiet bit is not part of the contract
             * (the hardware conversion sets it, NaNs are canonicalised). */
            assert_true(f[i] != f[i]);
            nans++;
            continue;
        }
        assert_memory_equal(&f[i], &w, sizeof w);
    }
    assert_int_equal(nans, 2 * 1023);
    ref_widen(DEVIO_BF16, h, f, 65536);
    for (uint32_t i = 0; i < 65536; i++) {
        float w = devio_bf16_to_f32((uint16_t)i);
        assert_memory_equal(&f[i], &w, sizeof w);
    }
    free(h);
    free(f);
}

typedef struct pool_probe {
    uint32_t *hits;
    uint32_t n_threads;
    uint32_t bad_thread;
} pool_probe;

static void pool_probe_fn(void *ctx, uint32_t job, uint32_t thread)
{
    pool_probe *p = ctx;
    p->hits[job] += 1;
    if (thread >= p->n_threads)
        p->bad_thread = 1;
}

static void test_pool_runs_every_job_once(void **unused)
{
    (void)unused;
    for (uint32_t nt = 1; nt <= 3; nt++) {
        devio_pool *pool = devio_pool_create(nt);
        assert_non_null(pool);
        uint32_t *hits = calloc(1000, sizeof *hits);
        assert_non_null(hits);
        pool_probe p = {.hits = hits, .n_threads = devio_pool_threads(pool)};
        for (uint32_t rep = 0; rep < 200; rep++)
            devio_pool_run(pool, rep % 7 == 0 ? 1000 : rep % 13, pool_probe_fn, &p);
        uint32_t want = 0;
        for (uint32_t rep = 0; rep < 200; rep++)
            want += rep % 7 == 0 ? 1 : 0;
        /* job j ran once in every run with more than j jobs */
        for (uint32_t j = 0; j < 1000; j++) {
            uint32_t expect = want;
            for (uint32_t rep = 0; rep < 200; rep++)
                if (rep % 7 != 0 && j < rep % 13)
                    expect++;
            assert_int_equal(hits[j], expect);
        }
        assert_int_equal(p.bad_thread, 0);
        free(hits);
        devio_pool_free(pool);
    }
}

/* ---- projections against the scalar rule ------------------------------ */

/* A random weight [m, n] of dtype dt with wide exponents (so that the order
 * of every sum shows), as raw elements; the widened copy into wf. */
static void *rand_weight(uint64_t *s, devio_dtype dt, uint32_t m, uint32_t n, float *wf)
{
    size_t cnt = (size_t)m * n;
    void *w = malloc(cnt * devio_dtype_size(dt));
    assert_non_null(w);
    for (size_t i = 0; i < cnt; i++) {
        float f = rng_unit(s) * (float)(1u << (rng_next(s) % 12));
        if (dt == DEVIO_F32) {
            ((float *)w)[i] = f;
        } else if (dt == DEVIO_BF16) {
            uint32_t b;
            memcpy(&b, &f, sizeof b);
            ((uint16_t *)w)[i] = (uint16_t)(b >> 16);
        } else {
            /* finite halves, subnormals included: exponent field 0..30 */
            ((uint16_t *)w)[i] = (uint16_t)(rng_next(s) % 0x7c00u) | (i % 3 ? 0x8000u : 0);
        }
    }
    ref_widen(dt, w, wf, cnt);
    return w;
}

/* One run of up to 3 projections sharing x, every epilogue, against
 * devio_lane_dot on the widened rows, bit for bit. */
static void check_gemm(uint64_t *s, devio_pool *pool, ref_scratch *scratch, devio_dtype dt,
                       uint32_t m, uint32_t n, uint32_t n_tok, ref_epilogue epi)
{
    uint32_t ldx = n + 3; /* a stride that is not the padded width */
    float *x = calloc((size_t)n_tok * ldx, sizeof(float));
    float *wf = malloc((size_t)m * n * sizeof(float)), *w2f = malloc((size_t)m * n * sizeof(float));
    float *bias = malloc((size_t)m * sizeof(float));
    float *y = malloc((size_t)n_tok * m * sizeof(float)), *want = malloc((size_t)n_tok * m * sizeof(float));
    float *xpack = malloc(ref_gemm_xpack_floats(n_tok, n) * sizeof(float));
    float **rows = malloc((size_t)n_tok * sizeof *rows);
    assert_true(x && wf && w2f && bias && y && want && xpack && rows);
    for (uint32_t t = 0; t < n_tok; t++)
        for (uint32_t i = 0; i < n; i++)
            x[(size_t)t * ldx + i] = i % 11 == 3 ? -0.0f : rng_unit(s);
    void *w = rand_weight(s, dt, m, n, wf), *w2 = rand_weight(s, dt, m, n, w2f);
    for (uint32_t o = 0; o < m; o++)
        bias[o] = rng_unit(s);
    for (size_t i = 0; i < (size_t)n_tok * m; i++)
        y[i] = want[i] = rng_unit(s);
    for (uint32_t t = 0; t < n_tok; t++) {
        rows[t] = y + (size_t)(n_tok - 1 - t) * m; /* rows in reverse, through y_rows */
        for (uint32_t o = 0; o < m; o++) {
            float d = devio_lane_dot(wf + (size_t)o * n, x + (size_t)t * ldx, n);
            float *out = &want[(size_t)(n_tok - 1 - t) * m + o];
            switch (epi) {
            case REF_EPI_STORE:
                *out = d;
                break;
            case REF_EPI_BIAS:
                *out = d + bias[o];
                break;
            case REF_EPI_ADD:
                *out = *out + d;
                break;
            case REF_EPI_ADD_SCALED:
                *out = *out + d * 0.375f;
                break;
            case REF_EPI_SILU_MUL:
                *out = devio_siluf(d) *
                       devio_lane_dot(w2f + (size_t)o * n, x + (size_t)t * ldx, n);
                break;
            }
        }
    }
    ref_panels p1, p2;
    assert_int_equal(ref_panels_pack(&p1, pool, w, dt, m, n), 0);
    assert_int_equal(ref_panels_pack(&p2, pool, w2, dt, m, n), 0);
    ref_gemm_work wk = {.pool = pool, .scratch = scratch, .xpack = xpack};
    ref_matmul mm = {.w = &p1, .w2 = epi == REF_EPI_SILU_MUL ? &p2 : NULL, .bias = bias,
                     .scale = 0.375f, .epi = epi, .x = x, .ldx = ldx, .n_tok = n_tok,
                     .y_rows = rows};
    ref_matmul_run(&wk, &mm, 1);
    assert_memory_equal(y, want, (size_t)n_tok * m * sizeof(float));
    ref_panels_free(&p1);
    ref_panels_free(&p2);
    free(w);
    free(w2);
    free(x);
    free(wf);
    free(w2f);
    free(bias);
    free(y);
    free(want);
    free(xpack);
    free(rows);
}

/* Shapes around every edge of the packing: rows past a panel of 16, inputs
 * past a chunk of 32, token counts past a group and past a token block. */
static void test_gemm_shapes(void **unused)
{
    (void)unused;
    static const uint32_t ms[] = {1, 15, 16, 17, 48, 100};
    static const uint32_t ns[] = {1, 31, 32, 33, 100, 300};
    static const uint32_t toks[] = {1, 2, 3, 5, 6, 7, 12, 13, 40, 200};
    static const devio_dtype dts[] = {DEVIO_F32, DEVIO_BF16, DEVIO_F16};
    uint64_t s = 7;
    for (uint32_t threads = 1; threads <= 2; threads++) {
        devio_pool *pool = devio_pool_create(threads);
        assert_non_null(pool);
        uint32_t nt = devio_pool_threads(pool);
        ref_scratch scratch[2];
        for (uint32_t i = 0; i < nt; i++)
            assert_int_equal(ref_scratch_init(&scratch[i], 16, 64, 300), 0);
        uint32_t k = 0;
        for (size_t a = 0; a < sizeof ms / sizeof *ms; a++)
            for (size_t b = 0; b < sizeof ns / sizeof *ns; b++)
                for (size_t c = 0; c < sizeof toks / sizeof *toks; c++, k++) {
                    uint32_t m = ms[a], n = ns[b], t = toks[c];
                    if (t == 200 && (m > 17 || n < 300))
                        continue; /* the second token block needs a wide input only */
                    check_gemm(&s, pool, scratch, dts[k % 3], m, n, t, (ref_epilogue)(k % 5));
                }
        for (uint32_t i = 0; i < nt; i++)
            ref_scratch_fini(&scratch[i]);
        devio_pool_free(pool);
    }
}

/* Built for one instruction-set path (tests/BUILD.bazel): on a CPU that
 * lacks it, one case that says so and is skipped. */
#ifdef REF_ISA_TEST_PATH
static void test_path_runs_here(void **state)
{
    (void)state;
    char why[160];
    if (!devio_ref_isa_runs(REF_ISA_TEST_PATH, why, sizeof why)) {
        print_message("skipped: %s\n", why);
        skip();
    }
}
#endif

int main(void)
{
#ifdef REF_ISA_TEST_PATH
    if (!devio_ref_isa_runs(REF_ISA_TEST_PATH, NULL, 0)) {
        const struct CMUnitTest lacking[] = {cmocka_unit_test(test_path_runs_here)};
        return cmocka_run_group_tests(lacking, NULL, NULL);
    }
#endif
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lane_reductions),
        cmocka_unit_test(test_widen_all_halves),
        cmocka_unit_test(test_gemm_shapes),
        cmocka_unit_test(test_pool_runs_every_job_once),
        cmocka_unit_test(test_naive_f32),
        cmocka_unit_test(test_naive_bf16),
        cmocka_unit_test(test_naive_bias_f16),
        cmocka_unit_test(test_chunk_invariance),
        cmocka_unit_test(test_batch_invariance),
        cmocka_unit_test(test_thread_invariance),
        cmocka_unit_test(test_block_copy),
        cmocka_unit_test(test_bad_batches),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
