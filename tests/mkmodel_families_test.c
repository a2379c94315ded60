/* mkmodel_families_test.c - devio_mkmodel's Llama family (qwen2, qwen3, mistral, granite; llama's bytes unchanged): config.json fields, rope_scaling, q_norm/k_norm, values, determinism, parameter counts, refusals.
 * Reads what the writer wrote with its own parsers (jansson, the safetensors header); it never goes through devio's model loader. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "tests/model_fixture.h"
#include "tools/mkmodel/mkmodel.h"

/* ---- helpers ---- */

static json_t *config_load(const char *dir)
{
    json_error_t je;
    json_t *c = json_load_file(path_in(dir, "config.json"), 0, &je);
    if (!c)
        print_error("config.json: %s\n", je.text);
    assert_non_null(c);
    return c;
}

/* A JSON float (written with a decimal point), exactly `want`. */
static void cfg_real_is(json_t *c, const char *key, double want)
{
    json_t *v = cfg_get(c, key);
    if (!json_is_real(v) || json_real_value(v) != want)
        print_error("config key %s is not %g\n", key, want);
    assert_true(json_is_real(v));
    assert_true(json_real_value(v) == want);
}

static void cfg_null(json_t *c, const char *key)
{
    assert_true(json_is_null(cfg_get(c, key)));
}

static void cfg_absent(json_t *c, const char *const *keys, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (json_object_get(c, keys[i]))
            print_error("config key %s should be absent\n", keys[i]);
        assert_null(json_object_get(c, keys[i]));
    }
}

static void cfg_arch(json_t *c, const char *class_name, const char *model_type)
{
    json_t *a = cfg_get(c, "architectures");
    assert_int_equal(json_array_size(a), 1);
    assert_string_equal(json_string_value(json_array_get(a, 0)), class_name);
    cfg_str(c, "model_type", model_type);
    cfg_str(c, "hidden_act", "silu");
    cfg_real_is(c, "attention_dropout", 0.0);
    cfg_null(c, "rope_scaling");
    cfg_real_is(c, "rope_theta", 10000.0);
    cfg_real_is(c, "rms_norm_eps", 1e-5);
}

/* ---- config.json ---- */

/* llama tiny's config, byte for byte as it was before the other families. */
static void test_llama_config_unchanged(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = arch_opts("llama", "tiny", fx->dir);
    write_model(&o);
    static const char want[] =
        "{\n  \"architectures\": [\"LlamaForCausalLM\"],\n  \"attention_bias\": false,\n"
        "  \"attention_dropout\": 0.0,\n  \"bos_token_id\": 1,\n  \"eos_token_id\": 2,\n"
        "  \"head_dim\": 16,\n  \"hidden_act\": \"silu\",\n  \"hidden_size\": 64,\n"
        "  \"initializer_range\": 0.02,\n  \"intermediate_size\": 128,\n"
        "  \"max_position_embeddings\": 512,\n  \"mlp_bias\": false,\n"
        "  \"model_type\": \"llama\",\n  \"num_attention_heads\": 4,\n"
        "  \"num_hidden_layers\": 2,\n  \"num_key_value_heads\": 2,\n"
        "  \"rms_norm_eps\": 1e-05,\n  \"rope_scaling\": null,\n  \"rope_theta\": 10000.0,\n"
        "  \"tie_word_embeddings\": false,\n  \"torch_dtype\": \"float32\",\n"
        "  \"use_cache\": true,\n  \"vocab_size\": 256\n}\n";
    size_t n;
    uint8_t *got = read_all(path_in(fx->dir, "config.json"), &n);
    assert_int_equal(n, strlen(want));
    assert_memory_equal(got, want, n);
    free(got);
}

static void test_qwen2_config(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = arch_opts("qwen2", "tiny", fx->dir);
    assert_true(o.attention_bias);
    write_model(&o);
    json_t *c = config_load(fx->dir);
    cfg_arch(c, "Qwen2ForCausalLM", "qwen2");
    assert_false(cfg_bool(c, "use_sliding_window"));
    assert_int_equal(cfg_int(c, "sliding_window"), 512);
    assert_int_equal(cfg_int(c, "max_window_layers"), 2);
    assert_int_equal(cfg_int(c, "num_key_value_heads"), 2);
    /* Qwen2's configs have neither: biases are always on, head_dim is hidden / heads */
    const char *absent[] = {"head_dim", "attention_bias", "mlp_bias", "attention_multiplier"};
    cfg_absent(c, absent, sizeof absent / sizeof *absent);
    json_decref(c);
}

