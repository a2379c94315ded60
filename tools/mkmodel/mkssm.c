/* mkssm.c - the Bamba and Mamba2 models of devio-mkmodel: their option checks, tensors (Hugging Face's names and shapes), parameter count and config.json.
 * It must never let anything but the options shape its output, nor accept a field the model's architecture does not have. */
#include "tools/mkmodel/mkssm.h"

#include <stdio.h>
#include <string.h>

/* Initial values that keep a random recurrence stable (mkmodel.h). */
#define MK_A_MIN 1.0f     /* A = -exp(A_log), A_log = log(uniform [1, 16)) */
#define MK_A_MAX 16.0f
#define MK_CONV_BIAS 0.1f /* conv1d.bias uniform in [-0.1, 0.1) */
#define MK_PROJ_BIAS 0.05f
#define MK_NORM_SPREAD 0.1f
#define MK_D_SPREAD 0.5f  /* D uniform in [0.5, 1.5) */
#define MK_CHUNK_SIZE 256u

bool mk_attn_layer(const devio_mkmodel_opts *o, uint32_t i)
{
    return i < DEVIO_MKMODEL_MAX_LAYERS && ((o->attn_layers[i / 64] >> (i % 64)) & 1u);
}

static bool mk_any_attn_layer(const devio_mkmodel_opts *o)
{
    for (size_t w = 0; w < DEVIO_MKMODEL_MAX_LAYERS / 64; w++)
        if (o->attn_layers[w])
            return true;
    return false;
}

/* The mixer's widths, from checked options. */
typedef struct mk_ssm_dims {
    uint64_t inner;    /* I = expand * hidden = heads * head_dim */
    uint64_t heads;    /* H */
    uint64_t conv_dim; /* I + 2 G N: the channels x, B and C convolved */
    uint64_t in_dim;   /* I + conv_dim + H: z, xBC and dt from in_proj */
} mk_ssm_dims;

static mk_ssm_dims mk_dims(const devio_mkmodel_opts *o)
{
    mk_ssm_dims m;
    m.inner = (uint64_t)o->ssm_heads * o->ssm_head_dim;
    m.heads = o->ssm_heads;
    m.conv_dim = m.inner + 2ull * o->ssm_groups * o->ssm_state;
    m.in_dim = m.inner + m.conv_dim + m.heads;
    return m;
}

/* ---- checks ---- */

/* The Llama family has no mixer: every field of one stays unset. */
static devio_status mk_check_family(const devio_mkmodel_opts *o, const char *arch,
                                    devio_error *err)
{
    if (o->ssm_heads || o->ssm_head_dim || o->ssm_expand || o->ssm_state || o->ssm_groups ||
        o->ssm_conv || o->ssm_conv_bias || o->ssm_proj_bias)
        return devio_fail(err, DEVIO_E_INVALID,
                          "the --ssm-* flags and the mixer biases belong to bamba and mamba2, "
                          "not %s",
                          arch);
    if (mk_any_attn_layer(o))
        return devio_fail(err, DEVIO_E_INVALID, "--attn-layers belongs to bamba, not %s", arch);
    return DEVIO_OK;
}

