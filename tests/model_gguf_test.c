/* model_gguf_test.c - a GGUF file as --model: devio-mkmodel's models written as llama.cpp lays
 * them out (names, metadata, ne order, q and k rows interleaved per head) must load as the very
 * model their Hugging Face directory gives, config and every weight byte; each way a GGUF
 * model can be wrong or beyond devio is refused, naming the file and the key or tensor. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/model/model.h"
#include "tests/gguf_fixture.h"
#include "tests/model_fixture.h"

static void same_tensor(const devio_tensor *a, const devio_tensor *b, const char *what,
                        uint32_t li)
{
    if (!a->data) {
        if (b->data)
            fail_msg("%s of layer %u: present in the GGUF model only", what, li);
        return;
    }
    if (!b->data)
        fail_msg("%s of layer %u: missing from the GGUF model", what, li);
    if (a->ndim == 1 && a->dtype != b->dtype) { /* a 16-bit vector, written widened */
        assert_int_equal(b->dtype, DEVIO_F32);
        for (uint64_t i = 0; i < a->shape[0]; i++)
            if (devio_tensor_get(a, i) != devio_tensor_get(b, i))
                fail_msg("%s of layer %u: element %llu differs", what, li,
                         (unsigned long long)i);
        return;
    }
    assert_int_equal(a->dtype, b->dtype);
    assert_int_equal(a->ndim, b->ndim);
    assert_int_equal(a->shape[0], b->shape[0]);
    assert_int_equal(a->shape[1], b->shape[1]);
    size_t n = (size_t)(a->shape[0] * (a->ndim > 1 ? a->shape[1] : 1)) * devio_dtype_size(a->dtype);
    if (memcmp(a->data, b->data, n) != 0)
        fail_msg("%s of layer %u: the bytes differ", what, li);
}

/* The model in fx->dir, written as GGUF and loaded back: the same model. */
static void round_trip(const fixture *fx)
{
    devio_model *hf = load_ok(fx->dir);
    const char *path = path_in(fx->dir, "m.gguf");
    gguf_write_model(hf, NULL, path);
    devio_model *g = load_ok(path);
    const devio_model_config *a = &hf->cfg, *b = &g->cfg;
    assert_string_equal(a->architecture, b->architecture);
    assert_int_equal(a->vocab_size, b->vocab_size);
    assert_int_equal(a->hidden_size, b->hidden_size);
    assert_int_equal(a->intermediate_size, b->intermediate_size);
    assert_int_equal(a->n_layers, b->n_layers);
    assert_int_equal(a->n_heads, b->n_heads);
    assert_int_equal(a->n_kv_heads, b->n_kv_heads);
    assert_int_equal(a->head_dim, b->head_dim);
    assert_int_equal(a->max_position_embeddings, b->max_position_embeddings);
    assert_true(a->rope_theta == b->rope_theta);
    assert_true(a->rms_norm_eps == b->rms_norm_eps);
    assert_int_equal(a->tie_word_embeddings, b->tie_word_embeddings);
    assert_int_equal(a->attention_bias, b->attention_bias);
    assert_int_equal(a->qk_norm, b->qk_norm);
    assert_int_equal(a->rotary_dim, b->rotary_dim);
    const devio_rope_scaling *ra = &a->rope_scaling, *rb = &b->rope_scaling;
    assert_int_equal(ra->type, rb->type);
    assert_true(ra->factor == rb->factor && ra->attention_factor == rb->attention_factor);
    assert_true(ra->original_max_positions == rb->original_max_positions);
    assert_true(ra->beta_fast == rb->beta_fast && ra->beta_slow == rb->beta_slow);
    assert_int_equal(ra->truncate, rb->truncate);
    assert_true(a->embedding_multiplier == b->embedding_multiplier);
    assert_true(a->residual_multiplier == b->residual_multiplier);
    assert_true(a->attention_multiplier == b->attention_multiplier);
    assert_true(a->logits_scaling == b->logits_scaling);
    same_tensor(&hf->embed, &g->embed, "embed", 0);
    same_tensor(&hf->norm, &g->norm, "norm", 0);
    same_tensor(&hf->lm_head, &g->lm_head, "lm_head", 0);
    for (uint32_t i = 0; i < a->n_layers; i++) {
        const devio_layer *x = &hf->layers[i], *y = &g->layers[i];
        const devio_tensor *xs[] = {&x->attn_norm, &x->wq, &x->wk, &x->wv, &x->wo, &x->bq,
                                    &x->bk, &x->bv, &x->q_norm, &x->k_norm, &x->ffn_norm,
                                    &x->w_gate, &x->w_up, &x->w_down};
        const devio_tensor *ys[] = {&y->attn_norm, &y->wq, &y->wk, &y->wv, &y->wo, &y->bq,
                                    &y->bk, &y->bv, &y->q_norm, &y->k_norm, &y->ffn_norm,
                                    &y->w_gate, &y->w_up, &y->w_down};
        static const char *names[] = {"attn_norm", "wq", "wk", "wv", "wo", "bq", "bk",
                                      "bv", "q_norm", "k_norm", "ffn_norm", "w_gate",
                                      "w_up", "w_down"};
        for (size_t k = 0; k < sizeof xs / sizeof *xs; k++)
            same_tensor(xs[k], ys[k], names[k], i);
    }
    /* The weights can be given back, as a server does once a device holds them. */
    devio_model_release_weights(g);
    assert_true(devio_model_weights_released(g));
    devio_model_free(g);
    devio_model_free(hf);
}

