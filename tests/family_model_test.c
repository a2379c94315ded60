/* family_model_test.c - the Llama-family classes beyond Llama: their config fields (RoPE scaling,
 * Qwen3's q/k norms, Granite's multipliers, Mistral's window) honoured or refused by name, and the
 * scaled RoPE frequencies against transformers' formulas worked in double precision. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include <cmocka.h>

#include "device/model/model.h"
#include "device/backend/shape.h"
#include "tests/model_fixture.h"
#include "tools/mkmodel/mkmodel.h"

/* transformers' llama3 frequency i of d, in double. */
static double llama3_ref(double theta, uint32_t d, uint32_t i, double factor, double lo,
                         double hi, double orig)
{
    double inv = 1.0 / pow(theta, (double)(2 * i) / d);
    double wl = 2.0 * 3.14159265358979323846 / inv;
    if (wl > orig / lo)
        return inv / factor;
    if (wl < orig / hi)
        return inv;
    double smooth = (orig / wl - lo) / (hi - lo);
    return (1.0 - smooth) * inv / factor + smooth * inv;
}

static void test_llama3_frequencies(void **state)
{
    fixture *fx = *state;
    const char *cfg = write_arch(fx, 4, "llama");
    file_sub(cfg, "\"rope_scaling\": null",
             "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, "
             "\"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
             "\"original_max_position_embeddings\": 64}");
    devio_model *m = load_ok(fx->dir);
    assert_int_equal(m->cfg.rope_scaling.type, DEVIO_ROPE_LLAMA3);
    int kept = 0, scaled = 0, smoothed = 0;
    for (uint32_t i = 0; i < 8; i++) {
        double want = llama3_ref(10000.0, 16, i, 8.0, 1.0, 4.0, 64.0);
        double plain = 1.0 / pow(10000.0, (double)(2 * i) / 16);
        double got = devio_rope_inv_freq(&m->cfg, 16, i);
        assert_true(fabs(got - want) <= 1e-6 * want);
        kept += fabs(want - plain) < 1e-12 * plain;
        scaled += fabs(want - plain / 8.0) < 1e-12 * plain;
        smoothed += fabs(want - plain) >= 1e-12 * plain && fabs(want - plain / 8.0) >= 1e-12 * plain;
    }
    assert_true(kept > 0 && scaled > 0 && smoothed > 0); /* the preset crosses the band */
    devio_model_free(m);
}

static void test_linear_and_yarn(void **state)
{
    fixture *fx = *state;
    const char *cfg = write_arch(fx, 4, "llama");
    file_sub(cfg, "\"rope_scaling\": null",
             "\"rope_scaling\": {\"type\": \"linear\", \"factor\": 4.0}");
    devio_model *m = load_ok(fx->dir);
    for (uint32_t i = 0; i < 8; i++) {
        double plain = 1.0 / pow(10000.0, (double)(2 * i) / 16);
        assert_true(fabs(devio_rope_inv_freq(&m->cfg, 16, i) - plain / 4.0) <= 1e-6 * plain);
    }
    devio_model_free(m);
    /* yarn: the default attention factor 0.1 ln(s) + 1; with mscale and
     * mscale_all_dim their ratio; given, as given. */
    file_sub(cfg, "{\"type\": \"linear\", \"factor\": 4.0}",
             "{\"rope_type\": \"yarn\", \"factor\": 8.0, "
             "\"original_max_position_embeddings\": 64}");
    m = load_ok(fx->dir);
    assert_int_equal(m->cfg.rope_scaling.type, DEVIO_ROPE_YARN);
    assert_true(fabs(m->cfg.rope_scaling.attention_factor - (0.1 * log(8.0) + 1.0)) < 1e-6);
    assert_true(m->cfg.rope_scaling.beta_fast == 32.0f && m->cfg.rope_scaling.beta_slow == 1.0f);
    /* Extrapolated at the high-frequency end, interpolated at the low end. */
    double f0 = 1.0, f7 = 1.0 / pow(10000.0, 14.0 / 16);
    assert_true(fabs(devio_rope_inv_freq(&m->cfg, 16, 0) - f0) < 1e-6);
    assert_true(fabs(devio_rope_inv_freq(&m->cfg, 16, 7) - f7 / 8.0) < 1e-6 * f7);
    devio_model_free(m);
    file_sub(cfg, "\"factor\": 8.0,", "\"factor\": 8.0, \"mscale\": 2.0, \"mscale_all_dim\": 1.0,");
    m = load_ok(fx->dir);
    double want = (0.2 * log(8.0) + 1.0) / (0.1 * log(8.0) + 1.0);
    assert_true(fabs(m->cfg.rope_scaling.attention_factor - want) < 1e-6);
    devio_model_free(m);
}

