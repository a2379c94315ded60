/* mkfamily.c - the Llama family of devio-mkmodel (llama, qwen2, qwen3, mistral, granite): option checks, tensors (Hugging Face's names and shapes), parameter count, config.json with RoPE scaling.
 * It must never let anything but the options shape its output, nor accept a field the model's architecture does not have. */
#include "tools/mkmodel/mkfamily.h"

#include <stdio.h>
#include <string.h>

#define MK_NORM_SPREAD 0.1f /* every RMSNorm weight: 1 + U[-0.1, 0.1) */
#define MK_BIAS_SPREAD 0.05f
#define MK_ROPE_FACTOR 8.0 /* rope_factor 0 */
#define MK_ROPE_MAX_FACTOR 65536.0
#define MK_MULT_MAX 1e6 /* Granite's multipliers lie in (0, MK_MULT_MAX] */

static const char *const arch_names[] = {"llama",   "bamba",  "mamba2", "qwen2",
                                         "qwen3",   "mistral", "granite"};

bool mk_arch_parse(const char *name, mk_arch *a)
{
    for (size_t i = 0; i < sizeof arch_names / sizeof *arch_names; i++)
        if (strcmp(name ? name : "llama", arch_names[i]) == 0) {
            *a = (mk_arch)i;
            return true;
        }
    return false;
}

const char *mk_arch_name(mk_arch a)
{
    return (size_t)a < sizeof arch_names / sizeof *arch_names ? arch_names[a] : "?";
}

bool mk_arch_is_family(mk_arch a)
{
    return a != MK_ARCH_BAMBA && a != MK_ARCH_MAMBA2;
}

/* What config.json holds, per family architecture. */
typedef struct mk_family {
    const char *class_name; /* architectures[0] */
    const char *model_type;
    bool bias_key;     /* "attention_bias" */
    bool mlp_bias_key; /* "mlp_bias" */
    bool head_dim_key; /* "head_dim" (qwen2's and granite's configs have none) */
    bool qwen_window;  /* "max_window_layers", "use_sliding_window": false */
} mk_family;

static mk_family mk_family_of(const devio_mkmodel_opts *o, mk_arch a)
{
    switch (a) {
    case MK_ARCH_QWEN2:
        return (mk_family){"Qwen2ForCausalLM", "qwen2", false, false, false, true};
    case MK_ARCH_QWEN3:
        return (mk_family){"Qwen3ForCausalLM", "qwen3", true, false, true, true};
    case MK_ARCH_MISTRAL:
        return (mk_family){"MistralForCausalLM", "mistral", false, false, true, false};
    case MK_ARCH_GRANITE:
        return (mk_family){"GraniteForCausalLM", "granite", true, true, false, false};
    default:
        /* q/k/v biases without an o_proj bias is Qwen2's layout; Llama's
         * attention_bias would bias o_proj too, which devio does not model. */
        if (o->attention_bias)
            return (mk_family){"Qwen2ForCausalLM", "qwen2", true, true, true, false};
        return (mk_family){"LlamaForCausalLM", "llama", true, true, true, false};
    }
}

static uint32_t mk_head_dim(const devio_mkmodel_opts *o)
{
    return o->head_dim ? o->head_dim : o->hidden_size / o->n_heads;
}

/* ---- checks ---- */

static double mk_rope_factor(const devio_mkmodel_opts *o)
{
    return o->rope_factor != 0.0 ? o->rope_factor : MK_ROPE_FACTOR;
}

/* llama3's and yarn's original_max_position_embeddings; 0 when none fits. */
static uint32_t mk_rope_original_max(const devio_mkmodel_opts *o)
{
    if (o->rope_original_max)
        return o->rope_original_max;
    return (uint32_t)(o->max_position_embeddings / mk_rope_factor(o)); /* >= 0: truncation floors */
}

