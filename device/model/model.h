/* model.h - a Hugging Face model: config.json + safetensors, of the Llama
 * family (Llama, Mistral, Qwen2) or the Mamba-2 family (Bamba, Mamba2).
 * Loading validates every tensor's dtype, shape and byte range; it never
 * computes, and a malformed file is an error naming the file and tensor. */
#ifndef DEVIO_MODEL_H
#define DEVIO_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "device/devio.h"

/* A weight's storage. The block-quantized types (a GGUF file's) hold
 * blocks of 32 or 256 elements whose values device/numerics/quant.h defines; a
 * tensor of them is a 2-D weight whose rows are whole blocks. */
typedef enum devio_dtype {
    DEVIO_F32 = 0,
    DEVIO_F16,
    DEVIO_BF16,
    DEVIO_Q8_0,
    DEVIO_Q4_0,
    DEVIO_Q4_1,
    DEVIO_Q5_0,
    DEVIO_Q5_1,
    DEVIO_Q4_K,
    DEVIO_Q5_K,
    DEVIO_Q6_K,
} devio_dtype;

/* Bytes of one element (4 or 2); for a quantized type, 0. */
size_t devio_dtype_size(devio_dtype t);
const char *devio_dtype_str(devio_dtype t); /* "F32", "F16", "BF16", "Q4_K", ... */
bool devio_dtype_quantized(devio_dtype t);
/* ggml's number of a quantized type (device/numerics/quant.h), 0 for the others. */
uint32_t devio_dtype_ggml(devio_dtype t);
/* Bytes of a row of n elements (n a whole number of blocks when quantized). */
uint64_t devio_dtype_row_bytes(devio_dtype t, uint64_t n);

/* A read-only view of one tensor. `data` points into the weight file's
 * bytes, read into anonymous memory at load and owned by the model, so a
 * file changed or truncated on disk afterwards changes nothing here.
 * Shapes are Hugging Face's ([out, in]). */
typedef struct devio_tensor {
    const void *data; /* NULL when the tensor is absent (optional biases) */
    devio_dtype dtype;
    uint32_t ndim;
    uint64_t shape[2]; /* conv1d's [c, 1, K] is held as [c, K] */
} devio_tensor;

/* What a layer's first half is: attention (Llama, Bamba's attn_layer_indices)
 * or a Mamba-2 mixer (every other Bamba layer, every Mamba2 layer). */
typedef enum devio_layer_kind {
    DEVIO_LAYER_ATTENTION = 0,
    DEVIO_LAYER_MIXER,
} devio_layer_kind;

/* A Mamba-2 mixer. I = n_heads * head_dim (inner), G groups of N states,
 * conv_dim = I + 2*G*N, in_dim = I + conv_dim + H; in_proj's rows are
 * z [I] | xBC [conv_dim] | dt [H] in that order. */
typedef struct devio_mixer {
    devio_tensor in_proj;  /* [in_dim, d]  in_proj.weight */
    devio_tensor in_bias;  /* [in_dim]     in_proj.bias (optional) */
    devio_tensor conv_w;   /* [conv_dim, K] conv1d.weight ([conv_dim, 1, K] on disk) */
    devio_tensor conv_b;   /* [conv_dim]   conv1d.bias (optional) */
    devio_tensor dt_bias;  /* [H] */
    devio_tensor a_log;    /* [H]          A = -exp(A_log) */
    devio_tensor d_skip;   /* [H]          D */
    devio_tensor norm;     /* [I]          the gated RMSNorm's weight */
    devio_tensor out_proj; /* [d, I]       out_proj.weight */
    devio_tensor out_bias; /* [d]          out_proj.bias (optional) */
} devio_mixer;

/* One decoder layer. Shapes with d = hidden_size, h = n_heads,
 * kv = n_kv_heads, hd = head_dim, f = intermediate_size. A mixer layer
 * leaves wq..bv empty; a Mamba2 layer has no MLP (ffn_norm..w_down empty). */
