/* model_bad_test.c - breaks written tiny models on purpose (safetensors, config.json, shard index), one case each.
 * Every case asserts the status and the words of the error; a broken file must never load, crash or leave a model behind. */
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

#include "device/model/model.h"
#include "tests/model_fixture.h"
#include "tools/mkmodel/mkmodel.h"

static void test_bad_truncated(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = tiny_opts(fx->dir);
    write_model(&o);
    const char *p = path_in(fx->dir, "model.safetensors");
    size_t n;
    free(read_all(p, &n));
    assert_int_equal(truncate(p, (off_t)n - 100), 0);
    /* Data is in name order, so the last tensor is the one cut. */
    expect_fail(fx->dir, DEVIO_E_MODEL, "model.safetensors", "'model.norm.weight'");
}

static void test_bad_tiny_file(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = tiny_opts(fx->dir);
    write_model(&o);
    write_all(path_in(fx->dir, "model.safetensors"), "\x05\0\0\0\0", 5);
    expect_fail(fx->dir, DEVIO_E_MODEL, "model.safetensors: file is 5 bytes",
                "'model.embed_tokens.weight'");
}

static void test_bad_header_length(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = tiny_opts(fx->dir);
    write_model(&o);
    const char *p = path_in(fx->dir, "model.safetensors");
    size_t n;
    uint8_t *b = read_all(p, &n);
    uint64_t big = n; /* one more than what follows the length field */
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(big >> (8 * i));
    write_all(p, b, n);
    free(b);
    expect_fail(fx->dir, DEVIO_E_MODEL, "model.safetensors: header length",
                "'model.embed_tokens.weight'");
    /* A length near 2^64 must not wrap any check. */
    b = read_all(p, &n);
    memset(b, 0xff, 8);
    write_all(p, b, n);
    free(b);
    expect_fail(fx->dir, DEVIO_E_MODEL, "model.safetensors: header length",
                "'model.embed_tokens.weight'");
}

static void test_bad_header_not_json(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = tiny_opts(fx->dir);
    write_model(&o);
    const char *p = path_in(fx->dir, "model.safetensors");
    header_set_raw(p, "{\"a\": [1, 2", 11);
    expect_fail(fx->dir, DEVIO_E_MODEL, "model.safetensors: header is not valid JSON",
                "'model.embed_tokens.weight'");
    header_set_raw(p, "[1, 2]", 6);
    expect_fail(fx->dir, DEVIO_E_MODEL, "model.safetensors: header is not a JSON object",
                "'model.embed_tokens.weight'");
    header_set_raw(p, "", 0);
    expect_fail(fx->dir, DEVIO_E_MODEL, "model.safetensors: header is not valid JSON", NULL);
}

static void test_bad_duplicate_key(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = tiny_opts(fx->dir);
    write_model(&o);
    const char *p = path_in(fx->dir, "model.safetensors");
    const char *h = "{\"model.norm.weight\":{\"dtype\":\"F32\",\"shape\":[64],"
                    "\"data_offsets\":[0,256]},\"model.norm.weight\":{\"dtype\":\"F32\","
                    "\"shape\":[64],\"data_offsets\":[256,512]}}";
    header_set_raw(p, h, strlen(h));
    expect_fail(fx->dir, DEVIO_E_MODEL, "model.safetensors", "duplicate");
}

static void set_offsets(const char *path, const char *name, json_int_t a, json_int_t b)
{
    json_t *h = header_load(path);
    json_t *e = json_object_get(h, name);
    assert_non_null(e);
    json_object_set_new(e, "data_offsets", json_pack("[II]", a, b));
    header_store(path, h);
}

static void test_bad_offsets_out_of_range(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = tiny_opts(fx->dir);
    write_model(&o);
    const char *p = path_in(fx->dir, "model.safetensors");
    set_offsets(p, "model.layers.1.mlp.up_proj.weight", 1000000000, 1000000000 + 32768);
    expect_fail(fx->dir, DEVIO_E_MODEL, "model.safetensors",
                "'model.layers.1.mlp.up_proj.weight'");
}

static void test_bad_offsets_reversed(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = tiny_opts(fx->dir);
    write_model(&o);
    const char *p = path_in(fx->dir, "model.safetensors");
    set_offsets(p, "model.norm.weight", 512, 256);
    expect_fail(fx->dir, DEVIO_E_MODEL, "model.safetensors: tensor 'model.norm.weight'",
                "before begin");
}

