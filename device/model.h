/* model.h - a Hugging Face Llama-family model: config.json + safetensors.
 * Loading validates every tensor's dtype, shape and byte range; it never
 * computes, and a malformed file is an error naming the file and tensor. */
#ifndef DEVIO_MODEL_H
#define DEVIO_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "device/devio.h"

typedef enum devio_dtype {
    DEVIO_F32 = 0,
    DEVIO_F16,
    DEVIO_BF16,
} devio_dtype;

size_t devio_dtype_size(devio_dtype t);
const char *devio_dtype_str(devio_dtype t); /* "F32", "F16", "BF16" */

/* A read-only view of one tensor. `data` points into the mapped (or read)
 * file and is owned by the model. Shapes are Hugging Face's ([out, in]). */
typedef struct devio_tensor {
    const void *data; /* NULL when the tensor is absent (optional biases) */
    devio_dtype dtype;
    uint32_t ndim;
    uint64_t shape[2];
} devio_tensor;

/* One decoder layer. Shapes with d = hidden_size, h = n_heads,
 * kv = n_kv_heads, hd = head_dim, f = intermediate_size. */
typedef struct devio_layer {
    devio_tensor attn_norm; /* [d]              input_layernorm.weight */
    devio_tensor wq;        /* [h*hd, d]        self_attn.q_proj.weight */
    devio_tensor wk;        /* [kv*hd, d]       self_attn.k_proj.weight */
    devio_tensor wv;        /* [kv*hd, d]       self_attn.v_proj.weight */
    devio_tensor wo;        /* [d, h*hd]        self_attn.o_proj.weight */
    devio_tensor bq, bk, bv;/* [h*hd],[kv*hd],[kv*hd] optional biases */
    devio_tensor ffn_norm;  /* [d]              post_attention_layernorm.weight */
    devio_tensor w_gate;    /* [f, d]           mlp.gate_proj.weight */
    devio_tensor w_up;      /* [f, d]           mlp.up_proj.weight */
    devio_tensor w_down;    /* [d, f]           mlp.down_proj.weight */
} devio_layer;

typedef struct devio_model_config {
    char architecture[64]; /* "LlamaForCausalLM", "Qwen2ForCausalLM", ... */
    uint32_t vocab_size;
    uint32_t hidden_size;
    uint32_t intermediate_size;
    uint32_t n_layers;
    uint32_t n_heads;
    uint32_t n_kv_heads;
    uint32_t head_dim;
    uint32_t max_position_embeddings;
    float rope_theta;
    float rms_norm_eps;
    int tie_word_embeddings;
    int attention_bias;
} devio_model_config;

/* Release with devio_model_free(). */
struct devio_model {
    devio_model_config cfg;
    devio_tensor embed;   /* [vocab, d] model.embed_tokens.weight */
    devio_tensor norm;    /* [d]        model.norm.weight */
    devio_tensor lm_head; /* [vocab, d] lm_head.weight, or embed when tied */
    devio_layer *layers;  /* n_layers entries */
    /* Backing storage: private to model.c. */
    void *priv;
};

/* Load `dir` (config.json + model.safetensors or a sharded index).
 * On success *out is owned by the caller (devio_model_free). On failure
 * *out is NULL and err->message names the file and tensor at fault. */
devio_status devio_model_load(const char *dir, devio_model **out, devio_error *err);
void devio_model_free(devio_model *m);

/* Widen element i of a tensor to binary32 exactly. */
float devio_tensor_get(const devio_tensor *t, uint64_t i);

#endif
