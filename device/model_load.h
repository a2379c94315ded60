/* model_load.h - the parts of the model loader (model.c) that read its sources: the JSON files
 * of a Hugging Face directory (model_json.c) and a GGUF file's metadata and tensors
 * (model_gguf.c). For model.c only. */
#ifndef DEVIO_MODEL_LOAD_H
#define DEVIO_MODEL_LOAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "device/devio.h"
#include "device/gguf.h"
#include "device/model.h"

/* Reads dir/name as JSON (bare Infinity, -Infinity and NaN outside strings
 * taken as those strings); DEVIO_E_MODEL when it is missing or not a JSON
 * object. On success *out is a new reference. */
devio_status devio_model_load_json(const char *dir, const char *name, json_t **out,
                                   devio_error *err);

/* Whether path names a GGUF file (a regular file starting with "GGUF")
 * rather than a model directory. */
bool devio_model_path_is_gguf(const char *path);

/* The config a Hugging Face directory of the same model would carry, built
 * from the GGUF's metadata (general.architecture llama, qwen2 or qwen3; any
 * other is DEVIO_E_MODEL naming it), for devio_model_config_parse. A RoPE
 * the metadata changes (rope.scaling, rope_freqs.weight) is
 * DEVIO_E_UNSUPPORTED. On success *out is a new reference. */
devio_status devio_gguf_model_config(const devio_gguf_file *f, json_t **out, devio_error *err);

/* The tensor Hugging Face calls hf_name (model.layers.N.self_attn.q_proj.weight ...), found
 * under llama.cpp's name (blk.N.attn_q.weight ...), checked to have the shape
 * [s0] or [s0, s1] and a type devio computes with, into *out. The rows of
 * a llama-architecture q and k, which llama.cpp's converter interleaves per
 * head, are put back in Hugging Face's order in a copy: *copy (devio_st_pages,
 * *copy_n bytes) then belongs to the caller; else *copy is NULL. Absent and
 * not required: OK with *out zeroed. scan: refuse NaN and infinities. */
devio_status devio_gguf_model_tensor(const devio_gguf_file *f, const devio_model_config *c,
                               const char *hf_name, bool required, uint32_t ndim, uint64_t s0,
                               uint64_t s1, bool scan, devio_tensor *out, void **copy,
                               size_t *copy_n, devio_error *err);

/* m's text metadata (token ids, chat template) from the GGUF's tokenizer.*
 * entries; absent entries stay -1 / NULL. Only memory can fail. */
devio_status devio_gguf_model_text(const devio_gguf_file *f, devio_model_text *t,
                                   devio_error *err);

/* The same from a directory: config.json's bos_token_id, eos_token_id (the
 * first of a list) and pad_token_id, and tokenizer_config.json's
 * chat_template (a string, or the "default" one of a list) when that file
 * is there and holds one. A tokenizer_config.json devio cannot read is
 * ignored: devio computes nothing from it. Only memory can fail. */
devio_status devio_model_text_from_dir(const char *dir, const json_t *config,
                                       devio_model_text *t, devio_error *err);

#endif
