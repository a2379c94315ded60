/* cpu_gemm_bench.c - devio-bench-cpu-gemm: the cpu backend's projections (cpu/cpu_gemm.c, fast
 * numerics) beside the reference's (ref/ref_gemm.c, strict) on the same quantized weights, in one
 * run, on the path this binary was built for (x86-64-v3). Times are the process's CPU time per
 * projection (best of several rounds), so that time the machine gives to others is not counted;
 * beside the fast time, the same with the packed activations 16 bytes off a cache line (as calloc
 * leaves a large block) against aligned; it measures and prints, and asserts nothing.
 *
 * usage: devio-bench-cpu-gemm [THREADS]   (default 1) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu/cpu_strict.h"
#include "device/model/model.h"
#include "device/numerics/numerics.h"
#include "device/numerics/quant.h"
#include "ref/pool.h"
#include "ref/ref_gemm.h"
#include "ref/ref_kernels.h"

static uint32_t rng = 2463534242u;
static uint32_t next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 17;
    rng ^= rng << 5;
    return rng;
}

/* m rows of n elements of GGML type t (n a whole number of its blocks):
 * random quants, binary16 scales (and minimums) of about 0.01, where the
 * block keeps them (its last two bytes for Q6_K, its first two else). */
static uint8_t *rand_rows(uint32_t t, uint32_t m, uint32_t n)
{
    uint32_t bb = devio_quant_block_bytes(t), blocks = m * (n / devio_quant_block(t));
    uint8_t *w = malloc((size_t)blocks * bb);
    for (size_t b = 0; w && b < blocks; b++) {
        uint8_t *p = w + b * bb;
        for (uint32_t i = 0; i < bb; i++)
            p[i] = (uint8_t)next();
        uint16_t d = devio_f32_to_f16_rne(0.005f + (float)(next() % 100) * 1e-4f);
        memcpy(t == DEVIO_QT_Q6_K ? p + bb - 2 : p, &d, 2);
        if (t == DEVIO_QT_Q4_1 || t == DEVIO_QT_Q5_1 || t == DEVIO_QT_Q4_K ||
            t == DEVIO_QT_Q5_K) {
            uint16_t mn = devio_f32_to_f16_rne(-0.04f);
            memcpy(p + 2, &mn, 2);
        }
    }
    return w;
}

static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef void (*run_fn)(const ref_gemm_work *, ref_matmul *, uint32_t);

/* CPU seconds per run of mm, the best of 5 rounds of `reps`. */
static double time_runs(run_fn run, const ref_gemm_work *wk, ref_matmul *mm, int reps)
{
    double best = 1e30;
    run(wk, mm, 1);
    for (int round = 0; round < 5; round++) {
        double t0 = cpu_s();
        for (int r = 0; r < reps; r++)
            run(wk, mm, 1);
        double t = (cpu_s() - t0) / reps;
        best = t < best ? t : best;
    }
    return best;
}

