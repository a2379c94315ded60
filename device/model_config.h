/* model_config.h - checking a Hugging Face config.json into a devio_model_config, for the model loader (model.c) only.
 * It never reads a file and never accepts a value out of range or a feature the backends do not compute. */
#ifndef DEVIO_MODEL_CONFIG_H
#define DEVIO_MODEL_CONFIG_H

#include <jansson.h>

#include "device/devio.h"
#include "device/model.h"

#define DEVIO_MODEL_CONFIG_NAME "config.json"

/* Fills *c (cleared first) from the parsed config.json `root`, which is
 * borrowed for the call only. DEVIO_E_MODEL naming the field for a missing,
 * mistyped or out-of-range value or an unknown architecture;
 * DEVIO_E_UNSUPPORTED for rope_scaling, a hidden_act other than silu,
 * mlp_bias, and Llama's or Mistral's attention_bias. */
devio_status devio_model_config_parse(const json_t *root, devio_model_config *c,
                                      devio_error *err);

#endif