static void test_qwen3_config(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = arch_opts("qwen3", "tiny", fx->dir);
    write_model(&o);
    json_t *c = config_load(fx->dir);
    cfg_arch(c, "Qwen3ForCausalLM", "qwen3");
    assert_int_equal(cfg_int(c, "head_dim"), 32);
    assert_true(cfg_int(c, "head_dim") !=
                cfg_int(c, "hidden_size") / cfg_int(c, "num_attention_heads"));
    assert_false(cfg_bool(c, "attention_bias"));
    assert_false(cfg_bool(c, "use_sliding_window"));
    cfg_null(c, "sliding_window");
    assert_int_equal(cfg_int(c, "max_window_layers"), 2);
    const char *absent[] = {"mlp_bias", "embedding_multiplier"};
    cfg_absent(c, absent, sizeof absent / sizeof *absent);
    json_decref(c);
}

static void test_mistral_config(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = arch_opts("mistral", "tiny", fx->dir);
    assert_int_equal(o.sliding_window, 24);
    write_model(&o);
    json_t *c = config_load(fx->dir);
    cfg_arch(c, "MistralForCausalLM", "mistral");
    assert_int_equal(cfg_int(c, "sliding_window"), 24);
    assert_int_equal(cfg_int(c, "head_dim"), 16);
    const char *absent[] = {"attention_bias", "mlp_bias", "use_sliding_window",
                            "max_window_layers"};
    cfg_absent(c, absent, sizeof absent / sizeof *absent);
    json_decref(c);
    /* --window 0: "sliding_window": null, full attention */
    o.sliding_window = 0;
    write_model(&o);
    c = config_load(fx->dir);
    cfg_null(c, "sliding_window");
    json_decref(c);
    devio_mkmodel_opts s = arch_opts("mistral", "small", NULL);
    assert_int_equal(s.sliding_window, 128);
}

static void test_granite_config(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = arch_opts("granite", "tiny", fx->dir);
    write_model(&o);
    json_t *c = config_load(fx->dir);
    cfg_arch(c, "GraniteForCausalLM", "granite");
    cfg_real_is(c, "embedding_multiplier", 12.0);
    cfg_real_is(c, "attention_multiplier", 0.0078125);
    cfg_real_is(c, "residual_multiplier", 0.22);
    cfg_real_is(c, "logits_scaling", 8.0);
    assert_false(cfg_bool(c, "attention_bias"));
    assert_false(cfg_bool(c, "mlp_bias"));
    const char *absent[] = {"head_dim", "sliding_window"};
    cfg_absent(c, absent, sizeof absent / sizeof *absent);
    json_decref(c);
    o.embedding_multiplier = 3.5;
    o.logits_scaling = 0.125;
    write_model(&o);
    c = config_load(fx->dir);
    cfg_real_is(c, "embedding_multiplier", 3.5);
    cfg_real_is(c, "logits_scaling", 0.125);
    json_decref(c);
}

/* ---- rope_scaling ---- */

/* The keys of rope_scaling: exactly these, with these values (a string for
 * rope_type, an integer for original_max_position_embeddings, else floats). */
typedef struct rope_want {
    devio_mkmodel_rope type;
    const char *name;
    size_t n_keys;
} rope_want;

static void rope_check(json_t *rs, const rope_want *w, double factor, int64_t orig)
{
    assert_true(json_is_object(rs));
    assert_int_equal(json_object_size(rs), w->n_keys);
    cfg_str(rs, "rope_type", w->name);
    cfg_real_is(rs, "factor", factor);
    if (w->type == DEVIO_MKMODEL_ROPE_LINEAR)
        return;
    assert_int_equal(cfg_int(rs, "original_max_position_embeddings"), orig);
    if (w->type == DEVIO_MKMODEL_ROPE_LLAMA3) {
        cfg_real_is(rs, "low_freq_factor", 1.0);
        cfg_real_is(rs, "high_freq_factor", 4.0);
    } else {
        cfg_real_is(rs, "beta_fast", 32.0);
        cfg_real_is(rs, "beta_slow", 1.0);
    }
}

