/* shape.h - the checks and derived sizes every backend needs, computed once by the core:
 * the model's shape (device/backend/backend.h devio_model_shape) and the RoPE tables of numspec rule 4.
 * Never computes a forward pass; never keeps a pointer into what it checks. */
#ifndef DEVIO_SHAPE_H
#define DEVIO_SHAPE_H

#include <stdint.h>

#include "device/backend/backend.h"
#include "device/model/model.h"

/* Check every tensor of `m` against the config (shapes, dtypes F32/F16/BF16,
 * gate and up of one dtype, heads divisible, head_dim even) and fill *out.
 * DEVIO_E_MODEL or DEVIO_E_UNSUPPORTED naming the layer at fault. */
devio_status devio_model_shape_get(const devio_model *m, devio_model_shape *out,
                                   devio_error *err);

/* RoPE tables of numspec rule 4 for model config c (rope_theta and its
 * rope_scaling): cos and sin [max_seq_len, rd / 2], rd the rotary
 * dimension (shape.rotary_dim), yarn's attention factor folded in. Caller
 * frees both with free(); DEVIO_E_NOMEM on failure (then both are NULL). */
devio_status devio_rope_tables(const devio_model_config *c, uint32_t rd, uint32_t max_seq_len,
                               float **cos_out, float **sin_out, devio_error *err);

/* Inverse frequency i < rd / 2 of numspec rule 4 for c's RoPE and scaling. */
float devio_rope_inv_freq(const devio_model_config *c, uint32_t rd, uint32_t i);

#endif
