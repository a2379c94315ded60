/* adapter_test.c - writes tiny base models and PEFT LoRA adapters with devio_mkmodel, loads them back, and breaks them on purpose.
 * Every test asserts a status, a value or a message; none may pass by printing. libm here is only an oracle. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "device/sha256.h"
#include "device/adapter.h"
#include "device/model.h"
#include "device/numerics.h"
#include "device/safetensors.h"
#include "tools/mkmodel/mkmodel.h"
#include "tests/testutil.h"

#define QV ((1u << DEVIO_LORA_Q) | (1u << DEVIO_LORA_V))

/* ---- fixture: a temp dir holding a base model, an adapters root and a
 * directory outside the root ---- */

typedef struct fixture {
    char dir[384];     /* Bazel's TEST_TMPDIR alone can pass 150 bytes */
    char base[448];    /* tiny model, seed 7 */
    char root[448];    /* the adapters root */
    char outside[448]; /* a sibling of the root */
    devio_model *model;
    char kept[64][512]; /* out_dir strings that must outlive path_in's ring */
    int n_kept;
} fixture;

static int fx_setup(void **state)
{
    fixture *fx = calloc(1, sizeof *fx);
    if (!fx)
        return -1;
    const char *tmp = getenv("TEST_TMPDIR");
    snprintf(fx->dir, sizeof fx->dir, "%s/devio-adapter-test-XXXXXX", tmp ? tmp : "/tmp");
    if (!mkdtemp(fx->dir)) {
        free(fx);
        return -1;
    }
    snprintf(fx->base, sizeof fx->base, "%s/base", fx->dir);
    snprintf(fx->root, sizeof fx->root, "%s/adapters", fx->dir);
    snprintf(fx->outside, sizeof fx->outside, "%s/outside", fx->dir);
    devio_mkmodel_opts o = devio_mkmodel_opts_default();
    o.out_dir = fx->base;
    o.seed = 7;
    devio_error err = {0};
    if (devio_mkmodel_write(&o, &err) != DEVIO_OK || mkdir(fx->root, 0777) != 0 ||
        mkdir(fx->outside, 0777) != 0 || devio_model_load(fx->base, &fx->model, &err) != DEVIO_OK) {
        fprintf(stderr, "fixture: %s\n", err.message);
        devio_rmtree(fx->dir);
        free(fx);
        return -1;
    }
    *state = fx;
    return 0;
}

static int fx_teardown(void **state)
{
    fixture *fx = *state;
    devio_model_free(fx->model);
    devio_rmtree(fx->dir);
    free(fx);
    return 0;
}

static const char *path_in(const char *dir, const char *name)
{
    static _Thread_local char buf[4][512];
    static _Thread_local int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
    return buf[k];
}

static devio_mkmodel_adapter_opts ad_opts(fixture *fx, const char *out_dir)
{
    devio_mkmodel_adapter_opts o = devio_mkmodel_adapter_opts_default();
    assert_true(fx->n_kept < 64);
    char *keep = fx->kept[fx->n_kept++];
    snprintf(keep, sizeof fx->kept[0], "%s", out_dir);
    o.model_dir = fx->base;
    o.out_dir = keep;
    o.rank = 8;
    o.alpha = 16.0;
    o.targets = QV;
    o.seed = 3;
    return o;
}

static void write_adapter(const devio_mkmodel_adapter_opts *o)
{
    devio_error err = {0};
    devio_status st = devio_mkmodel_write_adapter(o, &err);
    if (st != DEVIO_OK)
        print_error("mkmodel adapter: %s\n", err.message);
    assert_int_equal(st, DEVIO_OK);
}

/* Writes the default q/v adapter at root/rel and returns its options. */
static devio_mkmodel_adapter_opts write_default(fixture *fx, const char *rel)
{
    devio_mkmodel_adapter_opts o = ad_opts(fx, path_in(fx->root, rel));
    write_adapter(&o);
    return o;
}

/* Loads root/rel with max rank 64 and expects status `want`; returns the
 * adapter (NULL on failure, which is also asserted). */
static devio_adapter *load_expect(const fixture *fx, const char *rel, uint32_t max_rank,
                                  devio_status want, devio_error *err)
{
    devio_adapter *a = (devio_adapter *)(uintptr_t)1; /* must be overwritten */
    memset(err, 0, sizeof *err);
    devio_status st = devio_adapter_load(fx->root, rel, "test", fx->model, max_rank, &a, err);
    if (st != want)
        print_error("load '%s': got %s (%s), want %s\n", rel ? rel : "(null)",
                    devio_status_str(st), err->message, devio_status_str(want));
    assert_int_equal(st, want);
    if (st != DEVIO_OK) {
        assert_null(a);
        assert_int_equal(err->status, want);
        assert_true(err->message[0] != '\0');
    } else {
        assert_non_null(a);
    }
    return a;
}

static void assert_msg_has(const devio_error *err, const char *needle)
{
    if (!strstr(err->message, needle))
        print_error("message '%s' lacks '%s'\n", err->message, needle);
    assert_non_null(strstr(err->message, needle));
}

/* ---- file helpers ---- */

static uint8_t *read_all(const char *path, size_t *size)
{
    uint8_t *b = devio_read_file(path, size);
    assert_non_null(b);
    return b;
}

static void write_all(const char *path, const void *data, size_t size)
{
    assert_int_equal(devio_write_file(path, data, size), 0);
}

/* Loads DIR/adapter_config.json, lets `edit` change it, writes it back. */
static void edit_config(const char *dir, void (*edit)(json_t *root, const void *arg),
                        const void *arg)
{
    const char *p = path_in(dir, "adapter_config.json");
    json_error_t jerr;
    json_t *root = json_load_file(p, 0, &jerr);
    assert_non_null(root);
    edit(root, arg);
    assert_int_equal(json_dump_file(root, p, JSON_INDENT(2) | JSON_SORT_KEYS), 0);
    json_decref(root);
}

typedef struct kv {
    const char *key;
    json_t *val; /* stolen; NULL deletes the key */
} kv;

static void set_kv(json_t *root, const void *arg)
{
    const kv *e = arg;
    if (e->val)
        json_object_set_new(root, e->key, e->val);
    else
        json_object_del(root, e->key);
}

static void config_set(const char *dir, const char *key, json_t *val)
{
    kv e = {key, val};
    edit_config(dir, set_kv, &e);
}

/* One tensor of a hand-written safetensors file. */
typedef struct st_entry {
    char name[160];
    char dtype[16];
    uint32_t ndim; /* 1 or 2 */
    uint64_t shape[2];
    const void *data;
    uint64_t nbytes;
    uint64_t gap; /* zero bytes placed before the data, to misalign it */
} st_entry;

/* Writes a safetensors file: header sorted by jansson, padded to 8 bytes,
 * data in entry order. */
