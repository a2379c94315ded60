/* rtt_inproc.c - rtt_inproc: launch+await round trips of one-token greedy decode steps, called in-process.
 * The baseline for tests/bench/server_bench.py; a benchmark that prints one JSON line and asserts nothing. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "common/cli.h"
#include "common/clock.h"
#include "device/backend/backend.h"
#include "device/devio.h"
#include "device/model/model.h"
#include "ref/builtin.h"
#include "tools/mkmodel/mkmodel.h"

/* The shape of the HTTP side of the benchmark: a 16-token prompt, then
 * decode; the sequence is truncated back to the prompt before max_seq_len
 * (512 on the tiny preset). */
enum { PROMPT = 16, WRAP_AT = 500 };

static double now_us(void)
{
    return (double)devio_clock_us();
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

typedef struct flags {
    const char *model, *backend, *backend_path;
    uint32_t n, warmup, threads;
} flags;

#define F(f) offsetof(flags, f)
static const devio_opt opts[] = {
    {.flag = "model", .type = DEVIO_OPT_STR, .offset = F(model), .metavar = "DIR",
     .help = "model directory; one without config.json gets the tiny preset (required)"},
    {.flag = "n", .type = DEVIO_OPT_U32, .offset = F(n), .metavar = "N",
     .help = "timed round trips, 1..100000000 [2000]"},
    {.flag = "warmup", .type = DEVIO_OPT_U32, .offset = F(warmup), .metavar = "N",
     .help = "untimed round trips first [100]"},
    {.flag = "threads", .type = DEVIO_OPT_U32, .offset = F(threads), .metavar = "N",
     .help = "compute threads, 0 = all cores [0]"},
    {.flag = "backend", .type = DEVIO_OPT_STR, .offset = F(backend), .metavar = "NAME",
     .help = "ref, auto, or a plugin's name [ref]"},
    {.flag = "backend-path", .type = DEVIO_OPT_STR, .offset = F(backend_path), .metavar = "DIR",
     .help = "where backend plugins are [next to this binary]"},
};
#undef F

static const devio_cli cli = {
    .prog = "rtt_inproc",
    .usage = "usage: rtt_inproc --model DIR [--n N] [--warmup N] [--threads N]\n"
             "Times N launch+await round trips of one-token greedy decode steps in-process.\n"
             "Prints {\"steps_per_s\":..,\"p50_us\":..,\"p99_us\":..}.",
    .opts = opts,
    .n_opts = sizeof opts / sizeof *opts,
};

int main(int argc, char **argv)
{
    flags f = {.n = 2000, .warmup = 100, .backend = "ref"};
    devio_cli_result cr = devio_cli_parse(&cli, &f, argc, argv, NULL, NULL, stdout, stderr);
    if (cr != DEVIO_CLI_OK)
        return cr == DEVIO_CLI_EXIT ? 0 : 2;
    if (!f.model || f.n < 1 || f.n > 100000000 || f.threads > 1024) {
        devio_cli_help(&cli, stderr);
        return 2;
    }
    const char *dir = f.model;
    long n = f.n, warmup = f.warmup;
    int rc = 1;
    devio_error err = {0};
    devio_model *m = NULL;
    devio_device *d = NULL;
    devio_registry reg = {0};
    const devio_backend_ops *ops = NULL;
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
    cfg.threads = f.threads;
    cfg.use_worker_thread = true; /* as devio-server runs it */
    devio_registry_builtin(&reg, f.backend_path);
    if ((s = devio_registry_find(&reg, f.backend, &ops, &err)) != DEVIO_OK ||
        (s = devio_open(m, ops, &cfg, &d, &err)) != DEVIO_OK) {
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
    devio_registry_close(&reg);
    devio_model_free(m);
    free(lat);
    return rc;
}
