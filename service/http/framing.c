/* framing.c - Content-Length and Transfer-Encoding checked for a single reading (framing.h).
 * It refuses, never repairs: a request with two framings is not answered as either. */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "device/status.h"
#include "service/http/framing.h"

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

/* RFC 9110's tchar. */
static bool token_char(char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c && strchr("!#$%&'*+-.^_`|~", c));
}

static bool starts_with_ci(const char *s, const char *prefix)
{
    return strncasecmp(s, prefix, strlen(prefix)) == 0;
}

static bool name_ok(const char *name)
{
    if (!*name)
        return false;
    for (const char *p = name; *p; p++)
        if (!token_char(*p))
            return false;
    /* A folded framing header reaches devio as its name with the next
     * line's text joined on: which framing the client meant is a guess. */
    bool framing_like = starts_with_ci(name, "Content-Length") ||
                        starts_with_ci(name, "Transfer-Encoding");
    return !framing_like || strcasecmp(name, "Content-Length") == 0 ||
           strcasecmp(name, "Transfer-Encoding") == 0;
}

void devio_framing_add(devio_framing *f, const char *name, const char *value)
{
    if (!name)
        return;
    if (!name_ok(name) && !f->name_bad) {
        f->name_bad = true;
        snprintf(f->name, sizeof f->name, "%s", name);
    }
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
    if (f->name_bad)
        return devio_fail(err, DEVIO_E_BAD_FRAMING,
                          "header name '%s' is not a token, or a framing header's name with more"
                          " after it: whitespace before a colon and folded header lines are "
                          "refused",
                          f->name);
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
