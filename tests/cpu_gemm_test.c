/* cpu_gemm_test.c - the cpu backend's projections (cpu/cpu_gemm.c) on one instruction-set path:
 * quantized weights packed and multiplied within tolerance of their values, rows and widths that
 * are not whole fours and sweeps, a token's numbers the same alone or in a batch, and a weight
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
#include "ref/isa_dispatch.h"
#include "ref/pool.h"
#include "ref/ref_gemm.h"
#include "ref/ref_kernels.h"

extern const devio_backend_ops CPU_TEST_OPS;

/* Whether this CPU runs the path under test; a skip says so when not. */
static bool runs(void)
{
    devio_isa_path p = {.name = CPU_TEST_PATH, .ops = &CPU_TEST_OPS, .level = CPU_TEST_LEVEL,
                        .needs = "the path's -march"};
    devio_isa_family f = {.what = "cpu", .env = "DEVIO_CPU_TEST_UNSET", .paths = &p, .n_paths = 1};
    char why[160];
    if (devio_isa_runs(&f, CPU_TEST_PATH, why, sizeof why))
        return true;
    print_message("skipped: %s\n", why);
    return false;
}

static uint32_t rng = 12345u;
static uint32_t next(void)
{
    rng = rng * 1664525u + 1013904223u;
    return rng >> 8;
}

/* m rows of n Q4_0 elements, random quants, scales of about 0.01. */
static uint8_t *q4_0_rows(uint32_t m, uint32_t n)
{
    uint32_t bb = devio_quant_block_bytes(DEVIO_QT_Q4_0);
    uint8_t *w = malloc((size_t)m * n / 32u * bb);
    for (size_t b = 0; b < (size_t)m * n / 32u; b++) {
        uint16_t d = devio_f32_to_f16_rne(0.005f + (float)(next() % 100) * 1e-4f);
        memcpy(w + b * bb, &d, 2);
        for (uint32_t i = 2; i < bb; i++)
            w[b * bb + i] = (uint8_t)next();
    }
    return w;
}

static void test_q4_0_within_tolerance_and_batch_independent(void **state)
{
    (void)state;
    if (!runs())
        return;
    const uint32_t m = 6, n = 160, T = 3; /* a four and two rows; a sweep and a quarter */
    uint8_t *w = q4_0_rows(m, n);
    devio_pool *pool = devio_pool_create(2);
    ref_panels p;
    assert_int_equal(ref_panels_pack(&p, pool, w, DEVIO_Q4_0, m, n), 0);
    ref_scratch scratch[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(ref_scratch_init(&scratch[i], 16, 64, n), 0);
    float *xpack = calloc(ref_gemm_xpack_floats(T, n), sizeof(float));
    float x[3 * 160], y[3 * 6], alone[6];
    for (uint32_t i = 0; i < T * n; i++)
        x[i] = (float)((int)(next() % 2001) - 1000) / 250.0f;
    ref_gemm_work wk = {.pool = pool, .scratch = scratch, .xpack = xpack};
    ref_matmul mm = {.w = &p, .epi = REF_EPI_STORE, .x = x, .ldx = n, .n_tok = T, .y = y, .ldy = m};
    ref_matmul_run(&wk, &mm, 1);
    float row[160];
    for (uint32_t t = 0; t < T; t++) {
        double err = 0, norm = 0;
        for (uint32_t o = 0; o < m; o++) {
            double want = 0;
            for (uint32_t b = 0; b < n / 32u; b++) {
                devio_dequant_block(DEVIO_QT_Q4_0,
                                    w + ((size_t)o * n / 32u + b) * devio_quant_block_bytes(
                                                                        DEVIO_QT_Q4_0),
                                    row + b * 32u);
            }
            for (uint32_t k = 0; k < n; k++)
                want += (double)row[k] * x[t * n + k];
            err += (y[t * m + o] - want) * (y[t * m + o] - want);
            norm += want * want;
        }
        assert_true(err <= 1e-8 * norm); /* relative 1e-4 in the 2-norm */
        /* The last token alone: the same bits as in the batch. */
        ref_matmul one = {.w = &p, .epi = REF_EPI_STORE, .x = x + t * n, .ldx = n, .n_tok = 1,
                          .y = alone, .ldy = m};
        ref_matmul_run(&wk, &one, 1);
        assert_memory_equal(alone, y + t * m, m * sizeof(float));
    }
    ref_panels_free(&p);
    for (int i = 0; i < 2; i++)
        ref_scratch_fini(&scratch[i]);
    free(xpack);
    devio_pool_free(pool);
    free(w);
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
        cmocka_unit_test(test_q4_0_within_tolerance_and_batch_independent),
        cmocka_unit_test(test_scales_past_binary16_keep_the_reference_form),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
