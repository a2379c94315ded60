/* model_test.c - writes tiny models with devio_mkmodel and loads them back: every value, dtype, layout and config variant.
 * Every test asserts a status, a value or a message; none may pass by printing. libm here is only an oracle. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "device/model/model.h"
#include "device/numerics/numerics.h"
#include "tests/model_fixture.h"
#include "tools/mkmodel/mkmodel.h"

/* ---- oracles (double precision, libm allowed in tests) ---- */

/* Round v to `bits` significant bits, ties to even, with a smallest ulp of
 * 2^min_exp (subnormals); nearbyint uses the default round-to-nearest-even. */
static double oracle_round(double v, int bits, int min_exp)
{
    if (v == 0.0 || isinf(v) || isnan(v))
        return v;
    int e;
    frexp(v, &e);
    int ue = e - bits;
    if (ue < min_exp)
        ue = min_exp;
    double ulp = ldexp(1.0, ue);
    return nearbyint(v / ulp) * ulp;
}

static float oracle_bf16(float v)
{
    return (float)oracle_round(v, 8, -133);
}

static float oracle_f16(float v)
{
    double r = oracle_round(v, 11, -24);
    if (fabs(r) > 65504.0)
        return v < 0 ? -INFINITY : INFINITY;
    return (float)r;
}

static float oracle_narrow(devio_dtype t, float v)
{
    return t == DEVIO_F32 ? v : t == DEVIO_BF16 ? oracle_bf16(v) : oracle_f16(v);
}

static bool same_bits(float a, float b)
{
    return memcmp(&a, &b, sizeof a) == 0;
}

/* ---- checking a loaded model against the writer ---- */

static void check_tensor(const devio_mkmodel_opts *o, const devio_tensor *t, const char *name,
                         uint32_t ndim, uint64_t s0, uint64_t s1)
{
    assert_non_null(t->data);
    assert_int_equal(t->dtype, o->dtype);
    assert_int_equal(t->ndim, ndim);
    assert_int_equal(t->shape[0], s0);
    if (ndim == 2)
        assert_int_equal(t->shape[1], s1);
    assert_int_equal((uintptr_t)t->data % devio_dtype_size(t->dtype), 0);
    size_t n = (size_t)(ndim == 2 ? s0 * s1 : s0);
    float *v = malloc(n * sizeof *v);
    assert_non_null(v);
    devio_error err = {0};
    assert_int_equal(devio_mkmodel_values(o, name, 0, n, v, &err), DEVIO_OK);
    for (size_t i = 0; i < n; i++) {
        float want = oracle_narrow(o->dtype, v[i]);
        float got = devio_tensor_get(t, i);
        if (!same_bits(got, want))
            print_error("%s[%zu]: got %a want %a (raw %a)\n", name, i, got, want, v[i]);
        assert_true(same_bits(got, want));
    }
    free(v);
}

