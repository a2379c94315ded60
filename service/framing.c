/* framing.c - Content-Length and Transfer-Encoding checked for a single reading (framing.h).
 * It refuses, never repairs: a request with two framings is not answered as either. */
#include <stdio.h>
#include <strings.h>

#include "device/status.h"
#include "service/framing.h"

static bool parse_length(const char *v, uint64_t *out)
{
    uint64_t n = 0;
    if (!v || !*v)
        return false;
    for (; *v; v++) {
        if (*v < '0' || *v > '9')
            return false;
        unsigned d = (unsigned)(*v - '0');
        if (n > (UINT64_MAX - d) / 10)
            return false;
        n = n * 10 + d;
    }
    *out = n;
    return true;
}

void devio_framing_add(devio_framing *f, const char *name, const char *value)
{
    if (!name)
        return;
    if (strcasecmp(name, "Content-Length") == 0) {
        uint64_t n = 0;
        if (!parse_length(value, &n))
            f->length_bad = true;
        else if (f->n_length == 0)
            f->length = n;
        f->n_length++;
    } else if (strcasecmp(name, "Transfer-Encoding") == 0) {
        if ((!value || strcasecmp(value, "chunked") != 0) && !f->encoding_bad) {
            f->encoding_bad = true;
            snprintf(f->encoding, sizeof f->encoding, "%s", value ? value : "");
        }
        f->n_encoding++;
    }
}

devio_status devio_framing_check(const devio_framing *f, devio_error *err)
{
    if (f->n_length && f->n_encoding)
        return devio_fail(err, DEVIO_E_BAD_FRAMING,
                          "Content-Length together with Transfer-Encoding: the body's end "
                          "would be ambiguous");
    if (f->n_length > 1)
        return devio_fail_at(err, DEVIO_E_BAD_FRAMING, "content_length_headers", f->n_length,
                             "%u Content-Length headers; at most one is accepted", f->n_length);
    if (f->length_bad)
        return devio_fail(err, DEVIO_E_BAD_FRAMING,
                          "Content-Length must be a decimal number of bytes");
    if (f->n_encoding > 1)
        return devio_fail_at(err, DEVIO_E_BAD_FRAMING, "transfer_encoding_headers",
                             f->n_encoding, "%u Transfer-Encoding headers; at most one is accepted",
                             f->n_encoding);
    if (f->encoding_bad)
        return devio_fail(err, DEVIO_E_BAD_FRAMING,
                          "Transfer-Encoding '%s' is not supported; only chunked is", f->encoding);
    return DEVIO_OK;
}
