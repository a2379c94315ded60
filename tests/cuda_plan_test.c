/* cuda_plan_test.c - the CUDA backend's memory plan (kernels/cuda_plan.h): every region's
 * size worked out by hand for a small shape and for hybrid ones (Bamba's attention and mixer
 * layers, Mamba2's mixers only), how many KV blocks fit a budget, the reserve kept free, the
 * LoRA targets it sizes, Qwen3's q_norm and k_norm (and no room for the sliding window or
 * Granite's multipliers), and sizes that overflow. Plain arithmetic: runs on any machine. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "device/adapter/adapter.h"
#include "kernels/cuda_plan.h"

static const devio_model_shape shape = {
    .n_layers = 2, .d = 64, .n_heads = 4, .n_kv_heads = 2, .head_dim = 16,
    .q_dim = 64, .kv_dim = 32, .f = 128, .vocab = 256, .rotary_dim = 16,
};

/* Bamba-like: layers 0 and 2 mixers, layer 1 attention (RoPE on half a head);
 * H 4 heads of P 16, G 2 groups of N 16, K 4: I 64, conv_dim 64 + 2*2*16 = 128,
 * in_dim 64 + 128 + 4 = 196, a slot 2 * (128 * 3 + 64 * 16) = 2816 floats. */
static const devio_model_shape hybrid = {
    .n_layers = 3, .d = 64, .n_heads = 4, .n_kv_heads = 2, .head_dim = 16,
    .q_dim = 64, .kv_dim = 32, .f = 128, .vocab = 256, .rotary_dim = 8,
    .n_attn = 1, .n_mixers = 2, .has_mlp = true,
    .ssm_heads = 4, .ssm_head_dim = 16, .ssm_groups = 2, .ssm_state = 16, .ssm_conv = 4,
    .ssm_inner = 64, .conv_dim = 128, .in_dim = 196, .slot_floats = 2816,
};

