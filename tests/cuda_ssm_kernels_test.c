/* cuda_ssm_kernels_test.c - the Mamba-2 mixer kernels of fast numerics and of decode steps
 * (kernels/cuda_ssm.h) against the kernels they stand in for: the chunked scan against the
 * sequential one by tolerance, and the conv and scan as one kernel against the two, bit for
 * bit, windows, states, snapshots and outputs. Built twice: on the SIMT emulator (every
 * machine) and, where nvcc is, on the GPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <cuda_runtime_api.h>
#include "kernels/cuda_ssm.h"
#include "tests/cuda_test_util.h"

/* The chunked scan against the sequential one on the same inputs: rows of 1, 31, 32, 33 and
 * 100 tokens (one chunk, exactly one, one past, several), some from a fresh state and some
 * from a held one, one keeping an END snapshot; outputs and final states within 1e-4 of the
 * largest magnitude (fast numerics: sums in another order). */
static void test_chunked_scan(void **state)
{
    (void)state;
    need_device();
    enum { R = 5, H = 4, P = 8, G = 2, N = 40, K = 4 };
    static const uint32_t lens[R] = {1, 31, 32, 33, 100};
    const uint32_t I = H * P, conv_dim = I + 2 * G * N, in_dim = 2 * I + 2 * G * N + H;
    uint32_t T = 0;
    cuda_ssm_row rows[R];
    uint32_t chunks = 0;
    for (uint32_t r = 0; r < R; r++) {
        rows[r] = (cuda_ssm_row){.tok_start = T, .n_tokens = lens[r], .slot = r, .fresh = r % 2,
                                 .snap_mode = r == 4 ? CUDA_SNAP_END : CUDA_SNAP_NONE,
                                 .snap_off = 0};
        T += lens[r];
        chunks += (lens[r] + CUDA_SSM_CHUNK - 1) / CUDA_SSM_CHUNK;
    }
    uint64_t slot_floats = (uint64_t)conv_dim * (K - 1) + (uint64_t)I * N, seed = 31;
    size_t n_state = (R + 1) * slot_floats;
    float *st = malloc(n_state * 4), *zx = malloc((size_t)T * in_dim * 4);
    float *xa = malloc((size_t)T * conv_dim * 4), small[4 * H];
    for (size_t i = 0; i < n_state; i++)
        st[i] = uniform(&seed);
    for (size_t i = 0; i < (size_t)T * in_dim; i++)
        zx[i] = uniform(&seed);
    for (size_t i = 0; i < (size_t)T * conv_dim; i++)
        xa[i] = uniform(&seed);
    for (uint32_t i = 0; i < 4 * H; i++)
        small[i] = uniform(&seed) * 0.5f;
    uint32_t snaps[1] = {R};
    cuda_ssm m = {.H = H, .P = P, .G = G, .N = N, .K = K, .I = I, .conv_dim = conv_dim,
                  .in_dim = in_dim, .dt_min = 0.0f, .dt_max = 1e30f, .eps = 1e-5f,
                  .rows = dev_copy(rows, sizeof rows), .n_rows = R, .snaps = dev_copy(snaps, 4),
                  .slot_floats = slot_floats, .layer_off = 0, .dt_bias = dev_copy(small, 4 * H),
                  .a_log = dev_copy(small + H, 4 * H), .d_skip = dev_copy(small + 2 * H, 4 * H),
                  .zx = dev_copy(zx, (size_t)T * in_dim * 4),
                  .xa = dev_copy(xa, (size_t)T * conv_dim * 4)};
    float *want_y = malloc((size_t)T * I * 4), *got_y = malloc((size_t)T * I * 4);
    float *want_s = malloc(n_state * 4), *got_s = malloc(n_state * 4);
    float *cs = dev_copy(NULL, (size_t)2 * ((T + 31) / 32) * I * N * 4);
    float *lam = dev_copy(NULL, (size_t)T * H * 4);
    for (int chunked = 0; chunked < 2; chunked++) {
        m.state = dev_copy(st, n_state * 4);
        m.y = dev_copy(NULL, (size_t)T * I * 4);
        assert_int_equal(chunked ? cuda_ssm_scan_chunked(&m, chunks, cs, lam, NULL)
                                 : cuda_ssm_scan(&m, NULL),
                         0);
        assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
        assert_int_equal(cudaMemcpy(chunked ? got_y : want_y, m.y, (size_t)T * I * 4,
                                    cudaMemcpyDeviceToHost),
                         cudaSuccess);
        assert_int_equal(cudaMemcpy(chunked ? got_s : want_s, m.state, n_state * 4,
                                    cudaMemcpyDeviceToHost),
                         cudaSuccess);
        cudaFree(m.state), cudaFree(m.y);
    }
    double big = 0, worst = 0;
    for (size_t i = 0; i < (size_t)T * I; i++) {
        big = fabs(want_y[i]) > big ? fabs(want_y[i]) : big;
        worst = fabs(got_y[i] - want_y[i]) > worst ? fabs(got_y[i] - want_y[i]) : worst;
    }
    for (size_t i = 0; i < n_state; i++) {
        big = fabs(want_s[i]) > big ? fabs(want_s[i]) : big;
        worst = fabs(got_s[i] - want_s[i]) > worst ? fabs(got_s[i] - want_s[i]) : worst;
    }
    print_message("cuda_ssm_kernels_test: chunked scan off by %.3g of %.3g\n", worst, big);
    assert_true(worst <= 1e-4 * big);
    free(st), free(zx), free(xa), free(want_y), free(got_y), free(want_s), free(got_s);
    cudaFree((void *)m.rows), cudaFree((void *)m.snaps), cudaFree((void *)m.dt_bias);
    cudaFree((void *)m.a_log), cudaFree((void *)m.d_skip), cudaFree((void *)m.zx);
    cudaFree(m.xa), cudaFree(cs), cudaFree(lam);
}


