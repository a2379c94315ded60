/* json_fields.h - typed readers of JSON object fields, shared by every decoder in api/.
 * They validate and copy; they never allocate and never keep a reference to the JSON. */
#ifndef DEVIO_JSON_FIELDS_H
#define DEVIO_JSON_FIELDS_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "device/devio.h"

/* DEVIO_E_INVALID unless j is an object whose fields are all in `allowed`
 * (NULL-terminated; NULL allows any), so a typo is an error, not a no-op.
 * `what` names it in the message, e.g. "the plan". */
devio_status devio_json_check_object(const json_t *j, const char *const *allowed,
                                     const char *what, devio_error *err);

/* Unsigned integer field in [0, max]. Absent: DEVIO_E_INVALID when required,
 * otherwise DEVIO_OK with *out untouched. */
devio_status devio_json_get_uint(const json_t *obj, const char *key, uint64_t max, bool required,
                                 uint64_t *out, devio_error *err);

/* Optional number field as binary32; absent leaves *out untouched. The range
 * is checked on the JSON value (a double) before it is narrowed: [lo, hi],
 * lo excluded when lo_open, the message naming the field and the range. A
 * value in range that is not 0 stays not 0 (1e-300 becomes the smallest
 * float rather than 0). */
devio_status devio_json_get_float(const json_t *obj, const char *key, double lo, bool lo_open,
                                  double hi, float *out, devio_error *err);

/* Optional boolean field; absent leaves *out untouched. */
devio_status devio_json_get_bool(const json_t *obj, const char *key, bool *out, devio_error *err);

/* Optional string field copied into buf[size] (too long: DEVIO_E_INVALID); null
 * or absent leaves buf untouched. */
devio_status devio_json_get_text(const json_t *obj, const char *key, char *buf, size_t size,
                                 devio_error *err);

#endif
