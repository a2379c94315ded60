/* adapter_codec.h - the one JSON codec of adapter records and adapter commands, for HTTP, scripts and conform.
 * Translation only; it never calls the device or the store. */
#ifndef DEVIO_ADAPTER_CODEC_H
#define DEVIO_ADAPTER_CODEC_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "api/adapter_record.h"
#include "device/devio.h"

/* Which fields an encoded record carries. */
typedef enum devio_adapter_view {
    /* What a device knows: name, path, rank, alpha, scale, targets, sha256,
     * size, state, pinned, rows_served. The script runner's lora results. */
    DEVIO_ADAPTER_VIEW_DEVICE = 0,
    /* Those plus the store's loaded_ms, last_used_ms and reason: the HTTP record. */
    DEVIO_ADAPTER_VIEW_RECORD,
} devio_adapter_view;

/* A record as JSON: targets as an array, sha256 and reason null when "",
 * alpha and scale null when not finite. New reference, NULL on out of memory. */
json_t *devio_json_adapter_record(const devio_adapter_record *r, devio_adapter_view view);

/* Inverse of devio_json_adapter_record (either view; the record fields absent
 * from the device view stay zero). Fields it does not know are ignored, so an
 * answer may grow. *out is zeroed first; on failure it holds nothing useful. */
devio_status devio_json_adapter_record_decode(const json_t *j, devio_adapter_record *out,
                                              devio_error *err);

/* An adapter command's acknowledgement, the result of a script's lora op:
 * {"adapters":[records, device view], "evicted"?: name}; a device ack is
 * (ack.adapters, ack.n_adapters, ack.evicted). evicted may be NULL or "".
 * New reference, NULL on out of memory. */
json_t *devio_json_adapter_ack(const devio_adapter_record *recs, uint32_t n,
                               const char *evicted);

/* The body of PUT /v1/adapters/{name}: {"path": non-empty string, "pin"?: bool}. */
typedef struct devio_adapter_load_body {
    const char *path; /* borrowed from the JSON: keep it alive while this is used */
    bool pin;
} devio_adapter_load_body;

devio_status devio_json_adapter_load_decode(const json_t *j, devio_adapter_load_body *out,
                                            devio_error *err);

/* A script's command {"kind":..., "name":..., "path":..., "pin":...}; the load
 * fields are read as devio_json_adapter_load_decode reads them. cmd->name and
 * cmd->path borrow strings from j: keep j alive while cmd is used. */
devio_status devio_json_adapter_cmd_decode(const json_t *j, devio_adapter_cmd *out, devio_error *err);

#endif
