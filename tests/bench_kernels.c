/* bench_kernels.c - speed of the reference kernels and of a full decode step
 * on a random bench-shaped model held in memory. Measures and prints; it
 * asserts nothing about speed and never writes files.
 *
 * usage: bench_kernels [threads ...]   (default: 1 2) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "device/backend.h"
#include "device/model.h"
#include "ref/pool.h"
#include "ref/ref_kernels.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* BF16 values of magnitude about scale, from random bits. */
static uint16_t *rand_bf16(size_t n, float scale, uint64_t seed)
{
    uint16_t *p = malloc(n * sizeof *p);
    if (!p)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        uint64_t r = rng_next(&seed);
        float v = ((float)(r >> 40) * 0x1p-23f - 1.0f) * scale;
        uint32_t u;
        memcpy(&u, &v, sizeof u);
        p[i] = (uint16_t)(u >> 16);
    }
    return p;
}

static float *rand_f32(size_t n, float scale, uint64_t seed)
{
    float *p = malloc(n * sizeof *p);
    if (!p)
        return NULL;
    for (size_t i = 0; i < n; i++)
        p[i] = ((float)(rng_next(&seed) >> 40) * 0x1p-23f - 1.0f) * scale;
    return p;
}

/* ---- raw read bandwidth of the machine -------------------------------- */

typedef struct bw_ctx {
    const float *p;
    size_t n_per_job;
    float sink[64];
} bw_ctx;

static void bw_job(void *ctx, uint32_t job, uint32_t thread)
{
    bw_ctx *c = ctx;
    typedef float v16 __attribute__((vector_size(64)));
    const float *p = c->p + (size_t)job * c->n_per_job;
    v16 a = {0}, b = {0}, d = {0}, e = {0};
    for (size_t i = 0; i < c->n_per_job; i += 64) {
        v16 x, y, z, w;
        memcpy(&x, p + i, 64);
        memcpy(&y, p + i + 16, 64);
        memcpy(&z, p + i + 32, 64);
        memcpy(&w, p + i + 48, 64);
        a += x;
        b += y;
        d += z;
        e += w;
    }
    v16 s = a + b + d + e;
    c->sink[thread] += s[0];
}

static double bench_bandwidth(devio_pool *pool)
{
    size_t n = (size_t)64 << 20; /* 256 MiB of floats */
    float *p = malloc(n * sizeof *p);
    if (!p)
        return 0;
    memset(p, 1, n * sizeof *p);
    uint32_t jobs = 64;
    bw_ctx c = {.p = p, .n_per_job = n / jobs};
    devio_pool_run(pool, jobs, bw_job, &c);
    double best = 0;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = now_s();
        devio_pool_run(pool, jobs, bw_job, &c);
        double gbs = (double)n * 4 / (now_s() - t0) / 1e9;
        best = gbs > best ? gbs : best;
    }
    free(p);
    return best;
}

/* ---- projection speed -------------------------------------------------- */