static void st_write(const char *path, const st_entry *e, size_t n)
{
    json_t *h = json_object();
    uint64_t at = 0;
    for (size_t i = 0; i < n; i++) {
        at += e[i].gap;
        json_t *shape = e[i].ndim == 1
                            ? json_pack("[I]", (json_int_t)e[i].shape[0])
                            : json_pack("[I,I]", (json_int_t)e[i].shape[0],
                                        (json_int_t)e[i].shape[1]);
        json_t *t = json_pack("{s:s, s:o, s:[I,I]}", "dtype", e[i].dtype, "shape", shape,
                              "data_offsets", (json_int_t)at, (json_int_t)(at + e[i].nbytes));
        assert_non_null(t);
        json_object_set_new(h, e[i].name, t);
        at += e[i].nbytes;
    }
    char *hs = json_dumps(h, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(h);
    assert_non_null(hs);
    size_t hl = strlen(hs), padded = (hl + 7) / 8 * 8;
    size_t total = 8 + padded + at;
    uint8_t *buf = calloc(1, total);
    assert_non_null(buf);
    for (int i = 0; i < 8; i++)
        buf[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    memcpy(buf + 8, hs, hl);
    memset(buf + 8 + hl, ' ', padded - hl);
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        off += e[i].gap;
        memcpy(buf + 8 + padded + off, e[i].data, e[i].nbytes);
        off += e[i].nbytes;
    }
    free(hs);
    write_all(path, buf, total);
    free(buf);
}

/* Copies every tensor of an adapter file into entries (data borrowed from
 * the open file *f, which the caller closes after writing). */
static size_t st_entries(const char *path, devio_st_file **f, st_entry *e, size_t cap)
{
    devio_error err = {0};
    assert_int_equal(devio_st_open(path, "src", NULL, f, &err), DEVIO_OK);
    size_t n = devio_st_count(*f);
    assert_true(n <= cap);
    for (size_t i = 0; i < n; i++) {
        const devio_st_tensor *t = devio_st_at(*f, i);
        memset(&e[i], 0, sizeof e[i]);
        snprintf(e[i].name, sizeof e[i].name, "%s", t->name);
        snprintf(e[i].dtype, sizeof e[i].dtype, "%s", t->dtype_str);
        assert_int_equal(t->ndim, 2);
        e[i].ndim = 2;
        e[i].shape[0] = t->shape[0];
        e[i].shape[1] = t->shape[1];
        e[i].data = t->data;
        e[i].nbytes = t->nbytes;
    }
    return n;
}

static const char *tname(uint32_t layer, devio_lora_target t, char ab)
{
    static _Thread_local char buf[4][160];
    static _Thread_local int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "base_model.model.model.layers.%u.%s.%s.lora_%c.weight",
             layer, t <= DEVIO_LORA_O ? "self_attn" : "mlp", devio_lora_target_name(t), ab);
    return buf[k];
}

/* What the loader must read back for a value the writer generated. */
static float stored(float v, devio_dtype dt)
{
    switch (dt) {
    case DEVIO_F16:
        return devio_f16_to_f32(devio_f32_to_f16_rne(v));
    case DEVIO_BF16:
        return devio_bf16_to_f32(devio_f32_to_bf16_rne(v));
    case DEVIO_F32:
        break;
    }
    return v;
}

/* Every element of every adapted module equals the writer's value. */
static void check_values(const fixture *fx, const devio_mkmodel_adapter_opts *o,
                         const devio_adapter *a)
{
    const uint32_t L = fx->model->cfg.n_layers;
    for (uint32_t l = 0; l < L; l++) {
        for (int t = 0; t < DEVIO_LORA_N_TARGETS; t++) {
            const devio_lora_module *m = &a->mods[l * DEVIO_LORA_N_TARGETS + (uint32_t)t];
            if (!((o->targets >> t) & 1u)) {
                assert_null(m->a.data);
                assert_null(m->b.data);
                continue;
            }
            uint64_t od, id;
            assert_true(devio_lora_target_dims(fx->model, l, (devio_lora_target)t, &od, &id));
            assert_int_equal(m->a.shape[0], o->rank);
            assert_int_equal(m->a.shape[1], id);
            assert_int_equal(m->b.shape[0], od);
            assert_int_equal(m->b.shape[1], o->rank);
            assert_int_equal(m->a.dtype, o->dtype);
            assert_int_equal(m->b.dtype, o->dtype);
            const devio_tensor *views[2] = {&m->a, &m->b};
            for (int ab = 0; ab < 2; ab++) {
                uint64_t n = views[ab]->shape[0] * views[ab]->shape[1];
                float *want = malloc(n * sizeof *want);
                assert_non_null(want);
                devio_error err = {0};
                assert_int_equal(devio_mkmodel_adapter_values(o, tname(l, (devio_lora_target)t,
                                                                       ab ? 'B' : 'A'),
                                                              0, n, want, &err),
                                 DEVIO_OK);
                for (uint64_t i = 0; i < n; i++) {
                    float got = devio_tensor_get(views[ab], i);
                    if (devio_num_bits(got) != devio_num_bits(stored(want[i], o->dtype)))
                        print_error("layer %u %s %c [%llu]: %g vs %g\n", l,
                                    devio_lora_target_name((devio_lora_target)t),
                                    ab ? 'B' : 'A', (unsigned long long)i, got, want[i]);
                    assert_int_equal(devio_num_bits(got),
                                     devio_num_bits(stored(want[i], o->dtype)));
                }
                free(want);
            }
        }
    }
}

static void sha_of_file(const char *path, char hex[65], uint64_t *size)
{
    size_t n;
    uint8_t *b = read_all(path, &n);
    devio_sha256 s;
    uint8_t d[32];
    devio_sha256_init(&s);
    devio_sha256_update(&s, b, n);
    devio_sha256_final(&s, d);
    devio_sha256_hex(d, hex);
    *size = n;
    free(b);
}

/* ---- names ---- */

static void test_target_names(void **state)
{
    (void)state;
    const char *want[] = {"q_proj", "k_proj", "v_proj", "o_proj",
                          "gate_proj", "up_proj", "down_proj"};
    for (int t = 0; t < DEVIO_LORA_N_TARGETS; t++) {
        assert_string_equal(devio_lora_target_name((devio_lora_target)t), want[t]);
        devio_lora_target back = DEVIO_LORA_N_TARGETS;
        assert_true(devio_lora_target_parse(want[t], &back));
        assert_int_equal(back, t);
    }
    assert_string_equal(devio_lora_target_name(DEVIO_LORA_N_TARGETS), "?");
    devio_lora_target x = DEVIO_LORA_K;
    assert_false(devio_lora_target_parse("lm_head", &x));
    assert_false(devio_lora_target_parse("Q_PROJ", &x));
    assert_false(devio_lora_target_parse(NULL, &x));
    assert_int_equal(x, DEVIO_LORA_K);
}

static void test_target_dims(void **state)
{
    fixture *fx = *state;
    /* tiny: d 64, 4 heads x 16, 2 kv heads x 16, ffn 128. */
    const uint64_t want[DEVIO_LORA_N_TARGETS][2] = {
        {64, 64}, {32, 64}, {32, 64}, {64, 64}, {128, 64}, {128, 64}, {64, 128},
    };
    for (int t = 0; t < DEVIO_LORA_N_TARGETS; t++) {
        uint64_t o = 0, i = 0;
        assert_true(devio_lora_target_dims(fx->model, 1, (devio_lora_target)t, &o, &i));
        assert_int_equal(o, want[t][0]);
        assert_int_equal(i, want[t][1]);
    }
    uint64_t o, i;
    assert_false(devio_lora_target_dims(fx->model, 2, DEVIO_LORA_Q, &o, &i));
    assert_false(devio_lora_target_dims(fx->model, 0, DEVIO_LORA_N_TARGETS, &o, &i));
}