static void check_model(const devio_mkmodel_opts *o, const devio_model *m)
{
    const devio_model_config *c = &m->cfg;
    const uint32_t hd = o->head_dim ? o->head_dim : o->hidden_size / o->n_heads;
    assert_string_equal(c->architecture, o->attention_bias ? "Qwen2ForCausalLM" : "LlamaForCausalLM");
    assert_int_equal(c->vocab_size, o->vocab_size);
    assert_int_equal(c->hidden_size, o->hidden_size);
    assert_int_equal(c->intermediate_size, o->intermediate_size);
    assert_int_equal(c->n_layers, o->n_layers);
    assert_int_equal(c->n_heads, o->n_heads);
    assert_int_equal(c->n_kv_heads, o->n_kv_heads);
    assert_int_equal(c->head_dim, hd);
    assert_int_equal(c->max_position_embeddings, o->max_position_embeddings);
    assert_true(c->rope_theta == (float)o->rope_theta);
    assert_true(c->rms_norm_eps == (float)o->rms_norm_eps);
    assert_int_equal(!!c->tie_word_embeddings, o->tie_word_embeddings);
    assert_int_equal(!!c->attention_bias, o->attention_bias);

    const uint64_t V = o->vocab_size, d = o->hidden_size, f = o->intermediate_size;
    const uint64_t q = (uint64_t)o->n_heads * hd, kv = (uint64_t)o->n_kv_heads * hd;
    check_tensor(o, &m->embed, "model.embed_tokens.weight", 2, V, d);
    check_tensor(o, &m->norm, "model.norm.weight", 1, d, 0);
    if (o->tie_word_embeddings) {
        assert_ptr_equal(m->lm_head.data, m->embed.data);
        assert_int_equal(m->lm_head.shape[0], V);
    } else {
        assert_ptr_not_equal(m->lm_head.data, m->embed.data);
        check_tensor(o, &m->lm_head, "lm_head.weight", 2, V, d);
    }
    char nm[128];
#define CHECK(field, suffix, nd, a, b)                                     \
    do {                                                                   \
        snprintf(nm, sizeof nm, "model.layers.%u." suffix, i);             \
        check_tensor(o, &ly->field, nm, nd, a, b);                         \
    } while (0)
    for (uint32_t i = 0; i < o->n_layers; i++) {
        const devio_layer *ly = &m->layers[i];
        CHECK(attn_norm, "input_layernorm.weight", 1, d, 0);
        CHECK(wq, "self_attn.q_proj.weight", 2, q, d);
        CHECK(wk, "self_attn.k_proj.weight", 2, kv, d);
        CHECK(wv, "self_attn.v_proj.weight", 2, kv, d);
        CHECK(wo, "self_attn.o_proj.weight", 2, d, q);
        CHECK(ffn_norm, "post_attention_layernorm.weight", 1, d, 0);
        CHECK(w_gate, "mlp.gate_proj.weight", 2, f, d);
        CHECK(w_up, "mlp.up_proj.weight", 2, f, d);
        CHECK(w_down, "mlp.down_proj.weight", 2, d, f);
        if (o->attention_bias) {
            CHECK(bq, "self_attn.q_proj.bias", 1, q, 0);
            CHECK(bk, "self_attn.k_proj.bias", 1, kv, 0);
            CHECK(bv, "self_attn.v_proj.bias", 1, kv, 0);
        } else {
            assert_null(ly->bq.data);
            assert_null(ly->bk.data);
            assert_null(ly->bv.data);
        }
    }
#undef CHECK
}

static void roundtrip(const devio_mkmodel_opts *o)
{
    write_model(o);
    devio_model *m = load_ok(o->out_dir);
    check_model(o, m);
    devio_model_free(m);
}

/* ---- good models ---- */

static void test_load_f32(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = tiny_opts(fx->dir);
    roundtrip(&o);
}

static void test_load_f16(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = tiny_opts(fx->dir);
    o.dtype = DEVIO_F16;
    roundtrip(&o);
}

static void test_load_bf16(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = tiny_opts(fx->dir);
    o.dtype = DEVIO_BF16;
    roundtrip(&o);
}

static void test_load_tied(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = tiny_opts(fx->dir);
    o.tie_word_embeddings = true;
    roundtrip(&o);
    /* The file really has no lm_head: tying is what supplies it. */
    json_t *h = header_load(path_in(fx->dir, "model.safetensors"));
    assert_null(json_object_get(h, "lm_head.weight"));
    json_decref(h);
}

static void test_load_bias(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = tiny_opts(fx->dir);
    o.attention_bias = true;
    o.dtype = DEVIO_BF16;
    roundtrip(&o);
}

static void test_load_sharded(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = tiny_opts(fx->dir);
    o.shards = 3;
    o.dtype = DEVIO_F16;
    roundtrip(&o);
    assert_int_equal(access(path_in(fx->dir, "model.safetensors"), F_OK), -1);
    assert_int_equal(access(path_in(fx->dir, "model-00003-of-00003.safetensors"), F_OK), 0);
    /* Writing single over sharded removes the index, so the loader cannot
     * pick a stale layout. */
    o.shards = 1;
    roundtrip(&o);
    assert_int_equal(access(path_in(fx->dir, "model.safetensors.index.json"), F_OK), -1);
}

