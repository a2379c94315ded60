/* adapter_config.h - reading and checking one PEFT adapter_config.json, for the adapter loader (adapter.c) only.
 * It never opens a file (it reads the descriptor it is given) and never accepts a PEFT feature the device does not compute. */
#ifndef DEVIO_ADAPTER_CONFIG_H
#define DEVIO_ADAPTER_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include "device/devio.h"

/* What adapter_config.json says, after checking. */
typedef struct devio_lora_config {
    uint32_t rank;
    float alpha;     /* lora_alpha rounded to binary32 (PEFT's default 8 when absent) */
    bool use_rslora;
    uint32_t targets; /* bit (1u << devio_lora_target) per module named by target_modules */
    bool *layer_on;   /* n_layers entries, borrowed from the caller: layers_to_transform */
} devio_lora_config;

/* Reads the JSON file open as fd (borrowed, read with pread from offset 0;
 * named `label` in errors) and fills *c,
 * whose layer_on the caller has allocated with n_layers entries.
 * DEVIO_E_IO when it cannot be read; DEVIO_E_MODEL when it is not a JSON
 * object; DEVIO_E_UNSUPPORTED and DEVIO_E_INVALID as devio_adapter_load
 * (adapter.h) documents for the config's fields. Keeps no pointer into
 * anything it is given. */
devio_status devio_lora_config_load(int fd, const char *label, uint32_t n_layers,
                                    uint32_t max_rank, devio_lora_config *c, devio_error *err);

#endif
