/* ssm_model_test.c - loading Bamba and Mamba2 directories: their config fields (the bare
 * Infinity of time_step_limit included), layer kinds and tensors, and a clear error naming
 * every field, variant or tensor devio does not take. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "device/model/model.h"
#include "device/backend/shape.h"
#include "tests/model_fixture.h"
#include "tools/mkmodel/mkmodel.h"

static void test_bamba_loads(void **state)
{
    fixture *fx = *state;
    write_arch(fx, 3, "bamba");
    devio_model *m = load_ok(fx->dir);
    const devio_model_config *c = &m->cfg;
    assert_int_equal(c->arch, DEVIO_ARCH_BAMBA);
    assert_int_equal(c->rotary_dim, c->head_dim / 2);
    assert_int_equal(c->ssm.n_heads, 8);
    assert_int_equal(c->ssm.head_dim, 16);
    assert_int_equal(c->ssm.n_groups, 2);
    assert_int_equal(c->ssm.d_state, 16);
    assert_int_equal(c->ssm.d_conv, 4);
    assert_true(c->ssm.conv_bias && !c->ssm.proj_bias);
    assert_true(c->ssm.dt_min == 0.0f && c->ssm.dt_max == __builtin_inff());
    for (uint32_t i = 0; i < 4; i++)
        assert_int_equal(m->layers[i].kind, i == 1 ? DEVIO_LAYER_ATTENTION : DEVIO_LAYER_MIXER);
    assert_non_null(m->layers[0].mixer.conv_w.data);
    assert_int_equal(m->layers[0].mixer.conv_w.ndim, 2); /* [conv_dim, 1, K] held as [c, K] */
    assert_int_equal(m->layers[0].mixer.conv_w.shape[1], 4);
    assert_null(m->layers[0].wq.data);
    assert_non_null(m->layers[0].w_gate.data); /* every Bamba layer has its MLP */
    devio_model_shape s;
    assert_int_equal(devio_model_shape_get(m, &s, NULL), DEVIO_OK);
    assert_int_equal(s.n_attn, 1);
    assert_int_equal(s.n_mixers, 3);
    assert_int_equal(s.conv_dim, 128 + 2 * 2 * 16);
    assert_int_equal(s.in_dim, 128 + s.conv_dim + 8);
    assert_int_equal(s.slot_floats, 3 * (s.conv_dim * 3 + 128 * 16));
    devio_model_free(m);
}

static void test_mamba2_loads(void **state)
{
    fixture *fx = *state;
    const char *cfg = write_arch(fx, 3, "mamba2");
    devio_model *m = load_ok(fx->dir);
    assert_int_equal(m->cfg.arch, DEVIO_ARCH_MAMBA2);
    assert_int_equal(m->cfg.max_position_embeddings, 4096); /* Mamba2 names none */
    devio_model_shape s;
    assert_int_equal(devio_model_shape_get(m, &s, NULL), DEVIO_OK);
    assert_int_equal(s.n_attn, 0);
    assert_false(s.has_mlp);
    assert_null(m->layers[1].w_gate.data);
    devio_model_free(m);
    /* A limit other than [0, inf], and max_position_embeddings when given. */
    file_sub(cfg, "[0.0, Infinity]", "[0.001, 0.25]");
    file_sub(cfg, "\"n_groups\"", "\"max_position_embeddings\": 300, \"n_groups\"");
    m = load_ok(fx->dir);
    assert_true(m->cfg.ssm.dt_min == 0.001f && m->cfg.ssm.dt_max == 0.25f);
    assert_int_equal(m->cfg.max_position_embeddings, 300);
    devio_model_free(m);
}

/* Older Mamba2 checkpoints name the embedding backbone.embedding. */
static void test_mamba2_old_embedding_name(void **state)
{
    fixture *fx = *state;
    write_arch(fx, 3, "mamba2");
    const char *st = path_in(fx->dir, "model.safetensors");
    json_t *h = header_load(st);
    json_t *e = json_object_get(h, "backbone.embeddings.weight");
    json_object_set(h, "backbone.embedding.weight", e);
    json_object_del(h, "backbone.embeddings.weight");
    header_store(st, h);
    devio_model *m = load_ok(fx->dir);
    assert_non_null(m->embed.data);
    devio_model_free(m);
}

/* Each edit of config.json, and the status and words the refusal must carry. */
typedef struct bad_cfg {
    const char *arch, *old, *new;
    devio_status want;
    const char *says;
} bad_cfg;

