/* state_bench.c - devio-bench-state: how fast a sequence's state (docs/state.md) is exported
 * and imported in process, beside a plain memory copy of the same bytes, and what it weighs per
 * token. Prints figures; asserts nothing.
 *
 *   devio-bench-state [--model DIR] [--backend ref|cpu|auto] [--numerics strict|fast]
 *                     [--tokens N] [--threads T]
 *
 * Without --model it writes the tiny preset to a temporary directory. The sequence is one
 * prefill of N tokens (default 1024); export and import each run 5 times in pieces of 1 MiB and
 * the best is kept; the copy is the best of 5 memcpy calls of the whole state. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "device/backend/registry.h"
#include "device/devio.h"
#include "device/model/model.h"
#include "ref/builtin.h"
#include "tools/mkmodel/mkmodel.h"

#define PIECE ((size_t)1 << 20)
#define REPS 5

static int die(const char *what, const devio_error *err)
{
    fprintf(stderr, "devio-bench-state: %s: %s\n", what, err ? err->message : "failed");
    return 1;
}

static double export_once(devio_device *d, uint64_t seq, uint8_t *buf, uint64_t *n)
{
    devio_export *x = NULL;
    devio_error err = {0};
    double t0 = devio_clock_s();
    if (devio_export_open(d, seq, false, &x, n, &err) != DEVIO_OK)
        return -1.0;
    size_t at = 0, k = 1;
    while (k > 0)
        if (devio_export_read(x, buf + at, PIECE, &k, &err) != DEVIO_OK)
            return -1.0;
        else
            at += k;
    devio_export_close(x);
    return devio_clock_s() - t0;
}

static double import_once(devio_device *d, const uint8_t *buf, uint64_t n)
{
    devio_import *m = NULL;
    devio_error err = {0};
    uint64_t seq = 0;
    double t0 = devio_clock_s();
    devio_status s = devio_import_open(d, 0, &m, &err);
    for (uint64_t at = 0; s == DEVIO_OK && at < n; at += PIECE)
        s = devio_import_write(m, buf + at, n - at < PIECE ? (size_t)(n - at) : PIECE, &err);
    if (s == DEVIO_OK)
        s = devio_import_finish(m, &seq, &err);
    devio_import_close(m);
    double dt = devio_clock_s() - t0;
    devio_effect fr = {.kind = DEVIO_EFFECT_FREE, .seq = seq};
    devio_outcome o;
    if (s != DEVIO_OK || devio_apply(d, &fr, &o, &err) != DEVIO_OK)
        return -1.0;
    return dt;
}

/* The tiny model main wrote into dir: config.json, model.safetensors, the folder. */
static void remove_model(const char *dir)
{
    char path[96];
    const char *files[] = {"config.json", "model.safetensors"};
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        unlink(path);
    }
    rmdir(dir);
}

