/* model_config.c - reads the fields of a Hugging Face config.json (the Llama family, Bamba, Mamba2) into devio_model_config.
 * It must never accept a value outside the bounds below, nor a feature that would make a backend compute other numbers. */
#include "device/model/model_config.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "device/numerics/numerics.h"
#include "device/status.h"

/* Bounds past which a config is treated as corrupt rather than large. */
#define MAX_VOCAB (1u << 24)
#define MAX_HIDDEN (1u << 16)
#define MAX_FFN (1u << 20)
#define MAX_LAYERS 1024u
#define MAX_HEADS 1024u
#define MAX_HEAD_DIM 1024u
#define MAX_POSITIONS (1u << 24)

#define CONFIG_NAME DEVIO_MODEL_CONFIG_NAME

typedef enum arch_kind {
    ARCH_LLAMA,
    ARCH_MISTRAL,
    ARCH_QWEN2,
    ARCH_QWEN3,
    ARCH_GRANITE,
    ARCH_BAMBA,
    ARCH_MAMBA2
} arch_kind;

/* Positions a Mamba2 config (which names none) is served up to. */
#define MAMBA2_POSITIONS 4096u

/* Absent or null -> def (or an error when required). */
static devio_status cfg_u32(const json_t *root, const char *key, bool required, uint32_t def,
                            uint32_t lo, uint32_t hi, uint32_t *out, devio_error *err)
{
    const json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        if (required)
            return devio_fail(err, DEVIO_E_MODEL, CONFIG_NAME ": required field '%s' is missing",
                              key);
        *out = def;
        return DEVIO_OK;
    }
    if (!json_is_integer(v))
        return devio_fail(err, DEVIO_E_MODEL, CONFIG_NAME ": field '%s' is not an integer", key);
    json_int_t x = json_integer_value(v);
    if (x < (json_int_t)lo || x > (json_int_t)hi)
        return devio_fail(err, DEVIO_E_MODEL, CONFIG_NAME ": field '%s' = %lld is outside [%u, %u]",
                          key, (long long)x, lo, hi);
    *out = (uint32_t)x;
    return DEVIO_OK;
}

/* The range of every float a model is computed from, by config.json's name
 * (GGUF metadata is checked under the name it is read as): (0, hi] when lo
 * is 0, else [lo, hi]. Past these a value is taken as corrupt rather than
 * large or small: the floors keep RoPE's frequencies (inv_freq / factor,
 * with theta^(-2i/d) <= 1 from theta >= 1) and the logits (/ logits_scaling)
 * finite, the yarn caps keep attention scores (x attention_factor^2) so. */
static const struct {
    const char *field;
    double lo, hi;
} float_bounds[] = {
    {"rope_theta", 1.0, 1e12},
    {"rms_norm_eps", 0.0, 1.0},
    {"layer_norm_epsilon", 0.0, 1.0},
    {"embedding_multiplier", 0.0, 1e6},
    {"attention_multiplier", 0.0, 1e6},
    {"residual_multiplier", 0.0, 1e6},
    {"logits_scaling", 1e-6, 1e6},
    /* rope_scaling / rope_parameters */
    {"factor", 1.0, 1e12},
    {"original_max_position_embeddings", 1.0, 1e12},
    {"beta_fast", 0.0, 1e12},
    {"beta_slow", 0.0, 1e12},
    {"attention_factor", 0.0, 1e3},
    {"mscale", 0.0, 1e3},
    {"mscale_all_dim", 0.0, 1e3},
    {"low_freq_factor", 0.0, 1e12},
    {"high_freq_factor", 0.0, 1e12},
};

devio_status devio_model_float_check(const char *source, const char *what, const char *key,
                                     const char *field, double x, devio_error *err)
{
    double lo = 0.0, hi = 0.0; /* a field missing from the table: every value refused */
    for (size_t i = 0; i < sizeof float_bounds / sizeof *float_bounds; i++)
        if (strcmp(float_bounds[i].field, field) == 0)
            lo = float_bounds[i].lo, hi = float_bounds[i].hi;
    /* Written as !(x > 0) and !(x <= hi) so that a NaN is refused too; a
     * value is held as a float, which must not round it to 0. */
    if (!(x > 0.0) || !(x >= lo) || !(x <= hi) || !((float)x > 0.0f)) {
        if (lo > 0.0)
            return devio_fail(err, DEVIO_E_MODEL, "%.100s: %s '%.80s' = %g must be in [%g, %g]",
                              source, what, key, x, lo, hi);
        return devio_fail(err, DEVIO_E_MODEL, "%.100s: %s '%.80s' = %g must be in (0, %g]",
                          source, what, key, x, hi);
    }
    return DEVIO_OK;
}

