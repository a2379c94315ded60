/* cuda_fast_kernels_test.c - the fast numerics' kernels (kernels/cuda_fast.h) against float64:
 * the GEMV of small batches over every token count it takes; grouped LoRA over slots with and
 * without an adapter; and the paged attention against the same softmax over the same f16 keys
 * and values: GQA groups narrower and wider than a block's 8 warps, head sizes with a lane's
 * second column pair, a sliding window, keys past several chunks and every split count from
 * one to the most a step takes, blocks scattered over the pool; prefill tiled over queries; the
 * sampler kernel against the host's sampler and quantized weights widened to f16, bit for bit.
 * Built twice: on the SIMT
 * emulator (every machine) and, where nvcc is, on the GPU. */
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

#include "device/numerics/numerics.h"
#include "device/numerics/quant.h"
#include "device/sample/sampler.h"
#include "kernels/cuda_fast.h"
#include "kernels/cuda_proc.h"
#include "kernels/cuda_sample.h"
#include "tests/cuda_test_util.h"

typedef struct attn_case {
    uint32_t n_heads, n_kv, hd, block_size, window, n_tok;
    uint32_t pos[48];
    uint8_t row[48]; /* with rows: the token's row; a row's tokens are adjacent, one block table */
    bool rows;       /* else every token is a row of its own */
} attn_case;

#define TILED UINT32_MAX /* check_case's splits: the tiled (prefill) kernel */

/* Every (token, head) of c through cuda_attention16 with `splits` (0: what the step would
 * choose; TILED: cuda_attention16_tiled), each output within 1e-5 of the float64 result's
 * largest magnitude. */
static void check_case(const attn_case *c, uint32_t splits)
{
    uint32_t bs = c->block_size, hd = c->hd, G = c->n_heads / c->n_kv, n = c->n_tok;
    uint32_t off[48], n_bt = 0, max_keys = 0;
    for (uint32_t t = 0; t < n; t++) {
        bool fresh = !c->rows || t == 0 || c->row[t] != c->row[t - 1];
        if (fresh) { /* the row's table holds the blocks of its last (highest) position */
            uint32_t last = t;
            while (c->rows && last + 1 < n && c->row[last + 1] == c->row[t])
                last++;
            off[t] = n_bt;
            n_bt += c->pos[last] / bs + 1;
        } else {
            off[t] = off[t - 1];
        }
        uint32_t keys = c->pos[t] + 1;
        if (c->window && keys > c->window)
            keys = c->window;
        max_keys = keys > max_keys ? keys : max_keys;
    }
    bool tiled = splits == TILED;
    if (splits == 0 || tiled)
        splits = tiled ? 1 : cuda_attn16_splits(n, max_keys);
    /* The pool holds every token's blocks in a scattered order, plus two never read. */
    uint32_t n_blocks = n_bt + 2, *bt = malloc(n_bt * sizeof *bt);
    for (uint32_t i = 0; i < n_bt; i++)
        bt[i] = (i * 7 + 3) % n_blocks;
    size_t pool = (size_t)n_blocks * c->n_kv * bs * hd, qn = (size_t)n * c->n_heads * hd;
    uint16_t *k = malloc(pool * 2), *v = malloc(pool * 2);
    float *q = malloc(qn * 4), *out = malloc(qn * 4);
    uint64_t seed = 0x1234u + hd * 31u + splits;
    for (size_t i = 0; i < pool; i++) {
        k[i] = devio_f32_to_f16_rne(uniform(&seed) * 2.0f);
        v[i] = devio_f32_to_f16_rne(uniform(&seed));
    }
    for (size_t i = 0; i < qn; i++)
        q[i] = uniform(&seed);
    cuda_kv kv = {.k16 = dev_copy(k, pool * 2), .v16 = dev_copy(v, pool * 2), .block_size = bs,
                  .n_heads = c->n_heads, .n_kv = c->n_kv, .hd = hd, .rd = hd,
                  .window = c->window, .pos = dev_copy(c->pos, n * 4),
                  .bt_off = dev_copy(off, n * 4), .bt = dev_copy(bt, n_bt * 4)};
    float *dq = dev_copy(q, qn * 4), *dout = dev_copy(NULL, qn * 4), *part = NULL;
    if (splits > 1)
        part = dev_copy(NULL, (size_t)CUDA_ATTN16_PART_ROWS * c->n_heads * (hd + 2) * 4);
    float scale = 1.0f / sqrtf((float)hd);
    if (tiled)
        assert_int_equal(cuda_attention16_tiled(&kv, dq, scale, dout, n, NULL), 0);
    else
        assert_int_equal(cuda_attention16(&kv, dq, scale, dout, n, splits, part, NULL), 0);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    assert_int_equal(cudaMemcpy(out, dout, qn * 4, cudaMemcpyDeviceToHost), cudaSuccess);

    uint32_t top = 0;
    for (uint32_t t = 0; t < n; t++)
        top = c->pos[t] > top ? c->pos[t] : top;
    double *s = malloc((top + 1) * sizeof *s), *o = malloc(hd * sizeof *o);
    for (uint32_t t = 0; t < n; t++) {
        uint32_t pos = c->pos[t], j0 = c->window && pos + 1 > c->window ? pos + 1 - c->window : 0;
        for (uint32_t h = 0; h < c->n_heads; h++) {
            const float *qh = q + ((size_t)t * c->n_heads + h) * hd;
            double m = -INFINITY, z = 0.0, big = 0.0, worst = 0.0;
            for (uint32_t j = j0; j <= pos; j++) {
                const uint16_t *kr = k + cuda_kv_slot(&kv, bt + off[t], j, h / G);
                double d = 0.0;
                for (uint32_t i = 0; i < hd; i++)
                    d += (double)qh[i] * devio_f16_to_f32(kr[i]);
                s[j - j0] = d * scale;
                m = s[j - j0] > m ? s[j - j0] : m;
            }
            memset(o, 0, hd * sizeof *o);
            for (uint32_t j = j0; j <= pos; j++) {
                double e = exp(s[j - j0] - m);
                const uint16_t *vr = v + cuda_kv_slot(&kv, bt + off[t], j, h / G);
                z += e;
                for (uint32_t i = 0; i < hd; i++)
                    o[i] += e * devio_f16_to_f32(vr[i]);
            }
            const float *got = out + ((size_t)t * c->n_heads + h) * hd;
            for (uint32_t i = 0; i < hd; i++) {
                big = fabs(o[i] / z) > big ? fabs(o[i] / z) : big;
                worst = fabs(got[i] - o[i] / z) > worst ? fabs(got[i] - o[i] / z) : worst;
            }
            if (!(worst <= 1e-5 * (big > 1e-3 ? big : 1e-3)))
                fail_msg("token %u (pos %u) head %u, %u splits%s: off by %.3g of %.3g", t, pos,
                         h, splits, tiled ? " (tiled)" : "", worst, big);
        }
    }
    free(s), free(o), free(bt), free(k), free(v), free(q), free(out);
    cudaFree(kv.k16), cudaFree(kv.v16), cudaFree((void *)kv.pos), cudaFree((void *)kv.bt_off);
    cudaFree((void *)kv.bt), cudaFree(dq), cudaFree(dout), cudaFree(part);
}

