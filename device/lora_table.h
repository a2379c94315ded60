/* lora_table.h - the device's table of loaded LoRA adapters.
 * Holds names, ranks, pins and usage; it never touches weights or files. */
#ifndef DEVIO_LORA_TABLE_H
#define DEVIO_LORA_TABLE_H

#include <stdbool.h>
#include <stdint.h>

#include "device/devio.h"

typedef struct devio_lora_entry {
    bool used;
    devio_adapter_info info;
    uint64_t last_use; /* logical clock for LRU eviction */
} devio_lora_entry;

typedef struct devio_lora_table {
    uint32_t capacity; /* max_loras */
    uint32_t max_rank;
    uint32_t n_loaded;
    uint64_t clock;
    devio_lora_entry *entries; /* capacity entries */
} devio_lora_table;

devio_status devio_lora_table_init(devio_lora_table *t, uint32_t capacity, uint32_t max_rank);
void devio_lora_table_fini(devio_lora_table *t);

/* Index of the loaded adapter `name`, or -1 when none. */
int32_t devio_lora_table_find(const devio_lora_table *t, const char *name);

/* Apply a command. Loading weights needs the adapter loader; without one
 * the table answers DEVIO_E_UNSUPPORTED for load and changes nothing. */
devio_status devio_lora_table_apply(devio_lora_table *t, const devio_lora_cmd *cmd,
                                    devio_lora_ack *ack, devio_error *err);

#endif