static devio_status mk_check_mixer(const devio_mkmodel_opts *o, const char *arch,
                                   devio_error *err)
{
    const struct {
        const char *flag;
        uint32_t v, max;
    } dims[] = {
        {"ssm-heads", o->ssm_heads, 1024},   {"ssm-head-dim", o->ssm_head_dim, 65536},
        {"ssm-expand", o->ssm_expand, 16},   {"ssm-state", o->ssm_state, 65536},
        {"ssm-groups", o->ssm_groups, 1024}, {"ssm-conv", o->ssm_conv, 64},
    };
    if (o->ssm_heads == 0 && o->ssm_head_dim == 0)
        return devio_fail(err, DEVIO_E_INVALID,
                          "%s needs the Mamba-2 mixer's shape: choose a preset after the "
                          "architecture (--preset tiny --arch %s)",
                          arch, arch);
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
        if (dims[i].v == 0 || dims[i].v > dims[i].max)
            return devio_fail(err, DEVIO_E_INVALID, "%s must be in [1, %u], got %u",
                              dims[i].flag, dims[i].max, dims[i].v);
    uint64_t inner = (uint64_t)o->ssm_heads * o->ssm_head_dim;
    uint64_t want = (uint64_t)o->ssm_expand * o->hidden_size;
    if (inner != want)
        return devio_fail(err, DEVIO_E_INVALID,
                          "ssm-heads %u x ssm-head-dim %u = %llu must equal ssm-expand %u x "
                          "hidden %u = %llu",
                          o->ssm_heads, o->ssm_head_dim, (unsigned long long)inner,
                          o->ssm_expand, o->hidden_size, (unsigned long long)want);
    if (o->ssm_heads % o->ssm_groups != 0)
        return devio_fail(err, DEVIO_E_INVALID, "ssm-heads %u is not a multiple of ssm-groups %u",
                          o->ssm_heads, o->ssm_groups);
    if (!(o->time_step_min >= 1e-4) || !(o->time_step_max >= o->time_step_min) ||
        o->time_step_max > 1.0)
        return devio_fail(err, DEVIO_E_INVALID,
                          "time steps must satisfy 1e-4 <= time_step_min <= time_step_max <= 1");
    if (o->attention_bias)
        return devio_fail(err, DEVIO_E_INVALID,
                          "--bias (q/k/v biases) is llama only (qwen2 always has them); the "
                          "mixer's is --proj-bias");
    return DEVIO_OK;
}

/* Bamba's attention: head_dim is always hidden / heads (its config has no
 * head_dim), and RoPE turns the first half of each head, in pairs. */
static devio_status mk_check_bamba(const devio_mkmodel_opts *o, devio_error *err)
{
    for (uint32_t i = o->n_layers; i < DEVIO_MKMODEL_MAX_LAYERS; i++)
        if (mk_attn_layer(o, i))
            return devio_fail(err, DEVIO_E_INVALID,
                              "attn-layers names layer %u but the model has %u layers", i,
                              o->n_layers);
    uint32_t hd;
    devio_status s = mk_derived_head_dim(o, "bamba", &hd, err);
    if (s != DEVIO_OK)
        return s;
    if (hd % 4 != 0)
        return devio_fail(err, DEVIO_E_INVALID,
                          "bamba rotates the first half of each attention head: head_dim %u "
                          "(hidden / heads) must be a multiple of 4",
                          hd);
    return DEVIO_OK;
}

static devio_status mk_check_mamba2(const devio_mkmodel_opts *o, devio_error *err)
{
    if (o->intermediate_size || o->n_heads || o->n_kv_heads || o->head_dim ||
        o->max_position_embeddings)
        return devio_fail(err, DEVIO_E_INVALID,
                          "mamba2 has no attention, MLP or position limit: --ffn, --heads, "
                          "--kv-heads, --head-dim and --max-pos do not apply (its mixer's are "
                          "--ssm-*)");
    if (mk_any_attn_layer(o))
        return devio_fail(err, DEVIO_E_INVALID, "--attn-layers belongs to bamba, not mamba2");
    return DEVIO_OK;
}

devio_status mk_ssm_check(const devio_mkmodel_opts *o, mk_arch a, devio_error *err)
{
    devio_status st;
    if (mk_arch_is_family(a))
        return mk_check_family(o, mk_arch_name(a), err);
    switch (a) {
    case MK_ARCH_BAMBA:
        if ((st = mk_check_mixer(o, "bamba", err)) != DEVIO_OK)
            return st;
        return mk_check_bamba(o, err);
    case MK_ARCH_MAMBA2:
        if ((st = mk_check_mixer(o, "mamba2", err)) != DEVIO_OK)
            return st;
        return mk_check_mamba2(o, err);
    default:
        break;
    }
    return devio_fail(err, DEVIO_E_INVALID, "unknown architecture");
}

/* ---- tensors ---- */

/* mk_add with the name PREFIX + SUFFIX (both short: MK_NAME_MAX holds them). */
static void mk_addp(mk_list *L, const char *prefix, const char *suffix, uint32_t ndim,
                    uint64_t s0, uint64_t s1, mk_init init, float scale)
{
    char name[MK_NAME_MAX];
    snprintf(name, sizeof name, "%s%s", prefix, suffix);
    mk_add(L, name, ndim, s0, s1, init, scale);
}

