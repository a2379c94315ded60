/* mkmodel_ssm_test.c - devio_mkmodel's Bamba and Mamba2 models: files, config.json (with its bare Infinity), tensor names and shapes, values, determinism, shards, parameter counts, refusals.
 * Reads what the writer wrote with its own parsers (jansson, the safetensors header); it never goes through devio's model loader. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "tests/model_fixture.h"
#include "tools/mkmodel/mkmodel.h"

/* ---- helpers ---- */

/* config.json as JSON, its one bare Infinity replaced by 1e300 (jansson,
 * like strict JSON, has no Infinity); the text must hold it exactly once. */
static json_t *config_load(const char *dir)
{
    size_t n;
    char *s = (char *)read_all(path_in(dir, "config.json"), &n);
    const char *tok = "\"time_step_limit\": [0.0, Infinity]";
    char *at = strstr(s, tok);
    assert_non_null(at);
    assert_null(strstr(at + strlen(tok), "Infinity"));
    memcpy(strstr(at, "Infinity"), "1e300   ", 8);
    json_error_t je;
    json_t *c = json_loads(s, 0, &je);
    if (!c)
        print_error("config.json: %s\n", je.text);
    assert_non_null(c);
    free(s);
    return c;
}

static double cfg_real(json_t *c, const char *key)
{
    json_t *v = json_object_get(c, key);
    assert_true(json_is_real(v));
    return json_real_value(v);
}

static void cfg_time_steps(json_t *c)
{
    json_t *lim = json_object_get(c, "time_step_limit");
    assert_true(json_is_array(lim));
    assert_int_equal(json_array_size(lim), 2);
    assert_true(json_real_value(json_array_get(lim, 0)) == 0.0);
    assert_true(json_real_value(json_array_get(lim, 1)) == 1e300);
    assert_true(cfg_real(c, "time_step_min") == 0.001);
    assert_true(cfg_real(c, "time_step_max") == 0.1);
    cfg_str(c, "hidden_act", "silu");
}

/* ---- config.json ---- */

static void test_bamba_config(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = arch_opts("bamba", "tiny", fx->dir);
    write_model(&o);
    assert_int_equal(access(path_in(fx->dir, "model.safetensors"), F_OK), 0);
    assert_int_equal(access(path_in(fx->dir, "model.safetensors.index.json"), F_OK), -1);
    json_t *c = config_load(fx->dir);
    cfg_str(c, "model_type", "bamba");
    assert_string_equal(json_string_value(json_array_get(json_object_get(c, "architectures"), 0)),
                        "BambaForCausalLM");
    json_t *al = json_object_get(c, "attn_layer_indices");
    assert_int_equal(json_array_size(al), 1);
    assert_int_equal(json_integer_value(json_array_get(al, 0)), 1);
    assert_int_equal(cfg_int(c, "intermediate_size"), 128);
    assert_int_equal(cfg_int(c, "num_attention_heads"), 4);
    assert_int_equal(cfg_int(c, "num_key_value_heads"), 2);
    assert_int_equal(cfg_int(c, "max_position_embeddings"), 512);
    assert_int_equal(cfg_int(c, "mamba_n_heads"), 8);
    assert_int_equal(cfg_int(c, "mamba_d_head"), 16);
    assert_int_equal(cfg_int(c, "mamba_n_groups"), 2);
    assert_int_equal(cfg_int(c, "mamba_d_state"), 16);
    assert_int_equal(cfg_int(c, "mamba_d_conv"), 4);
    assert_int_equal(cfg_int(c, "mamba_expand"), 2);
    assert_int_equal(cfg_int(c, "mamba_chunk_size"), 256);
    assert_true(cfg_bool(c, "mamba_conv_bias"));
    assert_false(cfg_bool(c, "mamba_proj_bias"));
    assert_false(cfg_bool(c, "tie_word_embeddings"));
    assert_true(cfg_real(c, "rope_theta") == 10000.0);
    assert_true(cfg_real(c, "rms_norm_eps") == 1e-5);
    assert_null(json_object_get(c, "head_dim")); /* always hidden / heads */
    cfg_time_steps(c);
    json_decref(c);
}