static void test_bad_offsets_not_integers(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = tiny_opts(fx->dir);
    write_model(&o);
    const char *p = path_in(fx->dir, "model.safetensors");
    json_t *h = header_load(p);
    json_object_set_new(json_object_get(h, "model.norm.weight"), "data_offsets",
                        json_pack("[i]", 0));
    header_store(p, h);
    expect_fail(fx->dir, DEVIO_E_MODEL, "model.safetensors: tensor 'model.norm.weight'",
                "data_offsets");
    h = header_load(p);
    json_object_set_new(json_object_get(h, "model.norm.weight"), "data_offsets",
                        json_pack("[ii]", -4, 252));
    header_store(p, h);
    expect_fail(fx->dir, DEVIO_E_MODEL, "model.safetensors: tensor 'model.norm.weight'",
                "data_offsets");
}

/* ---- layout: the data section is exactly covered, in any header order ---- */

static json_t *offsets_of(json_t *h, const char *name)
{
    json_t *o = json_object_get(json_object_get(h, name), "data_offsets");
    assert_non_null(o);
    return o;
}

static void test_bad_offsets_overlap(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = tiny_opts(fx->dir);
    write_model(&o);
    const char *p = path_in(fx->dir, "model.safetensors");
    /* Two norms of the same size on the same bytes (each range alone is
     * fine): the later one is moved onto the earlier, so the overlap comes
     * before the hole it leaves. */
    const char *n0 = "model.layers.0.input_layernorm.weight",
               *n1 = "model.layers.1.input_layernorm.weight";
    json_t *h = header_load(p);
    if (json_integer_value(json_array_get(offsets_of(h, n0), 0)) >
        json_integer_value(json_array_get(offsets_of(h, n1), 0))) {
        const char *t = n0;
        n0 = n1;
        n1 = t;
    }
    json_object_set(json_object_get(h, n1), "data_offsets", offsets_of(h, n0));
    header_store(p, h);
    expect_fail(fx->dir, DEVIO_E_MODEL, "model.safetensors: tensor 'model.layers.", "overlaps");
    /* A partial overlap: a range moved down by half its length into the
     * tensor before it. */
    write_model(&o);
    h = header_load(p);
    json_t *off = offsets_of(h, n1);
    json_int_t a = json_integer_value(json_array_get(off, 0));
    json_int_t b = json_integer_value(json_array_get(off, 1));
    json_array_set_new(off, 0, json_integer(a - (b - a) / 2));
    json_array_set_new(off, 1, json_integer(b - (b - a) / 2));
    header_store(p, h);
    expect_fail(fx->dir, DEVIO_E_MODEL, "overlaps", n1);
}

static void test_bad_offsets_gap(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = tiny_opts(fx->dir);
    write_model(&o);
    const char *p = path_in(fx->dir, "model.safetensors");
    /* An entry dropped from the header, its bytes left behind. */
    json_t *h = header_load(p);
    json_object_del(h, "model.layers.0.mlp.up_proj.weight");
    header_store(p, h);
    expect_fail(fx->dir, DEVIO_E_MODEL, "model.safetensors: data bytes [", "no holes");
    /* Bytes after the last tensor. */
    write_model(&o);
    assert_int_equal(devio_append_zeros(p, 4), 0);
    expect_fail(fx->dir, DEVIO_E_MODEL, "after the last tensor 'model.norm.weight'", "no holes");
    /* A hole before the first tensor: every range moved up by 4 (the file
     * keeps its size, so the last one runs past the end or overlaps). */
    write_model(&o);
    h = header_load(p);
    const char *key;
    json_t *val;
    json_object_foreach(h, key, val)
    {
        json_t *off = json_object_get(val, "data_offsets");
        if (json_integer_value(json_array_get(off, 0)) == 0) {
            json_array_set_new(off, 0, json_integer(4));
            json_array_set_new(off, 1, json_integer(json_integer_value(json_array_get(off, 1)) + 4));
        }
    }
    header_store(p, h);
    expect_fail(fx->dir, DEVIO_E_MODEL, "model.safetensors", NULL);
}

/* The format leaves the header's order free: swapping where two tensors of
 * one size live (and their bytes) must load the same model. Reversed
 * offsets (end before begin) are refused by test_bad_offsets_reversed. */
