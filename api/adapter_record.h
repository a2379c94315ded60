/* adapter_record.h - the one adapter record: what the device, the store, HTTP and scripts say about a LoRA adapter.
 * Plain data with its own storage; it never touches JSON, SQL or the device. */
#ifndef DEVIO_ADAPTER_RECORD_H
#define DEVIO_ADAPTER_RECORD_H

#include <stdbool.h>
#include <stdint.h>

#include "device/devio.h"

typedef enum devio_adapter_state {
    DEVIO_ADAPTER_LOADED = 0,
    DEVIO_ADAPTER_UNLOADED,
    DEVIO_ADAPTER_STALE,  /* recorded weights differ from the file at restart */
    DEVIO_ADAPTER_FAILED, /* the last load failed; reason says why */
    DEVIO_ADAPTER_STATE_COUNT
} devio_adapter_state;

/* "loaded", "unloaded", "stale", "failed"; NULL for a value outside the enum. Static storage. */
const char *devio_adapter_state_str(devio_adapter_state s);
/* Inverse of devio_adapter_state_str. False (and *out untouched) for any other string or NULL. */
bool devio_adapter_state_parse(const char *s, devio_adapter_state *out);

/* Sizes include the NUL; name, path, targets and sha256 match devio_adapter_info. */
#define DEVIO_ADAPTER_NAME_MAX 64
#define DEVIO_ADAPTER_PATH_MAX 256
#define DEVIO_ADAPTER_TARGETS_MAX 128
#define DEVIO_ADAPTER_REASON_MAX 320

/* One adapter with its own storage: copy it, keep it, free nothing. */
typedef struct devio_adapter_record {
    char name[DEVIO_ADAPTER_NAME_MAX];
    char path[DEVIO_ADAPTER_PATH_MAX]; /* relative to the adapters root */
    uint32_t rank;                     /* 0 when unknown (a failed load) */
    float alpha, scale;
    char targets[DEVIO_ADAPTER_TARGETS_MAX]; /* comma-separated modules, e.g. "q_proj,v_proj" */
    char sha256[65];                         /* hex of the weights file; "" when unknown */
    uint64_t size;                           /* bytes of the weights file */
    devio_adapter_state state;
    bool pinned;
    uint64_t rows_served;            /* plan rows launched with it since it loaded (device count) */
    int64_t loaded_ms, last_used_ms; /* unix ms; 0 when never */
    char reason[DEVIO_ADAPTER_REASON_MAX]; /* why it is failed/stale/unloaded; "" when none */
} devio_adapter_record;

/* The device's view of an adapter, in `state`; the times and the reason are zero. */
void devio_adapter_record_from_info(devio_adapter_record *r, const devio_adapter_info *info,
                                    devio_adapter_state state);

/* Copy src into a fixed field of the record, cut to fit (NULL copies ""). */
void devio_adapter_record_set(char *field, size_t size, const char *src);

#endif