/* GQA 4 heads per group, keys across many chunks, every split count a step could take. */
static void test_gqa_splits(void **state)
{
    (void)state;
    need_device();
    attn_case c = {.n_heads = 8, .n_kv = 2, .hd = 64, .block_size = 16, .n_tok = 5,
                   .pos = {0, 31, 32, 100, 640}};
    uint32_t splits[] = {0, 1, 2, 3, 12};
    for (size_t i = 0; i < sizeof splits / sizeof *splits; i++)
        check_case(&c, splits[i]);
}

/* 12 heads on one KV head: two blocks per group, the second with idle warps. */
static void test_wide_group(void **state)
{
    (void)state;
    need_device();
    attn_case c = {.n_heads = 12, .n_kv = 1, .hd = 16, .block_size = 4, .n_tok = 3,
                   .pos = {5, 70, 200}};
    check_case(&c, 0);
    check_case(&c, 1);
}

/* head_dim 80 (lanes 0..7 hold a second column pair) under a sliding window of 50. */
static void test_window_odd_pairs(void **state)
{
    (void)state;
    need_device();
    attn_case c = {.n_heads = 4, .n_kv = 4, .hd = 80, .block_size = 8, .window = 50, .n_tok = 4,
                   .pos = {10, 49, 50, 300}};
    check_case(&c, 0);
    check_case(&c, 1);
    check_case(&c, 5);
}

/* The largest head_dim the kernel takes. */
static void test_head_dim_256(void **state)
{
    (void)state;
    need_device();
    attn_case c = {.n_heads = 2, .n_kv = 1, .hd = CUDA_ATTN16_MAX_HD, .block_size = 16,
                   .n_tok = 2, .pos = {3, 150}};
    check_case(&c, 0);
}

