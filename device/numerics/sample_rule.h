/* sample_rule.h - the pieces of device/sample/sampler.h's definition that every sampler computes
 * alike, the host's (sampler.c) and the CUDA backend's (kernels/cuda_sample.cu): step 0's
 * cleaning, step 3's tempering, step 6's order, step 8's Philox bits and Gumbel noise. Inline functions of
 * values (DEVIO_NUM_FN: host and device code); nothing to own. */
#ifndef DEVIO_SAMPLE_RULE_H
#define DEVIO_SAMPLE_RULE_H

#include <float.h>
#include <math.h> /* INFINITY only */
#include <stdint.h>

#include "device/numerics/numerics.h"

/* Step 0: NaN -> -inf, +inf -> FLT_MAX. */
DEVIO_NUM_FN float devio_clean_logit(float x)
{
    if (x != x)
        return -INFINITY;
    if (x > FLT_MAX)
        return FLT_MAX;
    return x;
}

/* Step 3 for one logit already cleaned, t > 0. */
DEVIO_NUM_FN float devio_temper(float l, float t)
{
    if (l == -INFINITY)
        return -INFINITY;
    float q = DEVIO_DIV(l, t);
    if (q > FLT_MAX)
        return FLT_MAX;
    if (q < -FLT_MAX)
        return -FLT_MAX;
    return q;
}

/* Step 6's order as an unsigned key, smaller first: p descending. p >= 0, so the bits of p
 * order like p and inverting them reverses that; both zeros map to the last key. */
DEVIO_NUM_FN uint32_t devio_nucleus_key(float p)
{
    return p > 0.0f ? ~devio_num_bits(p) : UINT32_MAX;
}

/* Philox4x32-10 as sampler.h defines it: out = the block of counter ctr under key. */
DEVIO_NUM_FN void devio_philox_block(const uint32_t ctr[4], const uint32_t key[2],
                                     uint32_t out[4])
{
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; round++) {
        if (round > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        uint64_t p0 = (uint64_t)0xD2511F53u * c0;
        uint64_t p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

/* Step 8's g from the 32 random bits r. */
DEVIO_NUM_FN float devio_gumbel_of_bits(uint32_t r)
{
    /* 2k+1 < 2^24 converts exactly; times 2^-24 is exact. */
    float u = DEVIO_MUL((float)(2u * (r >> 9) + 1u), 0x1p-24f);
    return -devio_logf(-devio_logf(u));
}

/* Step 8's g of token id under (seed, position): its word of the Philox block of id / 4. */
DEVIO_NUM_FN float devio_gumbel_of_id(uint32_t id, uint64_t seed, uint64_t position)
{
    uint32_t ctr[4] = {id >> 2, 0u, (uint32_t)position, (uint32_t)(position >> 32)};
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)}, bits[4];
    devio_philox_block(ctr, key, bits);
    return devio_gumbel_of_bits(bits[id & 3u]);
}

#endif
