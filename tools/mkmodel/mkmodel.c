/* mkmodel.c - writes deterministic random Llama-family, Bamba and Mamba2 models in Hugging Face's on-disk format (config.json, safetensors, shard index).
 * It must never let anything but the options shape its bytes; mkfamily.c holds the Llama family's own parts, mkssm.c Bamba's and Mamba2's, mkadapter.c adapters, mkwrite.c the files. */
#include "tools/mkmodel/mkmodel.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tools/mkmodel/mkfamily.h"
#include "tools/mkmodel/mkssm.h"
#include "tools/mkmodel/mkwrite.h"

#define MK_MAX_DIM (1u << 20)

/* ---- options and the tensor list ---- */

devio_mkmodel_opts devio_mkmodel_opts_default(void)
{
    devio_mkmodel_opts o = {
        .out_dir = NULL,
        .arch = "llama",
        .shards = 1,
        .rope_theta = 10000.0,
        .rms_norm_eps = 1e-5,
        .time_step_min = 0.001, /* Hugging Face's defaults */
        .time_step_max = 0.1,
        .seed = 0,
    };
    devio_mkmodel_preset("tiny", &o, NULL);
    return o;
}

/* The presets: what each measures or checks is in devio-mkmodel --help.
 * Bamba's and Mamba2's mixers all have a conv bias and no projection bias;
 * Bamba's head_dim is hidden / heads by definition (0 here). */
static const struct preset {
    const char *name;
    mk_arch arch;
    uint32_t vocab, hidden, layers, heads, kv_heads, head_dim, ffn, positions;
    bool tied;
    devio_dtype dtype;
    struct {
        uint32_t heads, head_dim, expand, state, groups, conv;
    } ssm;
    uint64_t attn; /* bamba: bit i set = layer i is an attention layer */
    uint32_t window; /* mistral: sliding_window */
    double mult[4];  /* granite: embedding, attention, residual, logits */
} presets[] = {
    {"tiny", MK_ARCH_LLAMA, 256, 64, 2, 4, 2, 16, 128, 512, false, DEVIO_F32, {0}, 0, 0, {0}},
    {"small", MK_ARCH_LLAMA, 32000, 288, 6, 6, 6, 48, 768, 1024, true, DEVIO_F32, {0}, 0, 0, {0}},
    /* the stories110M shape */
    {"bench", MK_ARCH_LLAMA, 32000, 768, 12, 12, 12, 64, 2048, 1024, false, DEVIO_BF16, {0}, 0, 0,
     {0}},
    /* TinyLlama-1.1B's shape: what a GPU's decode speed is measured on */
    {"1b", MK_ARCH_LLAMA, 32000, 2048, 22, 32, 4, 64, 5632, 2048, false, DEVIO_BF16, {0}, 0, 0,
     {0}},
    {"tiny", MK_ARCH_BAMBA, 256, 64, 4, 4, 2, 0, 128, 512, false, DEVIO_F32,
     {8, 16, 2, 16, 2, 4}, 1ull << 1, 0, {0}},
    {"small", MK_ARCH_BAMBA, 32000, 288, 6, 6, 6, 0, 768, 1024, true, DEVIO_F32,
     {9, 64, 2, 64, 1, 4}, 1ull << 2 | 1ull << 5, 0, {0}},
    /* Llama bench's parameter count: ffn 1600 (not 2048) brings the mixers'
     * extra weight back to within 0.2% of it */
    {"bench", MK_ARCH_BAMBA, 32000, 768, 12, 12, 12, 0, 1600, 1024, false, DEVIO_BF16,
     {24, 64, 2, 128, 1, 4}, 1ull << 3 | 1ull << 7 | 1ull << 11, 0, {0}},
    {"tiny", MK_ARCH_MAMBA2, 256, 64, 2, 0, 0, 0, 0, 0, false, DEVIO_F32, {8, 16, 2, 16, 2, 4}, 0,
     0, {0}},
    {"small", MK_ARCH_MAMBA2, 32000, 288, 6, 0, 0, 0, 0, 0, true, DEVIO_F32,
     {9, 64, 2, 64, 1, 4}, 0, 0, {0}},
    /* The Llama family's other members: tiny keeps llama tiny's widths, small
     * has grouped kv heads (as these families' checkpoints do). */
    {"tiny", MK_ARCH_QWEN2, 256, 64, 2, 4, 2, 0, 128, 512, false, DEVIO_F32, {0}, 0, 0, {0}},
    {"small", MK_ARCH_QWEN2, 32000, 288, 6, 6, 2, 0, 768, 1024, true, DEVIO_F32, {0}, 0, 0, {0}},
    /* head_dim != hidden / heads, as in Qwen3's own checkpoints */
    {"tiny", MK_ARCH_QWEN3, 256, 64, 2, 4, 2, 32, 128, 512, false, DEVIO_F32, {0}, 0, 0, {0}},
    {"small", MK_ARCH_QWEN3, 32000, 288, 6, 6, 2, 64, 768, 1024, true, DEVIO_F32, {0}, 0, 0,
     {0}},
    /* windows shorter than the 300-token prompts of tests/python/hf_check.py */
    {"tiny", MK_ARCH_MISTRAL, 256, 64, 2, 4, 2, 16, 128, 512, false, DEVIO_F32, {0}, 0, 24, {0}},
    {"small", MK_ARCH_MISTRAL, 32000, 288, 6, 6, 2, 48, 768, 1024, false, DEVIO_F32, {0}, 0, 128,
     {0}},
    /* Granite 3's kind of multipliers */
    {"tiny", MK_ARCH_GRANITE, 256, 64, 2, 4, 2, 0, 128, 512, false, DEVIO_F32, {0}, 0, 0,
     {12.0, 0.0078125, 0.22, 8.0}},
    {"small", MK_ARCH_GRANITE, 32000, 288, 6, 6, 2, 0, 768, 1024, true, DEVIO_F32, {0}, 0, 0,
     {12.0, 0.0078125, 0.22, 8.0}},
};

