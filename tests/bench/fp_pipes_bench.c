/* fp_pipes_bench.c - devio-bench-fp: how many 8-float multiply-adds per
 * second this x86 machine retires, as a rounded multiply then an add (what
 * the reference's lane rule allows) and as one fused multiply-add (what it
 * forbids), on 1 and 2 threads side by side. A benchmark: prints figures and
 * asserts nothing. Its only use is to say, per machine, what the lane rule
 * costs at peak (docs/numerics.md, "Projections"); the reference never runs
 * this code. Twelve independent accumulators keep both forms throughput-
 * bound (more than latency x pipes in flight), with no memory operand.
 * Owns nothing beyond its threads. */
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/version.h"

typedef struct fp_job {
    int fused;
    long iters;
    float out;
} fp_job;

#define ACC_DECL(i) __m256 a##i = _mm256_set1_ps((float)(i) * 1e-9f);
#define ACC_MULADD(i) a##i = _mm256_add_ps(a##i, _mm256_mul_ps(w, x));
#define ACC_FMA(i) a##i = _mm256_fmadd_ps(w, x, a##i);
#define ACC_SUM(i) s = _mm256_add_ps(s, a##i);
#define ACC_ALL(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)

static void *fp_run(void *arg)
{
    fp_job *j = arg;
    ACC_ALL(ACC_DECL)
    __m256 w = _mm256_set1_ps(0.999999f), x = _mm256_set1_ps(1e-7f);
    if (j->fused) {
        for (long k = 0; k < j->iters; k++) {
            ACC_ALL(ACC_FMA)
            __asm__ volatile("" : "+x"(x)); /* x is not loop-invariant to the compiler */
        }
    } else {
        for (long k = 0; k < j->iters; k++) {
            ACC_ALL(ACC_MULADD)
            __asm__ volatile("" : "+x"(x));
        }
    }
    __m256 s = _mm256_setzero_ps();
    ACC_ALL(ACC_SUM)
    float t[8];
    _mm256_storeu_ps(t, s);
    j->out = t[0];
    return NULL;
}

/* Billions of 8-float multiply-adds per second over `threads` threads. */
static double fp_rate(int fused, int threads, long iters)
{
    pthread_t th[2];
    fp_job jobs[2];
    double t0 = devio_clock_s();
    for (int i = 0; i < threads; i++) {
        jobs[i] = (fp_job){.fused = fused, .iters = iters};
        if (pthread_create(&th[i], NULL, fp_run, &jobs[i]) != 0)
            return 0.0;
    }
    for (int i = 0; i < threads; i++)
        pthread_join(th[i], NULL);
    double t = devio_clock_s() - t0;
    return (double)threads * (double)iters * 12.0 / t / 1e9;
}

int main(int argc, char **argv)
{
    long iters = 100000000;
    int rounds = 3;
    if (argc > 1 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        printf("usage: devio-bench-fp [ROUNDS]\n"
               "8-float multiply-adds per second, multiply then add vs fused, 1 and 2\n"
               "threads, best of ROUNDS (1..100) [3] runs of %ld iterations x 12 accumulators.\n"
               "  --help     this text\n"
               "  --version  print the version and exit\n",
               iters);
        return 0;
    }
    if (argc > 1 && strcmp(argv[1], "--version") == 0) {
        printf("devio-bench-fp %s\n", DEVIO_VERSION);
        return 0;
    }
    if (argc > 2) {
        fprintf(stderr, "devio-bench-fp: one argument at most (ROUNDS); see --help\n");
        return 2;
    }
    if (argc > 1) {
        char *end;
        long r = strtol(argv[1], &end, 10);
        if (end == argv[1] || *end || r < 1 || r > 100) {
            fprintf(stderr, "devio-bench-fp: ROUNDS must be a whole number in 1..100, not '%s'\n",
                    argv[1]);
            return 2;
        }
        rounds = (int)r;
    }
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
        printf("devio-bench-fp: this CPU lacks AVX2 or FMA; nothing to compare\n");
        return 0;
    }
    printf("%-18s %10s %10s %12s\n", "form", "1 thread", "2 threads", "2 / 1");
    double best[2][2] = {{0}};
    for (int r = 0; r < rounds; r++)
        for (int fused = 0; fused < 2; fused++)
            for (int t = 1; t <= 2; t++) {
                double g = fp_rate(fused, t, iters);
                if (g > best[fused][t - 1])
                    best[fused][t - 1] = g;
            }
    for (int fused = 0; fused < 2; fused++)
        printf("%-18s %8.2f G %8.2f G %11.2fx\n", fused ? "fused multiply-add" : "multiply, then add",
               best[fused][0], best[fused][1], best[fused][1] / best[fused][0]);
    printf("multiply-then-add / fused: %.2f (1 thread), %.2f (2 threads)\n",
           best[0][0] / best[1][0], best[0][1] / best[1][1]);
    return 0;
}