static devio_status mk_check_rope(const devio_mkmodel_opts *o, devio_error *err)
{
    if (o->rope_scaling == DEVIO_MKMODEL_ROPE_NONE) {
        if (o->rope_factor != 0.0 || o->rope_original_max)
            return devio_fail(err, DEVIO_E_INVALID,
                              "--rope-factor and --rope-original-max need --rope-scaling");
        return DEVIO_OK;
    }
    if (o->rope_scaling > DEVIO_MKMODEL_ROPE_YARN)
        return devio_fail(err, DEVIO_E_INVALID, "unknown rope scaling %d", (int)o->rope_scaling);
    double f = mk_rope_factor(o);
    if (!(f >= 1.0 && f <= MK_ROPE_MAX_FACTOR))
        return devio_fail(err, DEVIO_E_INVALID, "rope-factor must be in [1, %g], got %g",
                          MK_ROPE_MAX_FACTOR, f);
    if (o->rope_scaling == DEVIO_MKMODEL_ROPE_LINEAR) {
        if (o->rope_original_max)
            return devio_fail(err, DEVIO_E_INVALID,
                              "--rope-original-max belongs to llama3 and yarn scaling, not linear");
        return DEVIO_OK;
    }
    uint32_t orig = mk_rope_original_max(o);
    if (orig == 0)
        return devio_fail(err, DEVIO_E_INVALID,
                          "max-pos %u / rope-factor %g is below 1: give --rope-original-max",
                          o->max_position_embeddings, f);
    /* transformers 4.x replaces yarn's factor by this ratio; 5.x keeps it. */
    if (o->rope_scaling == DEVIO_MKMODEL_ROPE_YARN &&
        (double)o->max_position_embeddings / orig != f)
        return devio_fail(err, DEVIO_E_INVALID,
                          "yarn: max-pos %u / rope-original-max %u = %g must equal rope-factor "
                          "%g (transformers 4.x computes yarn with the ratio, 5.x with the "
                          "factor)",
                          o->max_position_embeddings, orig,
                          (double)o->max_position_embeddings / orig, f);
    return DEVIO_OK;
}

/* Whether any of Granite's multipliers is set. */
static bool mk_any_multiplier(const devio_mkmodel_opts *o)
{
    return o->embedding_multiplier != 0.0 || o->attention_multiplier != 0.0 ||
           o->residual_multiplier != 0.0 || o->logits_scaling != 0.0;
}

static devio_status mk_check_multipliers(const devio_mkmodel_opts *o, devio_error *err)
{
    const struct {
        const char *flag;
        double v;
    } m[] = {
        {"embedding-multiplier", o->embedding_multiplier},
        {"attention-multiplier", o->attention_multiplier},
        {"residual-multiplier", o->residual_multiplier},
        {"logits-scaling", o->logits_scaling},
    };
    for (size_t i = 0; i < sizeof m / sizeof *m; i++)
        if (!(m[i].v > 0.0 && m[i].v <= MK_MULT_MAX))
            return devio_fail(err, DEVIO_E_INVALID, "granite's %s must be in (0, %g], got %g",
                              m[i].flag, MK_MULT_MAX, m[i].v);
    return DEVIO_OK;
}

/* Qwen2's and Granite's configs have no head_dim: it is hidden / heads. */
devio_status mk_derived_head_dim(const devio_mkmodel_opts *o, const char *arch, uint32_t *hd,
                                 devio_error *err)
{
    if (o->hidden_size % o->n_heads != 0)
        return devio_fail(err, DEVIO_E_INVALID, "hidden %u is not a multiple of heads %u",
                          o->hidden_size, o->n_heads);
    *hd = o->hidden_size / o->n_heads;
    if (o->head_dim != 0 && o->head_dim != *hd)
        return devio_fail(err, DEVIO_E_INVALID,
                          "%s's config has no head_dim: it is hidden / heads = %u, and "
                          "--head-dim %u cannot change it",
                          arch, *hd, o->head_dim);
    return DEVIO_OK;
}

static devio_status mk_check_head_dim(const devio_mkmodel_opts *o, mk_arch a, devio_error *err)
{
    uint32_t hd;
    if (a != MK_ARCH_QWEN2 && a != MK_ARCH_GRANITE)
        return DEVIO_OK;
    return mk_derived_head_dim(o, mk_arch_name(a), &hd, err);
}

