/* rtt_inproc.c - rtt_inproc: launch+await round trips of one-token greedy decode steps, called in-process.
 * The baseline for tests/bench/server_bench.py; a benchmark that prints one JSON line and asserts nothing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "device/backend.h"
#include "device/devio.h"
#include "device/model.h"
#include "tools/mkmodel/mkmodel.h"

/* The shape of the HTTP side of the benchmark: a 16-token prompt, then
 * decode; the sequence is truncated back to the prompt before max_seq_len
 * (512 on the tiny preset). */
enum { PROMPT = 16, WRAP_AT = 500 };

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Nearest-rank percentile of sorted values. */
static double percentile(const double *sorted, size_t n, double p)
{
    size_t k = (size_t)(p / 100.0 * (double)n + 0.999999);
    if (k < 1)
        k = 1;
    if (k > n)
        k = n;
    return sorted[k - 1];
}

static int fail(devio_status s, const devio_error *e, const char *what)
{
    fprintf(stderr, "rtt_inproc: %s: %s: %s\n", what, devio_status_str(s), e->message);
    return 1;
}

/* Load DIR; when it holds no config.json, write the tiny preset there first. */
static devio_status model_open(const char *dir, devio_model **out, devio_error *err)
{
    char path[4096];
    struct stat st;
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (stat(path, &st) != 0) {
        devio_mkmodel_opts o = devio_mkmodel_opts_default();
        devio_status s = devio_mkmodel_preset("tiny", &o, err);
        if (s != DEVIO_OK)
            return s;
        o.out_dir = dir;
        s = devio_mkmodel_write(&o, err);
        if (s != DEVIO_OK)
            return s;
    }
    return devio_model_load(dir, out, err);
}

/* One step: launch a greedy row of n tokens on `seq`, await it; *next gets the sampled token. */
static devio_status step(devio_device *d, uint64_t seq, const int32_t *tok, uint32_t n,
                         int32_t *next, devio_error *err)
{
    devio_row row = {.seq = seq, .tokens = tok, .n_tokens = n, .has_sample = true,
                     .sample = devio_sample_params_default()};
    row.sample.temperature = 0;
    devio_plan plan = {.rows = &row, .n_rows = 1};
    uint64_t ticket;
    devio_step_result r;
    devio_status s = devio_launch(d, &plan, &ticket, err);
    if (s != DEVIO_OK)
        return s;
    s = devio_await(d, ticket, -1, &r, err);
    if (s != DEVIO_OK)
        return s;
    *next = r.rows[0].token;
    devio_step_result_free(&r);
    return DEVIO_OK;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: rtt_inproc --model DIR [--n N] [--warmup N] [--threads N]\n"
               "Times N launch+await round trips of one-token greedy decode steps on the\n"
               "reference device, in-process. DIR without config.json gets the tiny preset.\n"
               "Prints {\"steps_per_s\":..,\"p50_us\":..,\"p99_us\":..}.\n");
}

int main(int argc, char **argv)
{
    const char *dir = NULL;
    long n = 2000, warmup = 100, threads = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *end = NULL;
        if (strcmp(a, "--help") == 0) {
            usage(stdout);
            return 0;
        }
        if (!v) {
            usage(stderr);
            return 2;
        }
        if (strcmp(a, "--model") == 0) {
            dir = v;
        } else if (strcmp(a, "--n") == 0) {
            n = strtol(v, &end, 10);
        } else if (strcmp(a, "--warmup") == 0) {
            warmup = strtol(v, &end, 10);
        } else if (strcmp(a, "--threads") == 0) {
            threads = strtol(v, &end, 10);
        } else {
            usage(stderr);
            return 2;
        }
        if (end && (*end || end == v)) {
            usage(stderr);
            return 2;
        }
        i++;
    }
    if (!dir || n < 1 || n > 100000000 || warmup < 0 || threads < 0 || threads > 1024) {
        usage(stderr);
        return 2;
    }

    int rc = 1;
    devio_error err = {0};
    devio_model *m = NULL;
    devio_device *d = NULL;
    double *lat = malloc((size_t)n * sizeof *lat);
    devio_status s;
    if (!lat) {
        fprintf(stderr, "rtt_inproc: out of memory\n");
        goto out;
    }
    if ((s = model_open(dir, &m, &err)) != DEVIO_OK) {
        rc = fail(s, &err, "model");
        goto out;
    }
    devio_config cfg = devio_config_default();
    cfg.threads = (uint32_t)threads;
    cfg.use_worker_thread = true; /* as devio-server runs it */
    if ((s = devio_open(m, &devio_ref_backend, &cfg, &d, &err)) != DEVIO_OK) {
        rc = fail(s, &err, "open");
        goto out;
    }
    uint64_t seq;
    if ((s = devio_seq_create(d, &seq, &err)) != DEVIO_OK) {
        rc = fail(s, &err, "create");
        goto out;
    }
    /* The prompt server_bench.py's first client sends. */
    int32_t prompt[PROMPT], tok;
    for (int k = 0; k < PROMPT; k++)
        prompt[k] = (k * 7) % 256;
    if ((s = step(d, seq, prompt, PROMPT, &tok, &err)) != DEVIO_OK) {
        rc = fail(s, &err, "prefill");
        goto out;
    }
    uint32_t len = PROMPT;
    double start = 0;
    for (long i = -warmup; i < n; i++) {
        if (i == 0)
            start = now_us();
        if (len >= WRAP_AT) {
            devio_effect tr = {.kind = DEVIO_EFFECT_TRUNCATE, .seq = seq, .len = PROMPT};
            devio_outcome o;
            if ((s = devio_apply(d, &tr, &o, &err)) != DEVIO_OK) {
                rc = fail(s, &err, "truncate");
                goto out;
            }
            devio_outcome_free(&o);
            len = PROMPT;
        }
        double t0 = now_us();
        if ((s = step(d, seq, &tok, 1, &tok, &err)) != DEVIO_OK) {
            rc = fail(s, &err, "step");
            goto out;
        }
        len++;
        if (i >= 0)
            lat[i] = now_us() - t0;
    }
    /* Wall time of the timed loop, as the HTTP side measures it. */
    double total = now_us() - start;
    qsort(lat, (size_t)n, sizeof *lat, cmp_double);
    printf("{\"steps_per_s\":%.1f,\"p50_us\":%.1f,\"p99_us\":%.1f,\"n\":%ld}\n",
           (double)n / (total * 1e-6), percentile(lat, (size_t)n, 50), percentile(lat, (size_t)n, 99),
           n);
    rc = 0;
out:
    if (d)
        devio_teardown(d, NULL);
    devio_model_free(m);
    free(lat);
    return rc;
}