static void bench_matvec(devio_pool *pool, ref_scratch *scratch, uint32_t m, uint32_t n,
                         devio_dtype dt, uint32_t n_tok)
{
    size_t esz = dt == DEVIO_F32 ? 4 : 2;
    /* Several copies of the weight, cycled, so none of it sits in cache. */
    uint32_t copies = (uint32_t)(((size_t)512 << 20) / ((size_t)m * n * esz) + 1);
    if (copies > 8)
        copies = 8;
    void *w[8];
    for (uint32_t i = 0; i < copies; i++)
        w[i] = dt == DEVIO_F32 ? (void *)rand_f32((size_t)m * n, 0.05f, i)
                               : (void *)rand_bf16((size_t)m * n, 0.05f, i);
    uint32_t ldx = ref_pad32(n);
    float *x = calloc((size_t)n_tok * ldx, sizeof(float));
    float *y = calloc((size_t)n_tok * m, sizeof(float));
    if (!x || !y)
        return;
    for (uint32_t t = 0; t < n_tok; t++)
        for (uint32_t i = 0; i < n; i++)
            x[(size_t)t * ldx + i] = (float)((i * 7 + t) % 13) * 0.01f;
    ref_matmul mm = {.dtype = dt, .m = m, .n = n, .x = x, .ldx = ldx, .n_tok = n_tok, .y = y,
                     .ldy = m};
    int reps = 20;
    double dt_s = 1e30;
    for (int round = 0; round < 3; round++) {
        double t0 = 0;
        for (int r = -2; r < reps; r++) {
            if (r == 0)
                t0 = now_s();
            mm.w = w[(uint32_t)(r + 2) % copies];
            ref_matmul_run(pool, scratch, &mm, 1);
        }
        double t = (now_s() - t0) / reps;
        dt_s = t < dt_s ? t : dt_s;
    }
    double bytes = (double)m * n * esz;
    printf("  %-5s %5u x %-5u tokens %3u: %8.1f us  %6.2f GB/s  %7.2f GFLOP/s\n",
           dt == DEVIO_F32 ? "f32" : "bf16", m, n, n_tok, dt_s * 1e6, bytes / dt_s / 1e9,
           2.0 * m * n * n_tok / dt_s / 1e9);
    for (uint32_t i = 0; i < copies; i++)
        free(w[i]);
    free(x);
    free(y);
}

static void noop_job(void *ctx, uint32_t job, uint32_t thread)
{
    (void)ctx;
    (void)job;
    (void)thread;
}

/* A job that takes about 2 us, so that a worker that is awake gets some. */
static void spin_job(void *ctx, uint32_t job, uint32_t thread)
{
    (void)job;
    volatile float *sink = ctx;
    float a = 1.0f;
    for (int i = 0; i < 2000; i++)
        a = a * 0.999f + 0.001f;
    sink[thread] = a;
}

static void bench_pool(devio_pool *pool)
{
    int reps = 20000;
    double t0 = now_s();
    for (int i = 0; i < reps; i++)
        devio_pool_run(pool, 16, noop_job, NULL);
    double hot = (now_s() - t0) / reps;
    /* Regions after an idle gap longer than the spin: the workers sleep and
     * must be woken. 16 jobs of ~2 us: the wall time shows whether the
     * workers took part in time. */
    static float sink[64];
    struct timespec gap = {0, 2000000};
    double cold = 0, busy = 0;
    for (int i = 0; i < 200; i++) {
        nanosleep(&gap, NULL);
        double t1 = now_s();
        devio_pool_run(pool, 16, spin_job, sink);
        cold += now_s() - t1;
    }
    for (int i = 0; i < 200; i++) {
        double t1 = now_s();
        devio_pool_run(pool, 16, spin_job, sink);
        busy += now_s() - t1;
    }
    printf("  pool: empty region %.2f us; region of 16 x ~2 us jobs: %.1f us back to back, "
           "%.1f us after 2 ms idle\n", hot * 1e6, busy / 200 * 1e6, cold / 200 * 1e6);
}

/* ---- a whole model ----------------------------------------------------- */

typedef struct bench_model {
    devio_model m;
    devio_layer layers[12];
    void *blobs[200];
    int n_blobs;
} bench_model;

static devio_tensor bm_tensor(bench_model *bm, uint64_t rows, uint64_t cols, float scale,
                              float center)
{
    size_t n = (size_t)rows * (cols ? cols : 1);
    uint16_t *p = rand_bf16(n, scale, (uint64_t)bm->n_blobs + 1);
    if (p && center != 0.0f)
        for (size_t i = 0; i < n; i++)
            p[i] = 0x3f80; /* 1.0 */
    bm->blobs[bm->n_blobs++] = p;
    return (devio_tensor){.data = p, .dtype = DEVIO_BF16, .ndim = cols ? 2u : 1u,
                          .shape = {rows, cols}};
}

/* The `bench` preset: hidden 768, 12 layers, 12 heads, ffn 2048, vocab
 * 32000, separate lm_head, BF16. */