/* The GEMV of dtype on the m x n weight held in w (len bytes, as uploaded), whose values widened
 * are wf, against float64 over the same values, every token count it takes, with and without
 * beta: within 1e-5 (1 + sqrt n), plus rel sqrt(n) times the sum of the terms' magnitudes. */
static void gemv_check(int dtype, const void *w, size_t len, const float *wf, uint32_t m,
                       uint32_t n, uint64_t seed, double rel)
{
    uint32_t ldx = n + 3, ldy = m + 1;
    float *x = malloc(8 * (size_t)ldx * 4), *y0 = malloc(8 * (size_t)ldy * 4);
    float *y = malloc(8 * (size_t)ldy * 4);
    for (size_t i = 0; i < 8 * (size_t)ldx; i++)
        x[i] = uniform(&seed);
    for (size_t i = 0; i < 8 * (size_t)ldy; i++)
        y0[i] = uniform(&seed);
    void *dw = dev_copy(w, len);
    float *dx = dev_copy(x, 8 * (size_t)ldx * 4), *dy = dev_copy(NULL, 8 * (size_t)ldy * 4);
    assert_true(cuda_gemv_fits(dtype, n));
    for (uint32_t nt = 1; nt <= CUDA_GEMV_MAX_TOK; nt++)
        for (int with_beta = 0; with_beta < 2; with_beta++) {
            float alpha = 0.5f, beta = with_beta ? 2.0f : 0.0f;
            assert_int_equal(cudaMemcpy(dy, y0, 8 * (size_t)ldy * 4, cudaMemcpyHostToDevice),
                             cudaSuccess);
            assert_int_equal(cuda_gemv(dtype, dw, m, n, dx, ldx, nt, alpha, beta, dy, ldy, NULL),
                             0);
            assert_int_equal(cudaMemcpy(y, dy, 8 * (size_t)ldy * 4, cudaMemcpyDeviceToHost),
                             cudaSuccess);
            for (uint32_t t = 0; t < 8; t++)
                for (uint32_t o = 0; o < ldy; o++) {
                    size_t at = (size_t)t * ldy + o;
                    double want = y0[at], mag = 0.0;
                    if (t < nt && o < m) {
                        double d = 0.0;
                        for (uint32_t i = 0; i < n; i++) {
                            double p = (double)wf[(size_t)o * n + i] * x[(size_t)t * ldx + i];
                            d += p;
                            mag += fabs(p);
                        }
                        want = alpha * d + beta * (double)y0[at];
                    }
                    double tol = 1e-5 * (1.0 + sqrt((double)n)) + rel * sqrt((double)n) * mag;
                    if (fabs(y[at] - want) > tol)
                        fail_msg("dtype %d, %u tokens, beta %g: y[%u][%u] %.9g, want %.9g", dtype,
                                 nt, (double)beta, t, o, (double)y[at], want);
                }
        }
    cudaFree(dw), cudaFree(dx), cudaFree(dy);
    free(x), free(y0), free(y);
}

/* A 16-bit or f32 weight of uniform values. */
static void gemv_case(int dtype, uint32_t m, uint32_t n)
{
    uint32_t es = dtype == CUDA_F32 ? 4 : 2;
    uint64_t seed = 77u + n;
    uint8_t *w = malloc((size_t)m * n * es);
    float *wf = malloc((size_t)m * n * sizeof *wf);
    for (size_t i = 0; i < (size_t)m * n; i++) {
        float v = uniform(&seed);
        if (dtype == CUDA_F32) {
            memcpy(w + 4 * i, &v, 4);
        } else {
            uint16_t h = dtype == CUDA_F16 ? devio_f32_to_f16_rne(v) : devio_f32_to_bf16_rne(v);
            memcpy(w + 2 * i, &h, 2);
            v = dtype == CUDA_F16 ? devio_f16_to_f32(h) : devio_bf16_to_f32(h);
        }
        wf[i] = v;
    }
    gemv_check(dtype, w, (size_t)m * n * es, wf, m, n, seed, 0.0);
    free(w), free(wf);
}

/* ggml's numbers of CUDA_Q8_0 ... CUDA_Q6_K, in that order */
static const uint32_t GGML_OF[] = {8, 2, 3, 6, 7, 12, 13, 14};

/* Random blocks of ggml type g whose f16 scales are of a trained model's size (random bytes
 * there give scales up to 65504 and infinities). */
