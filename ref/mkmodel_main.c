/* mkmodel_main.c - the devio-mkmodel command: flags in, a seeded random model or PEFT adapter directory out.
 * It only parses flags and calls devio_mkmodel_write(_adapter); it must never decide a byte of the output itself. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ref/mkmodel.h"

static const char usage[] =
    "usage: devio-mkmodel [--preset tiny|small|bench] [--arch llama] [--seed N]\n"
    "                     [--dtype f32|f16|bf16] [--shards N] --out DIR\n"
    "                     [--vocab N] [--hidden N] [--layers N] [--heads N] [--kv-heads N]\n"
    "                     [--head-dim N] [--ffn N] [--max-pos N] [--rope-theta X] [--eps X]\n"
    "                     [--tied[=true|false]] [--bias[=true|false]]\n"
    "\n"
    "Writes config.json and model.safetensors (or N shards and\n"
    "model.safetensors.index.json) of a Llama model with seeded uniform random\n"
    "weights, in Hugging Face's format. The same options give the same bytes.\n"
    "\n"
    "presets (default tiny):\n"
    "  tiny   vocab 256, hidden 64, 2 layers, 4 heads, 2 kv heads, head_dim 16,\n"
    "         ffn 128, 512 positions, untied, f32 (106,816 parameters)\n"
    "  small  vocab 32000, hidden 288, 6 layers, 6 heads, ffn 768, 1024 positions,\n"
    "         tied, f32 (15,191,712 parameters)\n"
    "  bench  vocab 32000, hidden 768, 12 layers, 12 heads, ffn 2048, 1024 positions,\n"
    "         untied, bf16 (134,105,856 parameters)\n"
    "Flags after the preset override it, whatever their order on the command line.\n"
    "--arch bamba and --arch mamba2 are not supported by this build.\n"
    "\n"
    "       devio-mkmodel --adapter --model DIR [--rank 8] [--alpha 8]\n"
    "                     [--targets q_proj,v_proj] [--rslora[=true|false]]\n"
    "                     [--dtype f32|f16|bf16] [--seed N] --out DIR\n"
    "\n"
    "Writes adapter_config.json and adapter_model.safetensors of a PEFT LoRA\n"
    "adapter for the model in DIR (its shapes decide the adapter's), with seeded\n"
    "uniform random lora_A and lora_B (PEFT starts lora_B at zero; these are\n"
    "random so that the adapter changes the outputs). Targets, comma-separated:\n"
    "q_proj k_proj v_proj o_proj gate_proj up_proj down_proj. Defaults are PEFT's:\n"
    "rank 8, alpha 8, q_proj,v_proj.\n";

/* Splits "--name=value" or "--name value"; returns the value or NULL. */
static const char *flag_value(int argc, char **argv, int *i, const char *eq)
{
    if (eq)
        return eq + 1;
    if (*i + 1 < argc)
        return argv[++*i];
    return NULL;
}

static bool parse_u64(const char *s, uint64_t max, uint64_t *out)
{
    if (!s || !*s || *s == '-')
        return false;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end != '\0' || v > max)
        return false;
    *out = v;
    return true;
}

static bool parse_double(const char *s, double *out)
{
    if (!s || !*s)
        return false;
    char *end;
    double v = strtod(s, &end);
    if (*end != '\0')
        return false;
    *out = v;
    return true;
}

static bool parse_bool(const char *eq, bool *out)
{
    if (!eq || strcmp(eq + 1, "true") == 0 || strcmp(eq + 1, "1") == 0) {
        *out = true;
        return true;
    }
    if (strcmp(eq + 1, "false") == 0 || strcmp(eq + 1, "0") == 0) {
        *out = false;
        return true;
    }
    return false;
}

typedef enum flag_result { FLAG_OK, FLAG_BAD_VALUE, FLAG_UNKNOWN } flag_result;