static void test_offsets_out_of_header_order(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = tiny_opts(fx->dir);
    write_model(&o);
    devio_model *m = load_ok(fx->dir);
    float want0 = devio_tensor_get(&m->layers[0].attn_norm, 5);
    float want1 = devio_tensor_get(&m->layers[1].attn_norm, 5);
    devio_model_free(m);
    const char *p = path_in(fx->dir, "model.safetensors");
    json_t *h = header_load(p);
    json_t *o0 = json_deep_copy(offsets_of(h, "model.layers.0.input_layernorm.weight"));
    json_t *o1 = json_deep_copy(offsets_of(h, "model.layers.1.input_layernorm.weight"));
    size_t a0 = (size_t)json_integer_value(json_array_get(o0, 0));
    size_t a1 = (size_t)json_integer_value(json_array_get(o1, 0));
    size_t len = (size_t)json_integer_value(json_array_get(o0, 1)) - a0;
    json_object_set_new(json_object_get(h, "model.layers.0.input_layernorm.weight"),
                        "data_offsets", o1);
    json_object_set_new(json_object_get(h, "model.layers.1.input_layernorm.weight"),
                        "data_offsets", o0);
    size_t n;
    uint8_t *b = read_all(p, &n);
    size_t data = 8 + (size_t)header_len(b);
    uint8_t tmp[4096];
    assert_true(len <= sizeof tmp);
    memcpy(tmp, b + data + a0, len);
    memcpy(b + data + a0, b + data + a1, len);
    memcpy(b + data + a1, tmp, len);
    write_all(p, b, n);
    free(b);
    header_store(p, h);
    m = load_ok(fx->dir);
    assert_true(devio_tensor_get(&m->layers[0].attn_norm, 5) == want0);
    assert_true(devio_tensor_get(&m->layers[1].attn_norm, 5) == want1);
    devio_model_free(m);
}

/* ---- non-finite weights ---- */

/* Overwrites element i of tensor `name` with the `size` bytes at v. */
static void poke(const char *path, const char *name, size_t i, const void *v, size_t size)
{
    json_t *h = header_load(path);
    size_t at = (size_t)json_integer_value(json_array_get(offsets_of(h, name), 0));
    json_decref(h);
    size_t n;
    uint8_t *b = read_all(path, &n);
    memcpy(b + 8 + (size_t)header_len(b) + at + i * size, v, size);
    write_all(path, b, n);
    free(b);
}

static void test_bad_nonfinite(void **state)
{
    fixture *fx = *state;
    static const struct {
        devio_dtype dtype;
        uint32_t bits; /* the bad value, in the dtype's own width */
        const char *what;
    } cases[] = {
        {DEVIO_F32, 0x7fc00000u, "holds NaN at element 3 of"},
        {DEVIO_F32, 0xff800000u, "holds an infinity at element 3 of"},
        {DEVIO_F32, 0x7f800001u, "holds NaN at element 3 of"}, /* signalling */
        {DEVIO_BF16, 0x7fc0u, "holds NaN at element 3 of"},
        {DEVIO_BF16, 0x7f80u, "holds an infinity at element 3 of"},
        {DEVIO_F16, 0x7e00u, "holds NaN at element 3 of"},
        {DEVIO_F16, 0xfc00u, "holds an infinity at element 3 of"},
    };
    const char *tensors[] = {"model.layers.1.mlp.down_proj.weight", "model.norm.weight",
                             "model.embed_tokens.weight"};
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        devio_mkmodel_opts o = tiny_opts(fx->dir);
        o.dtype = cases[k].dtype;
        write_model(&o);
        const char *p = path_in(fx->dir, "model.safetensors");
        const char *name = tensors[k % 3];
        size_t es = devio_dtype_size(o.dtype);
        uint16_t h16 = (uint16_t)cases[k].bits;
        poke(p, name, 3, es == 4 ? (const void *)&cases[k].bits : (const void *)&h16, es);
        char want[128];
        snprintf(want, sizeof want, "model.safetensors: tensor '%s' %s", name, cases[k].what);
        expect_fail(fx->dir, DEVIO_E_MODEL, want, "non-finite weights are refused");
        /* The scan may be skipped; the file is otherwise well formed. */
        devio_model_params mp = devio_model_params_default();
        mp.skip_weight_scan = true;
        devio_model *m = NULL;
        devio_error err = {0};
        assert_int_equal(devio_model_load_with(fx->dir, &mp, &m, &err), DEVIO_OK);
        devio_model_free(m);
    }
    /* A big tensor with the bad value past the first scan block. */
    devio_mkmodel_opts o = tiny_opts(fx->dir);
    write_model(&o);
    const char *p = path_in(fx->dir, "model.safetensors");
    const float inf = 1.0f / 0.0f;
    poke(p, "model.embed_tokens.weight", 5000, &inf, 4);
    expect_fail(fx->dir, DEVIO_E_MODEL, "'model.embed_tokens.weight' holds an infinity at element 5000",
                NULL);
}

