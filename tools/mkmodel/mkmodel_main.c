/* mkmodel_main.c - the devio-mkmodel command: flags in, a seeded random model or PEFT adapter directory out.
 * It only parses flags and calls devio_mkmodel_write(_adapter); it must never decide a byte of the output itself. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "common/cli.h"
#include "common/clock.h"
#include "tools/mkmodel/mkmodel.h"

static const char usage[] =
    "usage: devio-mkmodel [--preset tiny|small|bench|1b] [--arch ARCH]\n"
    "                     [--seed N] [--dtype f32|f16|bf16] [--shards N] --out DIR\n"
    "                     [--vocab N] [--hidden N] [--layers N] [--heads N] [--kv-heads N]\n"
    "                     [--head-dim N] [--ffn N] [--max-pos N] [--rope-theta X] [--eps X]\n"
    "                     [--tied[=true|false]] [--bias[=true|false]]\n"
    "                     [--rope-scaling none|linear|llama3|yarn] [--rope-factor X]\n"
    "                     [--rope-original-max N] [--window N]\n"
    "                     [--embedding-multiplier X] [--attention-multiplier X]\n"
    "                     [--residual-multiplier X] [--logits-scaling X]\n"
    "                     [--ssm-heads N] [--ssm-head-dim N] [--ssm-expand N] [--ssm-state N]\n"
    "                     [--ssm-groups N] [--ssm-conv N] [--attn-layers LIST|none]\n"
    "                     [--no-conv-bias] [--proj-bias[=true|false]]\n"
    "\n"
    "Writes config.json and model.safetensors (or N shards and\n"
    "model.safetensors.index.json) of a model with seeded random weights, in\n"
    "Hugging Face's format. The same options give the same bytes. ARCH:\n"
    "  llama    LlamaForCausalLM (with --bias: q/k/v biases, written as Qwen2)\n"
    "  qwen2    Qwen2ForCausalLM: q/k/v biases, always\n"
    "  qwen3    Qwen3ForCausalLM: q_norm and k_norm on every head, explicit head_dim\n"
    "  mistral  MistralForCausalLM: sliding-window attention (--window N, 0 = null)\n"
    "  granite  GraniteForCausalLM: the embedding, attention, residual and logits\n"
    "           multipliers\n"
    "  bamba    BambaForCausalLM: hybrid Mamba-2 and attention\n"
    "  mamba2   Mamba2ForCausalLM: Mamba-2 mixers only\n"
    "\n"
    "presets (default tiny; --arch picks the table, default llama):\n"
    "llama\n"
    "  tiny   vocab 256, hidden 64, 2 layers, 4 heads, 2 kv heads, head_dim 16,\n"
    "         ffn 128, 512 positions, untied, f32 (106,816 parameters)\n"
    "  small  vocab 32000, hidden 288, 6 layers, 6 heads, ffn 768, 1024 positions,\n"
    "         tied, f32 (15,191,712 parameters)\n"
    "  bench  vocab 32000, hidden 768, 12 layers, 12 heads, ffn 2048, 1024 positions,\n"
    "         untied, bf16 (134,105,856 parameters)\n"
    "  1b     vocab 32000, hidden 2048, 22 layers, 32 heads, 4 kv heads, ffn 5632,\n"
    "         2048 positions, untied, bf16 (1,100,048,384 parameters)\n"
    "qwen2 (q/k/v biases)\n"
    "  tiny   llama tiny with q/k/v biases (107,072 parameters)\n"
    "  small  vocab 32000, hidden 288, 6 layers, 6 heads, 2 kv heads, ffn 768,\n"
    "         1024 positions, tied, f32 (14,531,040 parameters)\n"
    "qwen3 (head_dim != hidden / heads)\n"
    "  tiny   vocab 256, hidden 64, 2 layers, 4 heads, 2 kv heads, head_dim 32,\n"
    "         ffn 128, 512 positions, untied, f32 (131,520 parameters)\n"
    "  small  vocab 32000, hidden 288, 6 layers, 6 heads, 2 kv heads, head_dim 64,\n"
    "         ffn 768, 1024 positions, tied, f32 (14,971,296 parameters)\n"
    "mistral\n"
    "  tiny   llama tiny with window 24 (106,816 parameters)\n"
    "  small  vocab 32000, hidden 288, 6 layers, 6 heads, 2 kv heads, ffn 768,\n"
    "         1024 positions, window 128, untied, f32 (23,744,160 parameters)\n"
    "granite (embedding 12, attention 0.0078125, residual 0.22, logits 8)\n"
    "  tiny   llama tiny's shape (106,816 parameters)\n"
    "  small  qwen2 small's shape without biases (14,528,160 parameters)\n"
    "bamba (hybrid: Mamba-2 mixers, attention in --attn-layers, an MLP in every\n"
    "layer; mixers: expand 2, conv 4, conv bias, no projection bias)\n"
    "  tiny   vocab 256, hidden 64, 4 layers, attention in 1, 4 heads, 2 kv heads,\n"
    "         ffn 128, 512 positions, 8 SSM heads of 16, state 16, 2 groups,\n"
    "         untied, f32 (234,824 parameters)\n"
    "  small  vocab 32000, hidden 288, 6 layers, attention in 2,5, 6 heads, ffn 768,\n"
    "         1024 positions, 9 SSM heads of 64, state 64, 1 group, tied, f32\n"
    "         (16,029,580 parameters)\n"
    "  bench  vocab 32000, hidden 768, 12 layers, attention in 3,7,11, 12 heads,\n"
    "         ffn 1600, 1024 positions, 24 SSM heads of 64, state 128, 1 group,\n"
    "         untied, bf16 (134,366,856 parameters; llama bench's size)\n"
    "mamba2 (Mamba-2 mixers only; expand 2, conv 4, conv bias, no projection bias)\n"
    "  tiny   vocab 256, hidden 64, 2 layers, 8 SSM heads of 16, state 16,\n"
    "         2 groups, untied, f32 (93,552 parameters)\n"
    "  small  vocab 32000, hidden 288, 6 layers, 9 SSM heads of 64, state 64,\n"
    "         1 group, tied, f32 (12,465,474 parameters)\n"
    "Flags after the preset override it, whatever their order on the command line.\n"
    "SSM heads x SSM head dim must equal expand x hidden. Flags an architecture\n"
    "does not have are refused (mamba2: --ffn, --heads, --kv-heads, --head-dim,\n"
    "--max-pos; llama, qwen2, qwen3, mistral, granite: the SSM flags,\n"
    "--attn-layers, --proj-bias; --window: mistral only; the multipliers: granite\n"
    "only; --rope-scaling and its flags: the first five only; --head-dim other\n"
    "than hidden / heads: not qwen2, granite or bamba, whose configs have none).\n"
    "\n"
    "RoPE scaling writes \"rope_scaling\" as transformers does: linear {factor};\n"
    "llama3 {factor, low_freq_factor 1.0, high_freq_factor 4.0,\n"
    "original_max_position_embeddings}; yarn {factor, beta_fast 32.0,\n"
    "beta_slow 1.0, original_max_position_embeddings}. --rope-factor defaults to 8,\n"
    "--rope-original-max to max-pos / factor (tiny: 64); yarn needs max-pos =\n"
    "factor x original max (transformers 4.x uses that ratio as yarn's factor).\n"
    "\n"
    "       devio-mkmodel --adapter --model DIR [--rank 8] [--alpha 8]\n"
    "                     [--targets q_proj,v_proj] [--rslora[=true|false]]\n"
    "                     [--dtype f32|f16|bf16] [--seed N] --out DIR\n"
    "\n"
    "Writes adapter_config.json and adapter_model.safetensors of a PEFT LoRA\n"
    "adapter for the model in DIR (its shapes decide the adapter's), with seeded\n"
    "uniform random lora_A and lora_B (PEFT starts lora_B at zero; these are\n"
    "random so that the adapter changes the outputs). Targets, comma-separated:\n"
    "q_proj k_proj v_proj o_proj gate_proj up_proj down_proj in_proj out_proj (the\n"
    "last two are a Mamba-2 mixer's); each goes into the layers that have it.\n"
    "Defaults are PEFT's: rank 8, alpha 8, q_proj,v_proj.\n";

/* What both tables write into; the mode decides which table parses. */
typedef struct flags {
    devio_mkmodel_opts model;
    devio_mkmodel_adapter_opts adapter;
    const char *preset;
    bool adapter_mode;
    bool no_conv_bias; /* applied over the preset's ssm_conv_bias */
} flags;

