/* quant_test.c - device/numerics/quant.h: the split form kernels widen (S * q, plus M) gives every
 * element's defined value bit for bit, for random blocks of every type (their f16 scales
 * finite, of every kind); and a hand-worked Q4_1 and Q4_K block. The values themselves are
 * checked against the gguf package by tests/python/quant_check.py. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "device/numerics/quant.h"

static const uint32_t types[] = {DEVIO_QT_Q4_0, DEVIO_QT_Q4_1, DEVIO_QT_Q5_0, DEVIO_QT_Q5_1,
                                 DEVIO_QT_Q8_0, DEVIO_QT_Q4_K, DEVIO_QT_Q5_K, DEVIO_QT_Q6_K};

static uint32_t rnd(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(*s >> 33);
}

static uint32_t bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static void put_f16(uint8_t *p, uint32_t h)
{
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
}

/* The split form and the one-element form give each element's value. */
static void test_split_is_the_value(void **state)
{
    (void)state;
    uint64_t seed = 7;
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++) {
        uint32_t t = types[ti], blk = devio_quant_block(t), gs = devio_quant_group(t);
        for (int trial = 0; trial < 400; trial++) {
            uint8_t b[256];
            for (uint32_t i = 0; i < devio_quant_block_bytes(t); i++)
                b[i] = (uint8_t)rnd(&seed);
            /* Finite f16 scales: any sign and exponent below all ones. */
            uint32_t f1 = rnd(&seed) % 0x7c00u | (rnd(&seed) & 1u) << 15;
            uint32_t f2 = rnd(&seed) % 0x7c00u | (rnd(&seed) & 1u) << 15;
            put_f16(t == DEVIO_QT_Q6_K ? b + 208 : b, f1);
            if (devio_quant_has_offset(t) || t == DEVIO_QT_Q4_K || t == DEVIO_QT_Q5_K)
                put_f16(b + 2, f2);
            float y[256], S[16], M[16] = {0};
            int8_t q[256];
            devio_dequant_block(t, b, y);
            devio_quant_split(t, b, q, S, M);
            for (uint32_t i = 0; i < blk; i++) {
                float w = DEVIO_MUL(S[i / gs], (float)q[i]);
                if (devio_quant_has_offset(t))
                    w = DEVIO_ADD(w, M[i / gs]);
                if (bits(w) != bits(y[i]))
                    fail_msg("type %u element %u: split %a, value %a", t, i, w, y[i]);
                float e = devio_quant_elem(t, b, i);
                if (bits(e) != bits(y[i]))
                    fail_msg("type %u element %u: one element %a, value %a", t, i, e, y[i]);
            }
        }
    }
}

/* Q4_1: d = 0.5, m = -1, quants 0..15 then 15..0: y = 0.5 q - 1. */
static void test_q4_1_by_hand(void **state)
{
    (void)state;
    uint8_t b[20] = {0};
    put_f16(b, 0x3800);     /* 0.5 */
    put_f16(b + 2, 0xbc00); /* -1 */
    for (int j = 0; j < 16; j++)
        b[4 + j] = (uint8_t)(j | (15 - j) << 4);
    float y[32];
    devio_dequant_block(DEVIO_QT_Q4_1, b, y);
    for (int j = 0; j < 16; j++) {
        assert_true(y[j] == 0.5f * (float)j - 1.0f);
        assert_true(y[j + 16] == 0.5f * (float)(15 - j) - 1.0f);
    }
}

/* Q4_K: d = 1, dmin = 0.25; sub-block 5's scale and min take their top two bits from bytes 1
 * and 5: sc = 0x3 | (2 << 4) = 35, mn = 0x7 | (1 << 4) = 23; its elements are the high nibbles
 * of bytes 64..95 of qs. */
static void test_q4_k_high_sub_block(void **state)
{
    (void)state;
    uint8_t b[144] = {0};
    put_f16(b, 0x3c00);     /* 1 */
    put_f16(b + 2, 0x3400); /* 0.25 */
    uint8_t *s = b + 4, *qs = b + 16;
    s[1] = 2u << 6;      /* scale top bits of sub-block 5 */
    s[5] = 1u << 6;      /* min top bits of sub-block 5 */
    s[9] = 0x3 | 0x7 << 4;
    for (int l = 0; l < 32; l++)
        qs[64 + l] = (uint8_t)((l % 16) << 4);
    float y[256];
    devio_dequant_block(DEVIO_QT_Q4_K, b, y);
    for (int l = 0; l < 32; l++)
        assert_true(y[160 + l] == 35.0f * (float)(l % 16) - 0.25f * 23.0f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_is_the_value),
        cmocka_unit_test(test_q4_1_by_hand),
        cmocka_unit_test(test_q4_k_high_sub_block),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