devio_status devio_model_token_check(const char *source, const char *what, const char *key,
                                     int64_t id, uint32_t vocab, devio_error *err)
{
    if (id < 0 || id >= (int64_t)vocab)
        return devio_fail(err, DEVIO_E_MODEL,
                          "%.100s: %s '%.80s' = %lld is not a token of the vocabulary (0 to %lld)",
                          source, what, key, (long long)id, (long long)vocab - 1);
    return DEVIO_OK;
}

static devio_status cfg_pos_float(const json_t *root, const char *key, double def, float *out,
                                  devio_error *err)
{
    const json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        *out = (float)def;
        return DEVIO_OK;
    }
    if (!json_is_number(v))
        return devio_fail(err, DEVIO_E_MODEL, CONFIG_NAME ": field '%s' is not a number", key);
    double x = json_number_value(v);
    devio_status st = devio_model_float_check(CONFIG_NAME, "field", key, key, x, err);
    if (st == DEVIO_OK)
        *out = (float)x;
    return st;
}

static devio_status cfg_bool(const json_t *root, const char *key, bool def, bool *out,
                             devio_error *err)
{
    const json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return DEVIO_OK;
    }
    if (!json_is_boolean(v))
        return devio_fail(err, DEVIO_E_MODEL, CONFIG_NAME ": field '%s' is not true or false",
                          key);
    *out = json_is_true(v);
    return DEVIO_OK;
}

/* architectures[0], which must be one of the architectures below; each is one of the
 * three families devio computes (c->arch). */
static devio_status parse_arch(const json_t *root, devio_model_config *c, arch_kind *kind,
                               devio_error *err)
{
    const json_t *archs = json_object_get(root, "architectures");
    const char *arch = NULL;
    if (json_is_array(archs) && json_array_size(archs) > 0)
        arch = json_string_value(json_array_get(archs, 0));
    if (!arch)
        return devio_fail(err, DEVIO_E_MODEL,
                          CONFIG_NAME ": 'architectures' must be a non-empty array of strings");
    if (strcmp(arch, "LlamaForCausalLM") == 0)
        *kind = ARCH_LLAMA;
    else if (strcmp(arch, "MistralForCausalLM") == 0)
        *kind = ARCH_MISTRAL;
    else if (strcmp(arch, "Qwen2ForCausalLM") == 0)
        *kind = ARCH_QWEN2;
    else if (strcmp(arch, "Qwen3ForCausalLM") == 0)
        *kind = ARCH_QWEN3;
    else if (strcmp(arch, "GraniteForCausalLM") == 0)
        *kind = ARCH_GRANITE;
    else if (strcmp(arch, "BambaForCausalLM") == 0)
        *kind = ARCH_BAMBA;
    else if (strcmp(arch, "Mamba2ForCausalLM") == 0)
        *kind = ARCH_MAMBA2;
    else
        return devio_fail(err, DEVIO_E_MODEL,
                          CONFIG_NAME ": unknown architecture '%.64s' (supported: "
                                      "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, "
                                      "Qwen3ForCausalLM, GraniteForCausalLM, BambaForCausalLM, "
                                      "Mamba2ForCausalLM)",
                          arch);
    c->arch = *kind == ARCH_BAMBA    ? DEVIO_ARCH_BAMBA
              : *kind == ARCH_MAMBA2 ? DEVIO_ARCH_MAMBA2
                                     : DEVIO_ARCH_LLAMA;
    snprintf(c->architecture, sizeof c->architecture, "%s", arch);
    return DEVIO_OK;
}

