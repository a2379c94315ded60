/* model_gguf.c - a GGUF file as a model: its metadata as the config.json a Hugging Face
 * directory of the same model carries, and its tensors under Hugging Face's names and shapes
 * (model_load.h). It must never hand out a tensor of another shape or type than asked, nor
 * q and k rows in llama.cpp's interleaved order, nor pass a file holding a value or a tensor
 * devio would not compute with. */
#include "device/model/model_load.h"

#include <ctype.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "device/model/model_config.h"
#include "device/numerics/quant.h"
#include "device/model/safetensors.h"
#include "device/status.h"

bool devio_model_path_is_gguf(const char *path)
{
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode))
        return false;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return false;
    char magic[4];
    bool yes = pread(fd, magic, 4, 0) == 4 && memcmp(magic, "GGUF", 4) == 0;
    close(fd);
    return yes;
}

/* general.architecture -> the Hugging Face architecture devio computes it as. */
static const struct {
    const char *gguf, *hf;
} archs[] = {
    {"llama", "LlamaForCausalLM"},
    {"qwen2", "Qwen2ForCausalLM"},
    {"qwen3", "Qwen3ForCausalLM"},
    {"granite", "GraniteForCausalLM"},
};

/* The unsigned metadata value ARCH.key into obj[field]; absent and not
 * required: nothing set. */
static devio_status put_u(const devio_gguf_file *f, const char *arch, const char *key,
                          bool required, json_t *obj, const char *field, devio_error *err)
{
    char name[128];
    snprintf(name, sizeof name, "%s.%s", arch, key);
    uint64_t v;
    if (devio_gguf_get_u64(f, name, &v) && v <= INT32_MAX)
        return json_object_set_new(obj, field, json_integer((json_int_t)v)) == 0
                   ? DEVIO_OK
                   : devio_fail(err, DEVIO_E_NOMEM, "out of memory");
    if (!required && !devio_gguf_find_kv(f, name))
        return DEVIO_OK;
    return devio_fail(err, DEVIO_E_MODEL,
                      "%.100s: metadata '%s' is %s", devio_gguf_label(f), name,
                      devio_gguf_find_kv(f, name) ? "not an unsigned integer below 2^31"
                                                  : "missing");
}

/* The float NAME into *v when present (*have): a number obeying the rule
 * of config.json's `field`, the name it is read as (model_config.h). */
static devio_status get_f(const devio_gguf_file *f, const char *name, const char *field,
                          float *v, bool *have, devio_error *err)
{
    *have = devio_gguf_find_kv(f, name) != NULL;
    if (!*have)
        return DEVIO_OK;
    if (!devio_gguf_get_f32(f, name, v))
        return devio_fail(err, DEVIO_E_MODEL, "%.100s: metadata '%s' is not a number",
                          devio_gguf_label(f), name);
    return devio_model_float_check(devio_gguf_label(f), "metadata", name, field, (double)*v,
                                   err);
}

/* The float ARCH.key into obj[field]; absent: nothing set. */
static devio_status put_f(const devio_gguf_file *f, const char *arch, const char *key,
                          json_t *obj, const char *field, devio_error *err)
{
    char name[128];
    snprintf(name, sizeof name, "%s.%s", arch, key);
    float v;
    bool have;
    devio_status st = get_f(f, name, field, &v, &have, err);
    if (st != DEVIO_OK || !have)
        return st;
    return json_object_set_new(obj, field, json_real((double)v)) == 0
               ? DEVIO_OK
               : devio_fail(err, DEVIO_E_NOMEM, "out of memory");
}

/* The keys under ARCH.rope. that devio reads (rope.freq_base with the
 * config, the others in put_rope); any other changes RoPE in a way devio
 * would not compute (yarn's log multiplier, M-RoPE's sections, ...). */
static const char *const rope_keys[] = {
    "freq_base",
    "dimension_count",
    "scale_linear",
    "scaling.type",
    "scaling.factor",
    "scaling.attn_factor",
    "scaling.original_context_length",
    "scaling.finetuned", /* a flag that changes no number */
    "scaling.yarn_beta_fast",
    "scaling.yarn_beta_slow",
};

