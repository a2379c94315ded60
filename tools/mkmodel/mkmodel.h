/* mkmodel.h - writes seeded random Hugging Face models (Llama, Qwen2, Qwen3, Mistral, Granite, Bamba, Mamba2: config.json + safetensors) and PEFT LoRA adapters for them.
 * Output depends only on the options (and, for adapters, the base model's shapes): no clock, no host state, so equal options give equal bytes. */
#ifndef DEVIO_MKMODEL_H
#define DEVIO_MKMODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "device/adapter/adapter.h"
#include "device/devio.h"
#include "device/model/model.h"

#define DEVIO_MKMODEL_MAX_LAYERS 1024u

/* RoPE scaling, written as transformers' "rope_scaling" (keys sorted):
 *   linear : {"factor": F, "rope_type": "linear"}
 *   llama3 : {"factor": F, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
 *             "original_max_position_embeddings": N, "rope_type": "llama3"}
 *   yarn   : {"beta_fast": 32.0, "beta_slow": 1.0, "factor": F,
 *             "original_max_position_embeddings": N, "rope_type": "yarn"} */
typedef enum devio_mkmodel_rope {
    DEVIO_MKMODEL_ROPE_NONE = 0, /* "rope_scaling": null */
    DEVIO_MKMODEL_ROPE_LINEAR,
    DEVIO_MKMODEL_ROPE_LLAMA3,
    DEVIO_MKMODEL_ROPE_YARN,
} devio_mkmodel_rope;

/* The architectures:
 *   llama   : LlamaForCausalLM (Qwen2ForCausalLM with attention_bias, the
 *             older spelling of qwen2, kept byte for byte).
 *   qwen2   : Qwen2ForCausalLM: q/k/v biases (attention_bias always true).
 *   qwen3   : Qwen3ForCausalLM: RMSNorm of each q and k head (q_norm,
 *             k_norm [head_dim]) before RoPE; head_dim written explicitly.
 *   mistral : MistralForCausalLM: sliding-window attention (sliding_window).
 *   granite : GraniteForCausalLM: embedding, attention, residual and logits
 *             multipliers.
 *   bamba   : BambaForCausalLM, hybrid: every layer is a Mamba-2 mixer or, for
 *             the layers in attn_layers, Llama attention (RoPE on the first
 *             half of each head), each followed by a SiLU-gated MLP.
 *   mamba2  : Mamba2ForCausalLM: Mamba-2 mixers only, no MLP, no attention.
 * The first five are the Llama family. Fields a model's architecture does
 * not have stay 0 (false, empty); set, they are refused rather than
 * ignored. The presets fill them right. */
typedef struct devio_mkmodel_opts {
    const char *out_dir; /* borrowed; created (with parents) when missing */
    const char *arch;    /* borrowed; one of the names above; NULL = "llama" */
    uint32_t vocab_size;
    uint32_t hidden_size;
    uint32_t intermediate_size; /* MLP; all but mamba2 */
    uint32_t n_layers;
    uint32_t n_heads;    /* attention; all but mamba2 */
    uint32_t n_kv_heads; /* attention; all but mamba2 */
    /* 0 = hidden_size / n_heads. llama, qwen3, mistral: any even value;
     * qwen2 and granite (whose configs have no head_dim) and bamba: 0 or
     * hidden_size / n_heads */
    uint32_t head_dim;
    uint32_t max_position_embeddings; /* all but mamba2, which has none: 0 */
    uint32_t shards; /* 1 = model.safetensors; N > 1 = N shards + index */
    /* The Mamba-2 mixer (bamba, mamba2): I = ssm_expand * hidden_size
     * = ssm_heads * ssm_head_dim is its inner width. */
    uint32_t ssm_heads;    /* mamba_n_heads / num_heads, a multiple of ssm_groups */
    uint32_t ssm_head_dim; /* mamba_d_head / head_dim */
    uint32_t ssm_expand;   /* mamba_expand / expand */
    uint32_t ssm_state;    /* mamba_d_state / state_size: N */
    uint32_t ssm_groups;   /* mamba_n_groups / n_groups: heads sharing B and C */
    uint32_t ssm_conv;     /* mamba_d_conv / conv_kernel: K */
    double time_step_min, time_step_max; /* dt_bias is drawn from [min, max) */
    /* bamba: bit i of word i / 64 set = layer i is an attention layer */
    uint64_t attn_layers[DEVIO_MKMODEL_MAX_LAYERS / 64];
    double rope_theta;
    /* The Llama family only. rope_factor 0 = 8.0; rope_original_max (llama3
     * and yarn) 0 = max_position_embeddings / factor. yarn needs factor =
     * max_position_embeddings / original_max_position_embeddings: transformers
     * 4.x computes yarn with that ratio in place of "factor", 5.x with
     * "factor", and only equal values make one model of both. */
    devio_mkmodel_rope rope_scaling;
    double rope_factor;
    uint32_t rope_original_max;
    uint32_t sliding_window; /* mistral: keys i - W < j <= i; 0 = null (every key) */
    /* granite only (0 elsewhere), each finite and > 0: x = embed * embedding_
     * multiplier, scores scaled by attention_multiplier (for 1/sqrt(head_dim)),
     * residual adds of out * residual_multiplier, logits / logits_scaling */
    double embedding_multiplier, attention_multiplier, residual_multiplier, logits_scaling;
    double rms_norm_eps; /* mamba2: layer_norm_epsilon */
    devio_dtype dtype;
    uint64_t seed;
    bool tie_word_embeddings;
    bool attention_bias; /* q/k/v biases; llama (as Qwen2) and qwen2 (always) */
    bool ssm_conv_bias;  /* conv1d.bias (mamba_conv_bias / use_conv_bias) */
    bool ssm_proj_bias;  /* in_proj.bias, out_proj.bias (mamba_proj_bias / use_bias) */
} devio_mkmodel_opts;