static void test_mamba2_config(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = arch_opts("mamba2", "tiny", fx->dir);
    o.ssm_proj_bias = true;
    o.ssm_conv_bias = false;
    o.tie_word_embeddings = true;
    write_model(&o);
    json_t *c = config_load(fx->dir);
    json_t *arch = json_object_get(c, "architectures");
    assert_int_equal(json_array_size(arch), 1);
    assert_string_equal(json_string_value(json_array_get(arch, 0)), "Mamba2ForCausalLM");
    cfg_str(c, "model_type", "mamba2");
    assert_int_equal(cfg_int(c, "vocab_size"), 256);
    assert_int_equal(cfg_int(c, "hidden_size"), 64);
    assert_int_equal(cfg_int(c, "num_hidden_layers"), 2);
    assert_int_equal(cfg_int(c, "state_size"), 16);
    assert_int_equal(cfg_int(c, "expand"), 2);
    assert_int_equal(cfg_int(c, "conv_kernel"), 4);
    assert_int_equal(cfg_int(c, "n_groups"), 2);
    assert_int_equal(cfg_int(c, "num_heads"), 8);
    assert_int_equal(cfg_int(c, "head_dim"), 16);
    assert_int_equal(cfg_int(c, "chunk_size"), 256);
    assert_true(cfg_bool(c, "use_bias"));
    assert_false(cfg_bool(c, "use_conv_bias"));
    assert_true(cfg_bool(c, "rms_norm"));
    assert_true(cfg_bool(c, "residual_in_fp32"));
    assert_true(cfg_bool(c, "tie_word_embeddings"));
    assert_true(cfg_real(c, "layer_norm_epsilon") == 1e-5);
    assert_true(cfg_real(c, "time_step_floor") == 1e-4);
    cfg_time_steps(c);
    cfg_str(c, "torch_dtype", "float32");
    /* Mamba2 names no position bound (devio picks its own) and has no MLP or attention. */
    const char *absent[] = {"max_position_embeddings", "intermediate_size",
                            "num_attention_heads", "rope_theta", "attn_layer_indices"};
    for (size_t i = 0; i < sizeof absent / sizeof *absent; i++)
        assert_null(json_object_get(c, absent[i]));
    json_decref(c);
}

/* ---- tensors ---- */