/* ---- loading what the writer wrote ---- */

static void test_load_qv(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_adapter_opts o = write_default(fx, "sql-r8");
    devio_error err;
    devio_adapter *a = load_expect(fx, "sql-r8", 64, DEVIO_OK, &err);
    assert_string_equal(a->name, "test");
    assert_string_equal(a->path, "sql-r8");
    assert_int_equal(a->rank, 8);
    assert_true(a->alpha == 16.0f);
    assert_true(a->scale == 2.0f);
    assert_false(a->use_rslora);
    assert_int_equal(a->targets, QV);
    assert_int_equal(a->n_layers, 2);
    check_values(fx, &o, a);

    char hex[65];
    uint64_t size;
    sha_of_file(path_in(o.out_dir, "adapter_model.safetensors"), hex, &size);
    assert_string_equal(a->sha256, hex);
    assert_int_equal(a->size, size);
    /* 2 layers x (q: 8x64 + 64x8, v: 8x64 + 32x8) f32 plus the header. */
    assert_true(size > (uint64_t)2 * (1024 + 768) * 4);
    devio_adapter_free(a);
}

static void test_load_all_targets_bf16(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_adapter_opts o = ad_opts(fx, path_in(fx->root, "all"));
    o.targets = DEVIO_LORA_ALL_TARGETS;
    o.dtype = DEVIO_BF16;
    o.rank = 4;
    o.alpha = 6.0;
    write_adapter(&o);
    devio_error err;
    devio_adapter *a = load_expect(fx, "all", 64, DEVIO_OK, &err);
    assert_int_equal(a->targets, DEVIO_LORA_ALL_TARGETS);
    assert_true(a->scale == 1.5f);
    check_values(fx, &o, a);
    devio_adapter_free(a);
}

static void test_load_f16(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_adapter_opts o = ad_opts(fx, path_in(fx->root, "f16"));
    o.targets = (1u << DEVIO_LORA_O) | (1u << DEVIO_LORA_DOWN) | (1u << DEVIO_LORA_K);
    o.dtype = DEVIO_F16;
    write_adapter(&o);
    devio_error err;
    devio_adapter *a = load_expect(fx, "f16", 64, DEVIO_OK, &err);
    check_values(fx, &o, a);
    devio_adapter_free(a);
}

static void test_scale_rslora(void **state)
{
    fixture *fx = *state;
    const struct {
        uint32_t r;
        double alpha;
        bool rs;
    } cases[] = {{8, 16, false}, {16, 16, true}, {8, 16, true}, {3, 7, true}, {5, 0.1, false}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char rel[32];
        snprintf(rel, sizeof rel, "s%zu", k);
        devio_mkmodel_adapter_opts o = ad_opts(fx, path_in(fx->root, rel));
        o.rank = cases[k].r;
        o.alpha = cases[k].alpha;
        o.use_rslora = cases[k].rs;
        o.targets = 1u << DEVIO_LORA_UP;
        write_adapter(&o);
        devio_error err;
        devio_adapter *a = load_expect(fx, rel, 64, DEVIO_OK, &err);
        assert_int_equal(a->use_rslora, cases[k].rs);
        float alpha = (float)cases[k].alpha;
        assert_true(a->alpha == alpha);
        /* The documented expression, bit for bit. */
        float want = cases[k].rs ? alpha / devio_num_sqrt((float)cases[k].r)
                                 : alpha / (float)cases[k].r;
        assert_int_equal(devio_num_bits(a->scale), devio_num_bits(want));
        /* And within one ulp of the exact value (libm as the oracle). */
        double exact = cases[k].rs ? cases[k].alpha / sqrt((double)cases[k].r)
                                   : cases[k].alpha / cases[k].r;
        assert_true(fabs((double)a->scale - exact) <= fabs(exact) * 0x1p-23);
        devio_adapter_free(a);
    }
    devio_error err;
    devio_adapter *a = load_expect(fx, "s1", 64, DEVIO_OK, &err);
    assert_true(a->scale == 4.0f); /* 16 / sqrt(16) */
    devio_adapter_free(a);
}

static void test_alpha_default(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_adapter_opts o = write_default(fx, "noalpha");
    config_set(o.out_dir, "lora_alpha", NULL);
    config_set(o.out_dir, "use_rslora", NULL);
    config_set(o.out_dir, "peft_type", NULL);
    devio_error err;
    devio_adapter *a = load_expect(fx, "noalpha", 64, DEVIO_OK, &err);
    assert_true(a->alpha == 8.0f); /* PEFT's default */
    assert_true(a->scale == 1.0f);
    assert_false(a->use_rslora);
    devio_adapter_free(a);
}

static void test_alpha_real(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_adapter_opts o = write_default(fx, "realalpha");
    config_set(o.out_dir, "lora_alpha", json_real(12.5));
    devio_error err;
    devio_adapter *a = load_expect(fx, "realalpha", 64, DEVIO_OK, &err);
    assert_true(a->alpha == 12.5f);
    assert_true(a->scale == 12.5f / 8.0f);
    devio_adapter_free(a);
}

static void test_target_string(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_adapter_opts o = ad_opts(fx, path_in(fx->root, "one"));
    o.targets = 1u << DEVIO_LORA_GATE;
    write_adapter(&o);
    config_set(o.out_dir, "target_modules", json_string("gate_proj"));
    devio_error err;
    devio_adapter *a = load_expect(fx, "one", 64, DEVIO_OK, &err);
    assert_int_equal(a->targets, 1u << DEVIO_LORA_GATE);
    devio_adapter_free(a);

    o = ad_opts(fx, path_in(fx->root, "lin"));
    o.targets = DEVIO_LORA_ALL_TARGETS;
    write_adapter(&o);
    config_set(o.out_dir, "target_modules", json_string("all-linear"));
    a = load_expect(fx, "lin", 64, DEVIO_OK, &err);
    assert_int_equal(a->targets, DEVIO_LORA_ALL_TARGETS);
    devio_adapter_free(a);
    /* all-linear names all seven, so a gate_proj-only file lacks tensors. */
    config_set(path_in(fx->root, "one"), "target_modules", json_string("all-linear"));
    load_expect(fx, "one", 64, DEVIO_E_INVALID, &err);
    assert_msg_has(&err, "missing");
}

static void test_target_pattern(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_adapter_opts o = write_default(fx, "re");
    config_set(o.out_dir, "target_modules", json_string(".*\\.(q_proj|v_proj)"));
    devio_error err;
    load_expect(fx, "re", 64, DEVIO_E_UNSUPPORTED, &err);
    assert_msg_has(&err, "target_modules");
}