/* Applies one valued flag to *o. --preset was applied before, so it is a no-op here. */
static flag_result apply_flag(devio_mkmodel_opts *o, const char *name, const char *v)
{
    const struct {
        const char *flag;
        uint32_t *dst;
    } dims[] = {
        {"--vocab", &o->vocab_size},    {"--hidden", &o->hidden_size},
        {"--layers", &o->n_layers},     {"--heads", &o->n_heads},
        {"--kv-heads", &o->n_kv_heads}, {"--head-dim", &o->head_dim},
        {"--ffn", &o->intermediate_size}, {"--max-pos", &o->max_position_embeddings},
        {"--shards", &o->shards},
    };
    for (size_t k = 0; k < sizeof dims / sizeof dims[0]; k++) {
        if (strcmp(name, dims[k].flag) == 0) {
            uint64_t u;
            if (!parse_u64(v, UINT32_MAX, &u))
                return FLAG_BAD_VALUE;
            *dims[k].dst = (uint32_t)u;
            return FLAG_OK;
        }
    }
    bool ok = true;
    if (strcmp(name, "--preset") == 0)
        return FLAG_OK;
    if (strcmp(name, "--seed") == 0)
        ok = parse_u64(v, UINT64_MAX, &o->seed);
    else if (strcmp(name, "--rope-theta") == 0)
        ok = parse_double(v, &o->rope_theta);
    else if (strcmp(name, "--eps") == 0)
        ok = parse_double(v, &o->rms_norm_eps);
    else if (strcmp(name, "--arch") == 0)
        o->arch = v;
    else if (strcmp(name, "--out") == 0)
        o->out_dir = v;
    else if (strcmp(name, "--dtype") == 0) {
        if (strcmp(v, "f32") == 0)
            o->dtype = DEVIO_F32;
        else if (strcmp(v, "f16") == 0)
            o->dtype = DEVIO_F16;
        else if (strcmp(v, "bf16") == 0)
            o->dtype = DEVIO_BF16;
        else
            ok = false;
    } else
        return FLAG_UNKNOWN;
    return ok ? FLAG_OK : FLAG_BAD_VALUE;
}

/* "q_proj,v_proj" -> target bits. False on an empty list or unknown name. */
static bool parse_targets(const char *s, uint32_t *out)
{
    uint32_t bits = 0;
    if (!s)
        return false;
    while (*s) {
        size_t n = strcspn(s, ",");
        char name[32];
        devio_lora_target t;
        if (n == 0 || n >= sizeof name)
            return false;
        memcpy(name, s, n);
        name[n] = '\0';
        if (!devio_lora_target_parse(name, &t))
            return false;
        bits |= 1u << t;
        s += n;
        if (*s == ',' && *++s == '\0')
            return false;
    }
    if (bits == 0)
        return false;
    *out = bits;
    return true;
}

/* devio-mkmodel --adapter ...: every flag takes a value except --adapter and --rslora. */
/* Split "--flag" or "--flag=value" into name and *eq (NULL without '=').
 * 0, or 2 (with a message) for an argument that is not a flag we can hold. */
static int flag_name(const char *a, char *name, size_t cap, const char **eq)
{
    if (strncmp(a, "--", 2) != 0) {
        fprintf(stderr, "devio-mkmodel: unexpected argument '%s'\n%s", a, usage);
        return 2;
    }
    *eq = strchr(a, '=');
    size_t nl = *eq ? (size_t)(*eq - a) : strlen(a);
    if (nl >= cap) {
        fprintf(stderr, "devio-mkmodel: unknown flag '%s'\n", a);
        return 2;
    }
    memcpy(name, a, nl);
    name[nl] = '\0';
    return 0;
}

