/* sum64.c - devio_sum64 (sum64.h). Each lane takes every fourth 64-bit word of the stream:
 * lane = rotl(lane + word * K1, 31) * K0; the lanes run independently, so a stripe costs four
 * multiplies that overlap. The end folds the lanes, the length and the last partial stripe, and
 * mixes the result so that every input bit moves about half the output bits. */
#include "common/sum64.h"

#include <string.h>

#define K0 0x9E3779B97F4A7C15ull /* 2^64 / the golden ratio, odd */
#define K1 0xD6E8FEB86659FD93ull
#define K2 0xA0761D6478BD642Full

static uint64_t rotl(uint64_t x, int r) { return x << r | x >> (64 - r); }

/* The little-endian word at p. */
static uint64_t word(const uint8_t *p)
{
    uint64_t w;
    memcpy(&w, p, sizeof w);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    w = __builtin_bswap64(w);
#endif
    return w;
}

static uint64_t step(uint64_t lane, uint64_t w) { return rotl(lane + w * K1, 31) * K0; }

static void stripe(devio_sum64 *s, const uint8_t *p)
{
    for (int i = 0; i < 4; i++)
        s->lane[i] = step(s->lane[i], word(p + 8 * i));
}

void devio_sum64_init(devio_sum64 *s, uint64_t seed)
{
    memset(s, 0, sizeof *s);
    for (int i = 0; i < 4; i++)
        s->lane[i] = K2 * (uint64_t)(i + 1) + seed * K0;
}

void devio_sum64_update(devio_sum64 *s, const void *data, size_t n)
{
    const uint8_t *p = data;
    s->n_bytes += n;
    if (s->n_buf) {
        size_t k = 32 - s->n_buf < n ? 32 - s->n_buf : n;
        memcpy(s->buf + s->n_buf, p, k);
        s->n_buf += (uint32_t)k;
        p += k;
        n -= k;
        if (s->n_buf < 32)
            return;
        stripe(s, s->buf);
        s->n_buf = 0;
    }
    for (; n >= 32; p += 32, n -= 32)
        stripe(s, p);
    memcpy(s->buf, p, n);
    s->n_buf = (uint32_t)n;
}

uint64_t devio_sum64_final(const devio_sum64 *s)
{
    uint64_t h = rotl(s->lane[0], 1) + rotl(s->lane[1], 7) + rotl(s->lane[2], 12) +
                 rotl(s->lane[3], 18);
    h = (h ^ s->n_bytes) * K0;
    uint8_t tail[32] = {0};
    memcpy(tail, s->buf, s->n_buf);
    for (uint32_t i = 0; i < (s->n_buf + 7) / 8; i++)
        h = rotl(h ^ step(0, word(tail + 8 * i)), 27) * K1 + K2;
    h ^= h >> 33;
    h *= K1;
    h ^= h >> 29;
    h *= K2;
    return h ^ h >> 32;
}