static void bench(devio_pool *pool, ref_scratch *scratch, uint32_t threads, const char *name,
                  devio_dtype dt, uint32_t m, uint32_t n, uint32_t n_tok)
{
    uint32_t t = devio_dtype_ggml(dt);
    uint8_t *raw = rand_rows(t, m, n);
    ref_panels fast, strict;
    if (!raw || ref_panels_pack(&fast, pool, raw, dt, m, n) != 0 ||
        ref_strict_panels_pack(&strict, pool, raw, dt, m, n) != 0) {
        fprintf(stderr, "devio-bench-cpu-gemm: out of memory\n");
        exit(1);
    }
    uint32_t ldx = ref_pad32(n);
    float *x = calloc((size_t)n_tok * ldx, sizeof(float));
    float *y = calloc((size_t)n_tok * m, sizeof(float));
    size_t xf = ref_gemm_xpack_floats(n_tok, n) + 16u;
    float *xpack = NULL; /* 64-byte aligned, as ref_gemm.h asks; 16 floats more for `off16` */
    if (posix_memalign((void **)&xpack, 64, xf * sizeof(float)) == 0)
        memset(xpack, 0, xf * sizeof(float));
    if (!x || !y || !xpack)
        exit(1);
    for (uint32_t k = 0; k < n_tok; k++)
        for (uint32_t i = 0; i < n; i++)
            x[(size_t)k * ldx + i] = (float)((int)(next() % 2001) - 1000) / 500.0f;
    ref_gemm_work wk = {.pool = pool, .scratch = scratch, .xpack = xpack};
    ref_matmul mm = {.epi = REF_EPI_STORE, .x = x, .ldx = ldx, .n_tok = n_tok, .y = y, .ldy = m};
    int reps = (int)(2000000u / ((uint64_t)m * n * n_tok / 256u + 1u)) + 1;
    mm.w = &fast;
    double tf = time_runs(ref_matmul_run, &wk, &mm, reps) / threads;
    /* The same with the packed activations 16 bytes past a cache line, as
     * calloc leaves a large block: what aligning them is worth. */
    ref_gemm_work off16 = wk;
    off16.xpack = xpack + 4;
    double to = time_runs(ref_matmul_run, &off16, &mm, reps) / threads;
    mm.w = &strict;
    double ts = time_runs(ref_strict_matmul_run, &wk, &mm, reps) / threads;
    double macs = (double)m * n * n_tok;
    printf("  %-5s %5u x %-5u tokens %4u: fast %8.1f us %6.2f GB/s %7.1f GMAC/s | strict %8.1f us "
           "%7.1f GMAC/s | fast/strict %.2fx | off16/aligned %.2fx\n",
           name, m, n, n_tok, tf * 1e6, (double)devio_dtype_row_bytes(dt, n) * m / tf / 1e9,
           macs / tf / 1e9, ts * 1e6, macs / ts / 1e9, ts / tf, to / tf);
    ref_panels_free(&fast);
    ref_strict_panels_free(&strict);
    free(raw);
    free(x);
    free(y);
    free(xpack);
}

int main(int argc, char **argv)
{
    uint32_t threads = 1;
    if (argc > 2 || (argc == 2 && (!strcmp(argv[1], "--help") ||
                                   (threads = (uint32_t)atoi(argv[1])) < 1 || threads > 64))) {
        printf("usage: devio-bench-cpu-gemm [THREADS]\n"
               "The cpu backend's fast projections beside the reference's strict ones on the\n"
               "same random Q4_0, Q4_1, Q8_0, Q5_0, Q4_K and Q6_K weights (SmolLM2-135M's\n"
               "shapes, those whose width is whole blocks of the type), 1, 8 and 128 tokens:\n"
               "CPU time per projection (best of 5 rounds) over THREADS threads [1]; and the\n"
               "fast one's time with its packed activations 16 bytes off a cache line against\n"
               "64-byte aligned (off16/aligned).\n");
        return argc == 2 && !strcmp(argv[1], "--help") ? 0 : 2;
    }
    devio_pool *pool = devio_pool_create(threads);
    ref_scratch *scratch = calloc(threads, sizeof *scratch);
    if (!pool || !scratch)
        return 1;
    for (uint32_t i = 0; i < threads; i++)
        if (ref_scratch_init(&scratch[i], 1024, 64, 2048) != 0)
            return 1;
    printf("cpu projections, x86-64-v3 path, %u thread(s): CPU time per projection\n", threads);
    static const struct {
        const char *name;
        devio_dtype dt;
    } types[] = {{"q4_0", DEVIO_Q4_0}, {"q4_1", DEVIO_Q4_1}, {"q8_0", DEVIO_Q8_0},
                 {"q5_0", DEVIO_Q5_0}, {"q4_k", DEVIO_Q4_K}, {"q6_k", DEVIO_Q6_K}};
    static const uint32_t shapes[][2] = {{1536, 576}, {576, 1536}};
    static const uint32_t toks[] = {1, 8, 128};
    for (size_t i = 0; i < sizeof types / sizeof *types; i++)
        for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
            for (size_t k = 0; k < sizeof toks / sizeof *toks; k++)
                if (shapes[s][1] % devio_quant_block(devio_dtype_ggml(types[i].dt)) == 0)
                        bench(pool, scratch, threads, types[i].name, types[i].dt, shapes[s][0],
                          shapes[s][1], toks[k]);
    for (uint32_t i = 0; i < threads; i++)
        ref_scratch_fini(&scratch[i]);
    free(scratch);
    devio_pool_free(pool);
    return 0;
}