/* hidden_act: silu (the gate of the MLP and of the mixer) or absent. */
static devio_status refuse_act(const json_t *root, devio_error *err)
{
    const json_t *act = json_object_get(root, "hidden_act");
    if (act && !json_is_null(act) &&
        (!json_is_string(act) || strcmp(json_string_value(act), "silu") != 0))
        return devio_fail(err, DEVIO_E_UNSUPPORTED,
                          CONFIG_NAME ": hidden_act '%.32s' is not supported; only silu is",
                          json_is_string(act) ? json_string_value(act) : "?");
    return DEVIO_OK;
}

/* Features these architectures may switch on that the backends do not
 * compute: refuse them rather than produce different numbers. */
static devio_status refuse_features(const json_t *root, devio_error *err)
{
    devio_status st = refuse_act(root, err);
    if (st != DEVIO_OK)
        return st;
    bool mlp_bias = false;
    if ((st = cfg_bool(root, "mlp_bias", false, &mlp_bias, err)) != DEVIO_OK)
        return st;
    if (mlp_bias)
        return devio_fail(err, DEVIO_E_UNSUPPORTED, CONFIG_NAME ": mlp_bias true is not supported");
    return DEVIO_OK;
}

/* The integer shape: sizes, layer and head counts, head_dim. */
static devio_status parse_shape(const json_t *root, devio_model_config *c, devio_error *err)
{
    devio_status st;
    if ((st = cfg_u32(root, "vocab_size", true, 0, 1, MAX_VOCAB, &c->vocab_size, err)) ||
        (st = cfg_u32(root, "hidden_size", true, 0, 1, MAX_HIDDEN, &c->hidden_size, err)) ||
        (st = cfg_u32(root, "intermediate_size", true, 0, 1, MAX_FFN, &c->intermediate_size,
                      err)) ||
        (st = cfg_u32(root, "num_hidden_layers", true, 0, 1, MAX_LAYERS, &c->n_layers, err)) ||
        (st = cfg_u32(root, "num_attention_heads", true, 0, 1, MAX_HEADS, &c->n_heads, err)) ||
        (st = cfg_u32(root, "num_key_value_heads", false, c->n_heads, 1, MAX_HEADS,
                      &c->n_kv_heads, err)) ||
        (st = cfg_u32(root, "max_position_embeddings", true, 0, 1, MAX_POSITIONS,
                      &c->max_position_embeddings, err)))
        return st;
    if (c->n_heads % c->n_kv_heads != 0)
        return devio_fail(err, DEVIO_E_MODEL,
                          CONFIG_NAME ": num_attention_heads %u is not a multiple of "
                                      "num_key_value_heads %u",
                          c->n_heads, c->n_kv_heads);
    const json_t *hd = json_object_get(root, "head_dim");
    if (!hd || json_is_null(hd)) {
        if (c->hidden_size % c->n_heads != 0)
            return devio_fail(err, DEVIO_E_MODEL,
                              CONFIG_NAME ": hidden_size %u is not a multiple of "
                                          "num_attention_heads %u",
                              c->hidden_size, c->n_heads);
        c->head_dim = c->hidden_size / c->n_heads;
    } else if ((st = cfg_u32(root, "head_dim", true, 0, 1, MAX_HEAD_DIM, &c->head_dim, err))) {
        return st;
    }
    /* rotate_half pairs dimension i with i + head_dim/2. */
    if (c->head_dim % 2 != 0 || c->head_dim > MAX_HEAD_DIM)
        return devio_fail(err, DEVIO_E_MODEL,
                          CONFIG_NAME ": head_dim %u must be even and at most %u", c->head_dim,
                          MAX_HEAD_DIM);
    return DEVIO_OK;
}

/* The floats and switches: RoPE base, norm epsilon, tied embeddings,
 * attention bias and the sliding window, with each family's defaults. */
