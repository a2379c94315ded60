/* cpu_gemm_test.c - the cpu backend's projections (cpu/cpu_gemm.c) on one instruction-set path:
 * quantized weights of each form packed and multiplied within tolerance of their values, rows and
 * widths that are not whole fours and sweeps, a token's numbers the same alone or in a batch (tiles
 * of tokens and single tokens), and a weight
 * whose scales do not fit binary16 kept in the reference's form. The copts name the path. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "device/model/model.h"
#include "device/numerics/numerics.h"
#include "device/numerics/quant.h"
#include "ref/pool.h"
#include "ref/ref_gemm.h"
#include "ref/ref_kernels.h"
#include "tests/cpu_path_test.h"

static uint32_t rng = 12345u;
static uint32_t next(void)
{
    rng = rng * 1664525u + 1013904223u;
    return rng >> 8;
}

/* m rows of n elements of GGML type t: random quants, binary16 scales
 * (and minimums) of about 0.01 where the type keeps them. */
static uint8_t *rand_rows(uint32_t t, uint32_t m, uint32_t n)
{
    uint32_t bb = devio_quant_block_bytes(t), blocks = m * n / devio_quant_block(t);
    uint8_t *w = malloc((size_t)blocks * bb);
    for (size_t b = 0; b < blocks; b++) {
        uint8_t *p = w + b * bb;
        for (uint32_t i = 0; i < bb; i++)
            p[i] = (uint8_t)next();
        uint16_t d = devio_f32_to_f16_rne(0.005f + (float)(next() % 100) * 1e-4f);
        uint16_t mn = devio_f32_to_f16_rne(0.002f + (float)(next() % 10) * 1e-3f);
        memcpy(t == DEVIO_QT_Q6_K ? p + bb - 2 : p, &d, 2);
        if (t == DEVIO_QT_Q4_1 || t == DEVIO_QT_Q4_K || t == DEVIO_QT_Q5_1 || t == DEVIO_QT_Q5_K)
            memcpy(p + 2, &mn, 2);
    }
    return w;
}

/* Each type's rows (a four and two rows; widths not whole sweeps where the
 * block allows) times 70 tokens (wide tiles, a block of 64 and one of 4,
 * then two tokens alone) and its first 9 (two wide tiles, one alone) on
 * the path's kernels. Every output within `limit` of the float64 product
 * of the dequantized weights (relative, 2-norm per token): 1e-4 where the
 * file's scales are binary16 already, 1e-3 for the K-quants, whose scale
 * products d * sc are rounded to binary16 (2^-11 relative); and every
 * token's numbers the same bits when it is run alone or in either batch. */