int main(int argc, char **argv)
{
    const char *model_dir = NULL, *backend = "ref", *numerics = "strict";
    uint32_t tokens = 1024, threads = 2;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--model"))
            model_dir = argv[i + 1];
        else if (!strcmp(argv[i], "--backend"))
            backend = argv[i + 1];
        else if (!strcmp(argv[i], "--numerics"))
            numerics = argv[i + 1];
        else if (!strcmp(argv[i], "--tokens"))
            tokens = (uint32_t)strtoul(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--threads"))
            threads = (uint32_t)strtoul(argv[i + 1], NULL, 10);
        else
            return fprintf(stderr, "devio-bench-state: unknown flag %s\n", argv[i]), 2;
    }
    devio_error err = {0};
    char tmp[64] = "";
    if (!model_dir) {
        devio_mkmodel_opts o = devio_mkmodel_opts_default();
        snprintf(tmp, sizeof tmp, "/tmp/devio-bench-state-XXXXXX");
        if (devio_mkmodel_preset("tiny", &o, &err) != DEVIO_OK || !mkdtemp(tmp))
            return die("tiny preset", &err);
        o.out_dir = tmp;
        if (devio_mkmodel_write(&o, &err) != DEVIO_OK)
            return die("write model", &err);
        model_dir = tmp;
    }
    devio_model *m = NULL;
    if (devio_model_load(model_dir, &m, &err) != DEVIO_OK)
        return die("load", &err);
    double t0 = devio_clock_s();
    uint8_t fp[32];
    devio_model_fingerprint(m, fp);
    double fp_s = devio_clock_s() - t0;
    devio_config cfg = devio_config_default();
    cfg.threads = threads;
    cfg.max_seq_len = tokens + 16;
    cfg.max_batch_tokens = tokens;
    cfg.kv_blocks = 3 * ((tokens + 15) / 16 + 1);
    cfg.numerics = !strcmp(numerics, "fast") ? DEVIO_NUMERICS_FAST : DEVIO_NUMERICS_STRICT;
    devio_registry reg;
    const devio_backend_ops *ops = NULL;
    devio_device *d = NULL;
    devio_registry_builtin(&reg, NULL);
    reg.numerics = cfg.numerics;
    if (devio_registry_find(&reg, backend, &ops, &err) != DEVIO_OK ||
        devio_open(m, ops, &cfg, &d, &err) != DEVIO_OK)
        return die("open", &err);
    uint64_t seq = 0, ticket = 0;
    int32_t *tok = malloc(tokens * sizeof *tok);
    for (uint32_t i = 0; i < tokens; i++)
        tok[i] = (int32_t)((i * 2654435761u) % m->cfg.vocab_size);
    devio_row row = {.tokens = tok, .n_tokens = tokens, .logits = DEVIO_LOGITS_NONE};
    devio_plan plan = {.rows = &row, .n_rows = 1};
    devio_step_result r;
    if (devio_seq_create(d, &seq, &err) != DEVIO_OK || ((row.seq = seq), 0) ||
        devio_launch(d, &plan, &ticket, &err) != DEVIO_OK ||
        devio_await(d, ticket, -1, &r, &err) != DEVIO_OK)
        return die("prefill", &err);
    devio_step_result_free(&r);

    /* A second sequence of half the length: the state's size per token and what it holds
     * whatever the length (header, a hybrid model's state slot) are the line through both. */
    uint64_t half = 0, n = 0, n_half = 0;
    row.n_tokens = tokens / 2;
    devio_export *probe = NULL;
    if (devio_seq_create(d, &half, &err) != DEVIO_OK || ((row.seq = half), 0) ||
        devio_launch(d, &plan, &ticket, &err) != DEVIO_OK ||
        devio_await(d, ticket, -1, &r, &err) != DEVIO_OK)
        return die("prefill", &err);
    devio_step_result_free(&r);
    if (devio_export_open(d, half, false, &probe, &n_half, &err) != DEVIO_OK)
        return die("export", &err);
    devio_export_close(probe);
    if (devio_export_open(d, seq, false, &probe, &n, &err) != DEVIO_OK)
        return die("export", &err);
    devio_export_close(probe);
    double per_token = (double)(n - n_half) / (tokens - tokens / 2);
    double fixed = (double)n - per_token * tokens;
    double ex = 1e30, im = 1e30, cp = 1e30;
    uint8_t *buf = malloc((size_t)n), *copy = malloc((size_t)n);
    for (int k = 0; k < REPS; k++) {
        double e = export_once(d, seq, buf, &n), i = import_once(d, buf, n);
        if (e < 0 || i < 0)
            return die("export or import", NULL);
        double c0 = devio_clock_s();
        memcpy(copy, buf, (size_t)n);
        double c = devio_clock_s() - c0;
        ex = e < ex ? e : ex;
        im = i < im ? i : im;
        cp = c < cp ? c : cp;
    }
    devio_device_info info;
    devio_device_info_get(d, &info);
    printf("devio-bench-state: %s, backend %s (%s numerics), %u tokens, %s\n", model_dir,
           info.backend, numerics, tokens, info.device);
    printf("state: %llu bytes = %.0f bytes per token (its id and the K and V of every "
           "attention layer, %u-byte elements) + %.1f KiB whatever the length\n",
           (unsigned long long)n, per_token, info.kv_elem_bytes, fixed / 1024.0);
    printf("export %.2f GB/s, import %.2f GB/s, memcpy %.2f GB/s: export %.2fx and import "
           "%.2fx the copy's time\n",
           n / ex / 1e9, n / im / 1e9, n / cp / 1e9, ex / cp, im / cp);
    printf("fingerprint of the weights (once per device, at the first export or import): "
           "%.3f s\n", fp_s);
    free(buf);
    free(copy);
    free(tok);
    devio_teardown(d, NULL);
    devio_registry_close(&reg);
    devio_model_free(m);
    if (tmp[0])
        remove_model(tmp);
    return 0;
}