static void test_rope_refusals(void **state)
{
    fixture *fx = *state;
    const char *cfg = write_arch(fx, 4, "llama");
    file_sub(cfg, "\"rope_scaling\": null",
             "\"rope_scaling\": {\"rope_type\": \"longrope\", \"factor\": 4.0}");
    expect_fail(fx->dir, DEVIO_E_UNSUPPORTED, "rope_scaling of type 'longrope'", NULL);
    file_sub(cfg, "\"longrope\"", "\"llama3\"");
    file_sub(cfg, "\"factor\": 4.0", "\"factor\": 4.0, \"low_freq_factor\": 4.0, "
                                     "\"high_freq_factor\": 1.0");
    expect_fail(fx->dir, DEVIO_E_MODEL, "high_freq_factor", NULL);
}

static void test_qwen3(void **state)
{
    fixture *fx = *state;
    const char *cfg = write_arch(fx, 4, "qwen3");
    devio_model *m = load_ok(fx->dir);
    assert_true(m->cfg.qk_norm);
    assert_int_equal(m->cfg.head_dim, 32);
    assert_non_null(m->layers[1].q_norm.data);
    assert_int_equal(m->layers[1].k_norm.shape[0], 32);
    devio_model_free(m);
    file_sub(cfg, "\"attention_bias\": false", "\"attention_bias\": true");
    expect_fail(fx->dir, DEVIO_E_UNSUPPORTED, "attention_bias", "o_proj");
    file_sub(cfg, "\"attention_bias\": true", "\"attention_bias\": false");
    const char *st = path_in(fx->dir, "model.safetensors");
    tensor_drop(st, "model.layers.1.self_attn.k_norm.weight");
    expect_fail(fx->dir, DEVIO_E_MODEL, "model.layers.1.self_attn.k_norm.weight", "missing");
}

static void test_granite_and_mistral(void **state)
{
    fixture *fx = *state;
    write_arch(fx, 4, "granite");
    devio_model *m = load_ok(fx->dir);
    assert_true(m->cfg.embedding_multiplier == 12.0f);
    assert_true(m->cfg.attention_multiplier == 0.0078125f);
    assert_true(m->cfg.residual_multiplier == 0.22f);
    assert_true(m->cfg.logits_scaling == 8.0f);
    devio_model_shape s;
    assert_int_equal(devio_model_shape_get(m, &s, NULL), DEVIO_OK);
    assert_true(s.attn_scale == 0.0078125f && s.emb_mult == 12.0f && s.res_mult == 0.22f);
    devio_model_free(m);
    const char *cfg = write_arch(fx, 4, "granite");
    file_sub(cfg, "\"logits_scaling\": 8.0", "\"logits_scaling\": -1.0");
    expect_fail(fx->dir, DEVIO_E_MODEL, "logits_scaling", NULL);

    write_arch(fx, 4, "mistral");
    m = load_ok(fx->dir);
    assert_int_equal(m->cfg.sliding_window, 24);
    assert_int_equal(devio_model_shape_get(m, &s, NULL), DEVIO_OK);
    assert_int_equal(s.window, 24);
    devio_model_free(m);
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, fx_setup, fx_teardown)
    const struct CMUnitTest tests[] = {
        T(test_llama3_frequencies), T(test_linear_and_yarn), T(test_rope_refusals),
        T(test_qwen3),              T(test_granite_and_mistral),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}