static devio_status parse_options(const json_t *root, arch_kind kind, devio_model_config *c,
                                  devio_error *err)
{
    devio_status st;
    if ((st = cfg_pos_float(root, "rope_theta", 10000.0, &c->rope_theta, err)) ||
        (st = cfg_pos_float(root, "rms_norm_eps", 1e-6, &c->rms_norm_eps, err)))
        return st;
    bool tie = false, bias = false;
    if ((st = cfg_bool(root, "tie_word_embeddings", false, &tie, err)) ||
        (st = cfg_bool(root, "attention_bias", kind == ARCH_QWEN2, &bias, err)))
        return st;
    c->tie_word_embeddings = tie;
    /* Qwen2 always biases q/k/v (and never o_proj). Llama's and Mistral's
     * attention_bias biases o_proj as well, which devio_layer cannot hold:
     * refuse it rather than compute something else. */
    if (kind == ARCH_QWEN2)
        bias = true;
    else if (bias)
        return devio_fail(err, DEVIO_E_UNSUPPORTED,
                          CONFIG_NAME ": attention_bias with %s biases o_proj, which devio does "
                                      "not support (Qwen2's q/k/v biases are)",
                          c->architecture);
    c->attention_bias = bias;

    /* Mistral's sliding window applies to every layer: attention keeps the
     * keys within it (numspec rule 6). Qwen2's and Qwen3's apply to the
     * layers from max_window_layers on only; sliding-window attention is
     * full attention below the window, so those serve at most `window`
     * positions, which is exact. */
    bool qwen = kind == ARCH_QWEN2 || kind == ARCH_QWEN3;
    bool window_on = kind == ARCH_MISTRAL;
    if (qwen && (st = cfg_bool(root, "use_sliding_window", false, &window_on, err)) != DEVIO_OK)
        return st;
    if (window_on) {
        uint32_t window;
        if ((st = cfg_u32(root, "sliding_window", false, 0, 0, UINT32_MAX, &window, err)))
            return st;
        if (!qwen)
            c->sliding_window = window < c->max_position_embeddings ? window : 0;
        else if (window > 0 && window < c->max_position_embeddings)
            c->max_position_embeddings = window;
    }
    return DEVIO_OK;
}

/* time_step_limit: [lo, hi] with 0 <= lo <= hi, hi possibly +inf. The
 * loader turns the bare tokens Infinity and NaN that Hugging Face writes
 * into the strings "Infinity" and "NaN" before parsing (model.c). */
static devio_status cfg_dt_limit(const json_t *root, devio_ssm_config *m, devio_error *err)
{
    m->dt_min = 0.0f;
    m->dt_max = __builtin_inff();
    const json_t *v = json_object_get(root, "time_step_limit");
    if (!v || json_is_null(v))
        return DEVIO_OK;
    double lim[2];
    for (size_t i = 0; i < 2; i++) {
        const json_t *e = json_is_array(v) && json_array_size(v) == 2 ? json_array_get(v, i) : NULL;
        const char *str = json_string_value(e);
        if (json_is_number(e))
            lim[i] = json_number_value(e);
        else if (str && strcmp(str, "Infinity") == 0)
            lim[i] = __builtin_inf();
        else
            return devio_fail(err, DEVIO_E_MODEL,
                              CONFIG_NAME ": 'time_step_limit' must be [min, max] numbers");
    }
    if (!(lim[0] >= 0.0) || !(lim[1] >= lim[0]))
        return devio_fail(err, DEVIO_E_MODEL,
                          CONFIG_NAME ": 'time_step_limit' [%g, %g] must have 0 <= min <= max",
                          lim[0], lim[1]);
    m->dt_min = (float)lim[0];
    m->dt_max = (float)lim[1];
    return DEVIO_OK;
}

/* The mixer's dimensions, under either family's field names. */
typedef struct ssm_names {
    const char *heads, *head_dim, *groups, *state, *conv, *expand, *conv_bias, *proj_bias;
    uint32_t def_heads, def_groups, def_state;
} ssm_names;

static const ssm_names bamba_names = {"mamba_n_heads", "mamba_d_head", "mamba_n_groups",
                                      "mamba_d_state", "mamba_d_conv", "mamba_expand",
                                      "mamba_conv_bias", "mamba_proj_bias", 128, 1, 256};
static const ssm_names mamba2_names = {"num_heads", "head_dim", "n_groups", "state_size",
                                       "conv_kernel", "expand", "use_conv_bias", "use_bias",
                                       128, 8, 128};