/* One Mamba-2 mixer; `p` is its prefix, "model.layers.3.mamba." or
 * "backbone.layers.3.mixer.". */
static void mk_mixer_add(const devio_mkmodel_opts *o, mk_list *L, const char *p)
{
    const mk_ssm_dims m = mk_dims(o);
    const uint64_t d = o->hidden_size;
    char name[MK_NAME_MAX];
    mk_addp(L, p, "in_proj.weight", 2, m.in_dim, d, MK_INIT_LINEAR, mk_inv_sqrt(d));
    if (o->ssm_proj_bias)
        mk_addp(L, p, "in_proj.bias", 1, m.in_dim, 0, MK_INIT_BIAS, MK_PROJ_BIAS);
    snprintf(name, sizeof name, "%sconv1d.weight", p);
    mk_add_3d(L, name, m.conv_dim, 1, o->ssm_conv, MK_INIT_LINEAR, mk_inv_sqrt(o->ssm_conv));
    if (o->ssm_conv_bias)
        mk_addp(L, p, "conv1d.bias", 1, m.conv_dim, 0, MK_INIT_BIAS, MK_CONV_BIAS);
    snprintf(name, sizeof name, "%sdt_bias", p);
    mk_add_range(L, name, m.heads, MK_INIT_DT_BIAS, (float)o->time_step_min,
                 (float)o->time_step_max);
    snprintf(name, sizeof name, "%sA_log", p);
    mk_add_range(L, name, m.heads, MK_INIT_A_LOG, MK_A_MIN, MK_A_MAX);
    mk_addp(L, p, "D", 1, m.heads, 0, MK_INIT_NORM, MK_D_SPREAD);
    mk_addp(L, p, "norm.weight", 1, m.inner, 0, MK_INIT_NORM, MK_NORM_SPREAD);
    mk_addp(L, p, "out_proj.weight", 2, d, m.inner, MK_INIT_LINEAR, mk_inv_sqrt(m.inner));
    if (o->ssm_proj_bias)
        mk_addp(L, p, "out_proj.bias", 1, d, 0, MK_INIT_BIAS, MK_PROJ_BIAS);
}

/* Bamba's attention projections (no biases), prefix "model.layers.N.". */
static void mk_bamba_attn_add(const devio_mkmodel_opts *o, mk_list *L, const char *p)
{
    const uint64_t d = o->hidden_size, hd = d / o->n_heads;
    const uint64_t q = o->n_heads * hd, kv = o->n_kv_heads * hd;
    mk_addp(L, p, "self_attn.q_proj.weight", 2, q, d, MK_INIT_LINEAR, mk_inv_sqrt(d));
    mk_addp(L, p, "self_attn.k_proj.weight", 2, kv, d, MK_INIT_LINEAR, mk_inv_sqrt(d));
    mk_addp(L, p, "self_attn.v_proj.weight", 2, kv, d, MK_INIT_LINEAR, mk_inv_sqrt(d));
    mk_addp(L, p, "self_attn.o_proj.weight", 2, d, q, MK_INIT_LINEAR, mk_inv_sqrt(q));
}

static void mk_bamba_layer_add(const devio_mkmodel_opts *o, mk_list *L, uint32_t i)
{
    const uint64_t d = o->hidden_size, f = o->intermediate_size;
    char p[32];
    snprintf(p, sizeof p, "model.layers.%u.", i);
    mk_addp(L, p, "input_layernorm.weight", 1, d, 0, MK_INIT_NORM, MK_NORM_SPREAD);
    mk_addp(L, p, "pre_ff_layernorm.weight", 1, d, 0, MK_INIT_NORM, MK_NORM_SPREAD);
    mk_addp(L, p, "feed_forward.gate_proj.weight", 2, f, d, MK_INIT_LINEAR, mk_inv_sqrt(d));
    mk_addp(L, p, "feed_forward.up_proj.weight", 2, f, d, MK_INIT_LINEAR, mk_inv_sqrt(d));
    mk_addp(L, p, "feed_forward.down_proj.weight", 2, d, f, MK_INIT_LINEAR, mk_inv_sqrt(f));
    if (mk_attn_layer(o, i)) {
        mk_bamba_attn_add(o, L, p);
    } else {
        char mixer[40];
        snprintf(mixer, sizeof mixer, "model.layers.%u.mamba.", i);
        mk_mixer_add(o, L, mixer);
    }
}