static bool parse_dtype(const char *v, void *field)
{
    static const char *const names[] = {"f32", "f16", "bf16"};
    static const devio_dtype types[] = {DEVIO_F32, DEVIO_F16, DEVIO_BF16};
    for (size_t i = 0; i < 3; i++)
        if (strcmp(v, names[i]) == 0) {
            *(devio_dtype *)field = types[i];
            return true;
        }
    return false;
}

/* "none", "linear", "llama3", "yarn" -> a devio_mkmodel_rope. */
static bool parse_rope(const char *v, void *field)
{
    static const char *const names[] = {"none", "linear", "llama3", "yarn"};
    static const devio_mkmodel_rope types[] = {DEVIO_MKMODEL_ROPE_NONE, DEVIO_MKMODEL_ROPE_LINEAR,
                                               DEVIO_MKMODEL_ROPE_LLAMA3, DEVIO_MKMODEL_ROPE_YARN};
    for (size_t i = 0; i < 4; i++)
        if (strcmp(v, names[i]) == 0) {
            *(devio_mkmodel_rope *)field = types[i];
            return true;
        }
    return false;
}

/* "q_proj,v_proj" -> target bits. False on an empty list or unknown name. */
static bool parse_targets(const char *s, void *field)
{
    uint32_t bits = 0;
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
    *(uint32_t *)field = bits;
    return true;
}