static void random_blocks(uint32_t g, uint8_t *w, uint32_t nb, uint64_t *seed)
{
    uint32_t bytes = devio_quant_block_bytes(g);
    for (uint32_t i = 0; i < nb * bytes; i++)
        w[i] = (uint8_t)(uniform(seed) * 127.0f + 128.0f);
    for (uint32_t b = 0; b < nb; b++) {
        uint8_t *p = w + (size_t)b * bytes;
        uint16_t d = devio_f32_to_f16_rne(0.002f + 0.01f * (uniform(seed) + 1.0f));
        uint16_t mn = devio_f32_to_f16_rne(0.001f * (uniform(seed) + 1.0f));
        uint32_t at = g == 14 ? 208 : 0; /* Q6_K keeps d last */
        memcpy(p + at, &d, 2);
        if (g == 3 || g == 7 || g == 12 || g == 13) /* Q4_1, Q5_1: m; Q4_K, Q5_K: dmin */
            memcpy(p + 2, &mn, 2);
    }
}

/* A quantized weight of m rows of nb random blocks, widened by devio_quant_elem for float64. */
static void gemv_quant_case(int dtype, uint32_t m, uint32_t nb)
{
    uint32_t g = GGML_OF[dtype - CUDA_Q8_0], blk = devio_quant_block(g);
    uint32_t bytes = devio_quant_block_bytes(g), n = nb * blk;
    uint64_t seed = 31u + (uint64_t)dtype;
    uint8_t *w = malloc((size_t)m * nb * bytes);
    float *wf = malloc((size_t)m * n * sizeof *wf);
    random_blocks(g, w, m * nb, &seed);
    for (size_t i = 0; i < (size_t)m * n; i++)
        wf[i] = devio_quant_elem(g, w + (i / blk) * bytes, (uint32_t)(i % blk));
    assert_false(cuda_gemv_fits(dtype, n + 16));
    gemv_check(dtype, w, (size_t)m * nb * bytes, wf, m, n, seed, 1e-6);
    free(w), free(wf);
}

static void test_gemv(void **state)
{
    (void)state;
    need_device();
    gemv_case(CUDA_BF16, 37, 264);
    gemv_case(CUDA_F16, 9, 1024);
    gemv_case(CUDA_F32, 5, 36);
    for (int dt = CUDA_Q8_0; dt <= CUDA_Q6_K; dt++) /* 33 or 3 rows of 3 blocks: 96 or 768 */
        gemv_quant_case(dt, dt >= CUDA_Q4_K ? 3 : 33, 3);
    assert_false(cuda_gemv_fits(CUDA_BF16, 12));
    assert_false(cuda_gemv_fits(CUDA_Q8_0, 48));
    assert_int_equal(cuda_gemv(CUDA_BF16, NULL, 1, 12, NULL, 12, 1, 1.0f, 0.0f, NULL, 1, NULL),
                     cudaErrorInvalidValue);
    assert_int_equal(cuda_gemv(CUDA_BF16, NULL, 1, 16, NULL, 16, 9, 1.0f, 0.0f, NULL, 1, NULL),
                     cudaErrorInvalidValue);
}

/* Grouped LoRA over three slots (slot 1 not adapted, one token on no adapter) against float64:
 * y = y + (B (A x)) * scale for each token of an adapted slot, the rest untouched. */