static void drop_layer0(const fixture *fx, const char *dir)
{
    const char *p = path_in(dir, "adapter_model.safetensors");
    devio_st_file *f;
    st_entry e[64], keep[64];
    size_t n = st_entries(p, &f, e, 64), k = 0;
    for (size_t i = 0; i < n; i++)
        if (!strstr(e[i].name, ".layers.0."))
            keep[k++] = e[i];
    assert_int_equal(k, n / 2);
    st_write(path_in(fx->dir, "tmp.safetensors"), keep, k);
    devio_st_close(f);
    assert_int_equal(rename(path_in(fx->dir, "tmp.safetensors"), p), 0);
}

static void test_layers_to_transform(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_adapter_opts o = write_default(fx, "l1");
    config_set(o.out_dir, "layers_to_transform", json_pack("[i]", 1));
    devio_error err;
    /* The file still holds layer 0: refused, not ignored. */
    load_expect(fx, "l1", 64, DEVIO_E_INVALID, &err);
    assert_msg_has(&err, "layers_to_transform");

    drop_layer0(fx, o.out_dir);
    devio_adapter *a = load_expect(fx, "l1", 64, DEVIO_OK, &err);
    for (int t = 0; t < DEVIO_LORA_N_TARGETS; t++)
        assert_null(a->mods[t].a.data);
    assert_non_null(a->mods[DEVIO_LORA_N_TARGETS + DEVIO_LORA_Q].a.data);
    assert_non_null(a->mods[DEVIO_LORA_N_TARGETS + DEVIO_LORA_V].b.data);
    devio_adapter_free(a);

    config_set(o.out_dir, "layers_to_transform", json_integer(1));
    config_set(o.out_dir, "layers_pattern", json_string("layers"));
    a = load_expect(fx, "l1", 64, DEVIO_OK, &err);
    devio_adapter_free(a);

    config_set(o.out_dir, "layers_pattern", json_string("h"));
    load_expect(fx, "l1", 64, DEVIO_E_UNSUPPORTED, &err);
    config_set(o.out_dir, "layers_pattern", NULL);
    config_set(o.out_dir, "layers_to_transform", json_pack("[i]", 2));
    load_expect(fx, "l1", 64, DEVIO_E_INVALID, &err);
    assert_msg_has(&err, "layer 2");
    config_set(o.out_dir, "layers_to_transform", json_array());
    load_expect(fx, "l1", 64, DEVIO_E_INVALID, &err);
}

static void test_symlink_inside_ok(void **state)
{
    fixture *fx = *state;
    write_default(fx, "real");
    assert_int_equal(symlink("real", path_in(fx->root, "alias")), 0);
    assert_int_equal(mkdir(path_in(fx->root, "x"), 0777), 0);
    devio_error err;
    devio_adapter *a = load_expect(fx, "alias", 64, DEVIO_OK, &err);
    assert_string_equal(a->path, "alias");
    devio_adapter_free(a);
    a = load_expect(fx, "x/../real/", 64, DEVIO_OK, &err);
    assert_string_equal(a->path, "x/../real/");
    devio_adapter_free(a);
    a = load_expect(fx, "./real", 64, DEVIO_OK, &err);
    devio_adapter_free(a);
}

static void test_unaligned_tensor(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_adapter_opts o = write_default(fx, "odd");
    const char *p = path_in(o.out_dir, "adapter_model.safetensors");
    devio_st_file *f;
    st_entry e[64];
    size_t n = st_entries(p, &f, e, 64);
    e[0].gap = 2; /* every F32 tensor now sits 2 bytes off a 4-byte boundary */
    st_write(path_in(fx->dir, "tmp.safetensors"), e, n);
    devio_st_close(f);
    assert_int_equal(rename(path_in(fx->dir, "tmp.safetensors"), p), 0);
    devio_error err;
    devio_adapter *a = load_expect(fx, "odd", 64, DEVIO_OK, &err);
    check_values(fx, &o, a);
    const devio_lora_module *m = &a->mods[DEVIO_LORA_Q];
    assert_int_equal((uintptr_t)m->a.data % 4, 0);
    assert_int_equal((uintptr_t)m->b.data % 4, 0);
    devio_adapter_free(a);
}

/* ---- the hash ---- */

static void test_file_hash(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_adapter_opts o = write_default(fx, "h");
    char hex[65], want[65];
    uint64_t size = 0, wsize;
    devio_error err = {0};
    assert_int_equal(devio_adapter_file_hash(fx->root, "h", hex, &size, &err), DEVIO_OK);
    sha_of_file(path_in(o.out_dir, "adapter_model.safetensors"), want, &wsize);
    assert_string_equal(hex, want);
    assert_int_equal(size, wsize);
    assert_int_equal(strlen(hex), 64);
    for (int i = 0; i < 64; i++)
        assert_non_null(strchr("0123456789abcdef", hex[i]));

    /* A rewrite with another seed changes the digest. */
    o.seed = 4;
    write_adapter(&o);
    char hex2[65];
    assert_int_equal(devio_adapter_file_hash(fx->root, "h", hex2, &size, &err), DEVIO_OK);
    assert_string_not_equal(hex, hex2);

    assert_int_equal(devio_adapter_file_hash(fx->root, "../outside", hex, &size, &err),
                     DEVIO_E_INVALID);
    assert_int_equal(devio_adapter_file_hash(fx->root, "nope", hex, &size, &err), DEVIO_E_IO);
    /* Only the weights file is needed for the hash. */
    assert_int_equal(unlink(path_in(o.out_dir, "adapter_config.json")), 0);
    assert_int_equal(devio_adapter_file_hash(fx->root, "h", hex, &size, &err), DEVIO_OK);
    assert_int_equal(unlink(path_in(o.out_dir, "adapter_model.safetensors")), 0);
    assert_int_equal(devio_adapter_file_hash(fx->root, "h", hex, &size, &err), DEVIO_E_IO);
    assert_msg_has(&err, "adapter_model.safetensors");
}

/* ---- the writer ---- */

static void test_writer_deterministic(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_adapter_opts o1 = ad_opts(fx, path_in(fx->dir, "w1"));
    devio_mkmodel_adapter_opts o2 = ad_opts(fx, path_in(fx->dir, "w2"));
    devio_mkmodel_adapter_opts o3 = ad_opts(fx, path_in(fx->dir, "w3"));
    o3.seed = 99;
    write_adapter(&o1);
    write_adapter(&o2);
    write_adapter(&o3);
    const char *files[] = {"adapter_model.safetensors", "adapter_config.json"};
    for (int i = 0; i < 2; i++) {
        size_t n1, n2, n3;
        uint8_t *b1 = read_all(path_in(o1.out_dir, files[i]), &n1);
        uint8_t *b2 = read_all(path_in(o2.out_dir, files[i]), &n2);
        uint8_t *b3 = read_all(path_in(o3.out_dir, files[i]), &n3);
        assert_int_equal(n1, n2);
        assert_memory_equal(b1, b2, n1);
        assert_int_equal(n1, n3);
        if (i == 0)
            assert_memory_not_equal(b1, b3, n1);
        else
            assert_memory_equal(b1, b3, n1); /* the seed is not in the config */
        free(b1);
        free(b2);
        free(b3);
    }
    /* No temporary files left behind. */
    assert_int_not_equal(access(path_in(o1.out_dir, "adapter_model.safetensors.tmp"), F_OK), 0);
    assert_int_not_equal(access(path_in(o1.out_dir, "adapter_config.json.tmp"), F_OK), 0);
}