static void mk_preset_apply(const struct preset *p, devio_mkmodel_opts *o)
{
    o->vocab_size = p->vocab;
    o->hidden_size = p->hidden;
    o->n_layers = p->layers;
    o->n_heads = p->heads;
    o->n_kv_heads = p->kv_heads;
    o->head_dim = p->head_dim;
    o->intermediate_size = p->ffn;
    o->max_position_embeddings = p->positions;
    o->tie_word_embeddings = p->tied;
    o->dtype = p->dtype;
    o->attention_bias = p->arch == MK_ARCH_QWEN2;
    o->ssm_heads = p->ssm.heads;
    o->ssm_head_dim = p->ssm.head_dim;
    o->ssm_expand = p->ssm.expand;
    o->ssm_state = p->ssm.state;
    o->ssm_groups = p->ssm.groups;
    o->ssm_conv = p->ssm.conv;
    o->ssm_conv_bias = !mk_arch_is_family(p->arch);
    o->ssm_proj_bias = false;
    memset(o->attn_layers, 0, sizeof o->attn_layers);
    o->attn_layers[0] = p->attn;
    o->sliding_window = p->window;
    o->embedding_multiplier = p->mult[0];
    o->attention_multiplier = p->mult[1];
    o->residual_multiplier = p->mult[2];
    o->logits_scaling = p->mult[3];
}

devio_status devio_mkmodel_preset(const char *name, devio_mkmodel_opts *o, devio_error *err)
{
    mk_arch arch;
    if (!mk_arch_parse(o->arch, &arch))
        return devio_fail(err, DEVIO_E_INVALID,
                          "unknown architecture '%.40s' (" MK_ARCH_NAMES ")", o->arch);
    char names[64] = "";
    size_t len = 0;
    for (size_t i = 0; i < sizeof presets / sizeof *presets; i++) {
        const struct preset *p = &presets[i];
        if (p->arch != arch)
            continue;
        if (strcmp(name, p->name) == 0) {
            mk_preset_apply(p, o);
            return DEVIO_OK;
        }
        if (len < sizeof names)
            len += (size_t)snprintf(names + len, sizeof names - len, "%s%s", len ? ", " : "",
                                    p->name);
    }
    return devio_fail(err, DEVIO_E_INVALID, "unknown preset '%.40s' for %.40s (%s)", name,
                      o->arch ? o->arch : "llama", names);
}

