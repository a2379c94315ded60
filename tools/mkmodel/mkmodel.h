/* mkmodel.h - writes seeded random Hugging Face Llama models (config.json + safetensors) and PEFT LoRA adapters for them.
 * Output depends only on the options (and, for adapters, the base model's shapes): no clock, no host state, so equal options give equal bytes. */
#ifndef DEVIO_MKMODEL_H
#define DEVIO_MKMODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "device/adapter.h"
#include "device/devio.h"
#include "device/model.h"

typedef struct devio_mkmodel_opts {
    const char *out_dir; /* borrowed; created (with parents) when missing */
    const char *arch;    /* borrowed; "llama" (bamba, mamba2: DEVIO_E_UNSUPPORTED) */
    uint32_t vocab_size;
    uint32_t hidden_size;
    uint32_t intermediate_size;
    uint32_t n_layers;
    uint32_t n_heads;
    uint32_t n_kv_heads;
    uint32_t head_dim; /* 0 = hidden_size / n_heads */
    uint32_t max_position_embeddings;
    uint32_t shards; /* 1 = model.safetensors; N > 1 = N shards + index */
    double rope_theta;
    double rms_norm_eps;
    devio_dtype dtype;
    uint64_t seed;
    bool tie_word_embeddings;
    bool attention_bias; /* q/k/v biases */
} devio_mkmodel_opts;

/* The tiny preset, f32, seed 0, out_dir NULL. */
devio_mkmodel_opts devio_mkmodel_opts_default(void);

/* Overwrite the shape fields and dtype of *o with a preset:
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
 * out_dir, arch, seed and shards are left as they are.
 * Unknown name: DEVIO_E_INVALID. */
devio_status devio_mkmodel_preset(const char *name, devio_mkmodel_opts *o, devio_error *err);

/* Number of parameters the options describe (lm_head counted once when tied). */
uint64_t devio_mkmodel_param_count(const devio_mkmodel_opts *o);

/* Write config.json and the weights into o->out_dir, streaming one chunk of
 * one tensor at a time. Each file is written under a temporary name and
 * renamed when complete. Invalid options: DEVIO_E_INVALID; unsupported
 * architecture: DEVIO_E_UNSUPPORTED; file system errors: DEVIO_E_IO. */
devio_status devio_mkmodel_write(const devio_mkmodel_opts *o, devio_error *err);

/* The binary32 values of elements [start, start + n) of tensor `name` as
 * generated before conversion to o->dtype (round to nearest even, by
 * device/numerics.h), so tests can check what a loader reads.
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