static void test_load_non_square_gqa(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = tiny_opts(fx->dir);
    o.hidden_size = 48;
    o.n_heads = 6;
    o.n_kv_heads = 3;
    o.head_dim = 10; /* h*hd = 60 != hidden: q_proj is [60, 48] */
    o.intermediate_size = 40;
    o.vocab_size = 100;
    o.n_layers = 3;
    o.rope_theta = 500000.0;
    o.rms_norm_eps = 1e-6;
    roundtrip(&o);
}

/* A tensor stored at an unaligned offset is copied, not refused. */
static void test_load_unaligned(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = tiny_opts(fx->dir);
    write_model(&o);
    const char *p = path_in(fx->dir, "model.safetensors");
    json_t *h = header_load(p);
    char *s = json_dumps(h, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(h);
    size_t n = strlen(s);
    /* Trailing whitespace is legal JSON; pick a length that shifts the data
     * section off every 4-byte boundary. */
    char *pad = malloc(n + 8);
    memcpy(pad, s, n);
    size_t hl = n;
    while ((8 + hl) % 4 != 1)
        pad[hl++] = ' ';
    header_set_raw(p, pad, hl);
    free(pad);
    free(s);
    devio_model *m = load_ok(fx->dir);
    check_model(&o, m);
    devio_model_free(m);
}

static void test_param_counts(void **state)
{
    (void)state;
    devio_mkmodel_opts o = devio_mkmodel_opts_default();
    assert_int_equal(devio_mkmodel_param_count(&o), 106816);
    assert_int_equal(devio_mkmodel_preset("small", &o, NULL), DEVIO_OK);
    assert_int_equal(devio_mkmodel_param_count(&o), 15191712);
    assert_int_equal(devio_mkmodel_preset("bench", &o, NULL), DEVIO_OK);
    assert_int_equal(devio_mkmodel_param_count(&o), 134105856);
    assert_int_equal(o.dtype, DEVIO_BF16);
    devio_error err = {0};
    assert_int_equal(devio_mkmodel_preset("huge", &o, &err), DEVIO_E_INVALID);
    assert_non_null(strstr(err.message, "huge"));
}

static void test_writer_rejects(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = tiny_opts(fx->dir);
    devio_error err = {0};
    o.arch = "gpt2";
    assert_int_equal(devio_mkmodel_write(&o, &err), DEVIO_E_INVALID);
    o = tiny_opts(fx->dir);
    o.n_kv_heads = 3;
    assert_int_equal(devio_mkmodel_write(&o, &err), DEVIO_E_INVALID);
    o = tiny_opts(fx->dir);
    o.shards = 1000;
    assert_int_equal(devio_mkmodel_write(&o, &err), DEVIO_E_INVALID);
    o = tiny_opts(fx->dir);
    o.hidden_size = 0;
    assert_int_equal(devio_mkmodel_write(&o, &err), DEVIO_E_INVALID);
    /* Nothing was written by any refused call. */
    assert_int_equal(access(path_in(fx->dir, "config.json"), F_OK), -1);
}

static void test_determinism(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = tiny_opts(fx->dir);
    o.dtype = DEVIO_BF16;
    expect_deterministic(o, fx->dir, "llama");
}

/* Shards hold the same bytes per tensor as a single file: values depend on
 * (seed, name, index) only. */
static void test_shards_same_values(void **state)
{
    fixture *fx = *state;
    char a[128], b[128];
    snprintf(a, sizeof a, "%s/a", fx->dir);
    snprintf(b, sizeof b, "%s/b", fx->dir);
    devio_mkmodel_opts o = tiny_opts(a);
    write_model(&o);
    o.out_dir = b;
    o.shards = 4;
    write_model(&o);
    devio_model *m1 = load_ok(a), *m2 = load_ok(b);
    size_t n = (size_t)(m1->layers[1].w_down.shape[0] * m1->layers[1].w_down.shape[1]);
    assert_memory_equal(m1->layers[1].w_down.data, m2->layers[1].w_down.data, n * 4);
    assert_memory_equal(m1->lm_head.data, m2->lm_head.data, 256 * 64 * 4);
    devio_model_free(m1);
    devio_model_free(m2);
}

/* ---- conversions ---- */

static void test_widen_every_f16_bf16(void **state)
{
    (void)state;
    uint16_t h[65536];
    for (uint32_t i = 0; i < 65536; i++)
        h[i] = (uint16_t)i;
    devio_tensor t = {.data = h, .dtype = DEVIO_F16, .ndim = 1, .shape = {65536, 0}};
    for (uint32_t i = 0; i < 65536; i++) {
        uint32_t e = (i >> 10) & 31, mant = i & 1023;
        double sign = (i & 0x8000) ? -1.0 : 1.0;
        float got = devio_tensor_get(&t, i);
        if (e == 31) {
            assert_true(mant ? isnan(got) : isinf(got));
            assert_int_equal(signbit(got) != 0, (i & 0x8000) != 0);
            continue;
        }
        double want = e == 0 ? ldexp((double)mant, -24) : ldexp(1024.0 + mant, (int)e - 25);
        if (!same_bits(got, (float)(sign * want)))
            print_error("f16 %04x: got %a want %a\n", i, got, sign * want);
        assert_true(same_bits(got, (float)(sign * want)));
    }
    t.dtype = DEVIO_BF16;
    for (uint32_t i = 0; i < 65536; i++) {
        float got = devio_tensor_get(&t, i);
        uint32_t bits = i << 16;
        float want;
        memcpy(&want, &bits, 4);
        assert_true(same_bits(got, want) || (isnan(got) && isnan(want)));
    }
}

static float from_bits(uint32_t b)
{
    float f;
    memcpy(&f, &b, 4);
    return f;
}

static void test_narrow_rne(void **state)
{
    (void)state;
    /* Hand-picked ties and edges. */
    assert_int_equal(devio_f32_to_bf16_rne(from_bits(0x3f808000u)), 0x3f80); /* tie, even */
    assert_int_equal(devio_f32_to_bf16_rne(from_bits(0x3f818000u)), 0x3f82); /* tie, odd */
    assert_int_equal(devio_f32_to_bf16_rne(from_bits(0x3f808001u)), 0x3f81);
    assert_int_equal(devio_f32_to_bf16_rne(from_bits(0x7f7fffffu)), 0x7f80); /* to inf */
    assert_int_equal(devio_f32_to_bf16_rne(from_bits(0x7fc00000u)) & 0x7fc0, 0x7fc0);
    assert_int_equal(devio_f32_to_f16_rne(1.0f), 0x3c00);
    assert_int_equal(devio_f32_to_f16_rne(65504.0f), 0x7bff);
    assert_int_equal(devio_f32_to_f16_rne(65519.99f), 0x7bff);
    assert_int_equal(devio_f32_to_f16_rne(65520.0f), 0x7c00);
    assert_int_equal(devio_f32_to_f16_rne(-INFINITY), 0xfc00);
    assert_int_equal(devio_f32_to_f16_rne(0x1p-24f), 0x0001);
    assert_int_equal(devio_f32_to_f16_rne(0x1p-25f), 0x0000);            /* tie to 0 */
    assert_int_equal(devio_f32_to_f16_rne(0x1.8p-24f), 0x0002);          /* tie to 2 */
    assert_int_equal(devio_f32_to_f16_rne(0x1.ffcp-15f), 0x0400);        /* to normal */
    assert_int_equal(devio_f32_to_f16_rne(-0.0f), 0x8000);
    assert_true((devio_f32_to_f16_rne(NAN) & 0x7c00) == 0x7c00 &&
                (devio_f32_to_f16_rne(NAN) & 0x3ff) != 0);

    /* A sweep of random finite floats against the double-precision oracle,
     * with widening as the inverse. */
    uint64_t x = 0x123456789abcdefull;
    uint16_t h;
    devio_tensor t = {.data = &h, .ndim = 1, .shape = {1, 0}};
    for (int i = 0; i < 400000; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        uint32_t bits = (uint32_t)x;
        /* Concentrate on exponents around the f16 range. */
        bits = (bits & 0x807fffffu) | ((uint32_t)(96 + (x >> 40) % 48) << 23);
        float v = from_bits(bits);
        h = devio_f32_to_f16_rne(v);
        t.dtype = DEVIO_F16;
        float got = devio_tensor_get(&t, 0);
        if (!same_bits(got, oracle_f16(v)))
            print_error("f16 of %a: got %a want %a\n", v, got, oracle_f16(v));
        assert_true(same_bits(got, oracle_f16(v)));
        h = devio_f32_to_bf16_rne(v);
        t.dtype = DEVIO_BF16;
        got = devio_tensor_get(&t, 0);
        assert_true(same_bits(got, oracle_bf16(v)));
    }
}

static void test_dtype_names(void **state)
{
    (void)state;
    assert_int_equal(devio_dtype_size(DEVIO_F32), 4);
    assert_int_equal(devio_dtype_size(DEVIO_F16), 2);
    assert_int_equal(devio_dtype_size(DEVIO_BF16), 2);
    assert_string_equal(devio_dtype_str(DEVIO_F32), "F32");
    assert_string_equal(devio_dtype_str(DEVIO_F16), "F16");
    assert_string_equal(devio_dtype_str(DEVIO_BF16), "BF16");
}

/* ---- config variants ---- */

static void test_qwen2_bias_default(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = tiny_opts(fx->dir);
    o.attention_bias = true;
    write_model(&o);
    /* devio-mkmodel writes q/k/v biases as Qwen2 (Llama's attention_bias would bias o_proj too). */
    const char *cfg = path_in(fx->dir, "config.json");
    file_sub(cfg, "\"attention_bias\": true,", "");
    devio_model *m = load_ok(fx->dir);
    assert_string_equal(m->cfg.architecture, "Qwen2ForCausalLM");
    assert_true(m->cfg.attention_bias);
    assert_non_null(m->layers[1].bk.data);
    assert_int_equal(m->layers[1].bk.shape[0], 32);
    devio_model_free(m);
}

static void test_qwen2_without_bias_tensors(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = tiny_opts(fx->dir);
    write_model(&o);
    const char *cfg = path_in(fx->dir, "config.json");
    file_sub(cfg, "LlamaForCausalLM", "Qwen2ForCausalLM");
    file_sub(cfg, "\"attention_bias\": false,", "");
    expect_fail(fx->dir, DEVIO_E_MODEL, "model.safetensors",
                "'model.layers.0.self_attn.q_proj.bias' is missing");
    /* Qwen2 always biases q/k/v, as transformers does: a config key cannot switch it off. */
    file_sub(cfg, "\"attention_dropout\"", "\"attention_bias\": false, \"attention_dropout\"");
    expect_fail(fx->dir, DEVIO_E_MODEL, "model.safetensors",
                "'model.layers.0.self_attn.q_proj.bias' is missing");
}

static void test_mistral_window_and_defaults(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = tiny_opts(fx->dir);
    o.n_kv_heads = o.n_heads;
    write_model(&o);
    const char *cfg = path_in(fx->dir, "config.json");
    file_sub(cfg, "LlamaForCausalLM", "MistralForCausalLM");
    file_sub(cfg, "\"num_key_value_heads\": 4,", "\"sliding_window\": 128,");
    file_sub(cfg, "\"head_dim\": 16,", "");
    file_sub(cfg, "\"rms_norm_eps\": 1e-05,", "");
    file_sub(cfg, "\"rope_theta\": 10000.0,", "");
    devio_model *m = load_ok(fx->dir);
    assert_int_equal(m->cfg.n_kv_heads, 4);
    assert_int_equal(m->cfg.head_dim, 16);
    /* The window is kept (attention reads the last 128 keys, rule 6); the
     * positions served are the model's. */
    assert_int_equal(m->cfg.sliding_window, 128);
    assert_int_equal(m->cfg.max_position_embeddings, 512);
    assert_true(m->cfg.rms_norm_eps == 1e-6f);
    assert_true(m->cfg.rope_theta == 10000.0f);
    devio_model_free(m);
}

/* ---- the file on disk changes after load ---- */

/* Every byte of `path` inverted, in place: same inode, same size. */
static void overwrite_in_place(const char *path)
{
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    struct stat sb;
    assert_int_equal(fstat(fd, &sb), 0);
    uint8_t *b = malloc((size_t)sb.st_size);
    assert_non_null(b);
    assert_int_equal(pread(fd, b, (size_t)sb.st_size, 0), sb.st_size);
    for (off_t i = 0; i < sb.st_size; i++)
        b[i] ^= 0xFF;
    assert_int_equal(pwrite(fd, b, (size_t)sb.st_size, 0), sb.st_size);
    free(b);
    assert_int_equal(close(fd), 0);
}

/* Copies of the bytes of a few tensors spread over the file. */
typedef struct tensor_copy {
    const devio_tensor *t;
    size_t n;
    uint8_t *bytes;
} tensor_copy;

static void copies_check(const tensor_copy *c, size_t n)
{
    for (size_t i = 0; i < n; i++)
        assert_memory_equal(c[i].t->data, c[i].bytes, c[i].n);
}

static void test_file_changed_after_load(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_opts o = tiny_opts(fx->dir);
    write_model(&o);
    devio_model *m = load_ok(fx->dir);
    const devio_layer *last = &m->layers[m->cfg.n_layers - 1];
    const devio_tensor *ts[] = {&m->embed, &m->layers[0].wq, &last->w_down, &m->norm, &m->lm_head};
    tensor_copy c[5];
    for (size_t i = 0; i < 5; i++) {
        c[i].t = ts[i];
        c[i].n = (size_t)ts[i]->shape[0] * (ts[i]->ndim == 2 ? ts[i]->shape[1] : 1) *
                 devio_dtype_size(ts[i]->dtype);
        c[i].bytes = malloc(c[i].n);
        assert_non_null(c[i].bytes);
        memcpy(c[i].bytes, ts[i]->data, c[i].n);
    }
    const char *w = path_in(fx->dir, "model.safetensors");
    /* Same size, other bytes: what was loaded does not follow the file. */
    overwrite_in_place(w);
    copies_check(c, 5);
    /* Truncated: reading every tensor neither faults (SIGBUS) nor changes. */
    assert_int_equal(truncate(w, 0), 0);
    copies_check(c, 5);
    assert_int_equal(unlink(w), 0);
    copies_check(c, 5);
    for (size_t i = 0; i < 5; i++)
        free(c[i].bytes);
    devio_model_free(m);
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, fx_setup, fx_teardown)
    const struct CMUnitTest tests[] = {
        T(test_load_f32),
        T(test_load_f16),
        T(test_load_bf16),
        T(test_load_tied),
        T(test_load_bias),
        T(test_load_sharded),
        T(test_load_non_square_gqa),
        T(test_load_unaligned),
        cmocka_unit_test(test_param_counts),
        T(test_writer_rejects),
        T(test_determinism),
        T(test_shards_same_values),
        cmocka_unit_test(test_widen_every_f16_bf16),
        cmocka_unit_test(test_narrow_rne),
        cmocka_unit_test(test_dtype_names),
        T(test_qwen2_bias_default),
        T(test_qwen2_without_bias_tensors),
        T(test_mistral_window_and_defaults),
        T(test_file_changed_after_load),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}