static devio_status refuse_rope_keys(const devio_gguf_file *f, const char *arch,
                                     devio_error *err)
{
    char prefix[64];
    int plen = snprintf(prefix, sizeof prefix, "%s.rope.", arch);
    for (size_t i = 0; i < devio_gguf_kv_count(f); i++) {
        const char *k = devio_gguf_kv_at(f, i)->key;
        if (strncmp(k, prefix, (size_t)plen) != 0)
            continue;
        bool known = false;
        for (size_t j = 0; j < sizeof rope_keys / sizeof *rope_keys; j++)
            known = known || strcmp(k + plen, rope_keys[j]) == 0;
        if (!known)
            return devio_fail(err, DEVIO_E_UNSUPPORTED,
                              "%.100s: metadata '%.80s' is not one devio reads; it would change "
                              "RoPE",
                              devio_gguf_label(f), k);
    }
    return DEVIO_OK;
}

/* A scaling factor without ARCH.rope.scaling.type: rope.scaling.factor, or
 * rope.scale_linear, its older name, scales linearly, as llama.cpp (whose
 * default type is linear) reads it; 0 and 1 scale nothing. */
static devio_status untyped_factor(const devio_gguf_file *f, const char *arch, json_t *c,
                                   devio_error *err)
{
    char name[128];
    snprintf(name, sizeof name, "%s.rope.scaling.factor", arch);
    if (!devio_gguf_find_kv(f, name))
        snprintf(name, sizeof name, "%s.rope.scale_linear", arch);
    float v;
    if (!devio_gguf_find_kv(f, name))
        return DEVIO_OK;
    if (!devio_gguf_get_f32(f, name, &v))
        return devio_fail(err, DEVIO_E_MODEL, "%.100s: metadata '%s' is not a number",
                          devio_gguf_label(f), name);
    if (v == 0.0f || v == 1.0f)
        return DEVIO_OK;
    devio_status st =
        devio_model_float_check(devio_gguf_label(f), "metadata", name, "factor", (double)v, err);
    if (st != DEVIO_OK)
        return st;
    json_t *rs = json_object(); /* c owns it from here, whatever follows */
    if (json_object_set_new(c, "rope_scaling", rs) ||
        json_object_set_new(rs, "rope_type", json_string("linear")) ||
        json_object_set_new(rs, "factor", json_real((double)v)))
        return devio_fail(err, DEVIO_E_NOMEM, "out of memory");
    return DEVIO_OK;
}

/* RoPE scaling as config.json's rope_scaling: ARCH.rope.scaling.type
 * "linear" (its factor) or "yarn" (factor, original_context_length as
 * original_max_position_embeddings, yarn_beta_fast and yarn_beta_slow when
 * given; the attention factor by transformers' rule from the factor); no
 * type: untyped_factor. What devio does not compute is refused: another
 * type, an attn_factor other than 1 (llama.cpp multiplies its own by it;
 * transformers' config has no such product), per-frequency factors
 * (rope_freqs.weight, which stand for llama3's parameters without giving
 * them), a partial rotary dimension and a rope key devio does not read. */
