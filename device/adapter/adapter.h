/* adapter.h - one PEFT LoRA adapter directory (adapter_config.json + adapter_model.safetensors) checked against a loaded base model.
 * Loading validates every field, name, dtype and shape and never reads outside the adapters root; it never computes with the weights. */
#ifndef DEVIO_ADAPTER_H
#define DEVIO_ADAPTER_H

#include <stdbool.h>
#include <stdint.h>

#include "device/devio.h"
#include "device/adapter/lora_target.h"
#include "device/model/model.h"

/* The base projection's [out, in] for `target` in `layer`, read from the
 * loaded model's weight shapes. False when layer or target is out of range
 * or the layer has no such projection (q_proj of a mixer layer, in_proj of
 * an attention layer, the MLP of a Mamba2 layer). */
bool devio_lora_target_dims(const devio_model *base, uint32_t layer, devio_lora_target target,
                            uint64_t *out_dim, uint64_t *in_dim);

/* PEFT's name of the lora_A (ab 0) or lora_B (ab 1) weight of `target` in
 * `layer` of a model of base's architecture, e.g. "base_model.model.model.
 * layers.3.self_attn.q_proj.lora_A.weight" ("...backbone.layers.N.mixer.
 * in_proj..." for Mamba2, "...mamba.in_proj..." and "...feed_forward..."
 * for Bamba). Truncated to cap bytes. */
void devio_lora_tensor_name(const devio_model *base, uint32_t layer, devio_lora_target target,
                            int ab, char *dst, size_t cap);

/* One adapted projection: y += scale * B (A x). Views into the adapter's
 * storage, owned by the adapter. */
typedef struct devio_lora_module {
    devio_tensor a; /* [r, in]  ...lora_A.weight */
    devio_tensor b; /* [out, r] ...lora_B.weight */
} devio_lora_module; /* a.data == b.data == NULL when the module is not adapted */

/* A loaded adapter. Release with devio_adapter_free(). */
typedef struct devio_adapter {
    char name[64];
    char path[256]; /* as given, relative to the adapters root */
    uint32_t rank;
    /* alpha is lora_alpha rounded to binary32. scale, computed in binary32
     * with correctly rounded operations:
     *   use_rslora false: scale = alpha / (float)rank
     *   use_rslora true : scale = alpha / devio_num_sqrt((float)rank) */
    float alpha, scale;
    bool use_rslora;
    uint32_t targets;        /* bit (1u << devio_lora_target) per module named by target_modules */
    devio_lora_module *mods; /* n_layers * DEVIO_LORA_N_TARGETS, index layer * N + target */
    uint32_t n_layers;       /* the base model's layer count, for walking mods */
    char sha256[65];         /* lower-case hex of adapter_model.safetensors */
    uint64_t size;           /* bytes of adapter_model.safetensors */
    void *priv;              /* storage: private to adapter.c */
} devio_adapter;

/* Load root/rel_path for `base`, which is borrowed for the call only: the
 * adapter keeps no pointer into it. `name` is copied into the adapter.
 *
 * rel_path must be relative and non-empty, without a '..' or an empty
 * component ('.' is skipped, a trailing '/' ignored), and no directory or
 * file on the way may be a symbolic link: root is opened once and rel_path
 * walked one component at a time with openat(O_NOFOLLOW), so nothing can be
 * swapped in between a check and a read. Otherwise DEVIO_E_INVALID, whose
 * message says "... outside the adapters root". Both files must be regular
 * files and are read only through the descriptors of that walk. A WASI
 * runtime's refusal of an escape (ENOTCAPABLE) is the same DEVIO_E_INVALID.
 *
 * The weights are read into memory (the file is not kept mapped or open),
 * and sha256 and size describe exactly those bytes: changing, replacing or
 * truncating the file afterwards changes neither the numbers nor the record.
 *
 * Statuses: DEVIO_E_IO when the directory or a file is missing or unreadable
 * (the message names it); DEVIO_E_MODEL for malformed JSON or safetensors
 * (holes or overlaps in the data, NaN or infinite weights included);
 * DEVIO_E_UNSUPPORTED for PEFT features this device does not compute
 * (peft_type other than LORA, unknown target module, fan_in_fan_out, bias,
 * DoRA, rank_pattern, alpha_pattern, modules_to_save, ...); DEVIO_E_INVALID
 * for a rank missing, 0 or above max_rank, and for tensors missing, extra,
 * of another dtype than F32/F16/BF16 or of a shape that does not fit `base`.
 * layers_to_transform is honoured: modules of the other layers stay NULL.
 *
 * All or nothing: on success *out is owned by the caller
 * (devio_adapter_free); on failure *out is NULL and err names the file and
 * tensor at fault. */
devio_status devio_adapter_load(const char *root, const char *rel_path, const char *name,
                                const devio_model *base, uint32_t max_rank, devio_adapter **out,
                                devio_error *err);

/* Frees everything. a may be NULL. */
void devio_adapter_free(devio_adapter *a);

/* Only the containment rules of devio_adapter_load: DEVIO_E_INVALID when
 * root/rel_path (or one of its two files) could lead outside the root, through
 * '..', an absolute path or a symlink; DEVIO_OK otherwise, including when the
 * directory is missing (a load then says what is missing). Opens, reads nothing. */
devio_status devio_adapter_path_check(const char *root, const char *rel_path, devio_error *err);

/* SHA-256 (lower-case hex) and byte size of root/rel_path/adapter_model.safetensors,
 * without parsing it, for deciding whether a recorded adapter changed. Same
 * path rules and statuses as devio_adapter_load. */
devio_status devio_adapter_file_hash(const char *root, const char *rel_path, char hex[65],
                                     uint64_t *size, devio_error *err);

#endif