static void test_rope_scaling(void **state)
{
    fixture *fx = *state;
    const rope_want kinds[] = {
        {DEVIO_MKMODEL_ROPE_LINEAR, "linear", 2},
        {DEVIO_MKMODEL_ROPE_LLAMA3, "llama3", 5},
        {DEVIO_MKMODEL_ROPE_YARN, "yarn", 5},
    };
    const char *archs[] = {"llama", "qwen2", "qwen3", "mistral", "granite"};
    for (size_t a = 0; a < sizeof archs / sizeof *archs; a++) {
        for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++) {
            devio_mkmodel_opts o = arch_opts(archs[a], "tiny", fx->dir);
            o.rope_scaling = kinds[k].type;
            write_model(&o);
            json_t *c = config_load(fx->dir);
            /* the defaults: factor 8, original max 512 / 8 */
            rope_check(json_object_get(c, "rope_scaling"), &kinds[k], 8.0, 64);
            json_decref(c);
            o.rope_factor = 4.0;
            write_model(&o);
            c = config_load(fx->dir);
            rope_check(json_object_get(c, "rope_scaling"), &kinds[k], 4.0, 128);
            json_decref(c);
        }
    }
    /* llama3 takes any original max; the text is nested as transformers writes it */
    devio_mkmodel_opts o = arch_opts("qwen3", "tiny", fx->dir);
    o.rope_scaling = DEVIO_MKMODEL_ROPE_LLAMA3;
    o.rope_original_max = 100;
    write_model(&o);
    size_t n;
    char *s = (char *)read_all(path_in(fx->dir, "config.json"), &n);
    const char *want = "  \"rope_scaling\": {\n    \"factor\": 8.0,\n"
                       "    \"high_freq_factor\": 4.0,\n    \"low_freq_factor\": 1.0,\n"
                       "    \"original_max_position_embeddings\": 100,\n"
                       "    \"rope_type\": \"llama3\"\n  },\n  \"rope_theta\": 10000.0,\n";
    if (!strstr(s, want))
        print_error("config.json:\n%s\n", s);
    assert_non_null(strstr(s, want));
    free(s);
}

/* ---- tensors ---- */