/* "2,5" -> the bits of attn_layers (a uint64_t[DEVIO_MKMODEL_MAX_LAYERS / 64]);
 * "none" -> no attention layer. False on an empty item or a layer past the cap;
 * the writer checks the indices against --layers. */
static bool parse_attn_layers(const char *s, void *field)
{
    uint64_t bits[DEVIO_MKMODEL_MAX_LAYERS / 64] = {0};
    if (strcmp(s, "none") != 0) {
        while (*s) {
            char *end;
            if (*s < '0' || *s > '9')
                return false;
            unsigned long v = strtoul(s, &end, 10);
            if (v >= DEVIO_MKMODEL_MAX_LAYERS || (*end != ',' && *end != '\0'))
                return false;
            bits[v / 64] |= 1ull << (v % 64);
            s = end;
            if (*s == ',' && *++s == '\0')
                return false;
        }
    }
    memcpy(field, bits, sizeof bits);
    return true;
}

#define M(f) (offsetof(flags, model) + offsetof(devio_mkmodel_opts, f))
#define A(f) (offsetof(flags, adapter) + offsetof(devio_mkmodel_adapter_opts, f))
#define U32(name, field, text) \
    {.flag = name, .type = DEVIO_OPT_U32, .offset = M(field), .metavar = "N", .help = text}
#define F64(name, field, text) \
    {.flag = name, .type = DEVIO_OPT_F64, .offset = M(field), .metavar = "X", .help = text}
