/* cuda_plan_test.c - the CUDA backend's memory plan (kernels/cuda_plan.h): every region's
 * size worked out by hand for a small shape, how many KV blocks fit a budget, the reserve
 * kept free, and sizes that overflow. Plain arithmetic: runs on any machine. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "kernels/cuda_plan.h"

static const devio_model_shape shape = {
    .n_layers = 2, .d = 64, .n_heads = 4, .n_kv_heads = 2, .head_dim = 16,
    .q_dim = 64, .kv_dim = 32, .f = 128, .vocab = 256,
};

static devio_backend_config small_cfg(void)
{
    return (devio_backend_config){
        .kv_blocks = 10, .block_size = 4, .max_batch_tokens = 16, .max_rows = 4,
        .max_seq_len = 32, .max_depth = 2, .adapter_slots = 2, .max_lora_rank = 8,
        .logits_slots = 100, .shape = &shape,
    };
}

static void test_regions(void **state)
{
    (void)state;
    devio_backend_config cfg = small_cfg();
    cuda_plan p;
    assert_true(cuda_plan_make(&cfg, 1000, &p));
    assert_int_equal(p.max_blocks_per_seq, 8);
    assert_int_equal(p.weights, 1000);
    /* norms 2 * (64 + 64) + biases 2 * (64 + 32 + 32) + final 64, RoPE 2 * 32 * 8 floats */
    assert_int_equal(p.small, (576 + 512) * 4);
    /* 4 tokens * 32 floats * 4 bytes * K and V * 2 layers */
    assert_int_equal(p.kv_block, 2048);
    assert_int_equal(p.kv, 10 * 2048);
    /* per token: 4 * d + 3 * q_dim + 2 * kv_dim + 3 * f + rank floats */
    assert_int_equal(p.activations, 904 * 4 * 16);
    /* min(max_batch_tokens, logits_slots) rows of vocab floats */
    assert_int_equal(p.logits_rows, 16);
    assert_int_equal(p.logits, 16 * 256 * 4);
    /* per layer rank * (in + out) over the seven targets: 1024 * 8 floats */
    assert_int_equal(p.lora_slot, 1024 * 8 * 2 * 4);
    assert_int_equal(p.lora, 2 * p.lora_slot);
    /* 8 words per token and a block table per row */
    assert_int_equal(p.meta_words, 8 * 16 + 4 * 8);
    assert_int_equal(p.meta, 4 * p.meta_words);
    assert_int_equal(p.total, 1000 + 4352 + 20480 + 57856 + 16384 + 131072 + 640);

    cfg.logits_slots = 5;
    assert_true(cuda_plan_make(&cfg, 1000, &p));
    assert_int_equal(p.logits_rows, 5);
}

static void test_kv_fit(void **state)
{
    (void)state;
    devio_backend_config cfg = small_cfg();
    cuda_plan p;
    assert_true(cuda_plan_make(&cfg, 1000, &p));
    uint64_t rest = p.total - p.kv;
    assert_int_equal(cuda_plan_kv_fit(&p, p.total), 10);
    assert_int_equal(cuda_plan_kv_fit(&p, rest + 2047), 0);
    assert_int_equal(cuda_plan_kv_fit(&p, rest + 2048), 1);
    assert_int_equal(cuda_plan_kv_fit(&p, rest), 0);
    assert_int_equal(cuda_plan_kv_fit(&p, 100), 0);
    /* The fit ignores the blocks the plan was made with. */
    cfg.kv_blocks = 1;
    cuda_plan q;
    assert_true(cuda_plan_make(&cfg, 1000, &q));
    assert_int_equal(cuda_plan_kv_fit(&q, p.total), 10);
}

static void test_budget(void **state)
{
    (void)state;
    uint64_t gib = 1ull << 30;
    uint64_t reserve = CUDA_PLAN_RESERVE_BYTES + 10 * gib / 1000 * CUDA_PLAN_RESERVE_PER_MILLE;
    assert_true(cuda_plan_budget(10 * gib, 10 * gib) == 10 * gib - reserve);
    assert_true(cuda_plan_budget(4 * gib, 10 * gib) == 4 * gib - reserve);
    assert_true(cuda_plan_budget(100u << 20, 10 * gib) == 0);
    /* An H200: 141 GiB, of which about 2.8 GiB and 512 MiB stay free. */
    uint64_t h200 = 141 * gib;
    uint64_t b = cuda_plan_budget(h200, h200);
    assert_true(b < h200 - (3ull << 30) && b > h200 - (4ull << 30));
}

static void test_overflow(void **state)
{
    (void)state;
    devio_model_shape big = shape;
    big.f = UINT32_MAX;
    devio_backend_config cfg = small_cfg();
    cfg.shape = &big;
    cfg.max_batch_tokens = UINT32_MAX;
    cuda_plan p;
    assert_false(cuda_plan_make(&cfg, 0, &p));
    cfg = small_cfg();
    cfg.kv_blocks = UINT32_MAX;
    big = shape;
    big.kv_dim = UINT32_MAX;
    big.n_layers = UINT32_MAX;
    cfg.shape = &big;
    assert_false(cuda_plan_make(&cfg, 0, &p));
    /* Each product on its own: the norms, a KV block, the adapter slots. */
    big = shape;
    big.n_layers = UINT32_MAX;
    big.kv_dim = UINT32_MAX;
    cfg = small_cfg();
    cfg.kv_blocks = 0;
    cfg.shape = &big;
    assert_false(cuda_plan_make(&cfg, 0, &p));
    big = shape;
    big.kv_dim = UINT32_MAX;
    cfg = small_cfg();
    cfg.block_size = UINT32_MAX;
    cfg.shape = &big;
    assert_false(cuda_plan_make(&cfg, 0, &p));
    big = shape;
    big.n_layers = UINT32_MAX;
    big.f = UINT32_MAX;
    cfg = small_cfg();
    cfg.kv_blocks = 0;
    cfg.max_lora_rank = UINT32_MAX;
    cfg.shape = &big;
    assert_false(cuda_plan_make(&cfg, 0, &p));
    cfg = small_cfg();
    assert_false(cuda_plan_make(&cfg, UINT64_MAX - 10, &p));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_regions),
        cmocka_unit_test(test_kv_fit),
        cmocka_unit_test(test_budget),
        cmocka_unit_test(test_overflow),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