static void test_sgmv(void **state)
{
    (void)state;
    need_device();
    enum { N = 11, IN = 40, OUT = 150, RANK = 6, MAXR = 8, SLOTS = 3 };
    const int32_t slot[N] = {0, 2, -1, 0, 2, 2, 0, 1, 2, 0, 2};
    uint64_t seed = 5;
    float a[SLOTS][RANK * IN], b[SLOTS][OUT * RANK], x[N * IN], y0[N * OUT], y[N * OUT];
    for (int s = 0; s < SLOTS; s++) {
        for (int i = 0; i < RANK * IN; i++)
            a[s][i] = uniform(&seed);
        for (int i = 0; i < OUT * RANK; i++)
            b[s][i] = uniform(&seed);
    }
    for (int i = 0; i < N * IN; i++)
        x[i] = uniform(&seed);
    for (int i = 0; i < N * OUT; i++)
        y0[i] = uniform(&seed);
    cuda_lora_mod mods[SLOTS];
    for (int s = 0; s < SLOTS; s++)
        mods[s] = (cuda_lora_mod){.a = s == 1 ? NULL : dev_copy(a[s], sizeof a[s]),
                                  .b = s == 1 ? NULL : dev_copy(b[s], sizeof b[s]),
                                  .rank = RANK, .in = IN, .out = OUT, .scale = 0.75f};
    uint32_t groups[SLOTS + 1 + N], k = 0;
    for (uint32_t s = 0; s < SLOTS; s++) {
        groups[s] = k;
        for (uint32_t t = 0; t < N; t++)
            if (slot[t] == (int32_t)s)
                groups[SLOTS + 1 + k++] = t;
    }
    groups[SLOTS] = k;
    cuda_lora_mod *dmods = dev_copy(mods, sizeof mods);
    uint32_t *dgroups = dev_copy(groups, sizeof groups);
    float *dx = dev_copy(x, sizeof x), *dy = dev_copy(y0, sizeof y0);
    float *abuf = dev_copy(NULL, N * MAXR * sizeof(float));
    assert_int_equal(cuda_sgmv(dmods, 1, 0, SLOTS, dgroups, dx, IN, dy, OUT, MAXR, OUT, abuf,
                               NULL),
                     0);
    assert_int_equal(cudaMemcpy(y, dy, sizeof y, cudaMemcpyDeviceToHost), cudaSuccess);
    for (uint32_t t = 0; t < N; t++)
        for (uint32_t o = 0; o < OUT; o++) {
            double want = y0[t * OUT + o];
            int s = slot[t];
            if (s == 0 || s == 2) {
                double d = 0.0;
                for (int r = 0; r < RANK; r++) {
                    double ar = 0.0;
                    for (int i = 0; i < IN; i++)
                        ar += (double)a[s][r * IN + i] * x[t * IN + i];
                    d += (double)b[s][o * RANK + r] * ar;
                }
                want += d * 0.75;
            }
            if (fabs(y[t * OUT + o] - want) > 1e-5 * 8.0)
                fail_msg("token %u (slot %d) output %u: %.9g, want %.9g", t, s, o,
                         (double)y[t * OUT + o], want);
        }
    for (int s = 0; s < SLOTS; s++)
        cudaFree((void *)mods[s].a), cudaFree((void *)mods[s].b);
    cudaFree(dmods), cudaFree(dgroups), cudaFree(dx), cudaFree(dy), cudaFree(abuf);
}

/* Prefill, tiled over queries: three rows of 21, 3 and 20 tokens (runs cut by the rows and
 * by the tiles of 8), GQA 4 heads a group, keys over several chunks; then a window of 11
 * narrower than a tile's spread of keys, and head_dim 256. Each also per token. */
static void test_tiled_prefill(void **state)
{
    (void)state;
    need_device();
    attn_case c = {.n_heads = 8, .n_kv = 2, .hd = 64, .block_size = 16, .n_tok = 44, .rows = true};
    for (uint32_t t = 0; t < 44; t++) {
        c.row[t] = t < 21 ? 0 : t < 24 ? 1 : 2;
        c.pos[t] = t < 21 ? t : t < 24 ? 70 + t : 30 + t;
    }
    check_case(&c, TILED);
    check_case(&c, 1);
    c.window = 11;
    c.hd = 80;
    c.n_kv = 8;
    check_case(&c, TILED);
    attn_case wide = {.n_heads = 12, .n_kv = 1, .hd = CUDA_ATTN16_MAX_HD, .block_size = 8,
                      .n_tok = 10, .rows = true};
    for (uint32_t t = 0; t < 10; t++)
        wide.pos[t] = 40 + 3 * t; /* one row, positions not adjacent (outputs gathered) */
    check_case(&wide, TILED);
    assert_true(cuda_attn16_tiled(16, 1, 1));
    assert_true(cuda_attn16_tiled(64, 16, 1));
    assert_false(cuda_attn16_tiled(64, 64, 1)); /* decode */
    assert_false(cuda_attn16_tiled(16, 1, 2));
}

/* Step 0b for sample_case's last four rows: (greedy) id 5 biased up past every other, and a
 * bias, a ban and penalties that leave that pick alone; (top-p) an id biased twice, the
 * mask of even ids, bans and every penalty over a history with repeats; (top-k, min-p) a
 * -inf bias on the largest logit's neighbourhood and repetition alone; (nothing left) the
 * mask of id 7 alone with 7 banned. Each q[i] holds the processing alone (its draw is the
 * caller's), its penalties' history the first nh[i] tokens of hist. The mask and history are
 * the caller's to free/keep. */
