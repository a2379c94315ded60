/* cpu_attention_test.c - the cpu backend's attention (cpu/cpu_attention.c) on one
 * instruction-set path, over a binary16 KV cache (REF_KV_F16): shapes whose head dimension is
 * not a whole number of vectors, query groups wider than a tile, sliding windows, blocks that do
 * not divide the key blocks, two sequences in one batch. Every output within 1e-5 of attention
 * computed in float64 from the same cache, and every token's output the same bits whether it
 * runs in the whole batch on two threads, in chunks of 7, or alone on one thread. The copts
 * name the path. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "device/numerics/numerics.h"
#include "ref/pool.h"
#include "ref/ref_kernels.h"
#include "tests/cpu_path_test.h"

static uint32_t rng = 777u;
static float uniform(void) /* [-1, 1) */
{
    rng = rng * 1664525u + 1013904223u;
    return (float)(rng >> 8) / 8388608.0f - 1.0f;
}

typedef struct shape {
    uint32_t heads, kv_heads, hd, bs, window;
} shape;

enum { SEQS = 2, MAX_POS = 80, BLOCKS = 64 };
static const uint32_t seq_len[SEQS] = {70, 37};

/* Attention of token (s, pos), head h, in float64 from the cache's values. */
static void exact(const shape *sh, const ref_attention *a, const float *q, const uint32_t *blocks,
                  uint32_t pos, uint32_t h, double *out)
{
    uint32_t hd = sh->hd, g = h / (sh->heads / sh->kv_heads);
    uint32_t j0 = sh->window && pos + 1 > sh->window ? pos + 1 - sh->window : 0;
    double w[MAX_POS], m = -INFINITY, z = 0;
    for (uint32_t j = j0; j <= pos; j++) {
        size_t row = (((size_t)blocks[j / sh->bs] * sh->kv_heads + g) * sh->bs + j % sh->bs) * hd;
        double s = 0;
        for (uint32_t d = 0; d < hd; d++)
            s += (double)q[d] * devio_f16_to_f32(a->k_cache[row + d]);
        w[j] = s * a->scale;
        m = w[j] > m ? w[j] : m;
    }
    for (uint32_t d = 0; d < hd; d++)
        out[d] = 0;
    for (uint32_t j = j0; j <= pos; j++) {
        size_t row = (((size_t)blocks[j / sh->bs] * sh->kv_heads + g) * sh->bs + j % sh->bs) * hd;
        double e = exp(w[j] - m);
        z += e;
        for (uint32_t d = 0; d < hd; d++)
            out[d] += e * devio_f16_to_f32(a->v_cache[row + d]);
    }
    for (uint32_t d = 0; d < hd; d++)
        out[d] /= z;
}

/* Tokens [t0, t0 + n) of the batch through attention on pool, into out (the batch's rows). */
static void run_part(devio_pool *pool, ref_scratch *s, const ref_attention *all, uint32_t t0,
                     uint32_t n, float *out)
{
    ref_attention a = *all;
    a.q = all->q + (size_t)t0 * all->ldq;
    a.tok_pos = all->tok_pos + t0;
    a.tok_blocks = all->tok_blocks + t0;
    a.n_tok = n;
    a.out = out + (size_t)t0 * all->ldo;
    ref_attention_run(pool, s, &a);
}