/* --bias: llama's (written as Qwen2), always on for qwen2, and not for
 * qwen3 or granite (whose attention_bias biases o_proj as well) or mistral. */
static devio_status mk_check_bias(const devio_mkmodel_opts *o, mk_arch a, devio_error *err)
{
    if (a == MK_ARCH_QWEN2 && !o->attention_bias)
        return devio_fail(err, DEVIO_E_INVALID,
                          "qwen2 always has q/k/v biases: --bias=false cannot remove them");
    if (a != MK_ARCH_QWEN2 && a != MK_ARCH_LLAMA && o->attention_bias)
        return devio_fail(err, DEVIO_E_INVALID,
                          "--bias (q/k/v biases) belongs to llama and qwen2, not %s",
                          mk_arch_name(a));
    return DEVIO_OK;
}

/* --window is mistral's and the multipliers are granite's, on any
 * architecture. */
static devio_status mk_check_owners(const devio_mkmodel_opts *o, mk_arch a, devio_error *err)
{
    if (a != MK_ARCH_MISTRAL && o->sliding_window)
        return devio_fail(err, DEVIO_E_INVALID, "--window belongs to mistral, not %s",
                          mk_arch_name(a));
    if (a != MK_ARCH_GRANITE && mk_any_multiplier(o))
        return devio_fail(err, DEVIO_E_INVALID,
                          "the multipliers (--embedding-multiplier, --attention-multiplier, "
                          "--residual-multiplier, --logits-scaling) belong to granite, not %s",
                          mk_arch_name(a));
    return DEVIO_OK;
}

devio_status mk_family_check(const devio_mkmodel_opts *o, mk_arch a, devio_error *err)
{
    devio_status st;
    if (!mk_arch_is_family(a)) {
        /* The family's RoPE fields on an architecture outside it. */
        if (o->rope_scaling != DEVIO_MKMODEL_ROPE_NONE || o->rope_factor != 0.0 ||
            o->rope_original_max)
            return devio_fail(err, DEVIO_E_INVALID,
                              "--rope-scaling, --rope-factor and --rope-original-max belong to "
                              "llama, qwen2, qwen3, mistral and granite, not %s",
                              mk_arch_name(a));
        return mk_check_owners(o, a, err);
    }
    if ((st = mk_check_rope(o, err)) != DEVIO_OK || (st = mk_check_bias(o, a, err)) != DEVIO_OK ||
        (st = mk_check_head_dim(o, a, err)) != DEVIO_OK ||
        (st = mk_check_owners(o, a, err)) != DEVIO_OK)
        return st;
    return a == MK_ARCH_GRANITE ? mk_check_multipliers(o, err) : DEVIO_OK;
}

/* ---- tensors ---- */

/* mk_add with the name "model.layers.I." + SUFFIX. */
static void mk_add_layer(mk_list *L, uint32_t i, const char *suffix, uint32_t ndim, uint64_t s0,
                         uint64_t s1, mk_init init, float scale)
{
    char name[MK_NAME_MAX];
    snprintf(name, sizeof name, "model.layers.%u.%s", i, suffix);
    mk_add(L, name, ndim, s0, s1, init, scale);
}

static void mk_attention_add(const devio_mkmodel_opts *o, mk_arch a, mk_list *L, uint32_t i)
{
    const uint64_t d = o->hidden_size, hd = mk_head_dim(o);
    const uint64_t q = (uint64_t)o->n_heads * hd, kv = (uint64_t)o->n_kv_heads * hd;
    mk_add_layer(L, i, "self_attn.q_proj.weight", 2, q, d, MK_INIT_LINEAR, mk_inv_sqrt(d));
    mk_add_layer(L, i, "self_attn.k_proj.weight", 2, kv, d, MK_INIT_LINEAR, mk_inv_sqrt(d));
    mk_add_layer(L, i, "self_attn.v_proj.weight", 2, kv, d, MK_INIT_LINEAR, mk_inv_sqrt(d));
    mk_add_layer(L, i, "self_attn.o_proj.weight", 2, d, q, MK_INIT_LINEAR, mk_inv_sqrt(q));
    if (o->attention_bias) {
        mk_add_layer(L, i, "self_attn.q_proj.bias", 1, q, 0, MK_INIT_BIAS, MK_BIAS_SPREAD);
        mk_add_layer(L, i, "self_attn.k_proj.bias", 1, kv, 0, MK_INIT_BIAS, MK_BIAS_SPREAD);
        mk_add_layer(L, i, "self_attn.v_proj.bias", 1, kv, 0, MK_INIT_BIAS, MK_BIAS_SPREAD);
    }
    if (a == MK_ARCH_QWEN3) {
        mk_add_layer(L, i, "self_attn.q_norm.weight", 1, hd, 0, MK_INIT_NORM, MK_NORM_SPREAD);
        mk_add_layer(L, i, "self_attn.k_norm.weight", 1, hd, 0, MK_INIT_NORM, MK_NORM_SPREAD);
    }
}

