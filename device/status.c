/* status.c - names of the device status codes and the error filler.
 * The only table of code strings; HTTP mapping lives in the service. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "device/devio.h"
#include "device/status.h"

static const char *const status_names[DEVIO_STATUS_COUNT] = {
    [DEVIO_OK] = "ok",
    [DEVIO_E_INVALID] = "invalid_input",
    [DEVIO_E_UNKNOWN_SEQ] = "unknown_seq",
    [DEVIO_E_UNKNOWN_TICKET] = "unknown_ticket",
    [DEVIO_E_UNKNOWN_LOGITS] = "unknown_logits",
    [DEVIO_E_UNKNOWN_ADAPTER] = "unknown_adapter",
    [DEVIO_E_SEQ_BUSY] = "seq_busy",
    [DEVIO_E_DEPTH_EXCEEDED] = "depth_exceeded",
    [DEVIO_E_TICKET_CONSUMED] = "ticket_consumed",
    [DEVIO_E_TICKET_PENDING] = "ticket_pending",
    [DEVIO_E_OUT_OF_KV_BLOCKS] = "out_of_kv_blocks",
    [DEVIO_E_OUT_OF_LOGITS] = "out_of_logits",
    [DEVIO_E_OUT_OF_SEQS] = "out_of_seqs",
    [DEVIO_E_OUT_OF_SSM_SLOTS] = "out_of_ssm_slots",
    [DEVIO_E_OUT_OF_SNAPSHOTS] = "out_of_snapshots",
    [DEVIO_E_NO_SNAPSHOT] = "no_snapshot",
    [DEVIO_E_ADAPTER_CAPACITY] = "adapter_capacity",
    [DEVIO_E_UNSUPPORTED] = "unsupported",
    [DEVIO_E_TOO_LARGE] = "too_large",
    [DEVIO_E_TORN_DOWN] = "torn_down",
    [DEVIO_E_MODEL] = "model_error",
    [DEVIO_E_IO] = "io_error",
    [DEVIO_E_NOMEM] = "out_of_memory",
    [DEVIO_E_DEVICE] = "device_error",
    [DEVIO_E_UNAUTHORIZED] = "unauthorized",
    [DEVIO_E_NOT_FOUND] = "not_found",
    [DEVIO_E_METHOD] = "method_not_allowed",
    [DEVIO_E_NOT_READY] = "not_ready",
    [DEVIO_E_STORE_UNAVAILABLE] = "store_unavailable",
    [DEVIO_E_BAD_FRAMING] = "bad_framing",
    [DEVIO_E_TOO_MANY_CONNECTIONS] = "too_many_connections",
    [DEVIO_E_MEDIA_TYPE] = "unsupported_media_type",
    [DEVIO_E_TICKET_REAPED] = "ticket_reaped",
    [DEVIO_E_KEY_IN_USE] = "key_in_use",
    [DEVIO_E_KEY_REUSED] = "key_reused",
};

devio_status devio_status_parse(const char *code)
{
    for (int i = 0; code && i < DEVIO_STATUS_COUNT; i++)
        if (status_names[i] && strcmp(status_names[i], code) == 0)
            return (devio_status)i;
    return DEVIO_E_DEVICE;
}

const char *devio_status_str(devio_status s)
{
    if ((unsigned)s >= DEVIO_STATUS_COUNT || !status_names[s])
        return "unknown_status";
    return status_names[s];
}

devio_status devio_fail(devio_error *err, devio_status s, const char *fmt, ...)
{
    if (!err)
        return s;
    err->status = s;
    err->detail_key[0] = '\0';
    err->detail_val = 0;
    err->ticket = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    return s;
}

devio_status devio_fail_at(devio_error *err, devio_status s, const char *key, int64_t val,
                           const char *fmt, ...)
{
    if (!err)
        return s;
    err->status = s;
    snprintf(err->detail_key, sizeof err->detail_key, "%s", key);
    err->detail_val = val;
    err->ticket = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    return s;
}

void devio_error_prefix(devio_error *err, const char *fmt, ...)
{
    if (!err)
        return;
    char pre[sizeof err->message], msg[sizeof err->message];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pre, sizeof pre, fmt, ap);
    va_end(ap);
    memcpy(msg, err->message, sizeof msg);
    size_t n = strlen(pre);
    memcpy(err->message, pre, n + 1);
    if (n + 1 < sizeof err->message) {
        size_t m = strnlen(msg, sizeof msg - 1);
        if (m > sizeof err->message - 1 - n)
            m = sizeof err->message - 1 - n;
        memcpy(err->message + n, msg, m);
        err->message[n + m] = '\0';
    }
}