static devio_status put_rope(const devio_gguf_file *f, const char *arch, uint32_t hd, json_t *c,
                             devio_error *err)
{
    char name[128];
    const char *label = devio_gguf_label(f);
    uint64_t len = 0;
    if (devio_gguf_find_tensor(f, "rope_freqs.weight"))
        return devio_fail(err, DEVIO_E_UNSUPPORTED,
                          "%.100s: rope_freqs.weight (per-frequency RoPE factors, llama3's "
                          "scaling without its parameters) is not supported in GGUF files; "
                          "serve the Hugging Face directory",
                          label);
    uint32_t dims = hd;
    snprintf(name, sizeof name, "%s.rope.dimension_count", arch);
    if (devio_gguf_find_kv(f, name) && !devio_gguf_get_u32(f, name, &dims))
        return devio_fail(err, DEVIO_E_MODEL, "%.100s: metadata '%s' is not an unsigned integer",
                          label, name);
    if (dims != hd)
        return devio_fail(err, DEVIO_E_UNSUPPORTED,
                          "%.100s: %s %u turns part of a head of %u; devio turns whole heads",
                          label, name, dims, hd);
    devio_status st = refuse_rope_keys(f, arch, err);
    float attn = 1.0f;
    bool have = false;
    snprintf(name, sizeof name, "%s.rope.scaling.attn_factor", arch);
    if (st != DEVIO_OK || (st = get_f(f, name, "attention_factor", &attn, &have, err)))
        return st;
    if (attn != 1.0f)
        return devio_fail(err, DEVIO_E_UNSUPPORTED,
                          "%.100s: %s %g is not supported (1 is: transformers' attention factor "
                          "from the scaling factor)",
                          label, name, (double)attn);
    snprintf(name, sizeof name, "%s.rope.scaling.type", arch);
    const char *t = devio_gguf_get_str(f, name, &len);
    if (!t && devio_gguf_find_kv(f, name))
        return devio_fail(err, DEVIO_E_MODEL, "%.100s: metadata '%s' is not a string", label,
                          name);
    if (!t)
        return untyped_factor(f, arch, c, err);
    if (len == 4 && memcmp(t, "none", 4) == 0)
        return DEVIO_OK;
    bool yarn = len == 4 && memcmp(t, "yarn", 4) == 0;
    if (!yarn && !(len == 6 && memcmp(t, "linear", 6) == 0))
        return devio_fail(err, DEVIO_E_UNSUPPORTED,
                          "%.100s: %s '%.*s' is not supported (none, linear and yarn are)",
                          label, name, (int)(len > 40 ? 40 : len), t);
    snprintf(name, sizeof name, "%s.rope.scaling.factor", arch);
    if (!devio_gguf_find_kv(f, name))
        return devio_fail(err, DEVIO_E_MODEL, "%.100s: metadata '%s' is missing", label, name);
    json_t *rs = json_object(); /* c owns it from here, whatever follows */
    if (json_object_set_new(c, "rope_scaling", rs) ||
        json_object_set_new(rs, "rope_type", json_string(yarn ? "yarn" : "linear")))
        return devio_fail(err, DEVIO_E_NOMEM, "out of memory");
    if ((st = put_f(f, arch, "rope.scaling.factor", rs, "factor", err)) || !yarn)
        return st;
    if ((st = put_u(f, arch, "rope.scaling.original_context_length", false, rs,
                    "original_max_position_embeddings", err)) ||
        (st = put_f(f, arch, "rope.scaling.yarn_beta_fast", rs, "beta_fast", err)) ||
        (st = put_f(f, arch, "rope.scaling.yarn_beta_slow", rs, "beta_slow", err)))
        return st;
    return DEVIO_OK;
}

/* The vocabulary is token_embd.weight's rows; ARCH.vocab_size and the
 * tokenizer's token list, when given, must say the same. */
static devio_status check_vocab(const devio_gguf_file *f, const char *arch, uint64_t rows,
                                devio_error *err)
{
    char name[128];
    snprintf(name, sizeof name, "%s.vocab_size", arch);
    uint64_t v = rows;
    if (devio_gguf_find_kv(f, name) && !devio_gguf_get_u64(f, name, &v))
        return devio_fail(err, DEVIO_E_MODEL, "%.100s: metadata '%s' is not an unsigned integer",
                          devio_gguf_label(f), name);
    if (v != rows)
        return devio_fail(err, DEVIO_E_MODEL,
                          "%.100s: metadata '%s' is %llu, but tensor 'token_embd.weight' has "
                          "%llu rows",
                          devio_gguf_label(f), name, (unsigned long long)v,
                          (unsigned long long)rows);
    const devio_gguf_kv *tokens = devio_gguf_find_kv(f, "tokenizer.ggml.tokens");
    if (tokens && (tokens->type != DEVIO_GGUF_ARRAY || tokens->n != rows))
        return devio_fail(err, DEVIO_E_MODEL,
                          "%.100s: metadata 'tokenizer.ggml.tokens' lists %llu tokens, but "
                          "tensor 'token_embd.weight' has %llu rows",
                          devio_gguf_label(f),
                          (unsigned long long)(tokens->type == DEVIO_GGUF_ARRAY ? tokens->n : 0),
                          (unsigned long long)rows);
    return DEVIO_OK;
}