void mk_family_list_add(const devio_mkmodel_opts *o, mk_arch a, mk_list *L)
{
    const uint64_t V = o->vocab_size, d = o->hidden_size, f = o->intermediate_size;
    mk_add(L, "model.embed_tokens.weight", 2, V, d, MK_INIT_LINEAR, mk_inv_sqrt(d));
    mk_add(L, "model.norm.weight", 1, d, 0, MK_INIT_NORM, MK_NORM_SPREAD);
    if (!o->tie_word_embeddings)
        mk_add(L, "lm_head.weight", 2, V, d, MK_INIT_LINEAR, mk_inv_sqrt(d));
    for (uint32_t i = 0; i < o->n_layers; i++) {
        mk_add_layer(L, i, "input_layernorm.weight", 1, d, 0, MK_INIT_NORM, MK_NORM_SPREAD);
        mk_attention_add(o, a, L, i);
        mk_add_layer(L, i, "post_attention_layernorm.weight", 1, d, 0, MK_INIT_NORM,
                     MK_NORM_SPREAD);
        mk_add_layer(L, i, "mlp.gate_proj.weight", 2, f, d, MK_INIT_LINEAR, mk_inv_sqrt(d));
        mk_add_layer(L, i, "mlp.up_proj.weight", 2, f, d, MK_INIT_LINEAR, mk_inv_sqrt(d));
        mk_add_layer(L, i, "mlp.down_proj.weight", 2, d, f, MK_INIT_LINEAR, mk_inv_sqrt(f));
    }
}

uint64_t mk_family_param_count(const devio_mkmodel_opts *o, mk_arch a)
{
    const uint64_t V = o->vocab_size, d = o->hidden_size, f = o->intermediate_size;
    const uint64_t hd = o->head_dim ? o->head_dim : (o->n_heads ? d / o->n_heads : 0);
    const uint64_t q = o->n_heads * hd, kv = o->n_kv_heads * hd;
    uint64_t layer = 2 * d + q * d + 2 * kv * d + d * q + 3 * f * d;
    if (o->attention_bias)
        layer += q + 2 * kv;
    if (a == MK_ARCH_QWEN3)
        layer += 2 * hd;
    return V * d * (o->tie_word_embeddings ? 1 : 2) + d + layer * o->n_layers;
}

/* ---- config.json ---- */

/* "rope_scaling": null, or its object with keys sorted and nested two more
 * spaces, as json.dumps(indent=2, sort_keys=True) writes it. */
static void mk_rope_scaling(const devio_mkmodel_opts *o, mk_buf *b)
{
    static const char *const types[] = {NULL, "linear", "llama3", "yarn"};
    const devio_mkmodel_rope t = o->rope_scaling;
    if (t == DEVIO_MKMODEL_ROPE_NONE) {
        mk_buf_printf(b, "  \"rope_scaling\": null,\n");
        return;
    }
    mk_buf_printf(b, "  \"rope_scaling\": {\n");
    if (t == DEVIO_MKMODEL_ROPE_YARN)
        mk_buf_printf(b, "    \"beta_fast\": 32.0,\n    \"beta_slow\": 1.0,\n");
    mk_buf_printf(b, "    \"factor\": ");
    mk_json_double(b, mk_rope_factor(o));
    mk_buf_printf(b, ",\n");
    if (t == DEVIO_MKMODEL_ROPE_LLAMA3)
        mk_buf_printf(b, "    \"high_freq_factor\": 4.0,\n    \"low_freq_factor\": 1.0,\n");
    if (t != DEVIO_MKMODEL_ROPE_LINEAR)
        mk_buf_printf(b, "    \"original_max_position_embeddings\": %u,\n",
                      mk_rope_original_max(o));
    mk_buf_printf(b, "    \"rope_type\": \"%s\"\n  },\n", types[t]);
}

