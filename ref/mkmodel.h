/* mkmodel.h - writes seeded random Hugging Face Llama models (config.json + safetensors).
 * Output depends only on the options: no clock, no host state, so equal options give equal bytes. */
#ifndef DEVIO_MKMODEL_H
#define DEVIO_MKMODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

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

#endif