static devio_status parse_ssm(const json_t *root, const ssm_names *n, devio_model_config *c,
                              devio_error *err)
{
    devio_ssm_config *m = &c->ssm;
    uint32_t expand = 0;
    bool conv_bias = true, proj_bias = false;
    devio_status st;
    if ((st = cfg_u32(root, n->heads, false, n->def_heads, 1, MAX_HEADS * 64, &m->n_heads, err)) ||
        (st = cfg_u32(root, n->groups, false, n->def_groups, 1, MAX_HEADS, &m->n_groups, err)) ||
        (st = cfg_u32(root, n->state, false, n->def_state, 1, 4096, &m->d_state, err)) ||
        (st = cfg_u32(root, n->conv, false, 4, 1, 64, &m->d_conv, err)) ||
        (st = cfg_u32(root, n->expand, false, 2, 1, 64, &expand, err)) ||
        (st = cfg_bool(root, n->conv_bias, true, &conv_bias, err)) ||
        (st = cfg_bool(root, n->proj_bias, false, &proj_bias, err)) ||
        (st = cfg_dt_limit(root, m, err)))
        return st;
    m->conv_bias = conv_bias;
    m->proj_bias = proj_bias;
    uint64_t inner = (uint64_t)expand * c->hidden_size;
    const json_t *hd = json_object_get(root, n->head_dim);
    if (!hd || json_is_null(hd) ||
        (json_is_string(hd) && strcmp(json_string_value(hd), "auto") == 0)) {
        if (inner % m->n_heads != 0)
            return devio_fail(err, DEVIO_E_MODEL,
                              CONFIG_NAME ": %s %u does not divide %s * hidden_size = %llu",
                              n->heads, m->n_heads, n->expand, (unsigned long long)inner);
        m->head_dim = (uint32_t)(inner / m->n_heads);
    } else if ((st = cfg_u32(root, n->head_dim, true, 0, 1, MAX_HEAD_DIM * 16, &m->head_dim,
                             err))) {
        return st;
    }
    if ((uint64_t)m->head_dim * m->n_heads != inner)
        return devio_fail(err, DEVIO_E_MODEL,
                          CONFIG_NAME ": %s %u * %s %u is not %s * hidden_size = %llu", n->heads,
                          m->n_heads, n->head_dim, m->head_dim, n->expand,
                          (unsigned long long)inner);
    if (m->n_heads % m->n_groups != 0)
        return devio_fail(err, DEVIO_E_MODEL, CONFIG_NAME ": %s %u is not a multiple of %s %u",
                          n->heads, m->n_heads, n->groups, m->n_groups);
    if (inner > (1u << 22) || (uint64_t)m->n_groups * m->d_state > (1u << 20))
        return devio_fail(err, DEVIO_E_MODEL, CONFIG_NAME ": the mixer is too large");
    return DEVIO_OK;
}

/* Bamba: Llama's fields for attention and the MLP, attn_layer_indices, the
 * mamba_* fields; RoPE turns half of each head (fixed in the model code). */
static devio_status parse_bamba(const json_t *root, devio_model_config *c, devio_error *err)
{
    const json_t *idx = json_object_get(root, "attn_layer_indices");
    if (idx && !json_is_null(idx)) {
        if (!json_is_array(idx))
            return devio_fail(err, DEVIO_E_MODEL,
                              CONFIG_NAME ": 'attn_layer_indices' must be a list of layers");
        for (size_t i = 0; i < json_array_size(idx); i++) {
            const json_t *e = json_array_get(idx, i);
            json_int_t li = json_is_integer(e) ? json_integer_value(e) : -1;
            if (li < 0 || li >= (json_int_t)c->n_layers)
                return devio_fail(err, DEVIO_E_MODEL,
                                  CONFIG_NAME ": attn_layer_indices[%zu] is not a layer below %u",
                                  i, c->n_layers);
            c->attn_layers[li / 64] |= 1ull << (li % 64);
        }
    }
    if (c->head_dim % 4 != 0)
        return devio_fail(err, DEVIO_E_UNSUPPORTED,
                          CONFIG_NAME ": Bamba turns half of head_dim %u with RoPE, which must "
                                      "then be even: head_dim must be a multiple of 4",
                          c->head_dim);
    c->rotary_dim = c->head_dim / 2;
    c->ssm.norm_eps = c->rms_norm_eps;
    return parse_ssm(root, &bamba_names, c, err);
}