devio_status devio_gguf_model_config(const devio_gguf_file *f, json_t **out, devio_error *err)
{
    *out = NULL;
    const char *label = devio_gguf_label(f);
    uint64_t len = 0;
    const char *a = devio_gguf_get_str(f, "general.architecture", &len);
    if (!a)
        return devio_fail(err, DEVIO_E_MODEL, "%.100s: metadata 'general.architecture' is missing",
                          label);
    const char *hf = NULL, *arch = NULL;
    for (size_t i = 0; i < sizeof archs / sizeof *archs; i++)
        if (strlen(archs[i].gguf) == len && memcmp(archs[i].gguf, a, len) == 0)
            hf = archs[i].hf, arch = archs[i].gguf;
    if (!hf)
        return devio_fail(err, DEVIO_E_MODEL,
                          "%.100s: architecture '%.*s' is not one devio computes "
                          "(llama, qwen2, qwen3, granite)",
                          label, (int)(len > 40 ? 40 : len), a);
    const devio_gguf_tensor *embd = devio_gguf_find_tensor(f, "token_embd.weight");
    if (!embd || embd->ndim != 2)
        return devio_fail(err, DEVIO_E_MODEL,
                          "%.100s: tensor 'token_embd.weight' is missing or not 2-D", label);
    devio_status st = check_vocab(f, arch, embd->ne[1], err);
    if (st != DEVIO_OK)
        return st;
    json_t *c = json_object();
    json_t *names = json_array();
    if (!c || !names || json_array_append_new(names, json_string(hf)) ||
        json_object_set_new(c, "architectures", names) ||
        json_object_set_new(c, "vocab_size", json_integer((json_int_t)embd->ne[1])) ||
        json_object_set_new(c, "tie_word_embeddings",
                            json_boolean(!devio_gguf_find_tensor(f, "output.weight"))) ||
        json_object_set_new(c, "hidden_act", json_string("silu"))) {
        if (!c)
            json_decref(names);
        json_decref(c);
        return devio_fail(err, DEVIO_E_NOMEM, "out of memory");
    }
    if ((st = put_u(f, arch, "embedding_length", true, c, "hidden_size", err)) ||
        (st = put_u(f, arch, "feed_forward_length", true, c, "intermediate_size", err)) ||
        (st = put_u(f, arch, "block_count", true, c, "num_hidden_layers", err)) ||
        (st = put_u(f, arch, "attention.head_count", true, c, "num_attention_heads", err)) ||
        (st = put_u(f, arch, "attention.head_count_kv", false, c, "num_key_value_heads", err)) ||
        (st = put_u(f, arch, "attention.key_length", false, c, "head_dim", err)) ||
        (st = put_u(f, arch, "context_length", true, c, "max_position_embeddings", err)) ||
        (st = put_f(f, arch, "rope.freq_base", c, "rope_theta", err)) ||
        (st = put_f(f, arch, "attention.layer_norm_rms_epsilon", c, "rms_norm_eps", err)) ||
        /* Granite's four multipliers (absent in the other families). */
        (st = put_f(f, arch, "embedding_scale", c, "embedding_multiplier", err)) ||
        (st = put_f(f, arch, "residual_scale", c, "residual_multiplier", err)) ||
        (st = put_f(f, arch, "attention.scale", c, "attention_multiplier", err)) ||
        (st = put_f(f, arch, "logit_scale", c, "logits_scaling", err))) {
        json_decref(c);
        return st;
    }
    json_int_t d = json_integer_value(json_object_get(c, "hidden_size"));
    json_int_t h = json_integer_value(json_object_get(c, "num_attention_heads"));
    const json_t *kd = json_object_get(c, "head_dim");
    uint32_t hd = kd ? (uint32_t)json_integer_value(kd) : h ? (uint32_t)(d / h) : 0;
    if ((st = put_rope(f, arch, hd, c, err))) {
        json_decref(c);
        return st;
    }
    *out = c;
    return DEVIO_OK;
}

/* ---- tensors ---------------------------------------------------------- */