static bench_model *bm_build(void)
{
    bench_model *bm = calloc(1, sizeof *bm);
    if (!bm)
        return NULL;
    devio_model_config *c = &bm->m.cfg;
    strcpy(c->architecture, "LlamaForCausalLM");
    c->vocab_size = 32000;
    c->hidden_size = 768;
    c->intermediate_size = 2048;
    c->n_layers = 12;
    c->n_heads = 12;
    c->n_kv_heads = 12;
    c->head_dim = 64;
    c->max_position_embeddings = 2048;
    c->rope_theta = 10000.0f;
    c->rms_norm_eps = 1e-5f;
    uint32_t d = 768, f = 2048;
    bm->m.embed = bm_tensor(bm, c->vocab_size, d, 1.0f, 0);
    bm->m.lm_head = bm_tensor(bm, c->vocab_size, d, 0.05f, 0);
    bm->m.norm = bm_tensor(bm, d, 0, 0, 1);
    for (uint32_t i = 0; i < 12; i++) {
        devio_layer *l = &bm->layers[i];
        l->attn_norm = bm_tensor(bm, d, 0, 0, 1);
        l->ffn_norm = bm_tensor(bm, d, 0, 0, 1);
        l->wq = bm_tensor(bm, d, d, 0.05f, 0);
        l->wk = bm_tensor(bm, d, d, 0.05f, 0);
        l->wv = bm_tensor(bm, d, d, 0.05f, 0);
        l->wo = bm_tensor(bm, d, d, 0.05f, 0);
        l->w_gate = bm_tensor(bm, f, d, 0.05f, 0);
        l->w_up = bm_tensor(bm, f, d, 0.05f, 0);
        l->w_down = bm_tensor(bm, d, f, 0.05f, 0);
    }
    bm->m.layers = bm->layers;
    for (int i = 0; i < bm->n_blobs; i++)
        if (!bm->blobs[i])
            return NULL;
    return bm;
}

static void bm_free(bench_model *bm)
{
    for (int i = 0; i < bm->n_blobs; i++)
        free(bm->blobs[i]);
    free(bm);
}

/* Decode n_dec tokens at batch 1 from position pos0; seconds per token. */
static double decode_run(void *st, const uint32_t *blocks, uint32_t pos0, int n_dec, float *logits)
{
    int32_t tok = 17, out_index = 0;
    float *outp[1] = {logits};
    devio_error err = {0};
    double t0 = now_s();
    for (int i = 0; i < n_dec; i++) {
        devio_batch_row row = {.pos0 = pos0 + (uint32_t)i, .n_tokens = 1, .tok_start = 0,
                               .blocks = blocks};
        devio_batch b = {.n_rows = 1, .rows = &row, .n_tokens = 1, .tokens = &tok,
                         .out_index = &out_index, .n_out = 1, .out_rows = outp};
        if (devio_ref_backend.forward(st, &b, &err) != DEVIO_OK)
            return -1;
        tok = (int32_t)((uint32_t)(tok * 31 + i) % 32000u);
    }
    return (now_s() - t0) / n_dec;
}