static const devio_opt model_opts[] = {
    {.flag = "preset", .type = DEVIO_OPT_STR, .offset = offsetof(flags, preset),
     .metavar = "NAME", .help = "tiny|small|bench|1b, per --arch [tiny]; flags override it"},
    {.flag = "arch", .type = DEVIO_OPT_STR, .offset = M(arch), .metavar = "ARCH",
     .help = "llama|qwen2|qwen3|mistral|granite|bamba|mamba2 [llama]; picks the preset "
             "table"},
    {.flag = "seed", .type = DEVIO_OPT_U64, .offset = M(seed), .metavar = "N", .help = "[0]"},
    {.flag = "dtype", .type = DEVIO_OPT_CUSTOM, .offset = M(dtype), .metavar = "f32|f16|bf16",
     .help = "weight type [the preset's]", .parse = parse_dtype},
    U32("shards", shards, "safetensors files, with an index when > 1 [1]"),
    {.flag = "out", .type = DEVIO_OPT_STR, .offset = M(out_dir), .metavar = "DIR",
     .help = "where to write (required)"},
    U32("vocab", vocab_size, "vocabulary size"),
    U32("hidden", hidden_size, "hidden size"),
    U32("layers", n_layers, "decoder layers"),
    U32("heads", n_heads, "attention heads"),
    U32("kv-heads", n_kv_heads, "key/value heads"),
    U32("head-dim", head_dim, "head dimension, 0 = hidden / heads"),
    U32("ffn", intermediate_size, "intermediate size"),
    U32("max-pos", max_position_embeddings, "max_position_embeddings"),
    {.flag = "rope-theta", .type = DEVIO_OPT_F64, .offset = M(rope_theta), .metavar = "X",
     .help = "rope_theta [10000]"},
    {.flag = "eps", .type = DEVIO_OPT_F64, .offset = M(rms_norm_eps), .metavar = "X",
     .help = "rms_norm_eps [1e-5]"},
    {.flag = "tied", .type = DEVIO_OPT_BOOL, .offset = M(tie_word_embeddings),
     .help = "tie lm_head to the embedding (--tied=false unties)"},
    {.flag = "bias", .type = DEVIO_OPT_BOOL, .offset = M(attention_bias),
     .help = "q/k/v biases, written as a Qwen2 model (llama; qwen2 always has them)"},
    {.flag = "rope-scaling", .type = DEVIO_OPT_CUSTOM, .offset = M(rope_scaling),
     .metavar = "TYPE", .help = "none|linear|llama3|yarn: rope_scaling [none]",
     .parse = parse_rope},
    F64("rope-factor", rope_factor, "rope_scaling's factor [8]"),
    U32("rope-original-max", rope_original_max,
        "llama3's and yarn's original_max_position_embeddings [max-pos / factor]"),
    U32("window", sliding_window, "mistral's sliding_window, 0 = null [the preset's]"),
    F64("embedding-multiplier", embedding_multiplier, "granite's [12]"),
    F64("attention-multiplier", attention_multiplier,
        "granite's, in place of 1/sqrt(head_dim) [0.0078125]"),
    F64("residual-multiplier", residual_multiplier, "granite's [0.22]"),
    F64("logits-scaling", logits_scaling, "granite's: logits are divided by it [8]"),
    U32("ssm-heads", ssm_heads, "Mamba-2 heads (bamba, mamba2)"),
    U32("ssm-head-dim", ssm_head_dim, "Mamba-2 head dimension"),
    U32("ssm-expand", ssm_expand, "Mamba-2 inner width / hidden"),
    U32("ssm-state", ssm_state, "Mamba-2 state size per head"),
    U32("ssm-groups", ssm_groups, "Mamba-2 B/C groups, dividing ssm-heads"),
    U32("ssm-conv", ssm_conv, "Mamba-2 convolution width"),
    {.flag = "attn-layers", .type = DEVIO_OPT_CUSTOM, .offset = M(attn_layers),
     .metavar = "LIST", .help = "bamba's attention layers, e.g. 1,3, or none",
     .parse = parse_attn_layers},
    {.flag = "no-conv-bias", .type = DEVIO_OPT_BOOL, .offset = offsetof(flags, no_conv_bias),
     .help = "no conv1d.bias in the mixers"},
    {.flag = "proj-bias", .type = DEVIO_OPT_BOOL, .offset = M(ssm_proj_bias),
     .help = "in_proj and out_proj biases in the mixers"},
    {.flag = "adapter", .type = DEVIO_OPT_BOOL, .offset = offsetof(flags, adapter_mode),
     .help = "write a PEFT adapter instead (see below)"},
};
static const devio_opt adapter_opts[] = {
    {.flag = "adapter", .type = DEVIO_OPT_BOOL, .offset = offsetof(flags, adapter_mode),
     .help = "write a PEFT adapter"},
    {.flag = "model", .type = DEVIO_OPT_STR, .offset = A(model_dir), .metavar = "DIR",
     .help = "the base model (required)"},
    {.flag = "out", .type = DEVIO_OPT_STR, .offset = A(out_dir), .metavar = "DIR",
     .help = "where to write (required)"},
    {.flag = "rank", .type = DEVIO_OPT_U32, .offset = A(rank), .metavar = "N", .help = "r [8]"},
    {.flag = "alpha", .type = DEVIO_OPT_F64, .offset = A(alpha), .metavar = "X",
     .help = "lora_alpha [8]"},
    {.flag = "targets", .type = DEVIO_OPT_CUSTOM, .offset = A(targets), .metavar = "LIST",
     .help = "comma-separated modules [q_proj,v_proj]", .parse = parse_targets},
    {.flag = "rslora", .type = DEVIO_OPT_BOOL, .offset = A(use_rslora),
     .help = "use_rslora: scale alpha / sqrt(r)"},
    {.flag = "dtype", .type = DEVIO_OPT_CUSTOM, .offset = A(dtype), .metavar = "f32|f16|bf16",
     .help = "weight type [f32]", .parse = parse_dtype},
    {.flag = "seed", .type = DEVIO_OPT_U64, .offset = A(seed), .metavar = "N", .help = "[0]"},
};
#undef U32
#undef F64
#undef M
#undef A

static const devio_cli model_cli = {
    .prog = "devio-mkmodel",
    .usage = usage,
    .opts = model_opts,
    .n_opts = sizeof model_opts / sizeof *model_opts,
};
static const devio_cli adapter_cli = {
    .prog = "devio-mkmodel",
    .usage = usage,
    .opts = adapter_opts,
    .n_opts = sizeof adapter_opts / sizeof *adapter_opts,
};

static const char *const dtype_names[] = {"f32", "f16", "bf16"};

