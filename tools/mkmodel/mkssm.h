/* mkssm.h - the hybrid Mamba-2 half of devio-mkmodel's model writer (Bamba, Mamba2): option checks, tensor list, parameter count, config.json.
 * Private to tools/mkmodel (mkmodel.c calls it). Like the rest of the writer it reads nothing but the options. */
#ifndef DEVIO_MKSSM_H
#define DEVIO_MKSSM_H

#include <stdbool.h>
#include <stdint.h>

#include "tools/mkmodel/mkfamily.h"
#include "tools/mkmodel/mkmodel.h"
#include "tools/mkmodel/mkwrite.h"

/* Whether layer i is in o->attn_layers (bamba's attention layers). */
bool mk_attn_layer(const devio_mkmodel_opts *o, uint32_t i);

/* The fields of o that belong to the Mamba-2 mixer or differ by
 * architecture: complete and consistent for bamba and mamba2, unset for
 * the Llama family; mamba2 also leaves the attention and MLP fields unset. Run after
 * the checks every architecture shares (vocab, hidden, layers, dtype).
 * DEVIO_E_INVALID with a message naming the flag. */
devio_status mk_ssm_check(const devio_mkmodel_opts *o, mk_arch a, devio_error *err);

/* Appends every tensor of a checked bamba or mamba2 model to L, unsorted;
 * L has room for MK_MAX_TOP_TENSORS + MK_MAX_LAYER_TENSORS per layer. */
void mk_ssm_list_add(const devio_mkmodel_opts *o, mk_arch a, mk_list *L);

/* Parameters of a bamba or mamba2 model (lm_head counted once when tied). */
uint64_t mk_ssm_param_count(const devio_mkmodel_opts *o, mk_arch a);

/* config.json of a checked bamba or mamba2 model, keys sorted. */
void mk_ssm_config(const devio_mkmodel_opts *o, mk_arch a, mk_buf *b);

#endif
