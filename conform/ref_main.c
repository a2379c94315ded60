/* ref_main.c - devio-ref: run a conformance script on the reference device, in process (conform/inproc.c).
 * Prints one result line per operation; it must never print anything nondeterministic to stdout. */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cli.h"
#include "conform/inproc.h"
#include "conform/script.h"
#if !defined(__wasm__)
#include "cpu/cpu_backend.h"
#endif
#include "device/backend/backend.h"
#include "device/model/model.h"
#include "device/core/options.h"
#include "ref/builtin.h"
#if !defined(__wasm__)
#include "ref/ref_isa.h"
#endif

typedef struct flags {
    const char *model, *adapters, *backend, *backend_path;
    devio_config dev;
    devio_model_params load;
    bool sync;
} flags;

#define F(f) offsetof(flags, f)
static const devio_opt opts[] = {
    {.flag = "model", .type = DEVIO_OPT_STR, .offset = F(model), .metavar = "DIR",
     .help = "model directory (config.json + safetensors) or GGUF file"},
    {.flag = "adapters", .type = DEVIO_OPT_STR, .offset = F(adapters), .metavar = "DIR",
     .help = "root directory of PEFT adapters"},
    {.flag = "backend", .type = DEVIO_OPT_STR, .offset = F(backend), .metavar = "NAME",
     .help = "ref, auto, or a plugin's name [ref]"},
    {.flag = "backend-path", .type = DEVIO_OPT_STR, .offset = F(backend_path), .metavar = "DIR",
     .help = "where backend plugins (libdevio-backend-NAME.so) are [next to this binary]"},
    {.flag = "sync", .type = DEVIO_OPT_BOOL, .offset = F(sync),
     .help = "run steps inside await instead of on the worker thread (same numbers)"},
};
#undef F

static const devio_opt_group groups[] = {{devio_config_options, offsetof(flags, dev)},
                                          {devio_model_options, offsetof(flags, load)}};

static const devio_cli cli = {
    .prog = "devio-ref",
    .usage = "usage: devio-ref --model DIR [--adapters DIR] [options] SCRIPT.jsonl|-\n"
             "Runs a conformance script (JSON lines, docs/conformance.md) against a device in\n"
             "this process (the reference unless --backend says otherwise) and prints one\n"
             "JSON result line per operation.",
    .opts = opts,
    .n_opts = sizeof opts / sizeof *opts,
    .groups = groups,
    .n_groups = 2,
    .max_args = 1,
};

int main(int argc, char **argv)
{
    flags f = {.dev = devio_config_default(), .load = devio_model_params_default(),
               .backend = "ref"};
    const char *script = NULL;
    uint32_t n_args = 0;
    /* --help ends with the reference's and the cpu backend's instruction-set
     * paths (ref/ref_isa.h, cpu/cpu_backend.h). The WASI build has one path,
     * no ref_isa.c and no cpu backend (ref/wasm/BUILD.bazel). */
    devio_cli c = cli;
#if !defined(__wasm__)
    char paths[512];
    devio_ref_isa_describe(paths, sizeof paths / 2);
    size_t used = strlen(paths);
    snprintf(paths + used, sizeof paths - used, "\n");
    used = strlen(paths);
    devio_cpu_isa_describe(paths + used, sizeof paths - used);
    c.epilog = paths;
#endif
    devio_cli_result cr = devio_cli_parse(&c, &f, argc, argv, &script, &n_args, stdout, stderr);
    if (cr != DEVIO_CLI_OK)
        return cr == DEVIO_CLI_EXIT ? 0 : 2;
    if (!f.model || !script) {
        devio_cli_help(&c, stderr);
        return 2;
    }
    const char *model_dir = f.model;
    devio_config cfg = f.dev;
    cfg.adapters_root = f.adapters;
    cfg.use_worker_thread = !f.sync;
    FILE *in = strcmp(script, "-") == 0 ? stdin : fopen(script, "r");
    if (!in) {
        fprintf(stderr, "devio-ref: cannot open %s: %s\n", script, strerror(errno));
        return 2;
    }
    int rc = 1;
    devio_error err = {0};
    devio_model *model = NULL;
    devio_device *dev = NULL;
    devio_registry reg;
    const devio_backend_ops *ops = NULL;
    devio_registry_builtin(&reg, f.backend_path);
    reg.numerics = f.dev.numerics;
    devio_model_params mp = f.load;
    if (devio_model_load_with(model_dir, &mp, &model, &err) != DEVIO_OK) {
        fprintf(stderr, "devio-ref: %s: %s\n", devio_status_str(err.status), err.message);
        goto out_close;
    }
    if (devio_registry_find(&reg, f.backend, &ops, &err) != DEVIO_OK ||
        devio_open(model, ops, &cfg, &dev, &err) != DEVIO_OK) {
        fprintf(stderr, "devio-ref: %s: %s\n", devio_status_str(err.status), err.message);
        goto out_model;
    }
    if (ops->copies_weights) /* the backend (CUDA) holds them now */
        devio_model_release_weights(model);
    devio_script_target t = {0};
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
    devio_registry_close(&reg);
    if (in != stdin)
        fclose(in);
    return rc;
}
