/* sha256.h - SHA-256 (FIPS 180-4) for logits digests and adapter file hashes.
 * Streaming, no allocation, no I/O. */
#ifndef DEVIO_SHA256_H
#define DEVIO_SHA256_H

#include <stddef.h>
#include <stdint.h>

typedef struct devio_sha256 {
    uint32_t h[8];
    uint64_t n_bytes;
    uint8_t buf[64];
    uint32_t n_buf;
} devio_sha256;

void devio_sha256_init(devio_sha256 *s);
void devio_sha256_update(devio_sha256 *s, const void *data, size_t n);
void devio_sha256_final(devio_sha256 *s, uint8_t out[32]);
/* Lower-case hex of the digest, 64 chars + NUL. */
void devio_sha256_hex(const uint8_t digest[32], char out[65]);

#endif