void mk_ssm_list_add(const devio_mkmodel_opts *o, mk_arch a, mk_list *L)
{
    const uint64_t V = o->vocab_size, d = o->hidden_size;
    const bool bamba = a == MK_ARCH_BAMBA;
    mk_add(L, bamba ? "model.embed_tokens.weight" : "backbone.embeddings.weight", 2, V, d,
           MK_INIT_LINEAR, mk_inv_sqrt(d));
    mk_add(L, bamba ? "model.final_layernorm.weight" : "backbone.norm_f.weight", 1, d, 0,
           MK_INIT_NORM, MK_NORM_SPREAD);
    if (!o->tie_word_embeddings)
        mk_add(L, "lm_head.weight", 2, V, d, MK_INIT_LINEAR, mk_inv_sqrt(d));
    char p[40];
    for (uint32_t i = 0; i < o->n_layers; i++) {
        if (bamba) {
            mk_bamba_layer_add(o, L, i);
            continue;
        }
        snprintf(p, sizeof p, "backbone.layers.%u.", i);
        mk_addp(L, p, "norm.weight", 1, d, 0, MK_INIT_NORM, MK_NORM_SPREAD);
        snprintf(p, sizeof p, "backbone.layers.%u.mixer.", i);
        mk_mixer_add(o, L, p);
    }
}

/* ---- counts ---- */

static uint64_t mk_mixer_params(const devio_mkmodel_opts *o)
{
    const mk_ssm_dims m = mk_dims(o);
    const uint64_t d = o->hidden_size;
    uint64_t n = m.in_dim * d + m.conv_dim * o->ssm_conv + 3 * m.heads + m.inner + d * m.inner;
    if (o->ssm_conv_bias)
        n += m.conv_dim;
    if (o->ssm_proj_bias)
        n += m.in_dim + d;
    return n;
}

uint64_t mk_ssm_param_count(const devio_mkmodel_opts *o, mk_arch a)
{
    const uint64_t V = o->vocab_size, d = o->hidden_size, f = o->intermediate_size;
    uint64_t n = V * d * (o->tie_word_embeddings ? 1 : 2) + d;
    if (a != MK_ARCH_BAMBA)
        return n + (d + mk_mixer_params(o)) * o->n_layers;
    const uint64_t hd = o->n_heads ? d / o->n_heads : 0;
    const uint64_t q = o->n_heads * hd, kv = o->n_kv_heads * hd;
    for (uint32_t i = 0; i < o->n_layers; i++) {
        n += 2 * d + 3 * f * d;
        n += mk_attn_layer(o, i) ? 2 * q * d + 2 * kv * d : mk_mixer_params(o);
    }
    return n;
}

/* ---- config.json ---- */

/* Hugging Face's default clamp of dt, written as Python's json writes
 * (0.0, float("inf")): the bare token Infinity, which strict JSON lacks. */
static void mk_kv_time_step_limit(mk_buf *b)
{
    mk_buf_printf(b, "  \"time_step_limit\": [0.0, Infinity],\n");
}