static void sample_procs(uint32_t V, devio_sample_params *q, uint32_t *nh, uint32_t **mask,
                         int32_t *hist)
{
    static const int32_t bias_ids[] = {5, 9, 11, 9, 2, 3, 4};
    static const float bias[] = {100.0f, -3.0f, 2.5f, 1.5f, -INFINITY, -INFINITY, -INFINITY};
    static const int32_t banned[] = {1, 13, 7};
    uint32_t words = (V + 31) / 32;
    *mask = calloc(2u * words, sizeof **mask);
    for (uint32_t i = 0; i < V; i += 2)
        (*mask)[i >> 5] |= 1u << (i & 31u);
    (*mask)[words + 0] = 1u << 7;
    for (uint32_t k = 0; k < 64; k++)
        hist[k] = (int32_t)((k * k * 7u + 3u) % (V < 200 ? V : 200));
    q[0] = (devio_sample_params){.bias_ids = bias_ids, .bias = bias, .n_bias = 2,
                                 .banned = banned, .n_banned = 1, .repetition_penalty = 1.2f};
    nh[0] = 8;
    q[1] = (devio_sample_params){.bias_ids = bias_ids + 1, .bias = bias + 1, .n_bias = 3,
                                 .allowed = *mask, .allowed_words = words, .banned = banned,
                                 .n_banned = 2, .repetition_penalty = 1.3f,
                                 .presence_penalty = 0.2f, .frequency_penalty = 0.5f};
    nh[1] = 64;
    q[2] = (devio_sample_params){.bias_ids = bias_ids + 4, .bias = bias + 4, .n_bias = 3,
                                 .repetition_penalty = 0.7f};
    nh[2] = 40;
    q[3] = (devio_sample_params){.allowed = *mask + words, .allowed_words = words,
                                 .banned = banned + 2, .n_banned = 1, .repetition_penalty = 1.0f};
    nh[3] = 0;
}

/* The sampler kernel against device/sample/sampler.c on the same rows of V logits: every token and
 * logprob bit for bit, for greedy (ties among the largest included), a temperature below
 * DEVIO_GREEDY_BELOW, temperatures with and without min_p and top_k (1, 5 among tied largest
 * values, V - 1, V: off), seeds and positions past 32 bits, a row with NaN and +-inf and a row
 * with nothing to sample (token -1 where the host refuses); top_p alone, with top_k, with
 * min_p, among tied largest values, and wide enough (0.999 at temperature 4) that the nucleus
 * takes several batches of the kernel's walk; and step 0b (sample_procs) on the last rows. */
