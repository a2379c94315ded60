/* sum64.h - a fast 64-bit checksum of a byte stream, for what must catch a cut or altered body
 * at memory speed (a sequence's state, docs/state.md) rather than resist a forger: four
 * independent multiply-rotate lanes over 32-byte stripes, folded and mixed at the end. The
 * same bytes give the same sum on every target (words read little-endian). Streaming, no
 * allocation, no I/O; the caller owns the state. */
#ifndef DEVIO_SUM64_H
#define DEVIO_SUM64_H

#include <stddef.h>
#include <stdint.h>

typedef struct devio_sum64 {
    uint64_t lane[4];
    uint64_t n_bytes;
    uint8_t buf[32];
    uint32_t n_buf;
} devio_sum64;

/* Sums with different seeds are independent: two make a 128-bit sum. */
void devio_sum64_init(devio_sum64 *s, uint64_t seed);
void devio_sum64_update(devio_sum64 *s, const void *data, size_t n);
uint64_t devio_sum64_final(const devio_sum64 *s);

#endif