static void test_llama_f32(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = tiny_opts(fx->dir);
    write_model(&o);
    round_trip(fx);
}

/* Tied, BF16, grouped-query heads. */
static void test_llama_bf16_tied(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = tiny_opts(fx->dir);
    o.dtype = DEVIO_BF16;
    o.tie_word_embeddings = true;
    write_model(&o);
    round_trip(fx);
}

static void test_qwen2_and_qwen3(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = arch_opts("qwen2", "tiny", fx->dir);
    write_model(&o);
    round_trip(fx);
    o = arch_opts("qwen3", "tiny", fx->dir);
    o.dtype = DEVIO_F16;
    write_model(&o);
    round_trip(fx);
}

/* Granite: its four multipliers from granite.* metadata, q and k interleaved
 * as for llama. */
static void test_granite(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = arch_opts("granite", "tiny", fx->dir);
    write_model(&o);
    devio_model *hf = load_ok(fx->dir);
    assert_true(hf->cfg.embedding_multiplier != 1.0f && hf->cfg.logits_scaling != 1.0f);
    devio_model_free(hf);
    round_trip(fx);
}

/* RoPE scaling from rope.scaling.*: linear and yarn as their config.json
 * forms give them. */
static void test_rope_scaling(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = tiny_opts(fx->dir);
    o.rope_scaling = DEVIO_MKMODEL_ROPE_LINEAR;
    o.rope_factor = 2.0;
    write_model(&o);
    round_trip(fx);
    o.rope_scaling = DEVIO_MKMODEL_ROPE_YARN;
    o.rope_factor = 4.0; /* original_max_position_embeddings: the declared context / 4 */
    write_model(&o);
    devio_model *hf = load_ok(fx->dir);
    assert_int_equal(hf->cfg.rope_scaling.type, DEVIO_ROPE_YARN);
    assert_true(hf->cfg.rope_scaling.attention_factor > 1.0f);
    devio_model_free(hf);
    round_trip(fx);
}

/* ---- refusals ------------------------------------------------------------ */

static void expect_refused(const fixture *fx, const gguf_edits *e, devio_status want,
                           const char *words)
{
    devio_model *hf = load_ok(fx->dir);
    const char *path = path_in(fx->dir, "bad.gguf");
    gguf_write_model(hf, e, path);
    devio_model_free(hf);
    expect_fail(path, want, "bad.gguf", words);
}

