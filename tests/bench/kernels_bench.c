/* kernels_bench.c - devio-bench-kernels: speed of the reference kernels (read bandwidth,
 * the thread pool, bench-shaped projections). Measures and prints; it asserts nothing
 * about speed and never writes files. Whole steps are devio-bench's job.
 *
 * usage: devio-bench-kernels [threads ...]   (default: 1 2) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/cli.h"
#include "common/clock.h"
#include "device/model/model.h"
#include "ref/pool.h"
#include "ref/ref_gemm.h"
#include "ref/ref_kernels.h"


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
        double t0 = devio_clock_s();
        devio_pool_run(pool, jobs, bw_job, &c);
        double gbs = (double)n * 4 / (devio_clock_s() - t0) / 1e9;
        best = gbs > best ? gbs : best;
    }
    free(p);
    return best;
}

/* ---- projection speed -------------------------------------------------- */

static void bench_matvec(devio_pool *pool, ref_scratch *scratch, uint32_t m, uint32_t n,
                         devio_dtype dt, uint32_t n_tok)
{
    static const char *const names[] = {[DEVIO_F32] = "f32", [DEVIO_BF16] = "bf16",
                                        [DEVIO_F16] = "f16"};
    size_t esz = dt == DEVIO_F32 ? 4 : 2;
    /* Several copies of the weight, cycled, so none of it sits in cache. */
    uint32_t copies = (uint32_t)(((size_t)512 << 20) / ((size_t)m * n * esz) + 1);
    if (copies > 8)
        copies = 8;
    ref_panels w[8];
    for (uint32_t i = 0; i < copies; i++) {
        /* bf16 bits read as f16 are finite halves of the same spread. */
        void *raw = dt == DEVIO_F32 ? (void *)rand_f32((size_t)m * n, 0.05f, i)
                                    : (void *)rand_bf16((size_t)m * n, 0.05f, i);
        if (!raw || ref_panels_pack(&w[i], pool, raw, dt, m, n) != 0)
            return;
        free(raw);
    }
    uint32_t ldx = ref_pad32(n);
    float *x = calloc((size_t)n_tok * ldx, sizeof(float));
    float *y = calloc((size_t)n_tok * m, sizeof(float));
    float *xpack = calloc(ref_gemm_xpack_floats(n_tok, n), sizeof(float));
    if (!x || !y || !xpack)
        return;
    ref_gemm_work wk = {.pool = pool, .scratch = scratch, .xpack = xpack};
    for (uint32_t t = 0; t < n_tok; t++)
        for (uint32_t i = 0; i < n; i++)
            x[(size_t)t * ldx + i] = (float)((i * 7 + t) % 13) * 0.01f;
    ref_matmul mm = {.x = x, .ldx = ldx, .n_tok = n_tok, .y = y, .ldy = m};
    int reps = 20;
    double dt_s = 1e30;
    for (int round = 0; round < 3; round++) {
        double t0 = 0;
        for (int r = -2; r < reps; r++) {
            if (r == 0)
                t0 = devio_clock_s();
            mm.w = &w[(uint32_t)(r + 2) % copies];
            ref_matmul_run(&wk, &mm, 1);
        }
        double t = (devio_clock_s() - t0) / reps;
        dt_s = t < dt_s ? t : dt_s;
    }
    double bytes = (double)m * n * esz;
    printf("  %-5s %5u x %-5u tokens %3u: %8.1f us  %6.2f GB/s  %7.2f GFLOP/s\n",
           names[dt], m, n, n_tok, dt_s * 1e6, bytes / dt_s / 1e9,
           2.0 * m * n * n_tok / dt_s / 1e9);
    for (uint32_t i = 0; i < copies; i++)
        ref_panels_free(&w[i]);
    free(xpack);
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
    double t0 = devio_clock_s();
    for (int i = 0; i < reps; i++)
        devio_pool_run(pool, 16, noop_job, NULL);
    double hot = (devio_clock_s() - t0) / reps;
    /* Regions after an idle gap longer than the spin: the workers sleep and
     * must be woken. 16 jobs of ~2 us: the wall time shows whether the
     * workers took part in time. */
    static float sink[64];
    struct timespec gap = {0, 2000000};
    double cold = 0, busy = 0;
    for (int i = 0; i < 200; i++) {
        nanosleep(&gap, NULL);
        double t1 = devio_clock_s();
        devio_pool_run(pool, 16, spin_job, sink);
        cold += devio_clock_s() - t1;
    }
    for (int i = 0; i < 200; i++) {
        double t1 = devio_clock_s();
        devio_pool_run(pool, 16, spin_job, sink);
        busy += devio_clock_s() - t1;
    }
    printf("  pool: empty region %.2f us; region of 16 x ~2 us jobs: %.1f us back to back, "
           "%.1f us after 2 ms idle\n", hot * 1e6, busy / 200 * 1e6, cold / 200 * 1e6);
}

/* ---- a whole model ----------------------------------------------------- */

static const devio_cli cli = {
    .prog = "devio-bench-kernels",
    .usage = "usage: devio-bench-kernels [THREADS ...]   (default: 1 2)\n"
             "Speed of the reference kernels: read bandwidth, the thread pool and\n"
             "bench-shaped projections, for each thread count given (at most 8, each 1..64).",
    .max_args = 8,
};

int main(int argc, char **argv)
{
    uint32_t thread_list[8] = {1, 2};
    const char *args[8];
    uint32_t n_args = 0;
    devio_cli_result cr = devio_cli_parse(&cli, NULL, argc, argv, args, &n_args, stdout, stderr);
    if (cr != DEVIO_CLI_OK)
        return cr == DEVIO_CLI_EXIT ? 0 : 2;
    int n_list = n_args ? (int)n_args : 2;
    for (uint32_t i = 0; i < n_args; i++) {
        char *end;
        unsigned long v = strtoul(args[i], &end, 10);
        if (*end || v < 1 || v > 64) {
            fprintf(stderr, "devio-bench-kernels: '%s' is not a thread count in 1..64\n", args[i]);
            return 2;
        }
        thread_list[i] = (uint32_t)v;
    }
    for (int ti = 0; ti < n_list; ti++) {
        uint32_t nt = thread_list[ti];
        devio_pool *pool = devio_pool_create(nt);
        ref_scratch *scratch = calloc(nt, sizeof *scratch);
        if (!pool || !scratch)
            return 1;
        for (uint32_t i = 0; i < nt; i++)
            if (ref_scratch_init(&scratch[i], 1024, 64, 2048) != 0)
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
        bench_matvec(pool, scratch, 2048, 768, DEVIO_F16, 1);
        bench_matvec(pool, scratch, 2048, 768, DEVIO_BF16, 128);
        bench_matvec(pool, scratch, 2048, 768, DEVIO_F32, 512);
        bench_matvec(pool, scratch, 2048, 768, DEVIO_BF16, 512);
        bench_matvec(pool, scratch, 2048, 768, DEVIO_F16, 512);
        bench_matvec(pool, scratch, 768, 2048, DEVIO_BF16, 512);
        bench_matvec(pool, scratch, 2048, 768, DEVIO_F16, 32);
        bench_matvec(pool, scratch, 768, 2048, DEVIO_F16, 512);
        for (uint32_t i = 0; i < nt; i++)
            ref_scratch_fini(&scratch[i]);
        free(scratch);
        devio_pool_free(pool);
    }
    return 0;
}