static void test_bad_size_mismatch(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = tiny_opts(fx->dir);
    write_model(&o);
    const char *p = path_in(fx->dir, "model.safetensors");
    json_t *h = header_load(p);
    json_object_set_new(json_object_get(h, "model.norm.weight"), "shape", json_pack("[i]", 65));
    header_store(p, h);
    expect_fail(fx->dir, DEVIO_E_MODEL, "model.safetensors: tensor 'model.norm.weight'",
                "need 260");
    /* A shape whose product overflows 64 bits is refused, not wrapped. */
    h = header_load(p);
    json_object_set_new(json_object_get(h, "model.norm.weight"), "shape",
                        json_pack("[III]", (json_int_t)1 << 40, (json_int_t)1 << 40, 4));
    header_store(p, h);
    expect_fail(fx->dir, DEVIO_E_MODEL, "model.safetensors: tensor 'model.norm.weight'",
                "too large");
}

static void test_bad_dtype(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = tiny_opts(fx->dir);
    write_model(&o);
    const char *p = path_in(fx->dir, "model.safetensors");
    /* I64 with a shape that keeps the byte count: only the dtype is wrong. */
    json_t *h = header_load(p);
    json_t *e = json_object_get(h, "model.norm.weight");
    json_object_set_new(e, "dtype", json_string("I64"));
    json_object_set_new(e, "shape", json_pack("[i]", 32));
    header_store(p, h);
    expect_fail(fx->dir, DEVIO_E_MODEL, "model.safetensors: tensor 'model.norm.weight'",
                "dtype I64");
    h = header_load(p);
    json_object_set_new(json_object_get(h, "model.norm.weight"), "dtype", json_string("Q4_K"));
    header_store(p, h);
    expect_fail(fx->dir, DEVIO_E_MODEL, "model.safetensors: tensor 'model.norm.weight'",
                "unknown dtype 'Q4_K'");
}

static void test_bad_shape(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = tiny_opts(fx->dir);
    write_model(&o);
    const char *p = path_in(fx->dir, "model.safetensors");
    /* Same element count, transposed: only the shape check can see it. */
    json_t *h = header_load(p);
    json_object_set_new(json_object_get(h, "model.layers.0.self_attn.o_proj.weight"), "shape",
                        json_pack("[ii]", 32, 128));
    header_store(p, h);
    expect_fail(fx->dir, DEVIO_E_MODEL,
                "model.safetensors: tensor 'model.layers.0.self_attn.o_proj.weight'",
                "shape [32, 128], expected [64, 64]");
}

static void test_bad_missing_tensor(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = tiny_opts(fx->dir);
    write_model(&o);
    const char *p = path_in(fx->dir, "model.safetensors");
    json_t *h = header_load(p);
    json_t *e = json_incref(json_object_get(h, "model.layers.1.mlp.up_proj.weight"));
    json_object_del(h, "model.layers.1.mlp.up_proj.weight");
    json_object_set_new(h, "model.layers.1.mlp.up_proj.weight_", e);
    header_store(p, h);
    expect_fail(fx->dir, DEVIO_E_MODEL,
                "model.safetensors: tensor 'model.layers.1.mlp.up_proj.weight'", "missing");
}

static void test_bad_missing_lm_head(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = tiny_opts(fx->dir);
    write_model(&o);
    const char *p = path_in(fx->dir, "model.safetensors");
    tensor_drop(p, "lm_head.weight");
    expect_fail(fx->dir, DEVIO_E_MODEL, "model.safetensors: tensor 'lm_head.weight'",
                "tie_word_embeddings false");
    /* The same file is a valid tied model. */
    file_sub(path_in(fx->dir, "config.json"), "\"tie_word_embeddings\": false",
             "\"tie_word_embeddings\": true");
    devio_model *m = load_ok(fx->dir);
    assert_ptr_equal(m->lm_head.data, m->embed.data);
    devio_model_free(m);
}