static void test_writer_config(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_adapter_opts o = ad_opts(fx, path_in(fx->dir, "cfg"));
    o.targets = (1u << DEVIO_LORA_V) | (1u << DEVIO_LORA_DOWN) | (1u << DEVIO_LORA_Q);
    o.use_rslora = true;
    o.alpha = 32;
    write_adapter(&o);
    json_error_t jerr;
    json_t *c = json_load_file(path_in(o.out_dir, "adapter_config.json"), JSON_REJECT_DUPLICATES,
                               &jerr);
    assert_non_null(c);
    assert_string_equal(json_string_value(json_object_get(c, "peft_type")), "LORA");
    assert_int_equal(json_integer_value(json_object_get(c, "r")), 8);
    assert_true(json_is_integer(json_object_get(c, "lora_alpha")));
    assert_int_equal(json_integer_value(json_object_get(c, "lora_alpha")), 32);
    assert_true(json_is_true(json_object_get(c, "use_rslora")));
    assert_string_equal(json_string_value(json_object_get(c, "bias")), "none");
    assert_true(json_is_false(json_object_get(c, "fan_in_fan_out")));
    assert_string_equal(json_string_value(json_object_get(c, "task_type")), "CAUSAL_LM");
    assert_true(json_real_value(json_object_get(c, "lora_dropout")) == 0.0);
    assert_true(json_is_real(json_object_get(c, "lora_dropout")));
    assert_string_equal(json_string_value(json_object_get(c, "base_model_name_or_path")),
                        fx->base);
    const json_t *tm = json_object_get(c, "target_modules");
    assert_int_equal(json_array_size(tm), 3);
    assert_string_equal(json_string_value(json_array_get(tm, 0)), "down_proj");
    assert_string_equal(json_string_value(json_array_get(tm, 1)), "q_proj");
    assert_string_equal(json_string_value(json_array_get(tm, 2)), "v_proj");
    json_decref(c);

    /* A non-integral alpha is written as a real and reads back exactly. */
    o.alpha = 0.1;
    write_adapter(&o);
    c = json_load_file(path_in(o.out_dir, "adapter_config.json"), 0, &jerr);
    assert_non_null(c);
    assert_true(json_real_value(json_object_get(c, "lora_alpha")) == 0.1);
    json_decref(c);

    /* The weights file's header: PEFT names, nothing else but the metadata. */
    devio_st_file *f;
    devio_error err = {0};
    assert_int_equal(devio_st_open(path_in(o.out_dir, "adapter_model.safetensors"), "w", NULL,
                                   &f, &err),
                     DEVIO_OK);
    assert_int_equal(devio_st_count(f), 2 * 3 * 2);
    assert_non_null(devio_st_find(f, tname(1, DEVIO_LORA_DOWN, 'B')));
    const devio_st_tensor *t = devio_st_find(f, tname(0, DEVIO_LORA_DOWN, 'A'));
    assert_non_null(t);
    assert_int_equal(t->shape[0], 8);
    assert_int_equal(t->shape[1], 128);
    devio_st_close(f);
}

static void test_writer_value_ranges(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_adapter_opts o = ad_opts(fx, path_in(fx->dir, "rng"));
    o.targets = 1u << DEVIO_LORA_DOWN; /* in 128, out 64 */
    o.rank = 16;
    float a[16 * 128], b[64 * 16];
    devio_error err = {0};
    assert_int_equal(devio_mkmodel_adapter_values(&o, tname(0, DEVIO_LORA_DOWN, 'A'), 0,
                                                  16 * 128, a, &err),
                     DEVIO_OK);
    assert_int_equal(devio_mkmodel_adapter_values(&o, tname(0, DEVIO_LORA_DOWN, 'B'), 0, 64 * 16,
                                                  b, &err),
                     DEVIO_OK);
    float amax = 0, bmax = 0;
    for (int i = 0; i < 16 * 128; i++)
        amax = fabsf(a[i]) > amax ? fabsf(a[i]) : amax;
    for (int i = 0; i < 64 * 16; i++)
        bmax = fabsf(b[i]) > bmax ? fabsf(b[i]) : bmax;
    /* A within 1/sqrt(128), B within 0.5/sqrt(16), and both use their range. */
    assert_true(amax <= 1.0f / sqrtf(128.0f) && amax > 0.9f / sqrtf(128.0f));
    assert_true(bmax <= 0.125f && bmax > 0.9f * 0.125f);
    /* A slice equals the same elements of the whole. */
    float part[5];
    assert_int_equal(devio_mkmodel_adapter_values(&o, tname(0, DEVIO_LORA_DOWN, 'A'), 100, 5,
                                                  part, &err),
                     DEVIO_OK);
    assert_memory_equal(part, a + 100, sizeof part);
    /* Unknown names and ranges. */
    assert_int_equal(devio_mkmodel_adapter_values(&o, tname(0, DEVIO_LORA_Q, 'A'), 0, 1, part,
                                                  &err),
                     DEVIO_E_INVALID);
    assert_int_equal(devio_mkmodel_adapter_values(&o, tname(0, DEVIO_LORA_DOWN, 'A'), 16 * 128,
                                                  1, part, &err),
                     DEVIO_E_INVALID);
}

static void test_writer_bad_opts(void **state)
{
    fixture *fx = *state;
    const char *out = path_in(fx->dir, "never");
    devio_error err;
    devio_mkmodel_adapter_opts o;
#define BAD(field, value, want)                                                   \
    do {                                                                          \
        o = ad_opts(fx, out);                                                     \
        o.field = value;                                                          \
        memset(&err, 0, sizeof err);                                              \
        assert_int_equal(devio_mkmodel_write_adapter(&o, &err), want);            \
        assert_true(err.message[0] != '\0');                                      \
    } while (0)
    BAD(rank, 0, DEVIO_E_INVALID);
    BAD(rank, 65537, DEVIO_E_INVALID);
    BAD(alpha, 0.0, DEVIO_E_INVALID);
    BAD(alpha, -1.0, DEVIO_E_INVALID);
    BAD(alpha, NAN, DEVIO_E_INVALID);
    BAD(targets, 0, DEVIO_E_INVALID);
    BAD(targets, 1u << DEVIO_LORA_N_TARGETS, DEVIO_E_INVALID);
    BAD(dtype, (devio_dtype)7, DEVIO_E_INVALID);
    BAD(model_dir, NULL, DEVIO_E_INVALID);
    BAD(out_dir, NULL, DEVIO_E_INVALID);
    BAD(model_dir, fx->root, DEVIO_E_MODEL); /* no config.json there */
#undef BAD
    assert_int_not_equal(access(out, F_OK), 0); /* nothing was created */
}

/* ---- paths ---- */

static void test_path_absolute(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_adapter_opts o = write_default(fx, "abs");
    devio_error err;
    load_expect(fx, o.out_dir, 64, DEVIO_E_INVALID, &err);
    assert_msg_has(&err, "outside the adapters root");
}

static void test_path_empty(void **state)
{
    fixture *fx = *state;
    devio_error err;
    load_expect(fx, "", 64, DEVIO_E_INVALID, &err);
    load_expect(fx, NULL, 64, DEVIO_E_INVALID, &err);
}