typedef struct devio_layer {
    devio_layer_kind kind;
    devio_mixer mixer;      /* DEVIO_LAYER_MIXER only */
    devio_tensor attn_norm; /* [d]              input_layernorm.weight (Mamba2: norm.weight) */
    devio_tensor wq;        /* [h*hd, d]        self_attn.q_proj.weight */
    devio_tensor wk;        /* [kv*hd, d]       self_attn.k_proj.weight */
    devio_tensor wv;        /* [kv*hd, d]       self_attn.v_proj.weight */
    devio_tensor wo;        /* [d, h*hd]        self_attn.o_proj.weight */
    devio_tensor bq, bk, bv;/* [h*hd],[kv*hd],[kv*hd] optional biases */
    devio_tensor q_norm;    /* [hd]             self_attn.q_norm.weight (Qwen3), else absent */
    devio_tensor k_norm;    /* [hd]             self_attn.k_norm.weight (Qwen3), else absent */
    devio_tensor ffn_norm;  /* [d]              post_attention_layernorm (Bamba: pre_ff_layernorm) */
    devio_tensor w_gate;    /* [f, d]           mlp.gate_proj.weight (Bamba: feed_forward.) */
    devio_tensor w_up;      /* [f, d]           mlp.up_proj.weight */
    devio_tensor w_down;    /* [d, f]           mlp.down_proj.weight */
} devio_layer;

typedef enum devio_arch {
    DEVIO_ARCH_LLAMA = 0, /* Llama, Mistral, Qwen2 */
    DEVIO_ARCH_BAMBA,     /* Mamba-2 mixers, attention at attn_layer_indices, an MLP in every layer */
    DEVIO_ARCH_MAMBA2,    /* Mamba-2 mixers only, no MLP */
} devio_arch;

/* The Mamba-2 mixer's dimensions (zero for the Llama family). */
typedef struct devio_ssm_config {
    uint32_t n_heads;   /* H: mamba_n_heads / num_heads */
    uint32_t head_dim;  /* P: mamba_d_head / head_dim */
    uint32_t n_groups;  /* G: mamba_n_groups / n_groups */
    uint32_t d_state;   /* N: mamba_d_state / state_size */
    uint32_t d_conv;    /* K: mamba_d_conv / conv_kernel */
    int conv_bias;      /* mamba_conv_bias / use_conv_bias */
    int proj_bias;      /* mamba_proj_bias / use_bias */
    float dt_min, dt_max; /* time_step_limit; [0, inf] by default */
    float norm_eps;     /* the gated norm's epsilon */
} devio_ssm_config;

/* RoPE scaling (transformers' rope_scaling / rope_parameters). The core
 * turns it into the inverse frequencies and the cos/sin tables (shape.h). */
typedef enum devio_rope_type {
    DEVIO_ROPE_DEFAULT = 0,
    DEVIO_ROPE_LINEAR, /* inv_freq / factor */
    DEVIO_ROPE_LLAMA3, /* smooth interpolation between two wavelength bounds */
    DEVIO_ROPE_YARN,   /* ramped interpolation, cos and sin times attention_factor */
} devio_rope_type;

typedef struct devio_rope_scaling {
    devio_rope_type type;
    float factor;
    float low_freq_factor, high_freq_factor; /* llama3 */
    float original_max_positions;            /* llama3, yarn */
    float attention_factor;                  /* yarn: resolved at parse (mscale rules) */
    float beta_fast, beta_slow;              /* yarn */
    int truncate;                            /* yarn: round the correction range */
} devio_rope_scaling;

typedef struct devio_model_config {
    char architecture[64]; /* "LlamaForCausalLM", "BambaForCausalLM", ... */
    devio_arch arch;
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
    uint32_t rotary_dim;   /* dimensions of a head RoPE turns: head_dim; Bamba head_dim / 2 */
    devio_rope_scaling rope_scaling;
    int qk_norm;           /* Qwen3: RMSNorm of each q and k head before RoPE */
    uint32_t sliding_window; /* Mistral (and Qwen2/3 when on): keys within it, 0 = none */
    /* Granite's multipliers; 1 (and attention_multiplier 0 = 1/sqrt(head_dim))
     * for every other model. */
    float embedding_multiplier, attention_multiplier, residual_multiplier, logits_scaling;
    devio_ssm_config ssm;
    /* Bamba: which layers are attention; others are mixers. Bit i of word
     * i / 64 (MAX layers 1024). Llama: all; Mamba2: none. */
    uint64_t attn_layers[16];
} devio_model_config;