/* Hugging Face's name within a layer -> llama.cpp's. */
static const struct {
    const char *hf, *gguf;
} layer_names[] = {
    {"input_layernorm.weight", "attn_norm.weight"},
    {"self_attn.q_proj.weight", "attn_q.weight"},
    {"self_attn.k_proj.weight", "attn_k.weight"},
    {"self_attn.v_proj.weight", "attn_v.weight"},
    {"self_attn.o_proj.weight", "attn_output.weight"},
    {"self_attn.q_proj.bias", "attn_q.bias"},
    {"self_attn.k_proj.bias", "attn_k.bias"},
    {"self_attn.v_proj.bias", "attn_v.bias"},
    {"self_attn.q_norm.weight", "attn_q_norm.weight"},
    {"self_attn.k_norm.weight", "attn_k_norm.weight"},
    {"post_attention_layernorm.weight", "ffn_norm.weight"},
    {"mlp.gate_proj.weight", "ffn_gate.weight"},
    {"mlp.up_proj.weight", "ffn_up.weight"},
    {"mlp.down_proj.weight", "ffn_down.weight"},
};

/* llama.cpp's name of hf into buf; false when it has none. */
static bool gguf_name(const char *hf, char *buf, size_t n)
{
    static const struct {
        const char *hf, *gguf;
    } top[] = {{"model.embed_tokens.weight", "token_embd.weight"},
               {"model.norm.weight", "output_norm.weight"},
               {"lm_head.weight", "output.weight"}};
    for (size_t i = 0; i < sizeof top / sizeof *top; i++)
        if (strcmp(hf, top[i].hf) == 0) {
            snprintf(buf, n, "%s", top[i].gguf);
            return true;
        }
    unsigned li;
    int used = 0;
    if (sscanf(hf, "model.layers.%u.%n", &li, &used) != 1 || used == 0)
        return false;
    for (size_t i = 0; i < sizeof layer_names / sizeof *layer_names; i++)
        if (strcmp(hf + used, layer_names[i].hf) == 0) {
            snprintf(buf, n, "blk.%u.%s", li, layer_names[i].gguf);
            return true;
        }
    return false;
}

/* Whether the tensor is a q or k projection (or bias) whose rows llama.cpp
 * interleaved: per head, Hugging Face's row j * hd/2 + i is its 2i + j. */
static bool interleaved(const devio_model_config *c, const char *hf)
{
    return (strcmp(c->architecture, "LlamaForCausalLM") == 0 ||
            strcmp(c->architecture, "GraniteForCausalLM") == 0) &&
           (strstr(hf, ".q_proj.") || strstr(hf, ".k_proj."));
}

/* Rows of row_bytes each, heads of hd rows, from llama.cpp's order back to
 * Hugging Face's. */
static void deinterleave(uint8_t *dst, const uint8_t *src, uint64_t rows, uint32_t hd,
                         size_t row_bytes)
{
    for (uint64_t h = 0; h < rows / hd; h++)
        for (uint32_t j = 0; j < 2; j++)
            for (uint32_t i = 0; i < hd / 2; i++)
                memcpy(dst + (h * hd + j * (hd / 2) + i) * row_bytes,
                       src + (h * hd + 2 * i + j) * row_bytes, row_bytes);
}

static bool dtype_of(uint32_t type, devio_dtype *dt)
{
    static const struct {
        uint32_t ggml;
        devio_dtype dt;
    } map[] = {{DEVIO_GGML_F32, DEVIO_F32},   {DEVIO_GGML_F16, DEVIO_F16},
               {DEVIO_GGML_BF16, DEVIO_BF16}, {DEVIO_GGML_Q8_0, DEVIO_Q8_0},
               {DEVIO_GGML_Q4_0, DEVIO_Q4_0}, {DEVIO_GGML_Q4_1, DEVIO_Q4_1},
               {DEVIO_GGML_Q5_0, DEVIO_Q5_0}, {DEVIO_GGML_Q5_1, DEVIO_Q5_1},
               {DEVIO_GGML_Q4_K, DEVIO_Q4_K}, {DEVIO_GGML_Q5_K, DEVIO_Q5_K},
               {DEVIO_GGML_Q6_K, DEVIO_Q6_K}};
    for (size_t i = 0; i < sizeof map / sizeof *map; i++)
        if (map[i].ggml == type) {
            *dt = map[i].dt;
            return true;
        }
    return false;
}

/* Every block's scales finite: its split form's (devio_quant_split), which
 * is not finite exactly when one of its f16 scales is not (they are
 * multiplied by small integers, and an infinity times 0 is a NaN). */