static void check_shape(const shape *sh)
{
    uint32_t hd = sh->hd, qd = sh->heads * hd, kvd = sh->kv_heads * hd;
    uint32_t n_tok = seq_len[0] + seq_len[1];
    size_t cache = (size_t)BLOCKS * sh->bs * kvd;
    uint16_t *kc = malloc(cache * 2), *vc = malloc(cache * 2);
    for (size_t i = 0; i < cache; i++) {
        kc[i] = devio_f32_to_f16_rne(uniform() * 2.0f);
        vc[i] = devio_f32_to_f16_rne(uniform());
    }
    /* Each sequence's blocks: every other block of the pool, one sequence odd, one even,
     * walked backwards. */
    uint32_t tables[SEQS][BLOCKS / 2];
    for (uint32_t s = 0; s < SEQS; s++)
        for (uint32_t b = 0; b < BLOCKS / 2; b++)
            tables[s][b] = BLOCKS - 1 - (2 * b + s);
    assert_true((MAX_POS + sh->bs - 1) / sh->bs <= BLOCKS / 2);

    float *q = malloc((size_t)n_tok * qd * sizeof(float));
    for (size_t i = 0; i < (size_t)n_tok * qd; i++)
        q[i] = uniform();
    uint32_t pos[70 + 37];
    const uint32_t *blocks[70 + 37];
    for (uint32_t t = 0; t < n_tok; t++) {
        uint32_t s = t < seq_len[0] ? 0 : 1;
        pos[t] = s == 0 ? t : t - seq_len[0];
        blocks[t] = tables[s];
    }
    ref_attention a = {.q = q, .ldq = qd, .k_cache = kc, .v_cache = vc, .block_size = sh->bs,
                       .n_heads = sh->heads, .n_kv_heads = sh->kv_heads, .head_dim = hd,
                       .n_tok = n_tok, .tok_pos = pos, .tok_blocks = blocks,
                       .scale = 1.0f / sqrtf((float)hd), .window = sh->window, .ldo = qd};

    devio_pool *p2 = devio_pool_create(2), *p1 = devio_pool_create(1);
    uint32_t nth = devio_pool_threads(p2);
    ref_scratch s[2];
    for (uint32_t i = 0; i < nth; i++)
        assert_int_equal(ref_scratch_init(&s[i], MAX_POS, hd, 8), 0);
    size_t out_n = (size_t)n_tok * qd;
    float *whole = malloc(out_n * sizeof(float)), *chunks = malloc(out_n * sizeof(float));
    float *alone = malloc(out_n * sizeof(float));
    run_part(p2, s, &a, 0, n_tok, whole);
    for (uint32_t t = 0; t < n_tok; t += 7)
        run_part(p2, s, &a, t, n_tok - t < 7 ? n_tok - t : 7, chunks);
    for (uint32_t t = 0; t < n_tok; t++)
        run_part(p1, s, &a, t, 1, alone);
    assert_memory_equal(whole, chunks, out_n * sizeof(float));
    assert_memory_equal(whole, alone, out_n * sizeof(float));

    double worst = 0, want[256];
    for (uint32_t t = 0; t < n_tok; t++)
        for (uint32_t h = 0; h < sh->heads; h++) {
            exact(sh, &a, q + (size_t)t * qd + (size_t)h * hd, blocks[t], pos[t], h, want);
            double e = 0, n = 0;
            for (uint32_t d = 0; d < hd; d++) {
                double got = whole[(size_t)t * qd + (size_t)h * hd + d];
                e += (got - want[d]) * (got - want[d]);
                n += want[d] * want[d];
            }
            double rel = sqrt(e / n);
            if (!(rel < 1e-5)) /* a NaN too */
                fail_msg("token %u head %u: relative error %g", t, h, rel);
            worst = rel > worst ? rel : worst;
        }
    print_message("%u heads / %u, hd %u, blocks of %u, window %u: worst relative error %.2e\n",
                  sh->heads, sh->kv_heads, hd, sh->bs, sh->window, worst);
    assert_true(worst < 1e-5);

    for (uint32_t i = 0; i < nth; i++)
        ref_scratch_fini(&s[i]);
    devio_pool_free(p1);
    devio_pool_free(p2);
    free(whole);
    free(chunks);
    free(alone);
    free(q);
    free(kc);
    free(vc);
}

static void test_attention_within_tolerance_and_batch_independent(void **state)
{
    (void)state;
    if (!runs())
        return;
    static const shape shapes[] = {
        {9, 3, 64, 16, 0},  /* SmolLM2-135M: groups of 3 */
        {20, 1, 12, 5, 0},  /* a group wider than a tile; 12 dimensions; blocks of 5 */
        {4, 4, 40, 7, 9},   /* no grouping; a sliding window of 9 */
        {8, 2, 20, 32, 33}, /* a window just past a key block */
    };
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
        check_shape(&shapes[i]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attention_within_tolerance_and_batch_independent),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