/* The llama tiny preset, f32, seed 0, out_dir NULL. */
devio_mkmodel_opts devio_mkmodel_opts_default(void);

/* Overwrite the shape fields, biases and dtype of *o with the preset `name`
 * of architecture o->arch (NULL = llama). Llama:
 *   tiny  : vocab 256, hidden 64, 2 layers, 4 heads, 2 kv heads, head_dim 16,
 *           ffn 128, 512 positions, untied, f32            106,816 parameters
 *   small : the stories15M shape: vocab 32000, hidden 288, 6 layers, 6 heads,
 *           6 kv heads, ffn 768, 1024 positions, tied, f32 15,191,712 parameters
 *   bench : the stories110M shape: vocab 32000, hidden 768, 12 layers, 12 heads,
 *           12 kv heads, ffn 2048, 1024 positions, untied, bf16
 *                                                       134,105,856 parameters
 *   1b    : the TinyLlama-1.1B shape: vocab 32000, hidden 2048, 22 layers,
 *           32 heads, 4 kv heads, ffn 5632, 2048 positions, untied, bf16
 *                                                     1,100,048,384 parameters
 * Bamba (every mixer: conv bias, no projection bias, expand 2, conv 4):
 *   tiny  : vocab 256, hidden 64, 4 layers, attention in [1], 4 heads, 2 kv
 *           heads, ffn 128, 512 positions, 8 SSM heads of 16, state 16,
 *           2 groups, untied, f32                          234,824 parameters
 *   small : vocab 32000, hidden 288, 6 layers, attention in [2, 5], 6 heads,
 *           6 kv heads, ffn 768, 1024 positions, 9 SSM heads of 64, state 64,
 *           1 group, tied, f32                          16,029,580 parameters
 *   bench : Llama bench's size: vocab 32000, hidden 768, 12 layers, attention
 *           in [3, 7, 11], 12 heads, 12 kv heads, ffn 1600, 1024 positions,
 *           24 SSM heads of 64, state 128, 1 group, untied, bf16
 *                                                      134,366,856 parameters
 * Qwen2 (q/k/v biases; sliding_window = max_position_embeddings, unused):
 *   tiny  : llama tiny with q/k/v biases                   107,072 parameters
 *   small : vocab 32000, hidden 288, 6 layers, 6 heads, 2 kv heads, ffn 768,
 *           1024 positions, tied, f32                   14,531,040 parameters
 * Qwen3 (head_dim != hidden / heads, as in Qwen3's own checkpoints):
 *   tiny  : vocab 256, hidden 64, 2 layers, 4 heads, 2 kv heads, head_dim 32,
 *           ffn 128, 512 positions, untied, f32            131,520 parameters
 *   small : vocab 32000, hidden 288, 6 layers, 6 heads, 2 kv heads, head_dim
 *           64, ffn 768, 1024 positions, tied, f32      14,971,296 parameters
 * Mistral (a window shorter than the prompts the checks run):
 *   tiny  : llama tiny with sliding_window 24              106,816 parameters
 *   small : vocab 32000, hidden 288, 6 layers, 6 heads, 2 kv heads, ffn 768,
 *           1024 positions, sliding_window 128, untied, f32
 *                                                       23,744,160 parameters
 * Granite (embedding_multiplier 12, attention_multiplier 0.0078125,
 * residual_multiplier 0.22, logits_scaling 8: Granite 3's kind of values):
 *   tiny  : llama tiny's shape                             106,816 parameters
 *   small : qwen2 small's shape without biases          14,528,160 parameters
 * Mamba2 (conv bias, no projection bias, expand 2, conv 4):
 *   tiny  : vocab 256, hidden 64, 2 layers, 8 SSM heads of 16, state 16,
 *           2 groups, untied, f32                           93,552 parameters
 *   small : vocab 32000, hidden 288, 6 layers, 9 SSM heads of 64, state 64,
 *           1 group, tied, f32                          12,465,474 parameters
 * out_dir, arch, seed, shards, rope_theta, the RoPE scaling fields and
 * rms_norm_eps are left as they are. Unknown name or architecture:
 * DEVIO_E_INVALID. */