/* "sliding_window": Qwen2 writes its (unused) window as max_position_
 * embeddings, Qwen3 null; Mistral's is the window or null. */
static void mk_sliding_window(const devio_mkmodel_opts *o, mk_arch a, mk_buf *b)
{
    uint32_t w = a == MK_ARCH_QWEN2     ? o->max_position_embeddings
                 : a == MK_ARCH_MISTRAL ? o->sliding_window
                                        : 0;
    if (w)
        mk_kv_u(b, "sliding_window", w);
    else
        mk_buf_printf(b, "  \"sliding_window\": null,\n");
}

/* The keys from "architectures" to "max_position_embeddings". */
static void mk_config_head(const devio_mkmodel_opts *o, mk_arch a, const mk_family *fam,
                           mk_buf *b)
{
    const bool granite = a == MK_ARCH_GRANITE;
    mk_buf_printf(b, "{\n  \"architectures\": [\"%s\"],\n", fam->class_name);
    if (fam->bias_key)
        mk_kv_b(b, "attention_bias", o->attention_bias);
    mk_kv_f(b, "attention_dropout", 0.0);
    if (granite)
        mk_kv_f(b, "attention_multiplier", o->attention_multiplier);
    mk_kv_u(b, "bos_token_id", o->vocab_size > 1 ? 1u : 0u);
    if (granite)
        mk_kv_f(b, "embedding_multiplier", o->embedding_multiplier);
    mk_kv_u(b, "eos_token_id", o->vocab_size > 2 ? 2u : 0u);
    if (fam->head_dim_key)
        mk_kv_u(b, "head_dim", mk_head_dim(o));
    mk_kv_s(b, "hidden_act", "silu");
    mk_kv_u(b, "hidden_size", o->hidden_size);
    mk_kv_f(b, "initializer_range", 0.02);
    mk_kv_u(b, "intermediate_size", o->intermediate_size);
    if (granite)
        mk_kv_f(b, "logits_scaling", o->logits_scaling);
    mk_kv_u(b, "max_position_embeddings", o->max_position_embeddings);
}

void mk_family_config(const devio_mkmodel_opts *o, mk_arch a, mk_buf *b)
{
    const mk_family fam = mk_family_of(o, a);
    mk_config_head(o, a, &fam, b);
    if (fam.qwen_window)
        mk_kv_u(b, "max_window_layers", o->n_layers);
    if (fam.mlp_bias_key)
        mk_kv_b(b, "mlp_bias", false);
    mk_kv_s(b, "model_type", fam.model_type);
    mk_kv_u(b, "num_attention_heads", o->n_heads);
    mk_kv_u(b, "num_hidden_layers", o->n_layers);
    mk_kv_u(b, "num_key_value_heads", o->n_kv_heads);
    if (a == MK_ARCH_GRANITE)
        mk_kv_f(b, "residual_multiplier", o->residual_multiplier);
    mk_kv_f(b, "rms_norm_eps", o->rms_norm_eps);
    mk_rope_scaling(o, b);
    mk_kv_f(b, "rope_theta", o->rope_theta);
    if (fam.qwen_window || a == MK_ARCH_MISTRAL)
        mk_sliding_window(o, a, b);
    mk_kv_b(b, "tie_word_embeddings", o->tie_word_embeddings);
    mk_kv_s(b, "torch_dtype", mk_torch_dtype(o->dtype));
    mk_kv_b(b, "use_cache", true);
    if (fam.qwen_window)
        mk_kv_b(b, "use_sliding_window", false);
    mk_buf_printf(b, "  \"vocab_size\": %u\n}\n", o->vocab_size);
}