static int adapter_main(int argc, char **argv)
{
    devio_mkmodel_adapter_opts o = devio_mkmodel_adapter_opts_default();
    devio_error err = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            fputs(usage, stdout);
            return 0;
        }
        char name[32];
        const char *eq;
        if (flag_name(a, name, sizeof name, &eq) != 0)
            return 2;
        if (strcmp(name, "--adapter") == 0 && !eq)
            continue;
        if (strcmp(name, "--rslora") == 0) {
            if (!parse_bool(eq, &o.use_rslora)) {
                fprintf(stderr, "devio-mkmodel: --rslora takes true or false\n");
                return 2;
            }
            continue;
        }
        static const char *const valued[] = {"--model", "--out",  "--rank", "--alpha",
                                              "--targets", "--dtype", "--seed"};
        bool known = false;
        for (size_t k = 0; k < sizeof valued / sizeof valued[0]; k++)
            known = known || strcmp(name, valued[k]) == 0;
        if (!known) {
            fprintf(stderr, "devio-mkmodel: unknown flag '%s' with --adapter\n%s", name, usage);
            return 2;
        }
        const char *v = flag_value(argc, argv, &i, eq);
        if (!v) {
            fprintf(stderr, "devio-mkmodel: %s needs a value\n", name);
            return 2;
        }
        bool ok = true;
        uint64_t u = 0;
        if (strcmp(name, "--model") == 0)
            o.model_dir = v;
        else if (strcmp(name, "--out") == 0)
            o.out_dir = v;
        else if (strcmp(name, "--rank") == 0) {
            ok = parse_u64(v, UINT32_MAX, &u);
            o.rank = (uint32_t)u;
        } else if (strcmp(name, "--alpha") == 0)
            ok = parse_double(v, &o.alpha);
        else if (strcmp(name, "--targets") == 0)
            ok = parse_targets(v, &o.targets);
        else if (strcmp(name, "--seed") == 0)
            ok = parse_u64(v, UINT64_MAX, &o.seed);
        else if (strcmp(v, "f32") == 0)
            o.dtype = DEVIO_F32;
        else if (strcmp(v, "f16") == 0)
            o.dtype = DEVIO_F16;
        else if (strcmp(v, "bf16") == 0)
            o.dtype = DEVIO_BF16;
        else
            ok = false;
        if (!ok) {
            fprintf(stderr, "devio-mkmodel: bad value '%s' for %s\n", v, name);
            return 2;
        }
    }
    if (!o.model_dir || !o.out_dir) {
        fprintf(stderr, "devio-mkmodel: --adapter needs --model DIR and --out DIR\n%s", usage);
        return 2;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    devio_status st = devio_mkmodel_write_adapter(&o, &err);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (st != DEVIO_OK) {
        fprintf(stderr, "devio-mkmodel: %s\n", err.message);
        return st == DEVIO_E_INVALID || st == DEVIO_E_UNSUPPORTED ? 2 : 1;
    }
    char targets[96] = "";
    size_t tl = 0;
    for (int t = 0; t < DEVIO_LORA_N_TARGETS && tl < sizeof targets; t++)
        if ((o.targets >> t) & 1u)
            tl += (size_t)snprintf(targets + tl, sizeof targets - tl, "%s%s", tl ? "," : "",
                                   devio_lora_target_name((devio_lora_target)t));
    static const char *const dtype_names[] = {"f32", "f16", "bf16"};
    double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    printf("devio-mkmodel: wrote %s: LoRA adapter for %s, rank %u, alpha %g%s, %s, %s, "
           "%.2f s\n",
           o.out_dir, o.model_dir, o.rank, o.alpha, o.use_rslora ? " (rsLoRA)" : "", targets,
           dtype_names[o.dtype], secs);
    return 0;
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--adapter") == 0)
            return adapter_main(argc, argv);

    devio_mkmodel_opts o = devio_mkmodel_opts_default();
    devio_error err = {0};

    /* First pass: the preset, so every other flag overrides it. */
    const char *preset = "tiny";
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(usage, stdout);
            return 0;
        }
        if (strncmp(argv[i], "--preset", 8) == 0 && (argv[i][8] == '\0' || argv[i][8] == '=')) {
            const char *eq = argv[i][8] == '=' ? argv[i] + 8 : NULL;
            preset = flag_value(argc, argv, &i, eq);
            if (!preset) {
                fprintf(stderr, "devio-mkmodel: --preset needs a value\n");
                return 2;
            }
        }
    }
    if (devio_mkmodel_preset(preset, &o, &err) != DEVIO_OK) {
        fprintf(stderr, "devio-mkmodel: %s\n", err.message);
        return 2;
    }

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        char name[32];
        const char *eq;
        if (flag_name(a, name, sizeof name, &eq) != 0)
            return 2;

        if (strcmp(name, "--tied") == 0 || strcmp(name, "--bias") == 0) {
            bool *dst = name[2] == 't' ? &o.tie_word_embeddings : &o.attention_bias;
            if (!parse_bool(eq, dst)) {
                fprintf(stderr, "devio-mkmodel: %s takes true or false\n", name);
                return 2;
            }
            continue;
        }
        /* Probe with a dummy value so an unknown flag never swallows the next argument. */
        devio_mkmodel_opts probe = o;
        if (apply_flag(&probe, name, "0") == FLAG_UNKNOWN) {
            fprintf(stderr, "devio-mkmodel: unknown flag '%s'\n%s", name, usage);
            return 2;
        }
        const char *v = flag_value(argc, argv, &i, eq);
        if (!v) {
            fprintf(stderr, "devio-mkmodel: %s needs a value\n", name);
            return 2;
        }
        if (apply_flag(&o, name, v) != FLAG_OK) {
            fprintf(stderr, "devio-mkmodel: bad value '%s' for %s\n", v, name);
            return 2;
        }
    }
    if (!o.out_dir) {
        fprintf(stderr, "devio-mkmodel: --out DIR is required\n%s", usage);
        return 2;
    }

    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    devio_status st = devio_mkmodel_write(&o, &err);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (st != DEVIO_OK) {
        fprintf(stderr, "devio-mkmodel: %s\n", err.message);
        return st == DEVIO_E_INVALID || st == DEVIO_E_UNSUPPORTED ? 2 : 1;
    }
    uint64_t params = devio_mkmodel_param_count(&o);
    static const char *const dtype_names[] = {"f32", "f16", "bf16"};
    double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    printf("devio-mkmodel: wrote %s: %s, %llu parameters, %s, %u shard%s, %.1f MB in "
           "%.2f s\n",
           o.out_dir, o.attention_bias ? "Qwen2 (q/k/v biases)" : "Llama",
           (unsigned long long)params, dtype_names[o.dtype], o.shards,
           o.shards == 1 ? "" : "s", (double)params * (o.dtype == DEVIO_F32 ? 4.0 : 2.0) / 1e6,
           secs);
    return 0;
}