static void sample_case(uint32_t V)
{
    enum { ROWS = 22, PROC0 = 18 };
    static const struct {
        float t, min_p;
        uint64_t seed, pos;
        int32_t k;
        float top_p;
    } P[ROWS] = {
        {0.0f, 0.0f, 1, 5, 0, 1},        {0.0f, 0.0f, 1, 5, 0, 1},       {5e-6f, 0.0f, 9, 7, 0, 1},
        {0.7f, 0.0f, 42, 3, 0, 1},       {1.0f, 0.05f, 7, 100, 0, 1},    {2.5f, 0.3f, 1ull << 40, 1ull << 33, 0, 1},
        {1.3f, 0.0f, 0xdeadbeefcafe, 12, 0, 1}, {1.0f, 0.0f, 3, 4, 0, 1}, {1.0f, 0.0f, 5, 9, 1, 1},
        {0.8f, 0.2f, 6, 10, 5, 1},       {1.1f, 0.0f, 8, 11, -1, 1},     {0.9f, 0.0f, 2, 13, -2, 1},
        {1.0f, 0.0f, 11, 14, 0, 0.9f},   {0.8f, 0.0f, 12, 15, 40, 0.5f}, {1.2f, 0.1f, 13, 16, 0, 0.95f},
        {1.0f, 0.0f, 14, 17, 0, 0.3f},   {4.0f, 0.0f, 15, 18, 0, 0.999f}, {1.0f, 0.0f, 16, 19, -1, 1e-6f},
        {0.0f, 0.0f, 1, 20, 0, 1},       {1.0f, 0.0f, 17, 21, 0, 0.9f},  {0.8f, 0.1f, 18, 22, 5, 1},
        {1.0f, 0.0f, 19, 23, 0, 1},
    };
    devio_sample_params q[ROWS - PROC0];
    uint32_t nh[ROWS - PROC0];
    uint32_t *mask = NULL;
    int32_t hist[64];
    sample_procs(V, q, nh, &mask, hist);
    uint64_t seed = 99u + V;
    float *l = malloc((size_t)ROWS * V * sizeof *l);
    for (uint32_t r = 0; r < ROWS; r++)
        for (uint32_t i = 0; i < V; i++)
            l[(size_t)r * V + i] = uniform(&seed) * 8.0f;
    for (uint32_t i = 3; i < V; i += 97) /* rows 1, 9 and 15: the largest value at many ids */
        l[V + i] = l[9 * (size_t)V + i] = l[15 * (size_t)V + i] = 9.5f;
    l[6 * V + 2] = NAN, l[6 * V + 5] = INFINITY, l[6 * V + 11] = -INFINITY;
    for (uint32_t i = 0; i < V; i++) /* row 7: nothing to sample */
        l[7 * (size_t)V + i] = i % 2 ? NAN : -INFINITY;
    cuda_sample_job jobs[ROWS];
    int32_t top_k[ROWS];
    for (uint32_t r = 0; r < ROWS; r++) {
        /* -1: V - 1; -2: V (off) */
        top_k[r] = P[r].k == -1 ? (int32_t)V - 1 : P[r].k == -2 ? (int32_t)V : P[r].k;
        jobs[r] = (cuda_sample_job){.row = r, .temperature = P[r].t < DEVIO_GREEDY_BELOW ? 0 : P[r].t,
                                    .top_p = P[r].top_p, .min_p = P[r].min_p,
                                    .top_k = (uint32_t)top_k[r] < V ? (uint32_t)top_k[r] : 0,
                                    .seed = P[r].seed, .position = P[r].pos};
    }
    size_t words = 0;
    for (uint32_t r = PROC0; r < ROWS; r++)
        words += cuda_proc_words(&q[r - PROC0], nh[r - PROC0], V);
    uint32_t *args = malloc(words * sizeof *args);
    words = 0;
    for (uint32_t r = PROC0; r < ROWS; r++) {
        uint32_t k = r - PROC0;
        cuda_proc_record(&q[k], nh[k] ? hist : NULL, nh[k], V, args + words);
        jobs[r].proc = (uint32_t)words + 1u;
        words += cuda_proc_words(&q[k], nh[k], V);
    }
    uint32_t *dargs = dev_copy(args, words * sizeof *args);
    float *dl = dev_copy(l, (size_t)ROWS * V * 4), *scratch = dev_copy(NULL, (size_t)ROWS * 2 * V * 4);
    cuda_sample_job *dj = dev_copy(jobs, sizeof jobs);
    cuda_sample_out got[ROWS], *dout = dev_copy(NULL, sizeof got);
    assert_int_equal(cuda_sample(dl, V, dj, ROWS, dargs, scratch, dout, NULL), 0);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    assert_int_equal(cudaMemcpy(got, dout, sizeof got, cudaMemcpyDeviceToHost), cudaSuccess);
    devio_sampler *smp = NULL;
    assert_int_equal(devio_sampler_create(V, &smp), DEVIO_OK);
    for (uint32_t r = 0; r < ROWS; r++) {
        /* the row's processing (none before PROC0) with P's draw */
        devio_sample_params p = r >= PROC0 ? q[r - PROC0] : (devio_sample_params){0};
        p.temperature = P[r].t, p.top_k = top_k[r], p.top_p = P[r].top_p;
        p.min_p = P[r].min_p, p.seed = P[r].seed;
        uint32_t n_hist = r >= PROC0 ? nh[r - PROC0] : 0;
        int32_t tok = -1;
        float lp = 0.0f;
        devio_status st = devio_sampler_run_ex(smp, l + (size_t)r * V, &p, n_hist ? hist : NULL,
                                               n_hist, P[r].pos, &tok, &lp, NULL);
        if (st != DEVIO_OK) {
            assert_int_equal(got[r].token, -1);
            continue;
        }
        if (got[r].token != tok || memcmp(&got[r].logprob, &lp, 4) != 0)
            fail_msg("vocab %u row %u: token %d logprob %.9g, the host's %d %.9g", V, r,
                     got[r].token, (double)got[r].logprob, tok, (double)lp);
    }
    assert_int_equal(got[1].token, 3); /* the lowest of the tied ids */
    assert_int_equal(got[PROC0].token, 5); /* lifted by its bias */
    assert_int_equal(got[ROWS - 1].token, -1);
    devio_sampler_free(smp);
    free(l), free(args), free(mask);
    cudaFree(dl), cudaFree(scratch), cudaFree(dj), cudaFree(dout), cudaFree(dargs);
}

static void test_sample(void **state)
{
    (void)state;
    need_device();
    sample_case(1000);
    sample_case(49157);
}

/* Quantized weights widened for the GEMM: every element of random blocks of each type is
 * devio_quant_elem's value rounded to f16 (saturating at +-65504), bit for bit. */