static void test_path_dotdot(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_adapter_opts o = ad_opts(fx, path_in(fx->outside, "ad"));
    write_adapter(&o);
    assert_int_equal(mkdir(path_in(fx->root, "x"), 0777), 0);
    devio_error err;
    load_expect(fx, "../outside/ad", 64, DEVIO_E_INVALID, &err);
    assert_msg_has(&err, "outside the adapters root");
    load_expect(fx, "x/../../outside/ad", 64, DEVIO_E_INVALID, &err);
    assert_msg_has(&err, "outside the adapters root");
    load_expect(fx, "..", 64, DEVIO_E_INVALID, &err);
    /* Refused before any lookup, even when the target does not exist. */
    load_expect(fx, "../no/such", 64, DEVIO_E_INVALID, &err);
}

static void test_symlink_dir_outside(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_adapter_opts o = ad_opts(fx, path_in(fx->outside, "ad"));
    write_adapter(&o);
    assert_int_equal(symlink(o.out_dir, path_in(fx->root, "link")), 0);
    assert_int_equal(symlink("../outside/ad", path_in(fx->root, "rel-link")), 0);
    devio_error err;
    load_expect(fx, "link", 64, DEVIO_E_INVALID, &err);
    assert_msg_has(&err, "adapter path 'link' resolves to outside the adapters root");
    load_expect(fx, "rel-link", 64, DEVIO_E_INVALID, &err);
    assert_msg_has(&err, "adapter path 'rel-link' resolves to outside the adapters root");
    char hex[65];
    uint64_t size;
    assert_int_equal(devio_adapter_file_hash(fx->root, "link", hex, &size, &err),
                     DEVIO_E_INVALID);
}

static void test_symlink_file_outside(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_adapter_opts out = ad_opts(fx, path_in(fx->outside, "ad"));
    write_adapter(&out);
    devio_mkmodel_adapter_opts o = write_default(fx, "half");
    const char *w = path_in(o.out_dir, "adapter_model.safetensors");
    assert_int_equal(unlink(w), 0);
    assert_int_equal(symlink(path_in(out.out_dir, "adapter_model.safetensors"), w), 0);
    devio_error err;
    load_expect(fx, "half", 64, DEVIO_E_INVALID, &err);
    assert_msg_has(&err, "outside the adapters root");
    assert_msg_has(&err, "adapter_model.safetensors");

    const char *c = path_in(o.out_dir, "adapter_config.json");
    assert_int_equal(unlink(c), 0);
    assert_int_equal(symlink(path_in(out.out_dir, "adapter_config.json"), c), 0);
    load_expect(fx, "half", 64, DEVIO_E_INVALID, &err);
    assert_msg_has(&err, "adapter_config.json");
}

static void test_root_missing(void **state)
{
    fixture *fx = *state;
    devio_adapter *a = NULL;
    devio_error err = {0};
    assert_int_equal(devio_adapter_load(path_in(fx->dir, "no-root"), "x", "n", fx->model, 64, &a,
                                        &err),
                     DEVIO_E_INVALID);
    assert_null(a);
    assert_int_equal(devio_adapter_load("", "x", "n", fx->model, 64, &a, &err),
                     DEVIO_E_INVALID);
    assert_int_equal(devio_adapter_load(NULL, "x", "n", fx->model, 64, &a, &err),
                     DEVIO_E_INVALID);
}

static void test_bad_args(void **state)
{
    fixture *fx = *state;
    write_default(fx, "ok");
    devio_adapter *a = NULL;
    devio_error err = {0};
    char long_name[80];
    memset(long_name, 'n', sizeof long_name - 1);
    long_name[sizeof long_name - 1] = '\0';
    assert_int_equal(devio_adapter_load(fx->root, "ok", "n", NULL, 64, &a, &err),
                     DEVIO_E_INVALID);
    assert_int_equal(devio_adapter_load(fx->root, "ok", NULL, fx->model, 64, &a, &err),
                     DEVIO_E_INVALID);
    assert_int_equal(devio_adapter_load(fx->root, "ok", "", fx->model, 64, &a, &err),
                     DEVIO_E_INVALID);
    assert_int_equal(devio_adapter_load(fx->root, "ok", long_name, fx->model, 64, &a, &err),
                     DEVIO_E_INVALID);
    assert_null(a);
    assert_int_equal(devio_adapter_load(fx->root, "ok", "n", fx->model, 64, NULL, &err),
                     DEVIO_E_INVALID);
    char long_path[300];
    memset(long_path, 'p', sizeof long_path - 1);
    long_path[sizeof long_path - 1] = '\0';
    assert_int_equal(devio_adapter_load(fx->root, long_path, "n", fx->model, 64, &a, &err),
                     DEVIO_E_INVALID);
    /* A 63-byte name fits and is kept; a NULL err is allowed. */
    long_name[63] = '\0';
    assert_int_equal(devio_adapter_load(fx->root, "ok", long_name, fx->model, 64, &a, NULL),
                     DEVIO_OK);
    assert_string_equal(a->name, long_name);
    devio_adapter_free(a);
    devio_adapter_free(NULL);
}

/* ---- missing and corrupt files ---- */

static void test_missing_dir(void **state)
{
    fixture *fx = *state;
    devio_error err;
    load_expect(fx, "nope", 64, DEVIO_E_IO, &err);
    assert_msg_has(&err, "nope");
    write_all(path_in(fx->root, "file"), "x", 1);
    load_expect(fx, "file", 64, DEVIO_E_IO, &err);
}

static void test_missing_config(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_adapter_opts o = write_default(fx, "nc");
    assert_int_equal(unlink(path_in(o.out_dir, "adapter_config.json")), 0);
    devio_error err;
    load_expect(fx, "nc", 64, DEVIO_E_IO, &err);
    assert_msg_has(&err, "nc/adapter_config.json");
}

static void test_missing_weights(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_adapter_opts o = write_default(fx, "nw");
    assert_int_equal(unlink(path_in(o.out_dir, "adapter_model.safetensors")), 0);
    devio_error err;
    load_expect(fx, "nw", 64, DEVIO_E_IO, &err);
    assert_msg_has(&err, "nw/adapter_model.safetensors");
    /* A dangling link is missing too. */
    assert_int_equal(symlink("gone", path_in(o.out_dir, "adapter_model.safetensors")), 0);
    load_expect(fx, "nw", 64, DEVIO_E_IO, &err);
    assert_msg_has(&err, "adapter_model.safetensors");
}

static void test_corrupt_json(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_adapter_opts o = write_default(fx, "cj");
    const char *p = path_in(o.out_dir, "adapter_config.json");
    write_all(p, "{\"r\": 8, \"lora_alpha\": ", 23);
    devio_error err;
    load_expect(fx, "cj", 64, DEVIO_E_MODEL, &err);
    assert_msg_has(&err, "adapter_config.json");
    write_all(p, "[8, 16]", 7);
    load_expect(fx, "cj", 64, DEVIO_E_MODEL, &err);
    write_all(p, "{\"r\": 8, \"r\": 4}", 16);
    load_expect(fx, "cj", 64, DEVIO_E_MODEL, &err);
}