static void test_bad_bias_missing(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = tiny_opts(fx->dir);
    write_model(&o);
    file_sub(path_in(fx->dir, "config.json"), "\"attention_bias\": false",
             "\"attention_bias\": true");
    /* Llama's attention_bias biases o_proj as well, which devio does not model. */
    expect_fail(fx->dir, DEVIO_E_UNSUPPORTED, "config.json", "o_proj");
}

static void test_bad_unknown_arch(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = tiny_opts(fx->dir);
    write_model(&o);
    file_sub(path_in(fx->dir, "config.json"), "LlamaForCausalLM", "GPTNeoXForCausalLM");
    expect_fail(fx->dir, DEVIO_E_MODEL, "config.json",
                "unknown architecture 'GPTNeoXForCausalLM'");
}

static void test_bad_missing_config(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = tiny_opts(fx->dir);
    write_model(&o);
    assert_int_equal(unlink(path_in(fx->dir, "config.json")), 0);
    expect_fail(fx->dir, DEVIO_E_MODEL, "config.json", fx->dir);
    expect_fail("/nonexistent/devio/model", DEVIO_E_MODEL, "config.json", NULL);
}

static void test_bad_config_json(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = tiny_opts(fx->dir);
    write_model(&o);
    const char *cfg = path_in(fx->dir, "config.json");
    file_sub(cfg, "\"vocab_size\": 256", "\"vocab_size\": 256,");
    expect_fail(fx->dir, DEVIO_E_MODEL, "config.json: not valid JSON", NULL);
}