devio_status devio_mkmodel_preset(const char *name, devio_mkmodel_opts *o, devio_error *err);

/* Number of parameters the options describe (lm_head counted once when tied). */
uint64_t devio_mkmodel_param_count(const devio_mkmodel_opts *o);

/* Write config.json and the weights into o->out_dir, streaming one chunk of
 * one tensor at a time. Each file is written under a temporary name and
 * renamed when complete. Invalid options (unknown architecture included):
 * DEVIO_E_INVALID, with nothing written; file system errors: DEVIO_E_IO.
 * Bamba and Mamba2 configs hold "time_step_limit": [0.0, Infinity], the bare
 * token as Python's json writes float("inf"), exactly as Hugging Face does. */
devio_status devio_mkmodel_write(const devio_mkmodel_opts *o, devio_error *err);

/* The binary32 values of elements [start, start + n) of tensor `name` as
 * generated before conversion to o->dtype (round to nearest even, by
 * device/numerics/numerics.h), so tests can check what a loader reads.
 * Unknown tensor or range: DEVIO_E_INVALID. */
devio_status devio_mkmodel_values(const devio_mkmodel_opts *o, const char *name, uint64_t start,
                                  size_t n, float *dst, devio_error *err);

/* ---- PEFT LoRA adapters ---- */

typedef struct devio_mkmodel_adapter_opts {
    const char *model_dir; /* borrowed; the base model, loaded to read its shapes */
    const char *out_dir;   /* borrowed; created (with parents) when missing */
    uint32_t rank;         /* r, in [1, 65536] */
    double alpha;          /* lora_alpha, finite and > 0 */
    uint32_t targets;      /* bits (1u << devio_lora_target), at least one */
    devio_dtype dtype;
    uint64_t seed;
    bool use_rslora;
} devio_mkmodel_adapter_opts;

/* r 8, lora_alpha 8 (PEFT's defaults), q_proj and v_proj, f32, seed 0,
 * no rsLoRA; model_dir and out_dir NULL. */
devio_mkmodel_adapter_opts devio_mkmodel_adapter_opts_default(void);

/* Write adapter_model.safetensors (PEFT's tensor names, every targeted
 * projection of every layer) and adapter_config.json into o->out_dir.
 * lora_A [r, in] is uniform in [-1/sqrt(in), 1/sqrt(in)), lora_B [out, r]
 * uniform in [-0.5/sqrt(r), 0.5/sqrt(r)). PEFT starts lora_B at zero, which
 * would make a fresh adapter change nothing; these are random so that an
 * adapter visibly changes the logits in tests and demos.
 * Invalid options: DEVIO_E_INVALID; base model errors as devio_model_load
 * reports them; file system errors: DEVIO_E_IO. */
devio_status devio_mkmodel_write_adapter(const devio_mkmodel_adapter_opts *o, devio_error *err);

/* The binary32 values of elements [start, start + n) of adapter tensor
 * `name` (a PEFT name, e.g. "base_model.model.model.layers.0.self_attn.
 * q_proj.lora_A.weight") as generated before conversion to o->dtype.
 * Loads o->model_dir for the shapes. Unknown tensor or range: DEVIO_E_INVALID. */
devio_status devio_mkmodel_adapter_values(const devio_mkmodel_adapter_opts *o, const char *name,
                                          uint64_t start, size_t n, float *dst,
                                          devio_error *err);

#endif
