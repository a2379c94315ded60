/* tls.c - reads --tls-cert and --tls-key into memory for libmicrohttpd and refuses, naming the file, what cannot serve HTTPS.
 * The key's bytes are wiped when freed; it never logs or prints them. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <microhttpd.h>

#include "device/status.h"
#include "service/http/tls.h"

/* The whole file as a NUL-terminated string in *out (caller frees). */
static devio_status read_pem(const char *flag, const char *path, char **out, devio_error *err)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f)
        return devio_fail(err, DEVIO_E_IO, "cannot read %s file %s: %s", flag, path,
                          strerror(errno));
    char *buf = malloc(DEVIO_TLS_MAX_FILE + 1);
    size_t n = buf ? fread(buf, 1, DEVIO_TLS_MAX_FILE + 1, f) : 0;
    bool bad = buf && ferror(f);
    int e = errno;
    fclose(f);
    if (!buf)
        return devio_fail(err, DEVIO_E_NOMEM, "out of memory reading %s file %s", flag, path);
    if (bad || n > DEVIO_TLS_MAX_FILE) {
        explicit_bzero(buf, n > DEVIO_TLS_MAX_FILE ? DEVIO_TLS_MAX_FILE + 1 : n);
        free(buf);
        if (bad)
            return devio_fail(err, DEVIO_E_IO, "cannot read %s file %s: %s", flag, path,
                              strerror(e));
        return devio_fail_at(err, DEVIO_E_INVALID, "max_bytes", DEVIO_TLS_MAX_FILE,
                             "%s file %s is over %u bytes", flag, path, DEVIO_TLS_MAX_FILE);
    }
    buf[n] = '\0';
    *out = buf;
    return DEVIO_OK;
}

/* A PEM block "-----BEGIN <...>what-----" whose label ends with `what`. */
static bool has_block(const char *text, const char *what)
{
    size_t wn = strlen(what);
    for (const char *p = strstr(text, "-----BEGIN "); p; p = strstr(p + 1, "-----BEGIN ")) {
        const char *end = strstr(p + 11, "-----");
        if (!end)
            return false;
        const char *nl = strchr(p, '\n');
        if (nl && nl < end)
            continue;
        if ((size_t)(end - (p + 11)) >= wn && memcmp(end - wn, what, wn) == 0)
            return true;
    }
    return false;
}

devio_status devio_tls_load(devio_tls *t, const char *cert_file, const char *key_file,
                            devio_error *err)
{
    memset(t, 0, sizeof *t);
    bool cert = cert_file && *cert_file, key = key_file && *key_file;
    if (!cert && !key)
        return DEVIO_OK;
    if (!cert || !key)
        return devio_fail(err, DEVIO_E_INVALID, "--tls-cert and --tls-key go together: %s is missing",
                          cert ? "--tls-key" : "--tls-cert");
    if (MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES)
        return devio_fail(err, DEVIO_E_UNSUPPORTED,
                          "--tls-cert/--tls-key: this libmicrohttpd (%s) was built without TLS; "
                          "serve plain HTTP or terminate TLS in front of devio",
                          MHD_get_version());
    devio_status st = read_pem("--tls-cert", cert_file, &t->cert, err);
    if (st == DEVIO_OK)
        st = read_pem("--tls-key", key_file, &t->key, err);
    if (st == DEVIO_OK && !has_block(t->cert, "CERTIFICATE"))
        st = devio_fail(err, DEVIO_E_INVALID,
                        "--tls-cert file %s holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
                        cert_file);
    if (st == DEVIO_OK && !has_block(t->key, "PRIVATE KEY"))
        st = devio_fail(err, DEVIO_E_INVALID,
                        "--tls-key file %s holds no PEM private key (-----BEGIN ... PRIVATE KEY-----)",
                        key_file);
    if (st != DEVIO_OK)
        devio_tls_free(t);
    return st;
}

void devio_tls_free(devio_tls *t)
{
    if (t->key)
        explicit_bzero(t->key, strlen(t->key));
    free(t->key);
    free(t->cert);
    t->key = t->cert = NULL;
}