static uint32_t mk_head_dim(const devio_mkmodel_opts *o)
{
    return o->head_dim ? o->head_dim : o->hidden_size / o->n_heads;
}

/* A dimension and the flag that sets it, for messages. */
struct mk_dim {
    const char *what;
    uint32_t v;
};

/* Each of dims[0..n) in [1, MK_MAX_DIM]. */
static devio_status mk_check_dims(const struct mk_dim *dims, size_t n, devio_error *err)
{
    for (size_t i = 0; i < n; i++) {
        if (dims[i].v == 0 || dims[i].v > MK_MAX_DIM) {
            devio_fail(err, DEVIO_E_INVALID, "%s must be in [1, %u], got %u", dims[i].what,
                       MK_MAX_DIM, dims[i].v);
            return DEVIO_E_INVALID;
        }
    }
    return DEVIO_OK;
}

/* The attention and MLP of llama and bamba. */
static devio_status mk_check_attention(const devio_mkmodel_opts *o, devio_error *err)
{
    const struct mk_dim dims[] = {
        {"ffn", o->intermediate_size}, {"heads", o->n_heads}, {"kv-heads", o->n_kv_heads},
        {"max-pos", o->max_position_embeddings},
    };
    devio_status st = mk_check_dims(dims, sizeof dims / sizeof dims[0], err);
    if (st != DEVIO_OK)
        return st;
    if (o->n_heads > 1024) {
        devio_fail(err, DEVIO_E_INVALID, "heads must be at most 1024");
        return DEVIO_E_INVALID;
    }
    if (o->n_heads % o->n_kv_heads != 0) {
        devio_fail(err, DEVIO_E_INVALID, "heads %u is not a multiple of kv-heads %u", o->n_heads,
                   o->n_kv_heads);
        return DEVIO_E_INVALID;
    }
    if (o->head_dim == 0 && o->hidden_size % o->n_heads != 0) {
        devio_fail(err, DEVIO_E_INVALID,
                   "hidden %u is not a multiple of heads %u (give --head-dim)", o->hidden_size,
                   o->n_heads);
        return DEVIO_E_INVALID;
    }
    uint32_t hd = mk_head_dim(o);
    if (hd % 2 != 0 || hd > 1024) {
        devio_fail(err, DEVIO_E_INVALID, "head-dim %u must be even and at most 1024", hd);
        return DEVIO_E_INVALID;
    }
    if (!(o->rope_theta > 0.0) || o->rope_theta > 1e12) {
        devio_fail(err, DEVIO_E_INVALID, "rope-theta must be in (0, 1e12]");
        return DEVIO_E_INVALID;
    }
    return DEVIO_OK;
}

/* Every option, for the architecture it names (*arch on success). */
static devio_status mk_check(const devio_mkmodel_opts *o, mk_arch *arch, devio_error *err)
{
    if (!mk_arch_parse(o->arch, arch)) {
        devio_fail(err, DEVIO_E_INVALID, "unknown architecture '%.40s' (" MK_ARCH_NAMES ")",
                   o->arch);
        return DEVIO_E_INVALID;
    }
    const struct mk_dim dims[] = {
        {"vocab", o->vocab_size}, {"hidden", o->hidden_size}, {"layers", o->n_layers},
    };
    devio_status st = mk_check_dims(dims, sizeof dims / sizeof dims[0], err);
    if (st != DEVIO_OK)
        return st;
    if (o->n_layers > DEVIO_MKMODEL_MAX_LAYERS) {
        devio_fail(err, DEVIO_E_INVALID, "layers must be at most %u", DEVIO_MKMODEL_MAX_LAYERS);
        return DEVIO_E_INVALID;
    }
    if (*arch != MK_ARCH_MAMBA2 && (st = mk_check_attention(o, err)) != DEVIO_OK)
        return st;
    if (!(o->rms_norm_eps > 0.0) || o->rms_norm_eps > 1.0) {
        devio_fail(err, DEVIO_E_INVALID, "eps must be in (0, 1]");
        return DEVIO_E_INVALID;
    }
    if (o->dtype != DEVIO_F32 && o->dtype != DEVIO_F16 && o->dtype != DEVIO_BF16) {
        devio_fail(err, DEVIO_E_INVALID, "dtype must be f32, f16 or bf16");
        return DEVIO_E_INVALID;
    }
    if (o->shards == 0 || o->shards > 99999) {
        devio_fail(err, DEVIO_E_INVALID, "shards must be in [1, 99999]");
        return DEVIO_E_INVALID;
    }
    if ((st = mk_ssm_check(o, *arch, err)) != DEVIO_OK)
        return st;
    return mk_family_check(o, *arch, err);
}