static int bench_forward(bench_model *bm, uint32_t threads)
{
    enum { PREFILL = 512, BLOCKS = 80 };
    devio_backend_config cfg = {.kv_blocks = BLOCKS, .block_size = 16,
                                .max_batch_tokens = PREFILL, .max_rows = 8,
                                .max_seq_len = BLOCKS * 16, .threads = threads};
    void *st = NULL;
    devio_error err = {0};
    if (devio_ref_backend.create(&bm->m, &cfg, &st, &err) != DEVIO_OK) {
        fprintf(stderr, "create: %s\n", err.message);
        return 1;
    }
    uint32_t blocks[BLOCKS];
    for (uint32_t i = 0; i < BLOCKS; i++)
        blocks[i] = BLOCKS - 1 - i;
    float *logits = malloc(32000 * sizeof(float));
    static int32_t toks[PREFILL], out_index[PREFILL];
    float *outp[1] = {logits};
    for (uint32_t i = 0; i < PREFILL; i++) {
        toks[i] = (int32_t)((i * 7919u) % 32000u);
        out_index[i] = i == PREFILL - 1 ? 0 : -1;
    }
    double bytes = 32000.0 * 768 * 2 + 12.0 * (4 * 768 * 768 + 3 * 768 * 2048) * 2;

    /* Short context: 16-token prompt, then 128 decode steps (best of 2). */
    devio_batch_row row = {.pos0 = 0, .n_tokens = 16, .tok_start = 0, .blocks = blocks};
    devio_batch b = {.n_rows = 1, .rows = &row, .n_tokens = 16, .tokens = toks,
                     .out_index = out_index + PREFILL - 16, .n_out = 1, .out_rows = outp};
    if (devio_ref_backend.forward(st, &b, &err) != DEVIO_OK)
        return 1;
    double td = decode_run(st, blocks, 16, 128, logits);
    double td2 = decode_run(st, blocks, 16, 128, logits);
    td = td2 < td ? td2 : td;
    printf("  forward, %u thread(s): decode at 16..143: %.2f ms/token = %.1f tok/s, "
           "%.1f GB/s of weights\n", threads, td * 1e3, 1 / td, bytes / td / 1e9);

    /* Prefill 512 tokens, then decode at 512.. */
    row = (devio_batch_row){.pos0 = 0, .n_tokens = PREFILL, .tok_start = 0, .blocks = blocks};
    b.n_tokens = PREFILL;
    b.out_index = out_index;
    double t0 = now_s();
    if (devio_ref_backend.forward(st, &b, &err) != DEVIO_OK)
        return 1;
    double tp = now_s() - t0;
    td = decode_run(st, blocks, PREFILL, 128, logits);
    printf("  forward, %u thread(s): prefill %u tokens %.0f ms (%.0f tok/s); decode at "
           "512..639: %.2f ms/token = %.1f tok/s\n",
           threads, (unsigned)PREFILL, tp * 1e3, PREFILL / tp, td * 1e3, 1 / td);
    free(logits);
    devio_ref_backend.destroy(st);
    return 0;
}

int main(int argc, char **argv)
{
    uint32_t thread_list[8] = {1, 2};
    int n_list = 2;
    if (argc > 1) {
        n_list = 0;
        for (int i = 1; i < argc && n_list < 8; i++)
            thread_list[n_list++] = (uint32_t)atoi(argv[i]);
    }
    bench_model *bm = bm_build();
    if (!bm) {
        fprintf(stderr, "out of memory for the bench model\n");
        return 1;
    }
    for (int ti = 0; ti < n_list; ti++) {
        uint32_t nt = thread_list[ti];
        devio_pool *pool = devio_pool_create(nt);
        ref_scratch *scratch = calloc(nt, sizeof *scratch);
        if (!pool || !scratch)
            return 1;
        for (uint32_t i = 0; i < nt; i++)
            if (ref_scratch_init(&scratch[i], 2048, 1024, 64) != 0)
                return 1;
        printf("threads %u\n", nt);
        printf("  read bandwidth (vector sum of 256 MiB): %.2f GB/s\n", bench_bandwidth(pool));
        bench_pool(pool);
        bench_matvec(pool, scratch, 32000, 768, DEVIO_BF16, 1);
        bench_matvec(pool, scratch, 2048, 768, DEVIO_BF16, 1);
        bench_matvec(pool, scratch, 768, 2048, DEVIO_BF16, 1);
        bench_matvec(pool, scratch, 768, 768, DEVIO_BF16, 1);
        bench_matvec(pool, scratch, 2048, 768, DEVIO_F32, 1);
        bench_matvec(pool, scratch, 2048, 768, DEVIO_BF16, 8);
        bench_matvec(pool, scratch, 2048, 768, DEVIO_BF16, 128);
        for (uint32_t i = 0; i < nt; i++)
            ref_scratch_fini(&scratch[i]);
        free(scratch);
        devio_pool_free(pool);
        if (bench_forward(bm, nt) != 0)
            return 1;
    }
    bm_free(bm);
    return 0;
}