static void test_refusals(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = tiny_opts(fx->dir);
    write_model(&o);
    expect_refused(fx, &(gguf_edits){.arch = "gpt2"}, DEVIO_E_MODEL,
                   "architecture 'gpt2' is not one devio computes (llama, qwen2, qwen3, granite)");
    expect_refused(fx, &(gguf_edits){.drop_key = "block_count"}, DEVIO_E_MODEL,
                   "metadata 'llama.block_count' is missing");
    expect_refused(fx, &(gguf_edits){.retype = "blk.1.ffn_up.weight", .type = DEVIO_GGML_Q2_K},
                   DEVIO_E_MODEL, "rows of 64 are not whole Q2_K blocks of 256");
    expect_refused(fx, &(gguf_edits){.retype = "blk.1.ffn_up.weight", .type = DEVIO_GGML_Q8_1},
                   DEVIO_E_UNSUPPORTED,
                   "tensor 'blk.1.ffn_up.weight' is Q8_1; devio computes with F32, F16, BF16, Q8_0");
    expect_refused(fx, &(gguf_edits){.retype = "output_norm.weight", .type = DEVIO_GGML_Q8_0},
                   DEVIO_E_UNSUPPORTED, "tensor 'output_norm.weight' is a vector of Q8_0");
    expect_refused(fx, &(gguf_edits){.reshape = "blk.0.ffn_down.weight"}, DEVIO_E_MODEL,
                   "tensor 'blk.0.ffn_down.weight' has 2 dimensions (64, 128), expected rows "
                   "of 128 x 64");
    expect_refused(fx, &(gguf_edits){.extra_key = "rope.scaling.type", .extra_val = "longrope"},
                   DEVIO_E_UNSUPPORTED, "llama.rope.scaling.type 'longrope' is not supported");
    expect_refused(fx, &(gguf_edits){.extra_key = "rope.scaling.type", .extra_val = "linear"},
                   DEVIO_E_MODEL, "metadata 'llama.rope.scaling.factor' is missing");
    expect_refused(fx, &(gguf_edits){.extra_tensor = "rope_freqs.weight"}, DEVIO_E_UNSUPPORTED,
                   "rope_freqs.weight");
    /* A value the config rules refuse: said as the metadata's. */
    expect_refused(fx, &(gguf_edits){.heads = 3}, DEVIO_E_MODEL,
                   "bad.gguf, its metadata read as config.json: ");
}

/* Every float a model is computed from: finite and in its range, refused
 * naming the GGUF key as model_error (a NaN once failed as out_of_memory). */
