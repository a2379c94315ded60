/* mkfamily.h - the architectures devio-mkmodel writes, and the half of its model writer for the Llama family (llama, qwen2, qwen3, mistral, granite): checks, tensor list, parameter count, config.json.
 * Private to tools/mkmodel (mkmodel.c calls it). Like the rest of the writer it reads nothing but the options. */
#ifndef DEVIO_MKFAMILY_H
#define DEVIO_MKFAMILY_H

#include <stdbool.h>
#include <stdint.h>

#include "tools/mkmodel/mkmodel.h"
#include "tools/mkmodel/mkwrite.h"

/* The order of the names mk_arch_parse knows; the first five are attention-only decoders. */
typedef enum mk_arch {
    MK_ARCH_LLAMA,
    MK_ARCH_BAMBA,
    MK_ARCH_MAMBA2,
    MK_ARCH_QWEN2,
    MK_ARCH_QWEN3,
    MK_ARCH_MISTRAL,
    MK_ARCH_GRANITE,
} mk_arch;

/* Most tensors one layer of any architecture has (a Bamba mixer layer with
 * every bias: 5 + 10), and outside the layers (embedding, norm, lm_head). */
#define MK_MAX_LAYER_TENSORS 16u
#define MK_MAX_TOP_TENSORS 3u

/* Every name, for messages: "llama, qwen2, qwen3, mistral, granite, bamba, mamba2". */
#define MK_ARCH_NAMES "llama, qwen2, qwen3, mistral, granite, bamba, mamba2"

/* "llama" (and NULL), "bamba", ... -> *a; false for any other name. */
bool mk_arch_parse(const char *name, mk_arch *a);

/* "llama", "bamba", ...: the name mk_arch_parse reads. */
const char *mk_arch_name(mk_arch a);

/* For families whose config has no head_dim (qwen2, granite, bamba): the head
 * size hidden / heads into *hd, refused when heads do not divide hidden or
 * --head-dim asks for another. */
devio_status mk_derived_head_dim(const devio_mkmodel_opts *o, const char *arch, uint32_t *hd,
                                 devio_error *err);

/* Whether a is one of the Llama family (every layer attention and a SiLU MLP). */
bool mk_arch_is_family(mk_arch a);

/* The Llama family's own fields (RoPE scaling, the sliding window, Granite's
 * multipliers, Qwen2's biases, head_dim where a config cannot say it):
 * consistent for a family arch, unset where a's models do not have them.
 * Runs for every architecture, after the shape checks. DEVIO_E_INVALID
 * with a message naming the flag. */
devio_status mk_family_check(const devio_mkmodel_opts *o, mk_arch a, devio_error *err);

/* Appends every tensor of a checked family model to L, unsorted; L has room
 * for MK_MAX_TOP_TENSORS + MK_MAX_LAYER_TENSORS per layer. */
void mk_family_list_add(const devio_mkmodel_opts *o, mk_arch a, mk_list *L);

/* Parameters of a family model (lm_head counted once when tied). */
uint64_t mk_family_param_count(const devio_mkmodel_opts *o, mk_arch a);

/* config.json of a checked family model, keys sorted as transformers'
 * save_pretrained writes them. */
void mk_family_config(const devio_mkmodel_opts *o, mk_arch a, mk_buf *b);

#endif