static devio_status check_scales(const char *label, const char *name, devio_dtype dt,
                                 const uint8_t *p, uint64_t nbytes, devio_error *err)
{
    uint32_t q = devio_dtype_ggml(dt), bytes = devio_quant_block_bytes(q);
    uint32_t groups = devio_quant_block(q) / devio_quant_group(q);
    for (uint64_t b = 0; b < nbytes / bytes; b++) {
        int8_t qs[256];
        float S[16], M[16] = {0};
        devio_quant_split(q, p + b * bytes, qs, S, M);
        for (uint32_t g = 0; g < groups; g++)
            if (!isfinite(S[g]) || !isfinite(M[g]))
                return devio_fail(err, DEVIO_E_MODEL,
                                  "%.100s: tensor '%.80s' has a non-finite scale in block %llu; "
                                  "non-finite weights are refused",
                                  label, name, (unsigned long long)b);
    }
    return DEVIO_OK;
}

devio_status devio_gguf_model_tensor(const devio_gguf_file *f, const devio_model_config *c,
                                     const char *hf_name, bool required, uint32_t ndim,
                                     uint64_t s0, uint64_t s1, bool scan, bool *used,
                                     devio_tensor *out, void **copy, size_t *copy_n,
                                     devio_error *err)
{
    memset(out, 0, sizeof *out);
    *copy = NULL;
    *copy_n = 0;
    const char *label = devio_gguf_label(f);
    char name[160];
    if (!gguf_name(hf_name, name, sizeof name))
        return devio_fail(err, DEVIO_E_MODEL, "%.100s: no GGUF tensor stands for '%.80s'", label,
                          hf_name);
    const devio_gguf_tensor *t = devio_gguf_find_tensor(f, name);
    if (!t)
        return required ? devio_fail(err, DEVIO_E_MODEL, "%.100s: tensor '%s' is missing", label,
                                     name)
                        : DEVIO_OK;
    /* GGUF lists the row length first: Hugging Face's [s0, s1] is ne = {s1, s0}. */
    bool ok = ndim == 1 ? t->ndim == 1 && t->ne[0] == s0
                        : t->ndim == 2 && t->ne[0] == s1 && t->ne[1] == s0;
    if (!ok)
        return devio_fail(err, DEVIO_E_MODEL,
                          "%.100s: tensor '%s' has %u dimensions (%llu, %llu), expected rows of "
                          "%llu x %llu",
                          label, name, t->ndim, (unsigned long long)t->ne[0],
                          (unsigned long long)(t->ndim > 1 ? t->ne[1] : 1),
                          (unsigned long long)(ndim == 1 ? s0 : s1),
                          (unsigned long long)(ndim == 1 ? 1 : s0));
    devio_dtype dt;
    if (!dtype_of(t->type, &dt))
        return devio_fail(err, DEVIO_E_UNSUPPORTED,
                          "%.100s: tensor '%s' is %s; devio computes with F32, F16, BF16, Q8_0, "
                          "Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K weights",
                          label, name, devio_gguf_type_name(t->type));
    /* llama.cpp's converters write every vector as F32 and its kernels
     * take norms as F32: another type is no file of theirs (a retyped
     * tensor's F32 bytes read as other numbers), refused, not computed. */
    if (ndim == 1 && dt != DEVIO_F32)
        return devio_fail(err, DEVIO_E_UNSUPPORTED,
                          "%.100s: tensor '%s' is a vector of %s; devio reads a GGUF file's "
                          "vectors (norms, biases) as F32, as llama.cpp writes them",
                          label, name, devio_dtype_str(dt));
    used[devio_gguf_tensor_index(f, t)] = true;
    devio_status st;
    if (scan && (st = devio_dtype_quantized(dt)
                          ? check_scales(label, name, dt, t->data, t->nbytes, err)
                          : devio_weights_check_finite(label, name, dt, t->data, t->nbytes, err)))
        return st;
    *out = (devio_tensor){.data = t->data, .dtype = dt, .ndim = ndim, .shape = {s0, ndim > 1 ? s1 : 0}};
    bool perm = interleaved(c, hf_name);
    /* Quantized blocks are read byte by byte: any address does. */
    size_t align = devio_dtype_quantized(dt) ? 1u : devio_dtype_size(dt);
    if (!perm && (uintptr_t)t->data % align == 0)
        return DEVIO_OK;
    /* A copy: rows back in Hugging Face's order, or whole elements aligned. */
    uint8_t *p = devio_st_pages((size_t)t->nbytes);
    if (!p)
        return devio_fail(err, DEVIO_E_NOMEM, "%.100s: tensor '%s': out of memory for a copy",
                          label, name);
    /* A bias's rows are its elements. */
    size_t row_bytes = (size_t)(t->nbytes / s0);
    if (perm)
        deinterleave(p, t->data, s0, c->head_dim, row_bytes);
    else
        memcpy(p, t->data, (size_t)t->nbytes);
    out->data = p;
    *copy = p;
    *copy_n = (size_t)t->nbytes;
    return DEVIO_OK;
}

