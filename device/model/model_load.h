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
#include "device/model/gguf.h"
#include "device/model/model.h"

/* Reads dir/name as JSON (bare Infinity, -Infinity and NaN outside strings
 * taken as those strings); DEVIO_E_MODEL when it is missing or not a JSON
 * object. On success *out is a new reference. */
devio_status devio_model_load_json(const char *dir, const char *name, json_t **out,
                                   devio_error *err);

/* Whether path names a GGUF file (a regular file starting with "GGUF")
 * rather than a model directory. */
bool devio_model_path_is_gguf(const char *path);

/* The config a Hugging Face directory of the same model would carry, built
 * from the GGUF's metadata (general.architecture llama, qwen2, qwen3 or
 * granite; any other is DEVIO_E_MODEL naming it), for
 * devio_model_config_parse. Every float it reads obeys the rule of the
 * config.json field it becomes (devio_model_float_check: DEVIO_E_MODEL
 * naming the GGUF key); ARCH.vocab_size and tokenizer.ggml.tokens, when
 * given, agree with token_embd.weight's rows. A RoPE the metadata changes
 * in a way devio does not compute (rope_freqs.weight, an attn_factor other
 * than 1, a partial rotary dimension, another scaling type, an ARCH.rope.
 * key devio does not read) is DEVIO_E_UNSUPPORTED. On success *out is a new
 * reference. */
devio_status devio_gguf_model_config(const devio_gguf_file *f, json_t **out, devio_error *err);

/* The tensor Hugging Face calls hf_name (model.layers.N.self_attn.q_proj.weight ...), found
 * under llama.cpp's name (blk.N.attn_q.weight ...), checked to have the shape
 * [s0] or [s0, s1] and a type devio computes with (a vector: F32 only), into
 * *out, and marked in used (the caller's flags, one per tensor of f in file
 * order). The rows of a llama-architecture q and k, which llama.cpp's
 * converter interleaves per head, are put back in Hugging Face's order in a
 * copy: *copy (devio_st_pages, *copy_n bytes) then belongs to the caller;
 * else *copy is NULL. Absent and not required: OK with *out zeroed.
 * scan: refuse NaN and infinities. */
devio_status devio_gguf_model_tensor(const devio_gguf_file *f, const devio_model_config *c,
                                     const char *hf_name, bool required, uint32_t ndim,
                                     uint64_t s0, uint64_t s1, bool scan, bool *used,
                                     devio_tensor *out, void **copy, size_t *copy_n,
                                     devio_error *err);

/* Once every tensor of the model is loaded: a tensor of f that
 * devio_gguf_model_tensor did not mark in used is DEVIO_E_MODEL naming it
 * (one of a layer past block_count, or one devio has no place for), so a
 * file never serves a model other than the one it holds. */
devio_status devio_gguf_model_unused(const devio_gguf_file *f, const devio_model_config *c,
                                     const bool *used, devio_error *err);

/* m's text metadata (token ids, chat template) from the GGUF's tokenizer.*
 * entries; absent entries stay -1 / NULL. A token id that is not an
 * unsigned integer below vocab is DEVIO_E_MODEL naming its key. */
devio_status devio_gguf_model_text(const devio_gguf_file *f, uint32_t vocab, devio_model_text *t,
                                   devio_error *err);

/* The same from a directory: config.json's bos_token_id, eos_token_id (the
 * first of a list) and pad_token_id, and tokenizer_config.json's
 * chat_template (a string, or the "default" one of a list) when that file
 * is there and holds one. An id of config.json at or past vocab (any entry
 * of a list) is DEVIO_E_MODEL naming the field; a negative one or null is
 * none (-1). A tokenizer_config.json devio cannot read is ignored: devio
 * computes nothing from it. */
devio_status devio_model_text_from_dir(const char *dir, const json_t *config, uint32_t vocab,
                                       devio_model_text *t, devio_error *err);

#endif