/* A decode step (every row one token) through cuda_ssm_conv_scan then the gated norm, against
 * cuda_ssm_conv, cuda_ssm_scan and the gated norm on the same inputs: the whole state array
 * (windows, states, END and EACH snapshots) and the outputs bit for bit. Rows: fresh, held,
 * END, EACH; P = 6 leaves warps of a block without a channel; K = 4 and K = 6. */
static void conv_scan_case(uint32_t K)
{
    enum { R = 4, H = 4, P = 6, G = 2, N = 40 };
    const uint32_t I = H * P, conv_dim = I + 2 * G * N, in_dim = 2 * I + 2 * G * N + H;
    cuda_ssm_row rows[R];
    for (uint32_t r = 0; r < R; r++)
        rows[r] = (cuda_ssm_row){.tok_start = r, .n_tokens = 1, .slot = r, .fresh = r == 0,
                                 .snap_mode = r == 2 ? CUDA_SNAP_END : r == 3 ? CUDA_SNAP_EACH
                                                                               : CUDA_SNAP_NONE,
                                 .snap_off = r == 2 ? 0 : 1};
    uint64_t slot_floats = (uint64_t)conv_dim * (K - 1) + (uint64_t)I * N, seed = 71 + K;
    size_t n_state = (R + 2) * slot_floats;
    float *st = malloc(n_state * 4), *zx = malloc((size_t)R * in_dim * 4);
    float *cw = malloc((size_t)conv_dim * K * 4), *cb = malloc(conv_dim * 4), small[4 * H];
    float *norm = malloc(I * 4);
    for (size_t i = 0; i < n_state; i++)
        st[i] = uniform(&seed);
    for (size_t i = 0; i < (size_t)R * in_dim; i++)
        zx[i] = uniform(&seed);
    for (size_t i = 0; i < (size_t)conv_dim * K; i++)
        cw[i] = uniform(&seed);
    for (uint32_t i = 0; i < conv_dim; i++)
        cb[i] = uniform(&seed) * 0.1f;
    for (uint32_t i = 0; i < I; i++)
        norm[i] = 1.0f + uniform(&seed) * 0.1f;
    for (uint32_t i = 0; i < 4 * H; i++)
        small[i] = uniform(&seed) * 0.5f;
    uint32_t snaps[2] = {R, R + 1};
    cuda_ssm m0 = {.H = H, .P = P, .G = G, .N = N, .K = K, .I = I, .conv_dim = conv_dim,
                   .in_dim = in_dim, .dt_min = 0.0f, .dt_max = 1e30f, .eps = 1e-5f,
                   .rows = dev_copy(rows, sizeof rows), .n_rows = R, .snaps = dev_copy(snaps, 8),
                   .slot_floats = slot_floats, .layer_off = 0,
                   .conv_w = dev_copy(cw, (size_t)conv_dim * K * 4),
                   .conv_b = dev_copy(cb, conv_dim * 4), .dt_bias = dev_copy(small, 4 * H),
                   .a_log = dev_copy(small + H, 4 * H), .d_skip = dev_copy(small + 2 * H, 4 * H),
                   .norm = dev_copy(norm, I * 4), .zx = dev_copy(zx, (size_t)R * in_dim * 4),
                   .xa = dev_copy(NULL, (size_t)R * conv_dim * 4)};
    float *y[2], *s[2];
    for (int fused = 0; fused < 2; fused++) {
        cuda_ssm m = m0;
        m.state = dev_copy(st, n_state * 4);
        m.y = dev_copy(NULL, (size_t)R * I * 4);
        if (fused) {
            assert_int_equal(cuda_ssm_conv_scan(&m, NULL), 0);
            assert_int_equal(m.bc_pending, 1);
        } else {
            assert_int_equal(cuda_ssm_conv(&m, NULL), 0);
            assert_int_equal(cuda_ssm_scan(&m, NULL), 0);
        }
        assert_int_equal(cuda_ssm_gate_norm(&m, R, NULL), 0);
        assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
        y[fused] = malloc((size_t)R * I * 4), s[fused] = malloc(n_state * 4);
        assert_int_equal(cudaMemcpy(y[fused], m.y, (size_t)R * I * 4, cudaMemcpyDeviceToHost),
                         cudaSuccess);
        assert_int_equal(cudaMemcpy(s[fused], m.state, n_state * 4, cudaMemcpyDeviceToHost),
                         cudaSuccess);
        cudaFree(m.state), cudaFree(m.y);
    }
    for (size_t i = 0; i < n_state; i++)
        if (memcmp(&s[0][i], &s[1][i], 4))
            fail_msg("K %u: state float %zu (slot %zu) %.9g, the two kernels' %.9g", K, i,
                     i / (size_t)slot_floats, (double)s[1][i], (double)s[0][i]);
    for (size_t i = 0; i < (size_t)R * I; i++)
        if (memcmp(&y[0][i], &y[1][i], 4))
            fail_msg("K %u: y[%zu] %.9g, the two kernels' %.9g", K, i, (double)y[1][i],
                     (double)y[0][i]);
    assert_true(memcmp(s[0], st, n_state * 4) != 0); /* the step changed the state */
    free(st), free(zx), free(cw), free(cb), free(norm);
    free(y[0]), free(y[1]), free(s[0]), free(s[1]);
    cudaFree((void *)m0.rows), cudaFree((void *)m0.snaps), cudaFree((void *)m0.conv_w);
    cudaFree((void *)m0.conv_b), cudaFree((void *)m0.dt_bias), cudaFree((void *)m0.a_log);
    cudaFree((void *)m0.d_skip), cudaFree((void *)m0.norm), cudaFree((void *)m0.zx);
    cudaFree(m0.xa);
}

static void test_conv_scan(void **state)
{
    (void)state;
    need_device();
    conv_scan_case(4);
    conv_scan_case(6);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chunked_scan),
        cmocka_unit_test(test_conv_scan),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