devio_status devio_gguf_model_unused(const devio_gguf_file *f, const devio_model_config *c,
                                     const bool *used, devio_error *err)
{
    uint64_t len = 0;
    const char *arch = devio_gguf_get_str(f, "general.architecture", &len);
    int alen = arch ? (int)(len > 40 ? 40 : len) : 1;
    for (size_t i = 0; i < devio_gguf_tensor_count(f); i++) {
        if (used[i])
            continue;
        const char *name = devio_gguf_tensor_at(f, i)->name;
        char *end = NULL;
        unsigned long li = strncmp(name, "blk.", 4) == 0 && isdigit((unsigned char)name[4])
                               ? strtoul(name + 4, &end, 10)
                               : 0;
        if (end && *end == '.' && li >= c->n_layers)
            return devio_fail(err, DEVIO_E_MODEL,
                              "%.100s: tensor '%.80s' is of layer %lu, but '%.*s.block_count' "
                              "is %u; a tensor devio would not compute with is refused",
                              devio_gguf_label(f), name, li, alen, arch ? arch : "?",
                              c->n_layers);
        return devio_fail(err, DEVIO_E_MODEL,
                          "%.100s: tensor '%.80s' is not one devio computes a %.*s model with; "
                          "a tensor devio would not compute with is refused",
                          devio_gguf_label(f), name, alen, arch ? arch : "?");
    }
    return DEVIO_OK;
}

/* ---- text --------------------------------------------------------------- */

/* Token id `key` into *id (-1 when absent): an unsigned integer below vocab. */
static devio_status token_id(const devio_gguf_file *f, const char *key, uint32_t vocab,
                             int64_t *id, devio_error *err)
{
    uint64_t v;
    *id = -1;
    if (!devio_gguf_find_kv(f, key))
        return DEVIO_OK;
    if (!devio_gguf_get_u64(f, key, &v))
        return devio_fail(err, DEVIO_E_MODEL, "%.100s: metadata '%s' is not an unsigned integer",
                          devio_gguf_label(f), key);
    *id = v > INT64_MAX ? INT64_MAX : (int64_t)v;
    return devio_model_token_check(devio_gguf_label(f), "metadata", key, *id, vocab, err);
}

devio_status devio_gguf_model_text(const devio_gguf_file *f, uint32_t vocab, devio_model_text *t,
                                   devio_error *err)
{
    *t = (devio_model_text){.bos_id = -1, .eos_id = -1, .pad_id = -1, .format = "gguf"};
    devio_status st;
    if ((st = token_id(f, "tokenizer.ggml.bos_token_id", vocab, &t->bos_id, err)) ||
        (st = token_id(f, "tokenizer.ggml.eos_token_id", vocab, &t->eos_id, err)) ||
        (st = token_id(f, "tokenizer.ggml.padding_token_id", vocab, &t->pad_id, err)))
        return st;
    uint64_t len = 0;
    const char *tpl = devio_gguf_get_str(f, "tokenizer.chat_template", &len);
    if (tpl && len < ((uint64_t)1 << 24)) {
        if (!(t->chat_template = malloc((size_t)len + 1)))
            return devio_fail(err, DEVIO_E_NOMEM, "out of memory for the chat template");
        memcpy(t->chat_template, tpl, (size_t)len);
        t->chat_template[len] = '\0';
    }
    return DEVIO_OK;
}