/* Mamba2: mixers only, no attention and no MLP. */
static devio_status parse_mamba2(const json_t *root, devio_model_config *c, devio_error *err)
{
    devio_status st;
    bool rms = true, before = false, tie = false;
    if ((st = cfg_u32(root, "vocab_size", true, 0, 1, MAX_VOCAB, &c->vocab_size, err)) ||
        (st = cfg_u32(root, "hidden_size", true, 0, 1, MAX_HIDDEN, &c->hidden_size, err)) ||
        (st = cfg_u32(root, "num_hidden_layers", true, 0, 1, MAX_LAYERS, &c->n_layers, err)) ||
        (st = cfg_u32(root, "max_position_embeddings", false, MAMBA2_POSITIONS, 1, MAX_POSITIONS,
                      &c->max_position_embeddings, err)) ||
        (st = cfg_pos_float(root, "layer_norm_epsilon", 1e-5, &c->rms_norm_eps, err)) ||
        (st = cfg_bool(root, "rms_norm", true, &rms, err)) ||
        (st = cfg_bool(root, "norm_before_gate", false, &before, err)) ||
        (st = cfg_bool(root, "tie_word_embeddings", false, &tie, err)))
        return st;
    if (!rms || before)
        return devio_fail(err, DEVIO_E_UNSUPPORTED,
                          CONFIG_NAME ": %s is not supported (Mamba2 with rms_norm true and the "
                                      "gate before the norm is)",
                          !rms ? "rms_norm false" : "norm_before_gate true");
    if ((st = refuse_act(root, err)) != DEVIO_OK)
        return st;
    c->tie_word_embeddings = tie;
    c->ssm.norm_eps = c->rms_norm_eps;
    c->rope_theta = 10000.0f;
    return parse_ssm(root, &mamba2_names, c, err);
}

/* A positive finite float field of a rope_scaling object, or def. */
static devio_status rope_float(const json_t *rs, const char *key, double def, float *out,
                              devio_error *err)
{
    return cfg_pos_float(rs, key, def, out, err);
}

/* yarn's attention factor when the config gives none: transformers'
 * get_mscale, 0.1 * m * ln(s) + 1 for s > 1, else 1. */
static float yarn_mscale(float s, float m)
{
    return s <= 1.0f ? 1.0f : 0.1f * m * devio_logf(s) + 1.0f;
}

static devio_status parse_yarn(const json_t *rs, devio_model_config *c, devio_error *err)
{
    devio_rope_scaling *r = &c->rope_scaling;
    float mscale = 0.0f, mscale_all = 0.0f;
    bool truncate = true;
    devio_status st;
    if ((st = rope_float(rs, "original_max_position_embeddings", c->max_position_embeddings,
                         &r->original_max_positions, err)) ||
        (st = rope_float(rs, "beta_fast", 32.0, &r->beta_fast, err)) ||
        (st = rope_float(rs, "beta_slow", 1.0, &r->beta_slow, err)) ||
        (st = cfg_bool(rs, "truncate", true, &truncate, err)))
        return st;
    r->truncate = truncate;
    const json_t *af = json_object_get(rs, "attention_factor");
    if (af && !json_is_null(af))
        return rope_float(rs, "attention_factor", 1.0, &r->attention_factor, err);
    if (json_object_get(rs, "mscale") && json_object_get(rs, "mscale_all_dim")) {
        if ((st = rope_float(rs, "mscale", 1.0, &mscale, err)) ||
            (st = rope_float(rs, "mscale_all_dim", 1.0, &mscale_all, err)))
            return st;
        r->attention_factor = yarn_mscale(r->factor, mscale) / yarn_mscale(r->factor, mscale_all);
    } else {
        r->attention_factor = yarn_mscale(r->factor, 1.0f);
    }
    return DEVIO_OK;
}

/* RoPE: rope_theta, and the scaling transformers applies, from
 * rope_scaling (older configs) or rope_parameters (newer ones, which also
 * carry rope_theta). default, linear, llama3 and yarn are computed;
 * dynamic is refused because its frequencies depend on the length a
 * sequence has reached, not on the position alone; others are refused. */