static void test_qwen3_tensors(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = arch_opts("qwen3", "tiny", fx->dir);
    write_model(&o);
    json_t *h = header_load(path_in(fx->dir, "model.safetensors"));
    /* heads 4 x head_dim 32 = 128 for q, 2 x 32 = 64 for k and v */
    const shape_want want[] = {
        {"model.layers.0.self_attn.q_proj.weight", 2, {128, 64}},
        {"model.layers.0.self_attn.k_proj.weight", 2, {64, 64}},
        {"model.layers.0.self_attn.v_proj.weight", 2, {64, 64}},
        {"model.layers.0.self_attn.o_proj.weight", 2, {64, 128}},
        {"model.layers.0.self_attn.q_norm.weight", 1, {32}},
        {"model.layers.0.self_attn.k_norm.weight", 1, {32}},
        {"model.layers.1.self_attn.q_norm.weight", 1, {32}},
        {"model.layers.1.self_attn.k_norm.weight", 1, {32}},
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        header_shape_is(h, &want[i], NULL);
    assert_null(json_object_get(h, "model.layers.0.self_attn.q_proj.bias"));
    /* 3 outside the layers, 11 in each */
    assert_int_equal(json_object_size(h) - 1, 3 + 2 * 11);
    assert_int_equal(header_params(h), devio_mkmodel_param_count(&o));
    json_decref(h);
    /* the norms lie near 1, as the other norms do, and differ from each other */
    const char *norms[] = {"model.layers.0.self_attn.q_norm.weight",
                           "model.layers.1.self_attn.k_norm.weight"};
    float first[2];
    for (size_t k = 0; k < 2; k++) {
        size_t n;
        float *v = tensor_f32(fx->dir, norms[k], &n);
        float ref[32];
        devio_error err = {0};
        assert_int_equal(devio_mkmodel_values(&o, norms[k], 0, 32, ref, &err), DEVIO_OK);
        assert_int_equal(n, 32);
        assert_memory_equal(v, ref, sizeof ref);
        for (size_t i = 0; i < n; i++)
            assert_true(v[i] >= 0.9f && v[i] <= 1.1f);
        first[k] = v[0];
        free(v);
    }
    assert_true(first[0] != first[1]);
}

/* Each family's tensors: biases where it has them, q/k norms only in qwen3,
 * and the header's element count is the parameter count. */
static void test_family_tensors(void **state)
{
    fixture *fx = *state;
    const struct {
        const char *arch;
        bool bias, qk_norm;
        size_t per_layer;
    } want[] = {
        {"qwen2", true, false, 12},
        {"qwen3", false, true, 11},
        {"mistral", false, false, 9},
        {"granite", false, false, 9},
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        devio_mkmodel_opts o = arch_opts(want[i].arch, "tiny", fx->dir);
        o.tie_word_embeddings = true;
        write_model(&o);
        json_t *h = header_load(path_in(fx->dir, "model.safetensors"));
        assert_int_equal(json_object_get(h, "model.layers.1.self_attn.k_proj.bias") != NULL,
                         want[i].bias);
        assert_int_equal(json_object_get(h, "model.layers.1.self_attn.k_norm.weight") != NULL,
                         want[i].qk_norm);
        assert_null(json_object_get(h, "lm_head.weight"));
        assert_int_equal(json_object_size(h) - 1, 2 + 2 * want[i].per_layer);
        assert_int_equal(header_params(h), devio_mkmodel_param_count(&o));
        json_decref(h);
    }
}

/* ---- determinism ---- */

static void test_determinism(void **state)
{
    fixture *fx = *state;
    const char *archs[] = {"qwen2", "qwen3", "mistral", "granite"};
    for (size_t k = 0; k < sizeof archs / sizeof *archs; k++) {
        devio_mkmodel_opts o = arch_opts(archs[k], "tiny", fx->dir);
        o.dtype = DEVIO_BF16;
        o.rope_scaling = DEVIO_MKMODEL_ROPE_YARN;
        expect_deterministic(o, fx->dir, archs[k]);
    }
}

/* A tensor both llama and another family have holds the same values under
 * the same seed: the families differ by their own tensors and config only. */
static void test_shared_values(void **state)
{
    (void)state;
    const char *name = "model.layers.1.mlp.down_proj.weight";
    float want[16], got[16];
    devio_error err = {0};
    devio_mkmodel_opts o = arch_opts("llama", "tiny", NULL);
    assert_int_equal(devio_mkmodel_values(&o, name, 100, 16, want, &err), DEVIO_OK);
    const char *archs[] = {"qwen2", "qwen3", "mistral", "granite"};
    for (size_t k = 0; k < sizeof archs / sizeof *archs; k++) {
        o = arch_opts(archs[k], "tiny", NULL);
        assert_int_equal(devio_mkmodel_values(&o, name, 100, 16, got, &err), DEVIO_OK);
        assert_memory_equal(got, want, sizeof want);
    }
    o = arch_opts("mistral", "tiny", NULL);
    assert_int_equal(devio_mkmodel_values(&o, "model.layers.0.self_attn.q_norm.weight", 0, 1,
                                          got, &err),
                     DEVIO_E_INVALID);
}

/* ---- counts and presets ---- */

static void test_param_counts(void **state)
{
    (void)state;
    const struct {
        const char *arch, *preset;
        uint64_t params;
        bool tied;
    } want[] = {
        {"qwen2", "tiny", 107072, false},     {"qwen2", "small", 14531040, true},
        {"qwen3", "tiny", 131520, false},     {"qwen3", "small", 14971296, true},
        {"mistral", "tiny", 106816, false},   {"mistral", "small", 23744160, false},
        {"granite", "tiny", 106816, false},   {"granite", "small", 14528160, true},
        {"llama", "tiny", 106816, false},     {"llama", "small", 15191712, true},
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        devio_mkmodel_opts o = arch_opts(want[i].arch, want[i].preset, NULL);
        assert_int_equal(devio_mkmodel_param_count(&o), want[i].params);
        assert_int_equal(o.tie_word_embeddings, want[i].tied);
        assert_int_equal(o.dtype, DEVIO_F32);
    }
    devio_mkmodel_opts o = devio_mkmodel_opts_default();
    devio_error err = {0};
    o.arch = "qwen3";
    assert_int_equal(devio_mkmodel_preset("bench", &o, &err), DEVIO_E_INVALID);
    assert_non_null(strstr(err.message, "'bench' for qwen3 (tiny, small)"));
    o.arch = "qwen";
    assert_int_equal(devio_mkmodel_preset("tiny", &o, &err), DEVIO_E_INVALID);
    assert_non_null(strstr(err.message, "granite"));
}

/* ---- refusals ---- */

static void window_24(devio_mkmodel_opts *o) { o->sliding_window = 24; }
static void emb_mult(devio_mkmodel_opts *o) { o->embedding_multiplier = 12.0; }
static void logits_scale(devio_mkmodel_opts *o) { o->logits_scaling = 8.0; }
static void logits_zero(devio_mkmodel_opts *o) { o->logits_scaling = 0.0; }
static void attn_mult_neg(devio_mkmodel_opts *o) { o->attention_multiplier = -1.0; }
static void rope_llama3(devio_mkmodel_opts *o) { o->rope_scaling = DEVIO_MKMODEL_ROPE_LLAMA3; }
static void rope_factor_only(devio_mkmodel_opts *o) { o->rope_factor = 4.0; }
static void rope_orig_only(devio_mkmodel_opts *o) { o->rope_original_max = 64; }
static void rope_factor_small(devio_mkmodel_opts *o)
{
    o->rope_scaling = DEVIO_MKMODEL_ROPE_LINEAR;
    o->rope_factor = 0.5;
}
static void rope_linear_orig(devio_mkmodel_opts *o)
{
    o->rope_scaling = DEVIO_MKMODEL_ROPE_LINEAR;
    o->rope_original_max = 64;
}
static void yarn_mismatch(devio_mkmodel_opts *o)
{
    o->rope_scaling = DEVIO_MKMODEL_ROPE_YARN;
    o->rope_original_max = 100;
}
static void yarn_factor_3(devio_mkmodel_opts *o)
{
    o->rope_scaling = DEVIO_MKMODEL_ROPE_YARN;
    o->rope_factor = 3.0;
}
static void llama3_factor_huge(devio_mkmodel_opts *o)
{
    o->rope_scaling = DEVIO_MKMODEL_ROPE_LLAMA3;
    o->rope_factor = 1024.0; /* 512 / 1024 < 1 */
}
static void no_bias(devio_mkmodel_opts *o) { o->attention_bias = false; }
static void bias(devio_mkmodel_opts *o) { o->attention_bias = true; }
static void head_dim_32(devio_mkmodel_opts *o) { o->head_dim = 32; }
static void ssm_set(devio_mkmodel_opts *o) { o->ssm_state = 16; }
static void attn_layers_set(devio_mkmodel_opts *o) { o->attn_layers[0] = 1; }

static void test_rejects(void **state)
{
    fixture *fx = *state;
    const bad_case cases[] = {
        {"llama", window_24, "--window belongs to mistral, not llama"},
        {"qwen3", window_24, "--window belongs to mistral, not qwen3"},
        {"bamba", window_24, "--window belongs to mistral, not bamba"},
        {"llama", emb_mult, "belong to granite, not llama"},
        {"mistral", logits_scale, "belong to granite, not mistral"},
        {"mamba2", emb_mult, "belong to granite, not mamba2"},
        {"granite", logits_zero, "logits-scaling must be in (0"},
        {"granite", attn_mult_neg, "attention-multiplier must be in (0"},
        {"bamba", rope_llama3, "not bamba"},
        {"mamba2", rope_factor_only, "not mamba2"},
        {"llama", rope_factor_only, "need --rope-scaling"},
        {"qwen2", rope_orig_only, "need --rope-scaling"},
        {"granite", rope_factor_small, "rope-factor must be in [1"},
        {"mistral", rope_linear_orig, "not linear"},
        {"qwen3", yarn_mismatch, "must equal rope-factor"},
        {"llama", yarn_factor_3, "must equal rope-factor 3"},
        {"llama", llama3_factor_huge, "give --rope-original-max"},
        {"qwen2", no_bias, "qwen2 always has q/k/v biases"},
        {"qwen3", bias, "belongs to llama and qwen2, not qwen3"},
        {"mistral", bias, "not mistral"},
        {"granite", bias, "not granite"},
        {"qwen2", head_dim_32, "qwen2's config has no head_dim"},
        {"granite", head_dim_32, "granite's config has no head_dim"},
        {"qwen3", ssm_set, "not qwen3"},
        {"mistral", attn_layers_set, "belongs to bamba, not mistral"},
    };
    expect_refusals(cases, sizeof cases / sizeof *cases, fx->dir);
    /* What the refusals border on is accepted: a window on mistral, head_dim
     * hidden / heads written out on granite, llama3 with its own original max. */
    devio_mkmodel_opts o = arch_opts("mistral", "tiny", fx->dir);
    o.sliding_window = 4096;
    write_model(&o);
    o = arch_opts("granite", "tiny", fx->dir);
    o.head_dim = 16;
    write_model(&o);
    o = arch_opts("llama", "tiny", fx->dir);
    llama3_factor_huge(&o);
    o.rope_original_max = 8;
    write_model(&o);
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, fx_setup, fx_teardown)
    const struct CMUnitTest tests[] = {
        T(test_llama_config_unchanged), T(test_qwen2_config),   T(test_qwen3_config),
        T(test_mistral_config),         T(test_granite_config), T(test_rope_scaling),
        T(test_qwen3_tensors),          T(test_family_tensors), T(test_determinism),
        T(test_shared_values),          T(test_param_counts),   T(test_rejects),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}