/* Builds every tensor of the checked model, sorted by name (the order of
 * both the header and the data), with shards and offsets assigned. */
static devio_status mk_list_build(const devio_mkmodel_opts *o, mk_arch arch, mk_list *L,
                                  devio_error *err)
{
    size_t n = MK_MAX_TOP_TENSORS + (size_t)MK_MAX_LAYER_TENSORS * o->n_layers;
    L->n = 0;
    L->t = calloc(n, sizeof *L->t);
    if (!L->t) {
        devio_fail(err, DEVIO_E_NOMEM, "out of memory for %zu tensor entries", n);
        return DEVIO_E_NOMEM;
    }
    if (mk_arch_is_family(arch))
        mk_family_list_add(o, arch, L);
    else
        mk_ssm_list_add(o, arch, L);
    mk_list_sort(L);

    if (o->shards > L->n) {
        devio_fail(err, DEVIO_E_INVALID, "%u shards requested but the model has only %zu tensors",
                   o->shards, L->n);
        free(L->t);
        L->t = NULL;
        return DEVIO_E_INVALID;
    }
    /* Fill shards in name order, moving on before a tensor would take the
     * shard past an equal share of the bytes still to place, or when every
     * remaining shard still needs a tensor; the last takes what is left. */
    const uint64_t es = mk_dtype_size(o->dtype);
    uint64_t total = 0;
    for (size_t i = 0; i < L->n; i++)
        total += L->t[i].nelem * es;
    uint64_t target = (total + o->shards - 1) / o->shards, left = total;
    uint32_t s = 0;
    uint64_t acc = 0;
    for (size_t i = 0; i < L->n; i++) {
        uint64_t bytes = L->t[i].nelem * es;
        if (acc > 0 && s + 1 < o->shards &&
            (acc + bytes > target || L->n - i <= (size_t)(o->shards - 1 - s))) {
            s++;
            acc = 0;
            target = (left + (o->shards - s) - 1) / (o->shards - s);
        }
        left -= bytes;
        L->t[i].shard = s;
        L->t[i].offset = acc;
        acc += bytes;
    }
    return DEVIO_OK;
}

uint64_t devio_mkmodel_param_count(const devio_mkmodel_opts *o)
{
    mk_arch arch;
    if (!mk_arch_parse(o->arch, &arch) || mk_arch_is_family(arch))
        return mk_family_param_count(o, mk_arch_parse(o->arch, &arch) ? arch : MK_ARCH_LLAMA);
    return mk_ssm_param_count(o, arch);
}

devio_status devio_mkmodel_values(const devio_mkmodel_opts *o, const char *name, uint64_t start,
                                  size_t n, float *dst, devio_error *err)
{
    mk_arch arch;
    devio_status st = mk_check(o, &arch, err);
    if (st != DEVIO_OK)
        return st;
    mk_list L;
    devio_mkmodel_opts one = *o;
    one.shards = 1;
    if ((st = mk_list_build(&one, arch, &L, err)) != DEVIO_OK)
        return st;
    st = mk_list_values(&L, o->seed, name, start, n, dst, "model", err);
    free(L.t);
    return st;
}