static const bad_cfg bad_cfgs[] = {
    {"mamba2", "\"rms_norm\": true", "\"rms_norm\": false", DEVIO_E_UNSUPPORTED, "rms_norm false"},
    {"mamba2", "\"rms_norm\": true", "\"rms_norm\": true, \"norm_before_gate\": true",
     DEVIO_E_UNSUPPORTED, "norm_before_gate"},
    {"mamba2", "\"num_heads\": 8", "\"num_heads\": 7", DEVIO_E_MODEL, "num_heads"},
    {"mamba2", "\"n_groups\": 2", "\"n_groups\": 3", DEVIO_E_MODEL, "n_groups"},
    {"mamba2", "[0.0, Infinity]", "[0.5, 0.1]", DEVIO_E_MODEL, "time_step_limit"},
    {"mamba2", "[0.0, Infinity]", "[0.0, \"big\"]", DEVIO_E_MODEL, "time_step_limit"},
    {"mamba2", "[0.0, Infinity]", "[-Infinity, 1.0]", DEVIO_E_MODEL, "time_step_limit"},
    {"mamba2", "\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\"", DEVIO_E_UNSUPPORTED,
     "hidden_act"},
    {"bamba", "\"attn_layer_indices\": [1]", "\"attn_layer_indices\": [4]", DEVIO_E_MODEL,
     "attn_layer_indices"},
    {"bamba", "\"attn_layer_indices\": [1]", "\"attn_layer_indices\": 1", DEVIO_E_MODEL,
     "attn_layer_indices"},
    {"bamba", "\"mamba_d_head\": 16", "\"mamba_d_head\": 15", DEVIO_E_MODEL, "mamba_d_head"},
    {"bamba", "\"mamba_n_heads\": 8", "\"mamba_n_heads\": 6", DEVIO_E_MODEL, "mamba_n_heads"},
    {"bamba", "\"mamba_d_conv\": 4", "\"mamba_d_conv\": 65", DEVIO_E_MODEL, "mamba_d_conv"},
    {"bamba", "\"rope_theta\": 10000.0",
     "\"rope_theta\": 10000.0, \"rope_parameters\": {\"rope_type\": \"dynamic\"}",
     DEVIO_E_UNSUPPORTED, "rope_parameters"},
    {"bamba", "\"num_attention_heads\": 4", "\"num_attention_heads\": 32", DEVIO_E_UNSUPPORTED,
     "multiple of 4"},
};

static void test_config_refusals(void **state)
{
    fixture *fx = *state;
    for (size_t i = 0; i < sizeof bad_cfgs / sizeof *bad_cfgs; i++) {
        const bad_cfg *b = &bad_cfgs[i];
        const char *cfg = write_arch(fx, 3, b->arch);
        file_sub(cfg, b->old, b->new);
        expect_fail(fx->dir, b->want, "config.json", b->says);
    }
}

/* "auto" head dim and rope_parameters of type default are taken. */
static void test_config_variants(void **state)
{
    fixture *fx = *state;
    const char *cfg = write_arch(fx, 3, "bamba");
    file_sub(cfg, "\"mamba_d_head\": 16", "\"mamba_d_head\": \"auto\"");
    file_sub(cfg, "\"rope_theta\": 10000.0",
             "\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 500000.0}");
    devio_model *m = load_ok(fx->dir);
    assert_int_equal(m->cfg.ssm.head_dim, 16);
    assert_true(m->cfg.rope_theta == 500000.0f);
    devio_model_free(m);
}

static void test_tensor_refusals(void **state)
{
    fixture *fx = *state;
    write_arch(fx, 3, "bamba");
    const char *st = path_in(fx->dir, "model.safetensors");
    json_t *h = header_load(st);
    json_t *t = json_object_get(h, "model.layers.0.mamba.conv1d.weight");
    json_array_set_new(json_object_get(t, "shape"), 1, json_integer(4)); /* [c, 4, 4]... */
    json_array_set_new(json_object_get(t, "shape"), 2, json_integer(1)); /* ... [c, 4, 1] */
    header_store(st, h);
    expect_fail(fx->dir, DEVIO_E_MODEL, "model.layers.0.mamba.conv1d.weight", "expected [");

    write_arch(fx, 3, "bamba");
    tensor_drop(st, "model.layers.2.mamba.A_log");
    expect_fail(fx->dir, DEVIO_E_MODEL, "model.layers.2.mamba.A_log", "missing");

    /* A conv bias the config says is absent is never read; one it says is
     * there must be. */
    write_arch(fx, 3, "mamba2");
    tensor_drop(st, "backbone.layers.1.mixer.conv1d.bias");
    expect_fail(fx->dir, DEVIO_E_MODEL, "backbone.layers.1.mixer.conv1d.bias", "missing");
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, fx_setup, fx_teardown)
    const struct CMUnitTest tests[] = {
        T(test_bamba_loads),
        T(test_mamba2_loads),
        T(test_mamba2_old_embedding_name),
        T(test_config_refusals),
        T(test_config_variants),
        T(test_tensor_refusals),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}