static void test_dequant16(void **state)
{
    (void)state;
    need_device();
    const uint32_t *ggml = GGML_OF;
    uint64_t seed = 5;
    for (int dt = CUDA_Q8_0; dt <= CUDA_Q6_K; dt++) {
        uint32_t g = ggml[dt - CUDA_Q8_0], blk = devio_quant_block(g);
        uint32_t bytes = devio_quant_block_bytes(g);
        uint32_t nb = 6, n = nb * blk;
        uint8_t *w = malloc((size_t)nb * bytes);
        for (uint32_t i = 0; i < nb * bytes; i++)
            w[i] = (uint8_t)(uniform(&seed) * 127.0f + 128.0f);
        uint16_t *got = malloc(n * sizeof *got), *dw = dev_copy(w, (size_t)nb * bytes);
        uint16_t *dd = dev_copy(NULL, n * sizeof *got);
        assert_int_equal(cuda_dequant16(dt, dw, n, dd, NULL), 0);
        assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
        assert_int_equal(cudaMemcpy(got, dd, n * sizeof *got, cudaMemcpyDeviceToHost), cudaSuccess);
        for (uint32_t i = 0; i < n; i++) {
            float v = devio_quant_elem(g, w + (i / blk) * bytes, i % blk);
            v = v > 65504.0f ? 65504.0f : v < -65504.0f ? -65504.0f : v;
            if (got[i] != devio_f32_to_f16_rne(v))
                fail_msg("type %u element %u: f16 %04x, want %04x (%.9g)", g, i, got[i],
                         devio_f32_to_f16_rne(v), (double)v);
        }
        free(w), free(got);
        cudaFree(dw), cudaFree(dd);
    }
}

/* The norm that lays down the GEMM's 16-bit input: its f32 rows are cuda_rmsnorm's, bit for
 * bit, and its 16-bit rows those rounded, in f16 and in bf16. */
static void test_rmsnorm16(void **state)
{
    (void)state;
    need_device();
    enum { D = 300, T = 3 };
    uint64_t seed = 17;
    float x[T * D], w[D], want[T * D], got[T * D];
    for (uint32_t i = 0; i < T * D; i++)
        x[i] = uniform(&seed) * 3.0f;
    for (uint32_t i = 0; i < D; i++)
        w[i] = uniform(&seed);
    assert_int_equal(cuda_rmsnorm_prepare(D), 0);
    float *dx = dev_copy(x, sizeof x), *dw = dev_copy(w, sizeof w);
    float *dy = dev_copy(NULL, sizeof x), *dz = dev_copy(NULL, sizeof x);
    uint16_t h[T * D], *dh = dev_copy(NULL, sizeof h);
    assert_int_equal(cuda_rmsnorm(dx, dw, dy, D, 1e-5f, T, NULL), 0);
    for (int dt = CUDA_F16; dt <= CUDA_BF16; dt++) {
        assert_int_equal(cuda_rmsnorm16(dx, dw, dz, dh, dt, D, 1e-5f, T, NULL), 0);
        assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
        assert_int_equal(cudaMemcpy(want, dy, sizeof want, cudaMemcpyDeviceToHost), cudaSuccess);
        assert_int_equal(cudaMemcpy(got, dz, sizeof got, cudaMemcpyDeviceToHost), cudaSuccess);
        assert_int_equal(cudaMemcpy(h, dh, sizeof h, cudaMemcpyDeviceToHost), cudaSuccess);
        assert_memory_equal(got, want, sizeof got);
        for (uint32_t i = 0; i < T * D; i++)
            assert_int_equal(h[i], dt == CUDA_F16 ? devio_f32_to_f16_rne(want[i])
                                                  : devio_f32_to_bf16_rne(want[i]));
    }
    cudaFree(dx), cudaFree(dw), cudaFree(dy), cudaFree(dz), cudaFree(dh);
}

static void test_split_counts(void **state)
{
    (void)state;
    assert_int_equal(cuda_attn16_splits(0, 100), 1);
    assert_int_equal(cuda_attn16_splits(1, 1), 1);
    assert_int_equal(cuda_attn16_splits(1, 64), 1);
    assert_int_equal(cuda_attn16_splits(1, 65), 2);
    assert_int_equal(cuda_attn16_splits(1, 100000), 32);
    assert_int_equal(cuda_attn16_splits(8, 100000), 8);
    assert_int_equal(cuda_attn16_splits(32, 100000), 2);
    assert_int_equal(cuda_attn16_splits(33, 100000), 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_counts),     cmocka_unit_test(test_gqa_splits),
        cmocka_unit_test(test_wide_group),       cmocka_unit_test(test_window_odd_pairs),
        cmocka_unit_test(test_head_dim_256),     cmocka_unit_test(test_gemv),
        cmocka_unit_test(test_sgmv),            cmocka_unit_test(test_tiled_prefill),
        cmocka_unit_test(test_sample),          cmocka_unit_test(test_dequant16),
        cmocka_unit_test(test_rmsnorm16),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