static void check_type(devio_dtype dt, uint32_t n, double limit)
{
    enum { M = 6, T = 70, T9 = 9, NMAX = 512 };
    uint32_t t = devio_dtype_ggml(dt), blk = devio_quant_block(t);
    uint8_t *w = rand_rows(t, M, n);
    devio_pool *pool = devio_pool_create(2);
    ref_panels p;
    assert_int_equal(ref_panels_pack(&p, pool, w, dt, M, n), 0);
    assert_true(p.qgroups >= 16u); /* the fast form */
    ref_scratch scratch[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(ref_scratch_init(&scratch[i], 16, 64, n), 0);
    float *xpack = calloc(ref_gemm_xpack_floats(T, n), sizeof(float));
    static float x[T * NMAX], y[T * M], y9[T9 * M], alone[M], row[NMAX];
    for (uint32_t i = 0; i < T * n; i++)
        x[i] = (float)((int)(next() % 2001) - 1000) / 250.0f;
    ref_gemm_work wk = {.pool = pool, .scratch = scratch, .xpack = xpack};
    ref_matmul mm = {.w = &p, .epi = REF_EPI_STORE, .x = x, .ldx = n, .n_tok = T, .y = y, .ldy = M};
    ref_matmul_run(&wk, &mm, 1);
    ref_matmul nine = mm;
    nine.n_tok = T9;
    nine.y = y9;
    ref_matmul_run(&wk, &nine, 1);
    assert_memory_equal(y9, y, sizeof y9);
    for (uint32_t k = 0; k < T; k++) {
        double err = 0, norm = 0;
        for (uint32_t o = 0; o < M; o++) {
            double want = 0;
            for (uint32_t b = 0; b < n / blk; b++)
                devio_dequant_block(t, w + ((size_t)o * n / blk + b) * devio_quant_block_bytes(t),
                                    row + b * blk);
            for (uint32_t i = 0; i < n; i++)
                want += (double)row[i] * x[k * n + i];
            err += (y[k * M + o] - want) * (y[k * M + o] - want);
            norm += want * want;
        }
        if (!(err <= limit * limit * norm)) /* a NaN too */
            fail_msg("type %u token %u: relative error %g", t, k, err / norm);
        ref_matmul one = {.w = &p, .epi = REF_EPI_STORE, .x = x + k * n, .ldx = n, .n_tok = 1,
                          .y = alone, .ldy = M};
        ref_matmul_run(&wk, &one, 1);
        assert_memory_equal(alone, y + k * M, M * sizeof(float));
    }
    ref_panels_free(&p);
    for (int i = 0; i < 2; i++)
        ref_scratch_fini(&scratch[i]);
    free(xpack);
    devio_pool_free(pool);
    free(w);
}

static void test_each_form_within_tolerance_and_batch_independent(void **state)
{
    (void)state;
    if (!runs())
        return;
    check_type(DEVIO_Q4_0, 160, 1e-4); /* 4 bits, groups of 32, offsets made from scales */
    check_type(DEVIO_Q8_0, 160, 1e-4); /* int8, groups of 32 */
    check_type(DEVIO_Q4_K, 256, 1e-3);
    check_type(DEVIO_Q5_0, 160, 1e-4); /* 5 bits, groups of 32, a shift */
    check_type(DEVIO_Q5_0, 192, 1e-4); /* a last sweep of 64, a half tail at its widest */
    /* Offsets, no shift: with q unsigned and offsets of one sign every
     * weight here is positive, so the products cancel and the 15-bit
     * activations' error is larger against the small result (up to 1.6e-4
     * over these 70 tokens). */
    check_type(DEVIO_Q4_1, 160, 1e-3);
    check_type(DEVIO_Q5_1, 160, 1e-3);
    /* 1.005e-3 at worst here: rounded scale products and offsets. */
    check_type(DEVIO_Q5_K, 256, 2e-3);
    check_type(DEVIO_Q6_K, 512, 1e-3); /* 6 bits, groups of 16, a shift */
}

/* A row whose last sweep holds at most 64 elements (SmolLM2's 576 is 4.5
 * sweeps) keeps only those elements' quants there, not a padded sweep:
 * at width 192, Q4_0 its 96 bytes of nibbles (a padded row: 128), Q8_0
 * its 192 int8 (256); six rows are kept as eight (whole fours), with the
 * binary16 scales of two sweeps of four groups each. */
static void test_half_tail_keeps_the_files_quants(void **state)
{
    (void)state;
    if (!runs())
        return;
    enum { M = 6, N = 192, ROWS = 8, SCALES = 2 * ROWS * 2 * 4 };
    devio_pool *pool = devio_pool_create(1);
    static const struct {
        devio_dtype dt;
        size_t row_bytes;
    } cases[] = {{DEVIO_Q4_0, N / 2}, {DEVIO_Q8_0, N}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        uint8_t *w = rand_rows(devio_dtype_ggml(cases[i].dt), M, N);
        ref_panels p;
        assert_int_equal(ref_panels_pack(&p, pool, w, cases[i].dt, M, N), 0);
        assert_int_equal(p.bytes, ROWS * cases[i].row_bytes + SCALES);
        ref_panels_free(&p);
        free(w);
    }
    devio_pool_free(pool);
}

/* A Q4_K weight whose sub-block scales (d * sc) pass binary16's range is
 * packed by the reference's code (its qgroups, 1 or 2), not refused; one
 * in range takes the fast form (qgroups 32, the group size). */
static void test_scales_past_binary16_keep_the_reference_form(void **state)
{
    (void)state;
    if (!runs())
        return;
    uint32_t bb = devio_quant_block_bytes(DEVIO_QT_Q4_K);
    uint8_t blk[2][144];
    memset(blk, 0x3f, sizeof blk);
    uint16_t big = devio_f32_to_f16_rne(60000.0f), small = devio_f32_to_f16_rne(0.01f);
    memcpy(blk[0], &big, 2);
    memcpy(blk[1], &small, 2);
    memcpy(blk[0] + 2, &small, 2);
    memcpy(blk[1] + 2, &small, 2);
    assert_int_equal(bb, sizeof blk[0]);
    devio_pool *pool = devio_pool_create(1);
    ref_panels p;
    assert_int_equal(ref_panels_pack(&p, pool, blk[0], DEVIO_Q4_K, 1, 256), 0);
    assert_true(p.qgroups < 16u);
    ref_panels_free(&p);
    assert_int_equal(ref_panels_pack(&p, pool, blk[1], DEVIO_Q4_K, 1, 256), 0);
    assert_int_equal(p.qgroups, 32);
    ref_panels_free(&p);
    devio_pool_free(pool);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_each_form_within_tolerance_and_batch_independent),
        cmocka_unit_test(test_scales_past_binary16_keep_the_reference_form),
        cmocka_unit_test(test_half_tail_keeps_the_files_quants),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
