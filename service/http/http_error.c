/* http_error.c - device status -> HTTP status code: one table indexed by devio_status (docs/http.md).
 * The only such table in devio; it never builds bodies, and api/openapi.yaml (ErrorCode,
 * x-devio-http-status) must say the same: tests/python/status_table_check.py compares them. */
#include "service/http/http_error.h"

/* Every status has a row; a status added to the enum without one answers 500
 * (and fails the comparison with the OpenAPI document). */
static const unsigned short http_codes[DEVIO_STATUS_COUNT] = {
    [DEVIO_OK] = 200,
    [DEVIO_E_INVALID] = 400,
    [DEVIO_E_UNKNOWN_SEQ] = 404,
    [DEVIO_E_UNKNOWN_TICKET] = 404,
    [DEVIO_E_UNKNOWN_LOGITS] = 404,
    [DEVIO_E_UNKNOWN_ADAPTER] = 404,
    [DEVIO_E_SEQ_BUSY] = 409,
    [DEVIO_E_DEPTH_EXCEEDED] = 409,
    [DEVIO_E_TICKET_CONSUMED] = 409,
    [DEVIO_E_TICKET_PENDING] = 408,
    [DEVIO_E_OUT_OF_KV_BLOCKS] = 409,
    [DEVIO_E_OUT_OF_LOGITS] = 409,
    [DEVIO_E_OUT_OF_SEQS] = 409,
    [DEVIO_E_OUT_OF_SSM_SLOTS] = 409,
    [DEVIO_E_OUT_OF_SNAPSHOTS] = 409,
    [DEVIO_E_NO_SNAPSHOT] = 409,
    [DEVIO_E_ADAPTER_CAPACITY] = 409,
    [DEVIO_E_UNSUPPORTED] = 400,
    [DEVIO_E_TOO_LARGE] = 413,
    [DEVIO_E_TORN_DOWN] = 503,
    [DEVIO_E_MODEL] = 500,
    [DEVIO_E_IO] = 500,
    [DEVIO_E_NOMEM] = 500,
    [DEVIO_E_DEVICE] = 500,
    [DEVIO_E_UNAUTHORIZED] = 401,
    [DEVIO_E_NOT_FOUND] = 404,
    [DEVIO_E_METHOD] = 405,
    [DEVIO_E_NOT_READY] = 503,
    [DEVIO_E_STORE_UNAVAILABLE] = 503,
    [DEVIO_E_BAD_FRAMING] = 400,
    [DEVIO_E_TOO_MANY_CONNECTIONS] = 503,
    [DEVIO_E_MEDIA_TYPE] = 415,
    [DEVIO_E_TICKET_REAPED] = 410,
    [DEVIO_E_KEY_IN_USE] = 409,
    [DEVIO_E_KEY_REUSED] = 422,
};

unsigned devio_http_code(devio_status s)
{
    if ((unsigned)s >= DEVIO_STATUS_COUNT || http_codes[s] == 0)
        return 500;
    return http_codes[s];
}
