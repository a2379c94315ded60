/* http_error.c - device status -> HTTP status code (DESIGN §3, Errors).
 * The only such table in devio; every route answers through it. */
#include "service/http_error.h"

unsigned devio_http_code(devio_status s)
{
    switch (s) {
    case DEVIO_OK: return 200;
    case DEVIO_E_INVALID:
    case DEVIO_E_UNSUPPORTED: return 400;
    case DEVIO_E_UNAUTHORIZED: return 401;
    case DEVIO_E_UNKNOWN_SEQ:
    case DEVIO_E_UNKNOWN_TICKET:
    case DEVIO_E_UNKNOWN_LOGITS:
    case DEVIO_E_UNKNOWN_ADAPTER:
    case DEVIO_E_NOT_FOUND: return 404;
    case DEVIO_E_METHOD: return 405;
    case DEVIO_E_TICKET_PENDING: return 408;
    case DEVIO_E_SEQ_BUSY:
    case DEVIO_E_DEPTH_EXCEEDED:
    case DEVIO_E_TICKET_CONSUMED:
    case DEVIO_E_OUT_OF_KV_BLOCKS:
    case DEVIO_E_OUT_OF_LOGITS:
    case DEVIO_E_OUT_OF_SEQS:
    case DEVIO_E_OUT_OF_SSM_SLOTS:
    case DEVIO_E_NO_SNAPSHOT:
    case DEVIO_E_ADAPTER_CAPACITY: return 409;
    case DEVIO_E_TOO_LARGE: return 413;
    case DEVIO_E_TORN_DOWN:
    case DEVIO_E_NOT_READY: return 503;
    case DEVIO_E_MODEL:
    case DEVIO_E_IO:
    case DEVIO_E_NOMEM:
    case DEVIO_E_DEVICE:
    case DEVIO_STATUS_COUNT: return 500;
    }
    return 500;
}