static devio_status parse_rope(const json_t *root, devio_model_config *c, devio_error *err)
{
    devio_rope_scaling *r = &c->rope_scaling;
    *r = (devio_rope_scaling){.type = DEVIO_ROPE_DEFAULT, .factor = 1.0f,
                              .attention_factor = 1.0f};
    const char *field = "rope_parameters";
    const json_t *rs = json_object_get(root, field);
    if (!rs || json_is_null(rs)) {
        field = "rope_scaling";
        rs = json_object_get(root, field);
    }
    if (!rs || json_is_null(rs))
        return DEVIO_OK;
    if (!json_is_object(rs))
        return devio_fail(err, DEVIO_E_MODEL, CONFIG_NAME ": '%s' is not an object", field);
    const char *t = json_string_value(json_object_get(rs, "rope_type"));
    if (!t)
        t = json_string_value(json_object_get(rs, "type"));
    devio_status st = cfg_pos_float(rs, "rope_theta", c->rope_theta, &c->rope_theta, err);
    if (st != DEVIO_OK || !t || strcmp(t, "default") == 0)
        return st;
    if ((st = rope_float(rs, "factor", 1.0, &r->factor, err)))
        return st;
    if (strcmp(t, "linear") == 0) {
        r->type = DEVIO_ROPE_LINEAR;
        return DEVIO_OK;
    }
    if (strcmp(t, "llama3") == 0) {
        r->type = DEVIO_ROPE_LLAMA3;
        if ((st = rope_float(rs, "low_freq_factor", 1.0, &r->low_freq_factor, err)) ||
            (st = rope_float(rs, "high_freq_factor", 4.0, &r->high_freq_factor, err)) ||
            (st = rope_float(rs, "original_max_position_embeddings", 8192.0,
                             &r->original_max_positions, err)))
            return st;
        if (!(r->high_freq_factor > r->low_freq_factor))
            return devio_fail(err, DEVIO_E_MODEL,
                              CONFIG_NAME ": %s: high_freq_factor must exceed low_freq_factor",
                              field);
        return DEVIO_OK;
    }
    if (strcmp(t, "yarn") == 0) {
        r->type = DEVIO_ROPE_YARN;
        return parse_yarn(rs, c, err);
    }
    return devio_fail(err, DEVIO_E_UNSUPPORTED,
                      CONFIG_NAME ": %s of type '%.32s' is not supported (default, linear, "
                                  "llama3 and yarn are; dynamic depends on a sequence's length, "
                                  "not on the position alone)",
                      field, t);
}

/* Granite's four multipliers, and the defaults every other family has. */
static devio_status parse_multipliers(const json_t *root, arch_kind kind, devio_model_config *c,
                                      devio_error *err)
{
    c->embedding_multiplier = c->residual_multiplier = c->logits_scaling = 1.0f;
    c->attention_multiplier = 0.0f; /* 1 / sqrt(head_dim) */
    if (kind != ARCH_GRANITE)
        return DEVIO_OK;
    devio_status st;
    if ((st = cfg_pos_float(root, "embedding_multiplier", 1.0, &c->embedding_multiplier,
                            err)) ||
        (st = cfg_pos_float(root, "attention_multiplier", 1.0, &c->attention_multiplier,
                            err)) ||
        (st = cfg_pos_float(root, "residual_multiplier", 1.0, &c->residual_multiplier,
                            err)) ||
        (st = cfg_pos_float(root, "logits_scaling", 1.0, &c->logits_scaling, err)))
        return st;
    return DEVIO_OK;
}

devio_status devio_model_config_parse(const json_t *root, devio_model_config *c,
                                      devio_error *err)
{
    memset(c, 0, sizeof *c);
    arch_kind kind = ARCH_LLAMA; /* set by parse_arch; initialised for the compiler */
    devio_status st;
    if ((st = parse_arch(root, c, &kind, err)))
        return st;
    if (kind == ARCH_MAMBA2)
        return parse_mamba2(root, c, err);
    if ((st = refuse_features(root, err)) || (st = parse_shape(root, c, err)) ||
        (st = parse_options(root, kind, c, err)) || (st = parse_rope(root, c, err)) ||
        (st = parse_multipliers(root, kind, c, err)))
        return st;
    c->rotary_dim = c->head_dim;
    c->qk_norm = kind == ARCH_QWEN3;
    if (kind == ARCH_BAMBA)
        return parse_bamba(root, c, err);
    for (uint32_t i = 0; i < c->n_layers; i++)
        c->attn_layers[i / 64] |= 1ull << (i % 64);
    return DEVIO_OK;
}