static int adapter_main(const devio_mkmodel_adapter_opts *o)
{
    devio_error err = {0};
    if (!o->model_dir || !o->out_dir) {
        fprintf(stderr, "devio-mkmodel: --adapter needs --model DIR and --out DIR\n");
        return 2;
    }
    double t0 = devio_clock_s();
    devio_status st = devio_mkmodel_write_adapter(o, &err);
    double secs = devio_clock_s() - t0;
    if (st != DEVIO_OK) {
        fprintf(stderr, "devio-mkmodel: %s\n", err.message);
        return st == DEVIO_E_INVALID || st == DEVIO_E_UNSUPPORTED ? 2 : 1;
    }
    char targets[96] = "";
    size_t tl = 0;
    for (int t = 0; t < DEVIO_LORA_N_TARGETS && tl < sizeof targets; t++)
        if ((o->targets >> t) & 1u)
            tl += (size_t)snprintf(targets + tl, sizeof targets - tl, "%s%s", tl ? "," : "",
                                   devio_lora_target_name((devio_lora_target)t));
    printf("devio-mkmodel: wrote %s: LoRA adapter for %s, rank %u, alpha %g%s, %s, %s, "
           "%.2f s\n",
           o->out_dir, o->model_dir, o->rank, o->alpha, o->use_rslora ? " (rsLoRA)" : "",
           targets, dtype_names[o->dtype], secs);
    return 0;
}

static const char *model_kind(const devio_mkmodel_opts *o)
{
    static const struct {
        const char *arch, *kind;
    } kinds[] = {
        {"bamba", "Bamba (hybrid Mamba-2 and attention)"},
        {"mamba2", "Mamba2"},
        {"qwen2", "Qwen2 (q/k/v biases)"},
        {"qwen3", "Qwen3 (q/k norms)"},
        {"mistral", "Mistral"},
        {"granite", "Granite"},
    };
    for (size_t i = 0; o->arch && i < sizeof kinds / sizeof *kinds; i++)
        if (strcmp(o->arch, kinds[i].arch) == 0)
            return kinds[i].kind;
    return o->attention_bias ? "Qwen2 (q/k/v biases)" : "Llama";
}

int main(int argc, char **argv)
{
    flags f = {.model = devio_mkmodel_opts_default(),
               .adapter = devio_mkmodel_adapter_opts_default(),
               .preset = "tiny"};
    bool adapter_mode = false;
    for (int i = 1; i < argc; i++)
        adapter_mode = adapter_mode || strcmp(argv[i], "--adapter") == 0;
    devio_cli_result cr;
    if (adapter_mode) {
        cr = devio_cli_parse(&adapter_cli, &f, argc, argv, NULL, NULL, stdout, stderr);
        return cr != DEVIO_CLI_OK ? (cr == DEVIO_CLI_EXIT ? 0 : 2) : adapter_main(&f.adapter);
    }
    /* Two passes: the first finds the preset (and checks every flag), the
     * second applies the flags over the preset, whatever their order. */
    flags first = f;
    cr = devio_cli_parse(&model_cli, &first, argc, argv, NULL, NULL, stdout, stderr);
    if (cr != DEVIO_CLI_OK)
        return cr == DEVIO_CLI_EXIT ? 0 : 2;
    devio_error err = {0};
    f.model.arch = first.model.arch; /* the preset table is the architecture's */
    if (devio_mkmodel_preset(first.preset, &f.model, &err) != DEVIO_OK) {
        fprintf(stderr, "devio-mkmodel: %s\n", err.message);
        return 2;
    }
    devio_cli_parse(&model_cli, &f, argc, argv, NULL, NULL, stdout, stderr);
    if (f.no_conv_bias)
        f.model.ssm_conv_bias = false;
    const devio_mkmodel_opts *o = &f.model;
    if (!o->out_dir) {
        fprintf(stderr, "devio-mkmodel: --out DIR is required (see --help)\n");
        return 2;
    }
    double t0 = devio_clock_s();
    devio_status st = devio_mkmodel_write(o, &err);
    double secs = devio_clock_s() - t0;
    if (st != DEVIO_OK) {
        fprintf(stderr, "devio-mkmodel: %s\n", err.message);
        return st == DEVIO_E_INVALID || st == DEVIO_E_UNSUPPORTED ? 2 : 1;
    }
    uint64_t params = devio_mkmodel_param_count(o);
    printf("devio-mkmodel: wrote %s: %s, %llu parameters, %s, %u shard%s, %.1f MB in "
           "%.2f s\n",
           o->out_dir, model_kind(o),
           (unsigned long long)params, dtype_names[o->dtype], o->shards,
           o->shards == 1 ? "" : "s", (double)params * (o->dtype == DEVIO_F32 ? 4.0 : 2.0) / 1e6,
           secs);
    return 0;
}