static void mk_bamba_config(const devio_mkmodel_opts *o, mk_buf *b)
{
    mk_buf_printf(b, "{\n  \"architectures\": [\"BambaForCausalLM\"],\n");
    mk_kv_f(b, "attention_dropout", 0.0);
    mk_buf_printf(b, "  \"attn_layer_indices\": [");
    for (uint32_t i = 0, n = 0; i < o->n_layers; i++)
        if (mk_attn_layer(o, i))
            mk_buf_printf(b, "%s%u", n++ ? ", " : "", i);
    mk_buf_printf(b, "],\n");
    mk_kv_u(b, "bos_token_id", o->vocab_size > 1 ? 1u : 0u);
    mk_kv_u(b, "eos_token_id", o->vocab_size > 2 ? 2u : 0u);
    mk_buf_printf(b, "  \"hidden_act\": \"silu\",\n");
    mk_kv_u(b, "hidden_size", o->hidden_size);
    mk_kv_u(b, "intermediate_size", o->intermediate_size);
    mk_kv_u(b, "mamba_chunk_size", MK_CHUNK_SIZE);
    mk_kv_b(b, "mamba_conv_bias", o->ssm_conv_bias);
    mk_kv_u(b, "mamba_d_conv", o->ssm_conv);
    mk_kv_u(b, "mamba_d_head", o->ssm_head_dim);
    mk_kv_u(b, "mamba_d_state", o->ssm_state);
    mk_kv_u(b, "mamba_expand", o->ssm_expand);
    mk_kv_u(b, "mamba_n_groups", o->ssm_groups);
    mk_kv_u(b, "mamba_n_heads", o->ssm_heads);
    mk_kv_b(b, "mamba_proj_bias", o->ssm_proj_bias);
    mk_kv_u(b, "max_position_embeddings", o->max_position_embeddings);
    mk_buf_printf(b, "  \"model_type\": \"bamba\",\n");
    mk_kv_u(b, "num_attention_heads", o->n_heads);
    mk_kv_u(b, "num_hidden_layers", o->n_layers);
    mk_kv_u(b, "num_key_value_heads", o->n_kv_heads);
    mk_kv_f(b, "rms_norm_eps", o->rms_norm_eps);
    mk_kv_f(b, "rope_theta", o->rope_theta);
    mk_kv_b(b, "tie_word_embeddings", o->tie_word_embeddings);
    mk_kv_time_step_limit(b);
    mk_kv_f(b, "time_step_max", o->time_step_max);
    mk_kv_f(b, "time_step_min", o->time_step_min);
}

static void mk_mamba2_config(const devio_mkmodel_opts *o, mk_buf *b)
{
    mk_buf_printf(b, "{\n  \"architectures\": [\"Mamba2ForCausalLM\"],\n");
    mk_kv_u(b, "bos_token_id", o->vocab_size > 1 ? 1u : 0u);
    mk_kv_u(b, "chunk_size", MK_CHUNK_SIZE);
    mk_kv_u(b, "conv_kernel", o->ssm_conv);
    mk_kv_u(b, "eos_token_id", o->vocab_size > 2 ? 2u : 0u);
    mk_kv_u(b, "expand", o->ssm_expand);
    mk_kv_u(b, "head_dim", o->ssm_head_dim);
    mk_buf_printf(b, "  \"hidden_act\": \"silu\",\n");
    mk_kv_u(b, "hidden_size", o->hidden_size);
    mk_kv_f(b, "layer_norm_epsilon", o->rms_norm_eps);
    mk_buf_printf(b, "  \"model_type\": \"mamba2\",\n");
    mk_kv_u(b, "n_groups", o->ssm_groups);
    mk_kv_u(b, "num_heads", o->ssm_heads);
    mk_kv_u(b, "num_hidden_layers", o->n_layers);
    mk_kv_b(b, "residual_in_fp32", true);
    mk_kv_b(b, "rms_norm", true);
    mk_kv_u(b, "state_size", o->ssm_state);
    mk_kv_b(b, "tie_word_embeddings", o->tie_word_embeddings);
    mk_kv_f(b, "time_step_floor", 1e-4);
    mk_kv_time_step_limit(b);
    mk_kv_f(b, "time_step_max", o->time_step_max);
    mk_kv_f(b, "time_step_min", o->time_step_min);
}

void mk_ssm_config(const devio_mkmodel_opts *o, mk_arch a, mk_buf *b)
{
    if (a == MK_ARCH_BAMBA)
        mk_bamba_config(o, b);
    else
        mk_mamba2_config(o, b);
    mk_buf_printf(b, "  \"torch_dtype\": \"%s\",\n", mk_torch_dtype(o->dtype));
    if (a == MK_ARCH_MAMBA2) {
        mk_kv_b(b, "use_bias", o->ssm_proj_bias);
        mk_kv_b(b, "use_cache", true);
        mk_kv_b(b, "use_conv_bias", o->ssm_conv_bias);
    } else {
        mk_kv_b(b, "use_cache", true);
    }
    mk_buf_printf(b, "  \"vocab_size\": %u\n}\n", o->vocab_size);
}