static void test_bamba_tensors(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = arch_opts("bamba", "tiny", fx->dir);
    write_model(&o);
    json_t *h = header_load(path_in(fx->dir, "model.safetensors"));
    /* I = 128, conv_dim = 128 + 2*2*16 = 192, in_dim = 128 + 192 + 8 = 328 */
    const shape_want want[] = {
        {"model.embed_tokens.weight", 2, {256, 64}},
        {"model.final_layernorm.weight", 1, {64}},
        {"lm_head.weight", 2, {256, 64}},
        {"model.layers.0.input_layernorm.weight", 1, {64}},
        {"model.layers.0.pre_ff_layernorm.weight", 1, {64}},
        {"model.layers.0.feed_forward.gate_proj.weight", 2, {128, 64}},
        {"model.layers.0.feed_forward.up_proj.weight", 2, {128, 64}},
        {"model.layers.0.feed_forward.down_proj.weight", 2, {64, 128}},
        {"model.layers.0.mamba.in_proj.weight", 2, {328, 64}},
        {"model.layers.0.mamba.conv1d.weight", 3, {192, 1, 4}},
        {"model.layers.0.mamba.conv1d.bias", 1, {192}},
        {"model.layers.0.mamba.dt_bias", 1, {8}},
        {"model.layers.0.mamba.A_log", 1, {8}},
        {"model.layers.0.mamba.D", 1, {8}},
        {"model.layers.0.mamba.norm.weight", 1, {128}},
        {"model.layers.0.mamba.out_proj.weight", 2, {64, 128}},
        {"model.layers.1.self_attn.q_proj.weight", 2, {64, 64}},
        {"model.layers.1.self_attn.k_proj.weight", 2, {32, 64}},
        {"model.layers.1.self_attn.v_proj.weight", 2, {32, 64}},
        {"model.layers.1.self_attn.o_proj.weight", 2, {64, 64}},
        {"model.layers.3.mamba.out_proj.weight", 2, {64, 128}},
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        header_shape_is(h, &want[i], "F32");
    const char *absent[] = {"model.layers.1.mamba.in_proj.weight",
                            "model.layers.0.self_attn.q_proj.weight",
                            "model.layers.0.mamba.in_proj.bias",
                            "model.layers.0.mamba.out_proj.bias", "model.norm.weight",
                            "model.layers.1.self_attn.q_proj.bias"};
    for (size_t i = 0; i < sizeof absent / sizeof *absent; i++)
        assert_null(json_object_get(h, absent[i]));
    /* 3 outside the layers, 5 + 4 in the attention layer, 5 + 8 in each of 3 mixer layers */
    assert_int_equal(json_object_size(h) - 1, 3 + 9 + 3 * 13);
    assert_int_equal(header_params(h), devio_mkmodel_param_count(&o));
    json_decref(h);

}

static void test_mamba2_tensors_biases(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = arch_opts("mamba2", "tiny", fx->dir);
    o.ssm_proj_bias = true;
    o.ssm_conv_bias = false;
    o.ssm_groups = 1;
    o.dtype = DEVIO_BF16;
    write_model(&o);
    json_t *h = header_load(path_in(fx->dir, "model.safetensors"));
    /* conv_dim = 128 + 2*16 = 160, in_dim = 128 + 160 + 8 = 296 */
    const shape_want want[] = {
        {"backbone.embeddings.weight", 2, {256, 64}},
        {"backbone.norm_f.weight", 1, {64}},
        {"lm_head.weight", 2, {256, 64}},
        {"backbone.layers.1.norm.weight", 1, {64}},
        {"backbone.layers.1.mixer.in_proj.weight", 2, {296, 64}},
        {"backbone.layers.1.mixer.in_proj.bias", 1, {296}},
        {"backbone.layers.1.mixer.conv1d.weight", 3, {160, 1, 4}},
        {"backbone.layers.1.mixer.dt_bias", 1, {8}},
        {"backbone.layers.1.mixer.A_log", 1, {8}},
        {"backbone.layers.1.mixer.D", 1, {8}},
        {"backbone.layers.1.mixer.norm.weight", 1, {128}},
        {"backbone.layers.1.mixer.out_proj.weight", 2, {64, 128}},
        {"backbone.layers.1.mixer.out_proj.bias", 1, {64}},
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        header_shape_is(h, &want[i], "BF16");
    assert_null(json_object_get(h, "backbone.layers.0.mixer.conv1d.bias"));
    /* 3 outside the layers, 1 + 9 in each (both projection biases, no conv bias) */
    assert_int_equal(json_object_size(h) - 1, 3 + 2 * 10);
    assert_int_equal(header_params(h), devio_mkmodel_param_count(&o));
    json_decref(h);
}

/* Every element on disk is what devio_mkmodel_values says, and the mixer's
 * parameters lie where they keep the recurrence stable. */
static void test_values(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = arch_opts("bamba", "tiny", fx->dir);
    write_model(&o);
    json_t *h = header_load(path_in(fx->dir, "model.safetensors"));
    const char *name;
    json_t *t;
    json_object_foreach(h, name, t) {
        if (strcmp(name, "__metadata__") == 0)
            continue;
        size_t n;
        float *got = tensor_f32(fx->dir, name, &n);
        float *want = malloc(n * sizeof *want);
        assert_non_null(want);
        devio_error err = {0};
        assert_int_equal(devio_mkmodel_values(&o, name, 0, n, want, &err), DEVIO_OK);
        assert_memory_equal(got, want, n * sizeof *want);
        for (size_t i = 0; i < n; i++) {
            float v = got[i];
            if (strstr(name, "A_log"))
                assert_true(v >= 0.0f && v < logf(16.0f));
            else if (strstr(name, "mamba.D"))
                assert_true(v >= 0.5f && v < 1.5f);
            else if (strstr(name, "dt_bias")) {
                double dt = log1p(exp((double)v)); /* softplus */
                assert_true(dt >= 0.001 * (1 - 1e-5) && dt <= 0.1 * (1 + 1e-5));
            } else if (strstr(name, "conv1d.bias"))
                assert_true(fabsf(v) <= 0.1f);
            else if (strstr(name, "conv1d.weight"))
                assert_true(fabsf(v) <= 0.5f); /* 1/sqrt(K), K = 4 */
            else if (strstr(name, "norm"))
                assert_true(v >= 0.9f && v <= 1.1f);
        }
        free(got);
        free(want);
    }
    json_decref(h);
    float v;
    devio_error err = {0};
    assert_int_equal(devio_mkmodel_values(&o, "model.layers.1.mamba.A_log", 0, 1, &v, &err),
                     DEVIO_E_INVALID);
    assert_int_equal(devio_mkmodel_values(&o, "model.layers.0.mamba.A_log", 8, 1, &v, &err),
                     DEVIO_E_INVALID);
}

/* dt_bias spreads over [time_step_min, time_step_max) log-uniformly: of
 * many heads, some land in each decade. */
static void test_dt_spread(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = arch_opts("mamba2", "tiny", fx->dir);
    o.ssm_heads = 128;
    o.ssm_head_dim = 1;
    o.ssm_groups = 1;
    float b[128];
    devio_error err = {0};
    assert_int_equal(devio_mkmodel_values(&o, "backbone.layers.0.mixer.dt_bias", 0, 128, b, &err),
                     DEVIO_OK);
    int low = 0, high = 0;
    for (int i = 0; i < 128; i++) {
        double dt = log1p(exp((double)b[i]));
        assert_true(dt >= 0.001 * (1 - 1e-5) && dt <= 0.1 * (1 + 1e-5));
        low += dt < 0.01;
        high += dt >= 0.01;
    }
    assert_true(low > 32 && high > 32);
}

/* ---- determinism and shards ---- */

static void test_determinism(void **state)
{
    fixture *fx = *state;
    const char *archs[] = {"bamba", "mamba2"};
    for (int k = 0; k < 2; k++) {
        devio_mkmodel_opts o = arch_opts(archs[k], "tiny", fx->dir);
        o.dtype = DEVIO_F16;
        expect_deterministic(o, fx->dir, archs[k]);
    }
}

/* Three shards hold, tensor for tensor, the bytes of the single file. */
static void test_shards(void **state)
{
    fixture *fx = *state;
    char a[128], b[128];
    snprintf(a, sizeof a, "%s/a", fx->dir);
    snprintf(b, sizeof b, "%s/b", fx->dir);
    devio_mkmodel_opts o = arch_opts("bamba", "tiny", a);
    write_model(&o);
    o.out_dir = b;
    o.shards = 3;
    write_model(&o);
    assert_int_equal(access(path_in(b, "model.safetensors"), F_OK), -1);
    json_error_t je;
    json_t *idx = json_load_file(path_in(b, "model.safetensors.index.json"), 0, &je);
    assert_non_null(idx);
    json_t *map = json_object_get(idx, "weight_map");
    json_t *single = header_load(path_in(a, "model.safetensors"));
    assert_int_equal(json_object_size(map), json_object_size(single) - 1);
    const char *name = "model.layers.2.mamba.conv1d.weight";
    size_t n;
    float *want = tensor_f32(a, name, &n);
    const char *file = json_string_value(json_object_get(map, name));
    assert_non_null(file);
    size_t size;
    uint8_t *raw = read_all(path_in(b, file), &size);
    json_t *h = header_load(path_in(b, file));
    json_t *off = json_object_get(json_object_get(h, name), "data_offsets");
    size_t at = 8 + (size_t)header_len(raw) + (size_t)json_integer_value(json_array_get(off, 0));
    assert_memory_equal(raw + at, want, n * 4);
    free(raw);
    free(want);
    json_decref(h);
    json_decref(single);
    json_decref(idx);
}

/* ---- counts and presets ---- */

static void test_param_counts(void **state)
{
    (void)state;
    const struct {
        const char *arch, *preset;
        uint64_t params;
        devio_dtype dtype;
    } want[] = {
        {"bamba", "tiny", 234824, DEVIO_F32},        {"bamba", "small", 16029580, DEVIO_F32},
        {"bamba", "bench", 134366856, DEVIO_BF16},   {"mamba2", "tiny", 93552, DEVIO_F32},
        {"mamba2", "small", 12465474, DEVIO_F32},    {"llama", "bench", 134105856, DEVIO_BF16},
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        devio_mkmodel_opts o = arch_opts(want[i].arch, want[i].preset, NULL);
        assert_int_equal(devio_mkmodel_param_count(&o), want[i].params);
        assert_int_equal(o.dtype, want[i].dtype);
    }
    devio_mkmodel_opts o = devio_mkmodel_opts_default();
    devio_error err = {0};
    o.arch = "bamba";
    assert_int_equal(devio_mkmodel_preset("1b", &o, &err), DEVIO_E_INVALID);
    assert_non_null(strstr(err.message, "tiny, small, bench"));
    o.arch = "mamba2";
    assert_int_equal(devio_mkmodel_preset("bench", &o, &err), DEVIO_E_INVALID);
    assert_non_null(strstr(err.message, "'bench' for mamba2"));
    o.arch = "gpt2";
    assert_int_equal(devio_mkmodel_preset("tiny", &o, &err), DEVIO_E_INVALID);
}

/* One refused combination: `edit` changes the preset, the message names it. */
static void heads_7(devio_mkmodel_opts *o) { o->ssm_heads = 7; }
static void groups_3(devio_mkmodel_opts *o) { o->ssm_groups = 3; }
static void conv_0(devio_mkmodel_opts *o) { o->ssm_conv = 0; }
static void attn_past_end(devio_mkmodel_opts *o) { o->attn_layers[0] |= 1ull << 4; }
static void head_dim_32(devio_mkmodel_opts *o) { o->head_dim = 32; }
static void qkv_bias(devio_mkmodel_opts *o) { o->attention_bias = true; }
static void heads_32(devio_mkmodel_opts *o) { o->n_heads = 32; o->n_kv_heads = 32; }
static void ffn_set(devio_mkmodel_opts *o) { o->intermediate_size = 128; }
static void max_pos_set(devio_mkmodel_opts *o) { o->max_position_embeddings = 512; }
static void attn_set(devio_mkmodel_opts *o) { o->attn_layers[0] = 1; }
static void ssm_set(devio_mkmodel_opts *o) { o->ssm_state = 16; }
static void proj_bias(devio_mkmodel_opts *o) { o->ssm_proj_bias = true; }
static void dt_reversed(devio_mkmodel_opts *o) { o->time_step_min = 0.2; }
static void no_mixer(devio_mkmodel_opts *o)
{
    o->ssm_heads = 0;
    o->ssm_head_dim = 0;
}

static void test_rejects(void **state)
{
    fixture *fx = *state;
    const bad_case cases[] = {
        {"bamba", heads_7, "must equal ssm-expand 2 x hidden 64"},
        {"bamba", groups_3, "not a multiple of ssm-groups 3"},
        {"mamba2", conv_0, "ssm-conv must be in [1, 64]"},
        {"bamba", attn_past_end, "names layer 4 but the model has 4 layers"},
        {"bamba", head_dim_32, "cannot change it"},
        {"bamba", qkv_bias, "llama only"},
        {"bamba", heads_32, "must be a multiple of 4"}, /* head_dim 2: no pair to rotate */
        {"mamba2", ffn_set, "--ffn"},
        {"mamba2", max_pos_set, "--max-pos"},
        {"mamba2", attn_set, "belongs to bamba"},
        {"llama", ssm_set, "not llama"},
        {"llama", proj_bias, "not llama"},
        {"llama", attn_set, "belongs to bamba"},
        {"mamba2", dt_reversed, "time_step_min <= time_step_max"},
        {"bamba", no_mixer, "--preset tiny --arch bamba"},
    };
    expect_refusals(cases, sizeof cases / sizeof *cases, fx->dir);
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, fx_setup, fx_teardown)
    const struct CMUnitTest tests[] = {
        T(test_bamba_config),    T(test_mamba2_config), T(test_bamba_tensors),
        T(test_mamba2_tensors_biases), T(test_values),  T(test_dt_spread),
        T(test_determinism),     T(test_shards),        T(test_param_counts),
        T(test_rejects),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}
