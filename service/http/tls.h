/* tls.h - devio-server's certificate and key for HTTPS (--tls-cert, --tls-key): read from their files and checked before the server listens.
 * It never speaks TLS itself: libmicrohttpd's GnuTLS support does, given the PEM text held here. */
#ifndef DEVIO_TLS_H
#define DEVIO_TLS_H

#include <stddef.h>

#include "device/devio.h"

/* The largest certificate chain or key file read, in bytes. */
#define DEVIO_TLS_MAX_FILE (1u << 20)

typedef struct devio_tls {
    char *cert; /* PEM text, NUL-terminated, owned; NULL = plain HTTP */
    char *key;  /* PEM text, owned, wiped by devio_tls_free */
} devio_tls;

/* Both files or neither (then t stays plain HTTP and DEVIO_OK). Refused,
 * with err naming the flag and file: only one of the two given, a library
 * built without TLS, a file that cannot be read or is over
 * DEVIO_TLS_MAX_FILE, a certificate file without a PEM CERTIFICATE block, a
 * key file without a PEM PRIVATE KEY block. Whether the key matches the
 * certificate is checked by libmicrohttpd when the daemon starts. */
devio_status devio_tls_load(devio_tls *t, const char *cert_file, const char *key_file,
                            devio_error *err);

/* Wipe and free; t is plain HTTP after. */
void devio_tls_free(devio_tls *t);

#endif
