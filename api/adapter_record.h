/* adapter_record.h - helpers of the one adapter record (device/devio.h): its states' names and its fields' copy.
 * Plain data; it never touches JSON, SQL or the device. */
#ifndef DEVIO_ADAPTER_RECORD_H
#define DEVIO_ADAPTER_RECORD_H

#include <stdbool.h>
#include <stdint.h>

#include "device/devio.h"

/* devio_adapter_state and devio_adapter_record are device/devio.h's: the
 * device's acknowledgements carry the same record. */

/* "loaded", "unloaded", "stale", "failed"; NULL for a value outside the enum. Static storage. */
const char *devio_adapter_state_str(devio_adapter_state s);
/* Inverse of devio_adapter_state_str. False (and *out untouched) for any other string or NULL. */
bool devio_adapter_state_parse(const char *s, devio_adapter_state *out);

/* Copy src into a fixed field of the record, cut to fit (NULL copies ""). */
void devio_adapter_record_set(char *field, size_t size, const char *src);

#endif