static void test_truncated_safetensors(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_adapter_opts o = write_default(fx, "tr");
    const char *p = path_in(o.out_dir, "adapter_model.safetensors");
    size_t n;
    uint8_t *b = read_all(p, &n);
    write_all(p, b, n - 100);
    devio_error err;
    load_expect(fx, "tr", 64, DEVIO_E_MODEL, &err);
    assert_msg_has(&err, "adapter_model.safetensors");
    write_all(p, b, 5);
    load_expect(fx, "tr", 64, DEVIO_E_MODEL, &err);
    memset(b + 8, '!', 16); /* the header is no longer JSON */
    write_all(p, b, n);
    load_expect(fx, "tr", 64, DEVIO_E_MODEL, &err);
    free(b);
}

/* ---- config fields ---- */

static void test_peft_type(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_adapter_opts o = write_default(fx, "ia3");
    config_set(o.out_dir, "peft_type", json_string("IA3"));
    devio_error err;
    load_expect(fx, "ia3", 64, DEVIO_E_UNSUPPORTED, &err);
    assert_msg_has(&err, "IA3");
    config_set(o.out_dir, "peft_type", json_integer(1));
    load_expect(fx, "ia3", 64, DEVIO_E_INVALID, &err);
}

static void test_rank_missing_or_zero(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_adapter_opts o = write_default(fx, "r0");
    devio_error err;
    config_set(o.out_dir, "r", NULL);
    load_expect(fx, "r0", 64, DEVIO_E_INVALID, &err);
    assert_msg_has(&err, "missing");
    config_set(o.out_dir, "r", json_integer(0));
    load_expect(fx, "r0", 64, DEVIO_E_INVALID, &err);
    config_set(o.out_dir, "r", json_integer(-8));
    load_expect(fx, "r0", 64, DEVIO_E_INVALID, &err);
    config_set(o.out_dir, "r", json_real(8.0));
    load_expect(fx, "r0", 64, DEVIO_E_INVALID, &err);
    config_set(o.out_dir, "r", json_string("8"));
    load_expect(fx, "r0", 64, DEVIO_E_INVALID, &err);
}

static void test_rank_too_high(void **state)
{
    fixture *fx = *state;
    write_default(fx, "r8");
    devio_error err;
    load_expect(fx, "r8", 4, DEVIO_E_INVALID, &err);
    assert_msg_has(&err, "rank 8 exceeds max_lora_rank 4");
    devio_adapter *a = load_expect(fx, "r8", 8, DEVIO_OK, &err); /* the limit is inclusive */
    devio_adapter_free(a);
}

static void test_rank_disagrees_with_tensors(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_adapter_opts o = write_default(fx, "rd");
    config_set(o.out_dir, "r", json_integer(4));
    devio_error err;
    load_expect(fx, "rd", 64, DEVIO_E_INVALID, &err);
    assert_msg_has(&err, "shape [8, 64], expected [4, 64]");
}

static void test_unknown_target(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_adapter_opts o = write_default(fx, "emb");
    config_set(o.out_dir, "target_modules", json_pack("[s,s,s]", "q_proj", "embed_tokens",
                                                      "v_proj"));
    devio_error err;
    load_expect(fx, "emb", 64, DEVIO_E_UNSUPPORTED, &err);
    assert_msg_has(&err, "embed_tokens");
    config_set(o.out_dir, "target_modules", json_array());
    load_expect(fx, "emb", 64, DEVIO_E_INVALID, &err);
    config_set(o.out_dir, "target_modules", NULL);
    load_expect(fx, "emb", 64, DEVIO_E_INVALID, &err);
    config_set(o.out_dir, "target_modules", json_pack("[s,i]", "q_proj", 3));
    load_expect(fx, "emb", 64, DEVIO_E_INVALID, &err);
}

static void test_fan_in_fan_out(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_adapter_opts o = write_default(fx, "fifo");
    config_set(o.out_dir, "fan_in_fan_out", json_true());
    devio_error err;
    load_expect(fx, "fifo", 64, DEVIO_E_UNSUPPORTED, &err);
    assert_msg_has(&err, "fan_in_fan_out");
}

static void test_bias(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_adapter_opts o = write_default(fx, "bias");
    devio_error err;
    config_set(o.out_dir, "bias", json_string("all"));
    load_expect(fx, "bias", 64, DEVIO_E_UNSUPPORTED, &err);
    assert_msg_has(&err, "bias");
    config_set(o.out_dir, "bias", json_string("lora_only"));
    load_expect(fx, "bias", 64, DEVIO_E_UNSUPPORTED, &err);
    config_set(o.out_dir, "bias", json_false());
    load_expect(fx, "bias", 64, DEVIO_E_INVALID, &err);
    config_set(o.out_dir, "bias", NULL);
    devio_adapter *a = load_expect(fx, "bias", 64, DEVIO_OK, &err);
    devio_adapter_free(a);
}

static void test_other_features_refused(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_adapter_opts o = write_default(fx, "feat");
    const char *keys[] = {"use_dora", "rank_pattern", "alpha_pattern", "modules_to_save",
                          "lora_bias"};
    json_t *on[] = {json_true(), json_pack("{s:i}", "q_proj", 4),
                    json_pack("{s:i}", "q_proj", 4), json_pack("[s]", "lm_head"), json_true()};
    devio_error err;
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        config_set(o.out_dir, keys[i], on[i]);
        load_expect(fx, "feat", 64, DEVIO_E_UNSUPPORTED, &err);
        assert_msg_has(&err, keys[i]);
        /* The "off" spellings PEFT writes load fine. */
        json_t *off = i == 0 || i == 4 ? json_false() : i == 3 ? json_null() : json_object();
        config_set(o.out_dir, keys[i], off);
        devio_adapter *a = load_expect(fx, "feat", 64, DEVIO_OK, &err);
        devio_adapter_free(a);
    }
    config_set(o.out_dir, "use_rslora", json_string("yes"));
    load_expect(fx, "feat", 64, DEVIO_E_INVALID, &err);
    config_set(o.out_dir, "use_rslora", NULL);
    config_set(o.out_dir, "lora_alpha", json_string("16"));
    load_expect(fx, "feat", 64, DEVIO_E_INVALID, &err);
    config_set(o.out_dir, "lora_alpha", json_real(1e300));
    load_expect(fx, "feat", 64, DEVIO_E_INVALID, &err);
}

/* ---- tensors ---- */

static void test_shape_mismatch_other_base(void **state)
{
    fixture *fx = *state;
    /* Another base: hidden 32, 2 heads of 16, same layer count. */
    const char *other = path_in(fx->dir, "other-base");
    devio_mkmodel_opts mo = devio_mkmodel_opts_default();
    mo.out_dir = other;
    mo.hidden_size = 32;
    mo.n_heads = 2;
    mo.n_kv_heads = 2;
    devio_error err = {0};
    assert_int_equal(devio_mkmodel_write(&mo, &err), DEVIO_OK);
    devio_mkmodel_adapter_opts o = ad_opts(fx, path_in(fx->root, "for-other"));
    o.model_dir = other;
    write_adapter(&o);
    load_expect(fx, "for-other", 64, DEVIO_E_INVALID, &err);
    assert_msg_has(&err, "shape [8, 32], expected [8, 64]");
    assert_msg_has(&err, "q_proj.lora_A");
}

