/* devio_ref_main.c - devio-ref: run a conformance script on the reference device, in process.
 * Prints one result line per operation; it must never print anything nondeterministic to stdout. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/script.h"
#include "device/backend.h"
#include "device/model.h"
#include "ref/inproc.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: devio-ref --model DIR [--adapters DIR] [--threads N] [--kv-blocks N]\n"
            "                 [--block-size N] [--max-depth N] [--max-seqs N] [--max-seq-len N]\n"
            "                 [--max-rows N] [--max-batch-tokens N] [--logits-handles N]\n"
            "                 [--logits-rows N] [--sync] SCRIPT.jsonl|-\n"
            "Runs a conformance script (JSON lines) against the reference device and prints\n"
            "one JSON result line per operation. --sync runs steps inside await instead of\n"
            "on the worker thread (the numbers are the same).\n");
}

static int parse_u32(const char *s, uint32_t *out)
{
    char *end;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);
    if (errno || *end || end == s || v > 0xffffffffUL)
        return -1;
    *out = (uint32_t)v;
    return 0;
}

int main(int argc, char **argv)
{
    const char *model_dir = NULL, *script = NULL;
    devio_config cfg = devio_config_default();
    struct { const char *flag; uint32_t *dst; } knobs[] = {
        {"--threads", &cfg.threads},         {"--kv-blocks", &cfg.kv_blocks},
        {"--block-size", &cfg.block_size},   {"--max-depth", &cfg.max_depth},
        {"--max-seqs", &cfg.max_seqs},       {"--max-seq-len", &cfg.max_seq_len},
        {"--max-rows", &cfg.max_rows},       {"--max-batch-tokens", &cfg.max_batch_tokens},
        {"--logits-handles", &cfg.logits_handles}, {"--logits-rows", &cfg.logits_rows},
        {"--max-loras", &cfg.max_loras},     {"--max-lora-rank", &cfg.max_lora_rank},
    };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool matched = false;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        }
        if (strcmp(a, "--sync") == 0) {
            cfg.use_worker_thread = false;
            continue;
        }
        if ((strcmp(a, "--model") == 0 || strcmp(a, "--adapters") == 0) && i + 1 < argc) {
            if (strcmp(a, "--model") == 0)
                model_dir = argv[i + 1];
            else
                cfg.adapters_root = argv[i + 1];
            i++;
            continue;
        }
        for (size_t k = 0; k < sizeof knobs / sizeof *knobs; k++)
            if (strcmp(a, knobs[k].flag) == 0) {
                if (i + 1 >= argc || parse_u32(argv[i + 1], knobs[k].dst) < 0) {
                    fprintf(stderr, "devio-ref: %s needs an unsigned integer\n", a);
                    return 2;
                }
                i++;
                matched = true;
            }
        if (matched)
            continue;
        if (a[0] == '-' && a[1] != '\0') {
            fprintf(stderr, "devio-ref: unknown flag %s\n", a);
            usage(stderr);
            return 2;
        }
        script = a;
    }
    if (!model_dir || !script) {
        usage(stderr);
        return 2;
    }
    FILE *in = strcmp(script, "-") == 0 ? stdin : fopen(script, "r");
    if (!in) {
        fprintf(stderr, "devio-ref: cannot open %s: %s\n", script, strerror(errno));
        return 2;
    }
    int rc = 1;
    devio_error err = {0};
    devio_model *model = NULL;
    devio_device *dev = NULL;
    if (devio_model_load(model_dir, &model, &err) != DEVIO_OK) {
        fprintf(stderr, "devio-ref: %s: %s\n", devio_status_str(err.status), err.message);
        goto out_close;
    }
    if (devio_open(model, &devio_ref_backend, &cfg, &dev, &err) != DEVIO_OK) {
        fprintf(stderr, "devio-ref: %s: %s\n", devio_status_str(err.status), err.message);
        goto out_model;
    }
    devio_script_target t;
    devio_inproc_target(dev, &t);
    char why[512];
    if (devio_script_run(&t, in, stdout, why, sizeof why) != 0) {
        fprintf(stderr, "devio-ref: %s: %s\n", script, why);
        rc = 2;
    } else {
        rc = 0;
    }
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "devio-ref: writing the results failed: %s\n", strerror(errno));
        rc = 1;
    }
    devio_teardown(dev, NULL);
out_model:
    devio_model_free(model);
out_close:
    if (in != stdin)
        fclose(in);
    return rc;
}
