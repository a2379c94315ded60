/* model_config.h - checking a Hugging Face config.json into a devio_model_config, and the value rules
 * GGUF metadata shares, for the model loader (model*.c) only.
 * It never reads a file and never accepts a value out of range or a feature the backends do not compute. */
#ifndef DEVIO_MODEL_CONFIG_H
#define DEVIO_MODEL_CONFIG_H

#include <stdint.h>

#include <jansson.h>

#include "device/devio.h"
#include "device/model/model.h"

#define DEVIO_MODEL_CONFIG_NAME "config.json"

/* Fills *c (cleared first) from the parsed config.json `root`, which is
 * borrowed for the call only. DEVIO_E_MODEL naming the field for a missing,
 * mistyped or out-of-range value or an unknown architecture;
 * DEVIO_E_UNSUPPORTED for rope_scaling, a hidden_act other than silu,
 * mlp_bias, and Llama's or Mistral's attention_bias. */
devio_status devio_model_config_parse(const json_t *root, devio_model_config *c,
                                      devio_error *err);

/* The rules a value of any model file obeys, config.json's and a GGUF
 * file's metadata alike; `source` (the file) and `what` ("field",
 * "metadata") name `key` in the message, DEVIO_E_MODEL.
 *
 * A float a model is computed from: finite, and in the range of
 * config.json's `field` (the name key is read as; model_config.c's table:
 * (0, max], or [min, max] where a floor keeps the numbers finite), without
 * rounding to 0 as a float. */
devio_status devio_model_float_check(const char *source, const char *what, const char *key,
                                     const char *field, double x, devio_error *err);
/* A token id the file names (bos, eos, pad): one of the vocabulary,
 * 0 to vocab - 1. */
devio_status devio_model_token_check(const char *source, const char *what, const char *key,
                                     int64_t id, uint32_t vocab, devio_error *err);

#endif