static void test_layer_beyond_base(void **state)
{
    fixture *fx = *state;
    const char *other = path_in(fx->dir, "deep-base");
    devio_mkmodel_opts mo = devio_mkmodel_opts_default();
    mo.out_dir = other;
    mo.n_layers = 3;
    devio_error err = {0};
    assert_int_equal(devio_mkmodel_write(&mo, &err), DEVIO_OK);
    devio_mkmodel_adapter_opts o = ad_opts(fx, path_in(fx->root, "deep"));
    o.model_dir = other;
    write_adapter(&o);
    load_expect(fx, "deep", 64, DEVIO_E_INVALID, &err);
    assert_msg_has(&err, "layer 2");
}

/* Rewrites root/rel's weights through `edit`, which may change entries. */
static void rewrite_weights(const fixture *fx, const char *dir,
                            size_t (*edit)(st_entry *e, size_t n, void *scratch), void *scratch)
{
    const char *p = path_in(dir, "adapter_model.safetensors");
    devio_st_file *f;
    st_entry e[64];
    size_t n = st_entries(p, &f, e, 60);
    n = edit(e, n, scratch);
    st_write(path_in(fx->dir, "tmp.safetensors"), e, n);
    devio_st_close(f);
    assert_int_equal(rename(path_in(fx->dir, "tmp.safetensors"), p), 0);
}

static size_t drop_one(st_entry *e, size_t n, void *scratch)
{
    (void)scratch;
    for (size_t i = 0; i < n; i++) {
        if (strcmp(e[i].name, tname(1, DEVIO_LORA_V, 'B')) == 0) {
            e[i] = e[n - 1];
            return n - 1;
        }
    }
    fail_msg("tensor to drop not found");
    return n;
}

static void test_missing_tensor(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_adapter_opts o = write_default(fx, "mt");
    rewrite_weights(fx, o.out_dir, drop_one, NULL);
    devio_error err;
    load_expect(fx, "mt", 64, DEVIO_E_INVALID, &err);
    assert_msg_has(&err, "layers.1.self_attn.v_proj.lora_B.weight' is missing");
}

/* Adds a copy of a q_proj tensor under another name (scratch). */
static size_t add_named(st_entry *e, size_t n, void *scratch)
{
    e[n] = e[0];
    snprintf(e[n].name, sizeof e[n].name, "%s", (const char *)scratch);
    return n + 1;
}

static void test_extra_tensor(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_adapter_opts o = write_default(fx, "xt");
    /* k_proj's A has q_proj's A shape [8, 64]: only the name is wrong. */
    rewrite_weights(fx, o.out_dir, add_named, (void *)tname(0, DEVIO_LORA_K, 'A'));
    devio_error err;
    load_expect(fx, "xt", 64, DEVIO_E_INVALID, &err);
    assert_msg_has(&err, "k_proj");
    assert_msg_has(&err, "target_modules");
}

static void test_unrecognised_tensor(void **state)
{
    fixture *fx = *state;
    const char *names[] = {
        "base_model.model.lm_head.lora_A.weight",
        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight",
        "base_model.model.model.layers.00.self_attn.q_proj.lora_A.weight",
        "base_model.model.model.layers.0.mlp.q_proj.lora_A.weight",
        "base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector",
        "base_model.model.model.layers.0.self_attn.q_proj.lora_C.weight",
        "model.layers.0.self_attn.q_proj.lora_A.weight",
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char rel[16];
        snprintf(rel, sizeof rel, "u%zu", i);
        devio_mkmodel_adapter_opts o = write_default(fx, rel);
        rewrite_weights(fx, o.out_dir, add_named, (void *)names[i]);
        devio_error err;
        load_expect(fx, rel, 64, DEVIO_E_UNSUPPORTED, &err);
        assert_msg_has(&err, names[i]);
    }
}

/* Makes one tensor F64 with its shape kept (scratch: a buffer to fill). */
static size_t make_f64(st_entry *e, size_t n, void *scratch)
{
    for (size_t i = 0; i < n; i++) {
        if (strcmp(e[i].name, tname(0, DEVIO_LORA_Q, 'B')) == 0) {
            snprintf(e[i].dtype, sizeof e[i].dtype, "F64");
            e[i].nbytes *= 2;
            memset(scratch, 0, (size_t)e[i].nbytes);
            e[i].data = scratch;
            return n;
        }
    }
    fail_msg("tensor not found");
    return n;
}

static void test_bad_dtype(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_adapter_opts o = write_default(fx, "dt");
    static uint8_t scratch[64 * 8 * 8];
    rewrite_weights(fx, o.out_dir, make_f64, scratch);
    devio_error err;
    load_expect(fx, "dt", 64, DEVIO_E_INVALID, &err);
    assert_msg_has(&err, "dtype F64");
    assert_msg_has(&err, "q_proj.lora_B");
}

/* scratch: which change to make to the first tensor. */
static size_t reshape_first(st_entry *e, size_t n, void *scratch)
{
    e[0].shape[0] = e[0].shape[0] * e[0].shape[1];
    if (*(const int *)scratch == 1) {
        e[0].ndim = 1;
        e[0].shape[1] = 0;
    } else {
        e[0].shape[1] = 1;
    }
    return n;
}

static void test_wrong_ndim_shape(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_adapter_opts o = write_default(fx, "nd");
    int one_dim = 1, flat = 2;
    rewrite_weights(fx, o.out_dir, reshape_first, &one_dim);
    devio_error err;
    load_expect(fx, "nd", 64, DEVIO_E_INVALID, &err);
    assert_msg_has(&err, "has shape [512], expected [8, 64]");
    o = write_default(fx, "flat");
    rewrite_weights(fx, o.out_dir, reshape_first, &flat);
    load_expect(fx, "flat", 64, DEVIO_E_INVALID, &err);
    assert_msg_has(&err, "has shape [512, 1], expected [8, 64]");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_target_names),
        cmocka_unit_test_setup_teardown(test_target_dims, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_load_qv, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_load_all_targets_bf16, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_load_f16, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_scale_rslora, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_alpha_default, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_alpha_real, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_target_string, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_target_pattern, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_layers_to_transform, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_symlink_inside_ok, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_unaligned_tensor, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_file_hash, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_writer_deterministic, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_writer_config, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_writer_value_ranges, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_writer_bad_opts, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_path_absolute, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_path_empty, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_path_dotdot, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_symlink_dir_outside, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_symlink_file_outside, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_root_missing, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_bad_args, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_missing_dir, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_missing_config, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_missing_weights, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_corrupt_json, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_truncated_safetensors, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_peft_type, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_rank_missing_or_zero, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_rank_too_high, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_rank_disagrees_with_tensors, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_unknown_target, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_fan_in_fan_out, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_bias, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_other_features_refused, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_shape_mismatch_other_base, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_layer_beyond_base, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_missing_tensor, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_extra_tensor, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_unrecognised_tensor, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_bad_dtype, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_wrong_ndim_shape, fx_setup, fx_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