static void test_bad_config_values(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = tiny_opts(fx->dir);
    write_model(&o);
    const char *cfg = path_in(fx->dir, "config.json");
    static const struct {
        const char *from, *to, *field;
    } cases[] = {
        {"\"hidden_size\": 64", "\"hidden_size\": 0", "'hidden_size'"},
        {"\"vocab_size\": 256", "\"vocab_size\": 1000000000", "'vocab_size'"},
        {"\"vocab_size\": 256", "\"vocab_size\": -1", "'vocab_size'"},
        {"\"vocab_size\": 256", "\"vocab_size\": \"256\"", "'vocab_size'"},
        {"\"num_hidden_layers\": 2", "\"num_hidden_layers\": 100000", "'num_hidden_layers'"},
        {"\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3", "num_key_value_heads 3"},
        {"\"head_dim\": 16", "\"head_dim\": 15", "head_dim 15"},
        {"\"num_attention_heads\": 4", "\"num_attention_heads\": 0", "'num_attention_heads'"},
        {"\"rms_norm_eps\": 1e-05", "\"rms_norm_eps\": -1e-05", "'rms_norm_eps'"},
        {"\"rope_theta\": 10000.0", "\"rope_theta\": 0.0", "'rope_theta'"},
        {"\"rope_theta\": 10000.0", "\"rope_theta\": NaN", "'rope_theta'"},
        {"\"rms_norm_eps\": 1e-05", "\"rms_norm_eps\": Infinity", "'rms_norm_eps'"},
        {"\"tie_word_embeddings\": false", "\"tie_word_embeddings\": 0",
         "'tie_word_embeddings'"},
        {"\"intermediate_size\": 128,", "", "'intermediate_size' is missing"},
        {"\"architectures\": [\"LlamaForCausalLM\"]", "\"architectures\": []", "architectures"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        file_sub(cfg, cases[i].from, cases[i].to);
        expect_fail(fx->dir, DEVIO_E_MODEL, "config.json", cases[i].field);
        file_sub(cfg, cases[i].to[0] ? cases[i].to : "\"max_position_embeddings\"",
                 cases[i].to[0] ? cases[i].from
                                : "\"intermediate_size\": 128, \"max_position_embeddings\"");
    }
    /* heads not dividing hidden when head_dim is absent */
    file_sub(cfg, "\"head_dim\": 16,", "");
    file_sub(cfg, "\"num_attention_heads\": 4", "\"num_attention_heads\": 6");
    file_sub(cfg, "\"num_key_value_heads\": 2", "\"num_key_value_heads\": 6");
    expect_fail(fx->dir, DEVIO_E_MODEL, "config.json", "hidden_size 64 is not a multiple");
}

/* Token ids a client is told (GET /v1/model) are ids of the vocabulary;
 * a negative one stays "none", as older configs write it. */
static void test_bad_token_ids(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = tiny_opts(fx->dir);
    write_model(&o);
    const char *cfg = path_in(fx->dir, "config.json");
    file_sub(cfg, "\"bos_token_id\": 1", "\"bos_token_id\": 65537");
    expect_fail(fx->dir, DEVIO_E_MODEL,
                "config.json: field 'bos_token_id' = 65537 is not a token of the vocabulary "
                "(0 to 255)",
                NULL);
    file_sub(cfg, "\"bos_token_id\": 65537", "\"bos_token_id\": 1");
    file_sub(cfg, "\"eos_token_id\": 2", "\"eos_token_id\": [2, 256]");
    expect_fail(fx->dir, DEVIO_E_MODEL, "config.json: field 'eos_token_id' = 256 is not a token",
                NULL);
    file_sub(cfg, "\"eos_token_id\": [2, 256]", "\"eos_token_id\": 2, \"pad_token_id\": 300");
    expect_fail(fx->dir, DEVIO_E_MODEL, "config.json: field 'pad_token_id' = 300", NULL);
    file_sub(cfg, "\"pad_token_id\": 300", "\"pad_token_id\": -1");
    devio_model *m = load_ok(fx->dir);
    assert_int_equal(m->text.pad_id, -1);
    assert_int_equal(m->text.eos_id, 2);
    devio_model_free(m);
}

static void test_bad_config_unsupported(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = tiny_opts(fx->dir);
    write_model(&o);
    const char *cfg = path_in(fx->dir, "config.json");
    file_sub(cfg, "\"rope_scaling\": null",
             "\"rope_scaling\": {\"rope_type\": \"dynamic\", \"factor\": 8.0}");
    expect_fail(fx->dir, DEVIO_E_UNSUPPORTED, "config.json: rope_scaling of type 'dynamic'",
                "not supported");
    file_sub(cfg, "{\"rope_type\": \"dynamic\", \"factor\": 8.0}", "null");
    file_sub(cfg, "\"silu\"", "\"gelu\"");
    expect_fail(fx->dir, DEVIO_E_UNSUPPORTED, "config.json: hidden_act 'gelu'", NULL);
    file_sub(cfg, "\"gelu\"", "\"silu\"");
    file_sub(cfg, "\"mlp_bias\": false", "\"mlp_bias\": true");
    expect_fail(fx->dir, DEVIO_E_UNSUPPORTED, "config.json: mlp_bias", NULL);
}

static void test_bad_no_weights(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = tiny_opts(fx->dir);
    write_model(&o);
    assert_int_equal(unlink(path_in(fx->dir, "model.safetensors")), 0);
    expect_fail(fx->dir, DEVIO_E_MODEL, "model.safetensors", "model.safetensors.index.json");
}

static void test_bad_shard_missing(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = tiny_opts(fx->dir);
    o.shards = 3;
    write_model(&o);
    assert_int_equal(unlink(path_in(fx->dir, "model-00002-of-00003.safetensors")), 0);
    /* Names the shard and the first tensor (in name order) it should hold. */
    json_t *idx = json_load_file(path_in(fx->dir, "model.safetensors.index.json"), 0, NULL);
    assert_non_null(idx);
    const char *first = NULL, *key;
    json_t *val;
    json_object_foreach(json_object_get(idx, "weight_map"), key, val)
    {
        if (strcmp(json_string_value(val), "model-00002-of-00003.safetensors") == 0 &&
            (!first || strcmp(key, first) < 0))
            first = key;
    }
    assert_non_null(first);
    char want[160];
    snprintf(want, sizeof want, "'%s'", first);
    expect_fail(fx->dir, DEVIO_E_MODEL, "model-00002-of-00003.safetensors: cannot open", want);
    json_decref(idx);
}

static void test_bad_shard_lacks_tensor(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = tiny_opts(fx->dir);
    o.shards = 2;
    write_model(&o);
    const char *ip = path_in(fx->dir, "model.safetensors.index.json");
    json_t *idx = json_load_file(ip, 0, NULL);
    assert_non_null(idx);
    json_t *wm = json_object_get(idx, "weight_map");
    const char *was = json_string_value(json_object_get(wm, "model.norm.weight"));
    const char *other = strcmp(was, "model-00001-of-00002.safetensors") == 0
                            ? "model-00002-of-00002.safetensors"
                            : "model-00001-of-00002.safetensors";
    json_object_set_new(wm, "model.norm.weight", json_string(other));
    assert_int_equal(json_dump_file(idx, ip, JSON_INDENT(2)), 0);
    json_decref(idx);
    expect_fail(fx->dir, DEVIO_E_MODEL, "model.safetensors.index.json: tensor 'model.norm.weight'",
                other);
}

static void test_bad_index(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = tiny_opts(fx->dir);
    o.shards = 2;
    write_model(&o);
    const char *ip = path_in(fx->dir, "model.safetensors.index.json");
    json_t *idx = json_load_file(ip, 0, NULL);
    json_t *wm = json_object_get(idx, "weight_map");
    json_object_set_new(wm, "model.norm.weight", json_string("../model-00001-of-00002.safetensors"));
    assert_int_equal(json_dump_file(idx, ip, JSON_INDENT(2)), 0);
    expect_fail(fx->dir, DEVIO_E_MODEL, "model.safetensors.index.json: tensor 'model.norm.weight'",
                "not a file name");
    json_object_del(wm, "model.norm.weight");
    assert_int_equal(json_dump_file(idx, ip, JSON_INDENT(2)), 0);
    expect_fail(fx->dir, DEVIO_E_MODEL, "model.safetensors.index.json: tensor 'model.norm.weight'",
                "missing from weight_map");
    json_object_del(idx, "weight_map");
    assert_int_equal(json_dump_file(idx, ip, JSON_INDENT(2)), 0);
    expect_fail(fx->dir, DEVIO_E_MODEL, "model.safetensors.index.json", "weight_map");
    json_decref(idx);
}

/* Every malformed header must be refused without crashing: flip each byte
 * of the header of a small model in turn. */
static void test_bad_header_bytes(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = tiny_opts(fx->dir);
    o.n_layers = 1;
    write_model(&o);
    const char *p = path_in(fx->dir, "model.safetensors");
    size_t n;
    uint8_t *orig = read_all(p, &n);
    size_t hl = (size_t)header_len(orig);
    int refused = 0;
    for (size_t i = 0; i < 8 + hl; i += 3) {
        uint8_t *b = malloc(n);
        memcpy(b, orig, n);
        b[i] = (uint8_t)(b[i] ^ (i < 8 ? 0x40 : 0x0b));
        write_all(p, b, n);
        free(b);
        devio_model *m = NULL;
        devio_error err = {0};
        devio_status st = devio_model_load(fx->dir, &m, &err);
        if (st == DEVIO_OK) {
            assert_non_null(m);
            devio_model_free(m);
        } else {
            assert_null(m);
            assert_int_equal(err.status, st);
            assert_true(err.message[0] != '\0');
            refused++;
        }
    }
    assert_true(refused > 0);
    free(orig);
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, fx_setup, fx_teardown)
    const struct CMUnitTest tests[] = {
        T(test_bad_truncated),
        T(test_bad_tiny_file),
        T(test_bad_header_length),
        T(test_bad_header_not_json),
        T(test_bad_duplicate_key),
        T(test_bad_offsets_out_of_range),
        T(test_bad_offsets_reversed),
        T(test_bad_offsets_not_integers),
        T(test_bad_offsets_overlap),
        T(test_bad_offsets_gap),
        T(test_offsets_out_of_header_order),
        T(test_bad_nonfinite),
        T(test_bad_size_mismatch),
        T(test_bad_dtype),
        T(test_bad_shape),
        T(test_bad_missing_tensor),
        T(test_bad_missing_lm_head),
        T(test_bad_bias_missing),
        T(test_bad_unknown_arch),
        T(test_bad_missing_config),
        T(test_bad_config_json),
        T(test_bad_config_values),
        T(test_bad_config_unsupported),
        T(test_bad_token_ids),
        T(test_bad_no_weights),
        T(test_bad_shard_missing),
        T(test_bad_shard_lacks_tensor),
        T(test_bad_index),
        T(test_bad_header_bytes),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}