static devio_backend_config small_cfg(void)
{
    return (devio_backend_config){
        .kv_blocks = 10, .block_size = 4, .max_batch_tokens = 16, .max_rows = 4,
        .max_seq_len = 32, .max_depth = 2, .adapter_slots = 2, .max_lora_rank = 8,
        .logits_rows = 100, .shape = &shape,
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
    /* min(max_batch_tokens, logits_rows) rows of vocab floats */
    assert_int_equal(p.logits_rows, 16);
    assert_int_equal(p.logits, 16 * 256 * 4);
    /* per layer rank * (in + out) over the seven targets: 1024 * 8 floats */
    assert_int_equal(p.lora_slot, 1024 * 8 * 2 * 4);
    assert_int_equal(p.lora, 2 * p.lora_slot);
    /* 8 words per token and a block table per row */
    assert_int_equal(p.meta_words, 8 * 16 + 4 * 8);
    assert_int_equal(p.meta, 4 * p.meta_words);
    assert_int_equal(p.total, 1000 + 4352 + 20480 + 57856 + 16384 + 131072 + 640);

    cfg.logits_rows = 5;
    assert_true(cuda_plan_make(&cfg, 1000, &p));
    assert_int_equal(p.logits_rows, 5);
}

/* Fast numerics: K and V in f16, half the bytes a block, so the same budget
 * holds about twice the blocks; the fast path's own buffers counted. */
static void test_fast_regions(void **state)
{
    (void)state;
    devio_backend_config cfg = small_cfg();
    cuda_plan strict, fast;
    assert_true(cuda_plan_make(&cfg, 1000, &strict));
    cfg.numerics = DEVIO_NUMERICS_FAST;
    assert_true(cuda_plan_make(&cfg, 1000, &fast));
    assert_int_equal(cuda_plan_kv_elem(&cfg), 2);
    assert_int_equal(strict.fast, 0);
    assert_int_equal(fast.kv_block, 1024);
    assert_int_equal(fast.kv, 10 * 1024);
    /* GEMM inputs: 16 tokens of the widest input (f = 128) in 16 bits */
    assert_int_equal(fast.fast_buf.x16, 16 * 128 * 2);
    assert_int_equal(fast.fast_buf.qkv, 16 * (64 + 2 * 32) * 4);
    assert_int_equal(fast.fast_buf.gu, 16 * 2 * 128 * 4);
    assert_int_equal(fast.fast_buf.bqkv, 0); /* no biases */
    /* attention's ranges: 64 token-ranges of every head, hd + 2 floats each */
    assert_int_equal(fast.fast_buf.part, 64 * 4 * 18 * 4);
    /* sampling: per staging row a job (40 bytes), a result (8) and two vocabs of scratch */
    assert_int_equal(fast.fast_buf.sample, 16 * (40 + 8 + 2 * 256 * 4));
    /* the logits of every slot the core names, kept on the device */
    assert_int_equal(fast.fast_buf.logits, 100 * 256 * 4);
    assert_int_equal(fast.fast, 4096 + 8192 + 16384 + 18432 + 16 * (40 + 8 + 2 * 256 * 4) +
                                    100 * 256 * 4);
    /* the SGMV groups of all tokens and of the outputs: slots + 1 offsets and a list each */
    assert_int_equal(fast.meta_words, strict.meta_words + 2 * (2 + 1) + 2 * 16);
    assert_int_equal(fast.total,
                     strict.total - 10 * 1024 + fast.fast + 4 * (fast.meta_words - strict.meta_words));
    uint64_t budget = strict.total - strict.kv + 10000ull * 2048;
    assert_int_equal(cuda_plan_kv_fit(&strict, budget), 10000);
    /* the rest of the fast plan is larger by its buffers and the groups' words */
    uint64_t more = (fast.total - fast.kv) - (strict.total - strict.kv);
    assert_int_equal(more, fast.fast + 4 * (fast.meta_words - strict.meta_words));
    assert_int_equal(cuda_plan_kv_fit(&fast, budget), (10000 * 2048 - more) / 1024);
}

/* Qwen3's q_norm and k_norm take head_dim floats each per layer, widened;
 * the sliding window and Granite's multipliers take no memory (the window
 * changes the attention kernel's shared memory, which is no plan region). */
static void test_model_features(void **state)
{
    (void)state;
    devio_model_shape s = shape;
    s.qk_norm = true;
    devio_backend_config cfg = small_cfg();
    cfg.shape = &s;
    cuda_plan p, base;
    assert_true(cuda_plan_make(&cfg, 1000, &p));
    cfg.shape = &shape;
    assert_true(cuda_plan_make(&cfg, 1000, &base));
    /* 2 layers * (16 + 16) floats */
    assert_int_equal(p.small, base.small + 2 * 32 * 4);
    assert_int_equal(p.total, base.total + 2 * 32 * 4);

    s = shape;
    s.window = 8;
    s.emb_mult = 12.0f;
    s.res_mult = 0.22f;
    s.logit_scale = 8.0f;
    s.attn_scale = 0.0078125f;
    cfg.shape = &s;
    assert_true(cuda_plan_make(&cfg, 1000, &p));
    assert_int_equal(p.small, base.small);
    assert_int_equal(p.kv, base.kv);
    assert_int_equal(p.activations, base.activations);
    assert_int_equal(p.total, base.total);
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

static void test_hybrid_regions(void **state)
{
    (void)state;
    devio_backend_config cfg = small_cfg();
    cfg.shape = &hybrid;
    cfg.ssm_slots = 3;
    cfg.ssm_snapshots = 5;
    cuda_plan p;
    assert_true(cuda_plan_make(&cfg, 1000, &p));
    /* norms and biases 3 * 256 + final 64, RoPE 2 * 32 * 4, and per mixer the conv
     * 128 * 4 + its bias 128 + in_bias 196 + dt_bias, A_log, D 3 * 4 + norm 64 + out_bias 64 */
    assert_int_equal(p.small, (832 + 256 + 2 * 976) * 4);
    /* KV only for the one attention layer: 4 tokens * 32 floats * 4 bytes * K and V */
    assert_int_equal(p.kv_block, 1024);
    assert_int_equal(p.kv, 10 * 1024);
    /* 3 slots + 5 snapshots of 2816 floats */
    assert_int_equal(p.ssm_slot, 2816 * 4);
    assert_int_equal(p.ssm, 8 * 2816 * 4);
    /* per token: the Llama 904 + in_dim 196 + conv_dim 128 + 2 * I 128 floats */
    assert_int_equal(p.activations, (904 + 452) * 4 * 16);
    /* LoRA per layer: q 64+64, k and v 64+32, o 64+64, gate and up 64+128, down 128+64,
     * in_proj 64+196, out_proj 64+64 */
    assert_int_equal(p.lora_slot, 1412 * 8 * 3 * 4);
    /* 8 words per token, block tables, and per row a cuda_ssm_row and one snapshot
     * beyond one per token */
    assert_int_equal(p.meta_words, 8 * 16 + 4 * 8 + 4 * (6 + 1) + 16);
    assert_int_equal(p.total, 1000 + p.small + p.kv + p.ssm + p.activations + p.logits + p.lora +
                                  p.meta);
    /* The state counts against the KV blocks that fit. */
    assert_int_equal(cuda_plan_kv_fit(&p, p.total), 10);
    assert_int_equal(cuda_plan_kv_fit(&p, p.total - p.kv + 1023), 0);
    cfg.ssm_snapshots = 0;
    cuda_plan q;
    assert_true(cuda_plan_make(&cfg, 1000, &q));
    assert_int_equal(q.ssm, 3 * 2816 * 4);
    assert_int_equal(cuda_plan_kv_fit(&q, p.total), 10 + 5 * 11);
}

/* Mamba2: no attention layer, so a KV block takes nothing and any number fits
 * once the rest does; no RoPE table. */
static void test_mamba2(void **state)
{
    (void)state;
    devio_model_shape m2 = hybrid;
    m2.n_layers = 2;
    m2.n_heads = m2.n_kv_heads = m2.head_dim = m2.q_dim = m2.kv_dim = m2.f = 0;
    m2.rotary_dim = 0;
    m2.n_attn = 0;
    m2.has_mlp = false;
    devio_backend_config cfg = small_cfg();
    cfg.shape = &m2;
    cfg.ssm_slots = 2;
    cfg.ssm_snapshots = 2;
    cuda_plan p;
    assert_true(cuda_plan_make(&cfg, 1000, &p));
    assert_int_equal(p.kv_block, 0);
    assert_int_equal(p.kv, 0);
    assert_int_equal(p.small, (2 * 128 + 64 + 2 * 976) * 4);
    assert_int_equal(p.ssm, 4 * 2816 * 4);
    assert_int_equal(cuda_plan_kv_fit(&p, p.total), UINT32_MAX);
    assert_int_equal(cuda_plan_kv_fit(&p, p.total - 1), 0);
    /* LoRA: no attention and no MLP; in_proj [196, 64] and out_proj [64, 64] per layer */
    assert_int_equal(p.lora_slot, (64 + 196 + 64 + 64) * 8 * 2 * 4);
}

/* The targets the plan sizes and the backend applies; any other is refused. */
static void test_lora_dims(void **state)
{
    (void)state;
    uint32_t in, out;
    assert_true(cuda_plan_lora_dims(&shape, DEVIO_LORA_Q, &in, &out));
    assert_true(in == 64 && out == 64);
    assert_true(cuda_plan_lora_dims(&shape, DEVIO_LORA_V, &in, &out));
    assert_true(in == 64 && out == 32);
    assert_true(cuda_plan_lora_dims(&shape, DEVIO_LORA_DOWN, &in, &out));
    assert_true(in == 128 && out == 64);
    /* A Llama shape has no mixer: in_proj and out_proj take no room. */
    assert_true(cuda_plan_lora_dims(&shape, DEVIO_LORA_IN_PROJ, &in, &out));
    assert_true(in == 0 && out == 0);
    assert_true(cuda_plan_lora_dims(&hybrid, DEVIO_LORA_IN_PROJ, &in, &out));
    assert_true(in == 64 && out == 196);
    assert_true(cuda_plan_lora_dims(&hybrid, DEVIO_LORA_OUT_PROJ, &in, &out));
    assert_true(in == 64 && out == 64);
    assert_false(cuda_plan_lora_dims(&shape, DEVIO_LORA_N_TARGETS, &in, &out));
    assert_true(in == 0 && out == 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_regions),
        cmocka_unit_test(test_fast_regions),
        cmocka_unit_test(test_hybrid_regions),
        cmocka_unit_test(test_mamba2),
        cmocka_unit_test(test_lora_dims),
        cmocka_unit_test(test_model_features),
        cmocka_unit_test(test_kv_fit),
        cmocka_unit_test(test_budget),
        cmocka_unit_test(test_overflow),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
