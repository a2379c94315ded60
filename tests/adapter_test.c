/* adapter_test.c - writes tiny base models and PEFT LoRA adapters with devio_mkmodel and loads them back: names, values, scales, hashes, the writer.
 * Every test asserts a status, a value or a message; none may pass by printing. libm here is only an oracle. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "device/adapter/adapter.h"
#include "device/model/model.h"
#include "device/numerics/numerics.h"
#include "device/model/safetensors.h"
#include "common/sha256.h"
#include "tests/adapter_fixture.h"
#include "tools/mkmodel/mkmodel.h"

/* What the loader must read back for a value the writer generated. */
static float stored(float v, devio_dtype dt)
{
    switch (dt) {
    case DEVIO_F16:
        return devio_f16_to_f32(devio_f32_to_f16_rne(v));
    case DEVIO_BF16:
        return devio_bf16_to_f32(devio_f32_to_bf16_rne(v));
    default: /* F32: adapters are never quantized */
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
            uint64_t od, id;
            if (!((o->targets >> t) & 1u) ||
                !devio_lora_target_dims(fx->model, l, (devio_lora_target)t, &od, &id)) {
                assert_null(m->a.data);
                assert_null(m->b.data);
                continue;
            }
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
    const char *want[] = {"q_proj",  "k_proj",    "v_proj",  "o_proj",  "gate_proj",
                          "up_proj", "down_proj", "in_proj", "out_proj"};
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
    for (int t = 0; t <= DEVIO_LORA_DOWN; t++) {
        uint64_t o = 0, i = 0;
        assert_true(devio_lora_target_dims(fx->model, 1, (devio_lora_target)t, &o, &i));
        assert_int_equal(o, want[t][0]);
        assert_int_equal(i, want[t][1]);
    }
    uint64_t o, i;
    /* A Llama layer has no mixer. */
    assert_false(devio_lora_target_dims(fx->model, 1, DEVIO_LORA_IN_PROJ, &o, &i));
    assert_false(devio_lora_target_dims(fx->model, 1, DEVIO_LORA_OUT_PROJ, &o, &i));
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
    /* Every module a Llama layer has; in_proj and out_proj are a mixer's. */
    const uint32_t llama_all = (1u << (DEVIO_LORA_DOWN + 1)) - 1u;
    assert_int_equal(a->targets, llama_all);
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
    assert_int_equal(a->targets, (1u << (DEVIO_LORA_DOWN + 1)) - 1u);
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

/* No link is followed, even one that stays inside the root: the path is
 * walked with openat(O_NOFOLLOW), so what was checked is what is read. */
static void test_links_and_dotdot_refused(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_adapter_opts o = write_default(fx, "real");
    assert_int_equal(symlink("real", path_in(fx->root, "alias")), 0);
    assert_int_equal(mkdir(path_in(fx->root, "x"), 0777), 0);
    devio_error err;
    load_expect(fx, "alias", 64, DEVIO_E_INVALID, &err);
    assert_msg_has(&err, "symbolic link ('alias')");
    assert_msg_has(&err, "outside the adapters root");
    load_expect(fx, "x/../real/", 64, DEVIO_E_INVALID, &err);
    assert_msg_has(&err, "'..'");
    load_expect(fx, "x//real", 64, DEVIO_E_INVALID, &err);
    assert_msg_has(&err, "empty component");
    devio_adapter *a = load_expect(fx, "./real", 64, DEVIO_OK, &err);
    devio_adapter_free(a);
    a = load_expect(fx, "real/", 64, DEVIO_OK, &err);
    assert_string_equal(a->path, "real/");
    devio_adapter_free(a);
    /* A link to a file of the same directory is refused too. */
    const char *c = path_in(o.out_dir, "adapter_config.json");
    assert_int_equal(rename(c, path_in(o.out_dir, "cfg.json")), 0);
    assert_int_equal(symlink("cfg.json", c), 0);
    load_expect(fx, "real", 64, DEVIO_E_INVALID, &err);
    assert_msg_has(&err, "real/adapter_config.json is a symbolic link");
    char hex[65];
    uint64_t size;
    assert_int_equal(devio_adapter_file_hash(fx->root, "alias", hex, &size, &err),
                     DEVIO_E_INVALID);
}

/* Every byte of `path` inverted, in place: same inode, same size. */
static void overwrite_in_place(const char *path)
{
    size_t n;
    uint8_t *b = read_all(path, &n);
    for (size_t i = 0; i < n; i++)
        b[i] ^= 0xFF;
    int fd = open(path, O_WRONLY);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, b, n, 0), (ssize_t)n);
    assert_int_equal(close(fd), 0);
    free(b);
}

/* The loaded weights are the bytes the record's digest describes, and
 * neither follows the file once it is loaded. */
static void test_weights_changed_after_load(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_adapter_opts o = write_default(fx, "w");
    const char *w = path_in(o.out_dir, "adapter_model.safetensors");
    char want[65];
    uint64_t wsize;
    sha_of_file(w, want, &wsize);
    devio_error err;
    devio_adapter *a = load_expect(fx, "w", 64, DEVIO_OK, &err);
    assert_string_equal(a->sha256, want);
    assert_int_equal(a->size, wsize);
    overwrite_in_place(w);
    check_values(fx, &o, a);
    assert_string_equal(a->sha256, want);
    assert_int_equal(truncate(w, 0), 0);
    check_values(fx, &o, a); /* reads every element: no SIGBUS */
    assert_string_equal(a->sha256, want);
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
    /* Every F32 tensor now sits 2 bytes off a 4-byte boundary. */
    st_write_shifted(path_in(fx->dir, "tmp.safetensors"), e, n, 2);
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
    assert_int_equal(devio_adapter_file_hash(fx->root, "nope", hex, &size, &err),
                     DEVIO_E_INVALID);
    /* Only the weights file is needed for the hash. */
    assert_int_equal(unlink(path_in(o.out_dir, "adapter_config.json")), 0);
    assert_int_equal(devio_adapter_file_hash(fx->root, "h", hex, &size, &err), DEVIO_OK);
    assert_int_equal(unlink(path_in(o.out_dir, "adapter_model.safetensors")), 0);
    assert_int_equal(devio_adapter_file_hash(fx->root, "h", hex, &size, &err), DEVIO_E_INVALID);
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
        cmocka_unit_test_setup_teardown(test_links_and_dotdot_refused, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_weights_changed_after_load, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_unaligned_tensor, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_file_hash, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_writer_deterministic, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_writer_config, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_writer_value_ranges, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_writer_bad_opts, fx_setup, fx_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