/* ---- files ---- */

static void mk_shard_name(char *dst, size_t cap, uint32_t shard, uint32_t shards)
{
    if (shards == 1)
        snprintf(dst, cap, "model.safetensors");
    else
        snprintf(dst, cap, "model-%05u-of-%05u.safetensors", shard + 1, shards);
}

static devio_status mk_write_shard(const devio_mkmodel_opts *o, const mk_list *L,
                                   uint32_t shard, const mk_chunk *ck, devio_error *err)
{
    char name[64];
    mk_shard_name(name, sizeof name, shard, o->shards);
    return mk_write_st(o->out_dir, name, L, shard, o->dtype, o->seed, ck, err);
}

static void mk_index(const devio_mkmodel_opts *o, const mk_list *L, mk_buf *b)
{
    const uint64_t es = mk_dtype_size(o->dtype);
    uint64_t total = 0;
    for (size_t i = 0; i < L->n; i++)
        total += L->t[i].nelem * es;
    mk_buf_printf(b, "{\n  \"metadata\": {\n    \"total_size\": %llu\n  },\n  \"weight_map\": {",
                  (unsigned long long)total);
    char name[64];
    for (size_t i = 0; i < L->n; i++) {
        mk_shard_name(name, sizeof name, L->t[i].shard, o->shards);
        mk_buf_printf(b, "%s\n    \"%s\": \"%s\"", i ? "," : "", L->t[i].name, name);
    }
    mk_buf_printf(b, "\n  }\n}\n");
}

/* Removes the other layout's entry file, so the directory never offers a
 * stale single file next to a fresh index (or the reverse). */
static devio_status mk_unlink_stale(const char *dir, const char *name, devio_error *err)
{
    char *p = mk_path(dir, name, "");
    if (!p) {
        devio_fail(err, DEVIO_E_NOMEM, "out of memory");
        return DEVIO_E_NOMEM;
    }
    devio_status st = DEVIO_OK;
    if (unlink(p) != 0 && errno != ENOENT) {
        devio_fail(err, DEVIO_E_IO, "cannot remove stale '%.150s': %s", p, strerror(errno));
        st = DEVIO_E_IO;
    }
    free(p);
    return st;
}

devio_status devio_mkmodel_write(const devio_mkmodel_opts *o, devio_error *err)
{
    mk_arch arch;
    devio_status st = mk_check(o, &arch, err);
    if (st != DEVIO_OK)
        return st;
    if (!o->out_dir || !o->out_dir[0]) {
        devio_fail(err, DEVIO_E_INVALID, "no output directory given");
        return DEVIO_E_INVALID;
    }
    /* Every option is checked before the file system is touched. */
    mk_list L = {0};
    if ((st = mk_list_build(o, arch, &L, err)) != DEVIO_OK)
        return st;
    mk_buf cb = {0}, ib = {0};
    mk_chunk ck = {0};
    if ((st = mk_chunk_alloc(&ck, err)) != DEVIO_OK ||
        (st = mk_mkdirs(o->out_dir, err)) != DEVIO_OK)
        goto out;
    if ((st = mk_unlink_stale(o->out_dir,
                              o->shards == 1 ? "model.safetensors.index.json"
                                             : "model.safetensors",
                              err)) != DEVIO_OK)
        goto out;
    for (uint32_t s = 0; s < o->shards; s++)
        if ((st = mk_write_shard(o, &L, s, &ck, err)) != DEVIO_OK)
            goto out;
    if (o->shards > 1) {
        mk_index(o, &L, &ib);
        if ((st = mk_write_json(o->out_dir, "model.safetensors.index.json", &ib, err)) !=
            DEVIO_OK)
            goto out;
    }
    if (mk_arch_is_family(arch))
        mk_family_config(o, arch, &cb);
    else
        mk_ssm_config(o, arch, &cb);
    st = mk_write_json(o->out_dir, "config.json", &cb, err);
out:
    free(cb.s);
    free(ib.s);
    mk_chunk_free(&ck);
    free(L.t);
    return st;
}
