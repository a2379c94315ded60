/* adapter_table.h - the device's table of loaded adapters: weights, pins, use, LRU,
 * and the backend's adapter indices kept in step with it (index = entry index).
 * Changed only at quiescence (under the device lock, after every launched step ran). */
#ifndef DEVIO_ADAPTER_TABLE_H
#define DEVIO_ADAPTER_TABLE_H

#include <stdbool.h>
#include <stdint.h>

#include "device/adapter/adapter.h"
#include "device/backend/backend.h"
#include "device/devio.h"
#include "device/model/model.h"

typedef struct devio_adapter_entry {
    bool used;
    devio_adapter_record rec; /* state loaded; what list and the acks copy */
    devio_adapter *weights; /* owned */
    uint64_t last_use;      /* logical clock for LRU eviction */
    uint32_t in_use;        /* unawaited tickets with a row naming it */
    uint32_t generation;    /* bumped whenever the slot changes hands; never reused */
} devio_adapter_entry;

typedef struct devio_adapter_table {
    uint32_t capacity; /* max_loras */
    uint32_t max_rank;
    uint32_t n_loaded;
    uint64_t clock;
    const char *root;          /* adapters root, borrowed; NULL = loading refused */
    const devio_model *model;  /* borrowed */
    const devio_backend_ops *ops; /* borrowed: the backend holding the adapters */
    void *backend;                /* borrowed */
    devio_adapter_entry *entries; /* capacity entries */
} devio_adapter_table;

/* ops/backend receive adapter_add/adapter_remove for every change of an
 * entry; a backend without the adapter entries makes every load DEVIO_E_UNSUPPORTED. */
devio_status devio_adapter_table_init(devio_adapter_table *t, uint32_t capacity, uint32_t max_rank,
                                   const char *root, const devio_model *model,
                                   const devio_backend_ops *ops, void *backend);
/* Removes every adapter from the backend and frees it. */
void devio_adapter_table_fini(devio_adapter_table *t);

/* Index of the loaded adapter `name`, or -1 when none. */
int32_t devio_adapter_table_find(const devio_adapter_table *t, const char *name);

/* A launched row names entry i: count it (rows served, LRU clock, in use). */
void devio_adapter_table_acquire(devio_adapter_table *t, int32_t i);
/* The ticket of such a row was awaited; gen is the entry's generation at acquire. */
void devio_adapter_table_release(devio_adapter_table *t, int32_t i, uint32_t gen);

/* Apply a command; all or nothing. Load reads the adapter from
 * root/cmd->path (device/adapter/adapter.h), reuses the entry when the same name
 * is loaded with the same weights, refuses the name with other weights,
 * and when the table is full evicts the least recently used adapter that
 * is unpinned and named by no unawaited ticket (DEVIO_E_ADAPTER_CAPACITY
 * when there is none). The backend's slot changes with the entry; when the
 * backend refuses the new adapter, the evicted one is put back. */
devio_status devio_adapter_table_apply(devio_adapter_table *t, const devio_adapter_cmd *cmd,
                                    devio_adapter_ack *ack, devio_error *err);

#endif