static void test_bad_floats(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = tiny_opts(fx->dir);
    write_model(&o);
    static const struct {
        const char *key;
        float v;
        const char *words;
    } cases[] = {
        {"rope.freq_base", NAN, "metadata 'llama.rope.freq_base' = nan must be in [1, 1e+12]"},
        {"rope.freq_base", 0.5f, "metadata 'llama.rope.freq_base' = 0.5 must be in [1, 1e+12]"},
        {"attention.layer_norm_rms_epsilon", INFINITY,
         "metadata 'llama.attention.layer_norm_rms_epsilon' = inf must be in (0, 1]"},
        {"attention.layer_norm_rms_epsilon", -1e-5f,
         "metadata 'llama.attention.layer_norm_rms_epsilon' = -1e-05 must be in (0, 1]"},
        /* A scaling factor without a type: linear, as llama.cpp reads it. */
        {"rope.scaling.factor", NAN, "metadata 'llama.rope.scaling.factor' = nan must be in"},
        {"rope.scale_linear", -INFINITY,
         "metadata 'llama.rope.scale_linear' = -inf must be in [1, 1e+12]"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        expect_refused(fx, &(gguf_edits){.f32_key = cases[i].key, .f32_val = cases[i].v},
                       DEVIO_E_MODEL, cases[i].words);
    /* Granite's four multipliers. */
    o = arch_opts("granite", "tiny", fx->dir);
    write_model(&o);
    static const char *granite[] = {"embedding_scale", "residual_scale", "attention.scale",
                                    "logit_scale"};
    char words[128];
    for (size_t i = 0; i < 4; i++) {
        snprintf(words, sizeof words, "metadata 'granite.%s' = nan must be in ",
                 granite[i]);
        expect_refused(fx, &(gguf_edits){.f32_key = granite[i], .f32_val = NAN}, DEVIO_E_MODEL,
                       words);
    }
    /* Logits divided by a scale this small would overflow. */
    expect_refused(fx, &(gguf_edits){.f32_key = "logit_scale", .f32_val = 1e-9f}, DEVIO_E_MODEL,
                   "metadata 'granite.logit_scale' = 1e-09 must be in [1e-06, 1e+06]");
    /* yarn's factors, and its attention factor before it is compared with 1. */
    o = tiny_opts(fx->dir);
    o.rope_scaling = DEVIO_MKMODEL_ROPE_YARN;
    o.rope_factor = 4.0;
    write_model(&o);
    expect_refused(fx, &(gguf_edits){.f32_key = "rope.scaling.yarn_beta_fast", .f32_val = NAN},
                   DEVIO_E_MODEL, "metadata 'llama.rope.scaling.yarn_beta_fast' = nan");
    expect_refused(fx, &(gguf_edits){.f32_key = "rope.scaling.attn_factor", .f32_val = INFINITY},
                   DEVIO_E_MODEL, "metadata 'llama.rope.scaling.attn_factor' = inf");
}

/* RoPE keys: a factor without a type scales linearly (llama.cpp's default
 * type); a key of ARCH.rope. devio does not read is refused. */
static void test_rope_keys(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = tiny_opts(fx->dir);
    write_model(&o);
    devio_model *hf = load_ok(fx->dir);
    const char *path = path_in(fx->dir, "m.gguf");
    gguf_write_model(hf, &(gguf_edits){.f32_key = "rope.scaling.factor", .f32_val = 2.0f}, path);
    devio_model *g = load_ok(path);
    assert_int_equal(g->cfg.rope_scaling.type, DEVIO_ROPE_LINEAR);
    assert_true(g->cfg.rope_scaling.factor == 2.0f);
    devio_model_free(g);
    gguf_write_model(hf, &(gguf_edits){.f32_key = "rope.scaling.factor", .f32_val = 1.0f}, path);
    g = load_ok(path);
    assert_int_equal(g->cfg.rope_scaling.type, DEVIO_ROPE_DEFAULT);
    devio_model_free(g);
    devio_model_free(hf);
    expect_refused(fx, &(gguf_edits){.f32_key = "rope.scaling.yarn_log_multiplier",
                                     .f32_val = 0.1f},
                   DEVIO_E_UNSUPPORTED, "metadata 'llama.rope.scaling.yarn_log_multiplier' is "
                                        "not one devio reads");
}

/* Token ids and the vocabulary: what the file says must be what its
 * weights hold (a bos of 65537 with 256 tokens was once served). */
static void test_bad_tokens(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = tiny_opts(fx->dir);
    write_model(&o);
    static const struct {
        const char *key;
        uint32_t v;
    } ids[] = {{"tokenizer.ggml.bos_token_id", 65537},
               {"tokenizer.ggml.eos_token_id", 256},
               {"tokenizer.ggml.padding_token_id", UINT32_MAX}};
    char words[160];
    for (size_t i = 0; i < sizeof ids / sizeof *ids; i++) {
        snprintf(words, sizeof words,
                 "metadata '%s' = %u is not a token of the vocabulary (0 to 255)", ids[i].key,
                 ids[i].v);
        expect_refused(fx, &(gguf_edits){.u32_key = ids[i].key, .u32_val = ids[i].v},
                       DEVIO_E_MODEL, words);
    }
    expect_refused(fx, &(gguf_edits){.u32_key = "vocab_size", .u32_val = 300}, DEVIO_E_MODEL,
                   "metadata 'llama.vocab_size' is 300, but tensor 'token_embd.weight' has "
                   "256 rows");
    expect_refused(fx, &(gguf_edits){.n_tokens = 100}, DEVIO_E_MODEL,
                   "metadata 'tokenizer.ggml.tokens' lists 100 tokens, but tensor "
                   "'token_embd.weight' has 256 rows");
    /* In range, and as many tokens as rows: served as said. */
    devio_model *hf = load_ok(fx->dir);
    const char *path = path_in(fx->dir, "m.gguf");
    gguf_write_model(hf, &(gguf_edits){.u32_key = "tokenizer.ggml.bos_token_id", .u32_val = 255,
                                       .n_tokens = 256},
                     path);
    devio_model *g = load_ok(path);
    assert_int_equal(g->text.bos_id, 255);
    devio_model_free(g);
    devio_model_free(hf);
}

/* Every tensor of the file is used or refused: one past block_count, one
 * devio has no place for, a bias in a family without biases. */
static void test_unused_tensors(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = tiny_opts(fx->dir);
    write_model(&o);
    expect_refused(fx, &(gguf_edits){.u32_key = "block_count", .u32_val = 1}, DEVIO_E_MODEL,
                   "tensor 'blk.1.attn_norm.weight' is of layer 1, but 'llama.block_count' is 1");
    expect_refused(fx, &(gguf_edits){.extra_tensor = "blk.0.attn_rot_embd"}, DEVIO_E_MODEL,
                   "tensor 'blk.0.attn_rot_embd' is not one devio computes a llama model with");
    o = arch_opts("qwen2", "tiny", fx->dir);
    write_model(&o);
    expect_refused(fx, &(gguf_edits){.arch = "llama"}, DEVIO_E_MODEL,
                   "tensor 'blk.0.attn_q.bias' is not one devio computes a llama model with");
}

/* A vector (norm, bias) is F32, as llama.cpp's converter writes it: a norm
 * retyped to BF16 once loaded and then failed every sampled step. */
static void test_vector_types(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = tiny_opts(fx->dir);
    write_model(&o);
    expect_refused(fx, &(gguf_edits){.retype = "blk.0.attn_norm.weight", .type = DEVIO_GGML_BF16},
                   DEVIO_E_UNSUPPORTED,
                   "tensor 'blk.0.attn_norm.weight' is a vector of BF16; devio reads a GGUF "
                   "file's vectors (norms, biases) as F32");
    expect_refused(fx, &(gguf_edits){.retype = "output_norm.weight", .type = DEVIO_GGML_F16},
                   DEVIO_E_UNSUPPORTED, "tensor 'output_norm.weight' is a vector of F16");
    o = arch_opts("qwen2", "tiny", fx->dir);
    write_model(&o);
    expect_refused(fx, &(gguf_edits){.retype = "blk.1.attn_k.bias", .type = DEVIO_GGML_BF16},
                   DEVIO_E_UNSUPPORTED, "tensor 'blk.1.attn_k.bias' is a vector of BF16");
}

/* A GGUF file that is not one: the reader's error, not the directory's. */
static void test_not_a_model(void **state)
{
    fixture *fx = *state;
    const char *path = path_in(fx->dir, "cut.gguf");
    write_all(path, "GGUF\3\0\0\0", 8);
    expect_fail(path, DEVIO_E_MODEL, "cut.gguf: file is 8 bytes", NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_llama_f32, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_llama_bf16_tied, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_qwen2_and_qwen3, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_granite, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_rope_scaling, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_refusals, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_bad_floats, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_rope_keys, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_bad_tokens, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_unused_tensors, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_vector_types, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_not_a_model, fx_setup, fx_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