/* What a checkpoint says about text, which devio never handles itself but
 * a client needs to tokenize and stop. */
typedef struct devio_model_text {
    int64_t bos_id, eos_id, pad_id; /* -1 when not given */
    char *chat_template;            /* owned, NUL-terminated; NULL when none */
    const char *format;             /* "safetensors" or "gguf" (static) */
} devio_model_text;

/* Release with devio_model_free(). */
struct devio_model {
    devio_model_config cfg;
    /* From GGUF's tokenizer.* metadata, or from config.json's *_token_id
     * and tokenizer_config.json's chat_template beside it. */
    devio_model_text text;
    devio_tensor embed;   /* [vocab, d] model.embed_tokens.weight */
    devio_tensor norm;    /* [d]        model.norm.weight */
    devio_tensor lm_head; /* [vocab, d] lm_head.weight, or embed when tied */
    devio_layer *layers;  /* n_layers entries */
    /* Backing storage: private to model.c. */
    void *priv;
};

/* Whether layer i of a model with this config is an attention layer. */
static inline int devio_config_layer_is_attn(const devio_model_config *c, uint32_t i)
{
    return i < 1024u && (int)((c->attn_layers[i / 64] >> (i % 64)) & 1u);
}

/* How a model is loaded. */
typedef struct devio_model_params {
    /* Skip the scan of every used tensor for NaN and infinities (a pass over
     * the weights at load; docs/operations.md gives its cost). Off: a
     * non-finite weight is DEVIO_E_MODEL naming the file and tensor. */
    bool skip_weight_scan;
} devio_model_params;

devio_model_params devio_model_params_default(void);

/* Load `dir` (config.json + model.safetensors or a sharded index) with the
 * default params. On success *out is owned by the caller (devio_model_free).
 * On failure *out is NULL and err->message names the file and tensor at
 * fault. */
devio_status devio_model_load(const char *dir, devio_model **out, devio_error *err);
/* The same with params p (NULL: the defaults). */
devio_status devio_model_load_with(const char *dir, const devio_model_params *p,
                                   devio_model **out, devio_error *err);
void devio_model_free(devio_model *m);

/* Gives the weights' host memory back (what the files were read into and
 * the aligned copies), keeping everything else: config, shapes, tensor
 * views whose addresses stay (to be compared, never read: a read faults).
 * For a process whose device runs a backend that copied the weights to its
 * own memory (devio_backend_ops.copies_weights): devio_release_host_weights
 * in device/devio.h does it when that holds. Idempotent. Natively only; under
 * WASI nothing is given back. */
void devio_model_release_weights(devio_model *m);
bool devio_model_weights_released(const devio_model *m);

/* Bytes of K and V one KV block of block_size positions takes over every
 * attention layer: binary32 under strict numerics, binary16 under fast (what
 * every backend with fast numerics keeps); 0 for a model without attention. */
uint64_t devio_kv_block_bytes(const devio_model_config *c, uint32_t block_size, bool fast);

/* A 128-bit sum of the model's config and weights (fingerprint.c says what
 * it covers), in out[0..16), zeros after: what a sequence's exported state
 * names its model by. Reads every weight byte, so it needs weights not
 * released; docs/state.md gives its cost. */
void devio_model_fingerprint(const devio_model *m, uint8_t out[32]);

/* The dtypes of the model's weights, bit (1 << dtype) for each. */
uint32_t devio_model_dtypes(const devio_model *m);

/* Bytes of a tensor's data (0 when absent). */
uint64_t devio_tensor_bytes(const devio_tensor *t);

/* Widen element i of a tensor to binary32 exactly. */
float devio_tensor_get(const devio_tensor *t, uint64_t i);

/* Widen the first n elements of t to binary32 at dst (caller-owned, n floats), as
 * devio_tensor_get does each; false, dst untouched, when t is absent (no data). */
bool devio_tensor_widen(const devio_tensor *t, float *dst, size_t n);

#endif
