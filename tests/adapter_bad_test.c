/* adapter_bad_test.c - breaks adapters on purpose: paths leading out of the root, missing and corrupt files, config fields and tensors the device refuses.
 * Every case asserts the status and the words of the error; nothing refused may load, crash or leave an adapter behind. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "device/adapter/adapter.h"
#include "device/model/model.h"
#include "device/model/safetensors.h"
#include "tests/adapter_fixture.h"
#include "tools/mkmodel/mkmodel.h"

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
    assert_msg_has(&err, "adapter path 'link' goes through a symbolic link");
    assert_msg_has(&err, "outside the adapters root");
    load_expect(fx, "rel-link", 64, DEVIO_E_INVALID, &err);
    assert_msg_has(&err, "adapter path 'rel-link' goes through a symbolic link");
    /* A link deeper down is refused the same way. */
    assert_int_equal(mkdir(path_in(fx->root, "d"), 0777), 0);
    assert_int_equal(symlink(o.out_dir, path_in(path_in(fx->root, "d"), "in")), 0);
    load_expect(fx, "d/in", 64, DEVIO_E_INVALID, &err);
    assert_msg_has(&err, "symbolic link ('in')");
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
    /* A root that went away after start is the server's fault, not the command's. */
    assert_int_equal(devio_adapter_load(path_in(fx->dir, "no-root"), "x", "n", fx->model, 64, &a,
                                        &err),
                     DEVIO_E_IO);
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

/* ---- missing and corrupt files ----
 * What the command names and is not there is invalid_input, at the device as
 * over HTTP; a file that is there but cannot be read is io_error (the fault
 * sweep, tests/fault_sweep_test.c, fails reads). */

static void test_missing_dir(void **state)
{
    fixture *fx = *state;
    devio_error err;
    load_expect(fx, "nope", 64, DEVIO_E_INVALID, &err);
    assert_msg_has(&err, "nope");
    write_all(path_in(fx->root, "file"), "x", 1);
    load_expect(fx, "file", 64, DEVIO_E_INVALID, &err);
}

static void test_missing_config(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_adapter_opts o = write_default(fx, "nc");
    assert_int_equal(unlink(path_in(o.out_dir, "adapter_config.json")), 0);
    devio_error err;
    load_expect(fx, "nc", 64, DEVIO_E_INVALID, &err);
    assert_msg_has(&err, "nc/adapter_config.json");
}

static void test_missing_weights(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_adapter_opts o = write_default(fx, "nw");
    assert_int_equal(unlink(path_in(o.out_dir, "adapter_model.safetensors")), 0);
    devio_error err;
    load_expect(fx, "nw", 64, DEVIO_E_INVALID, &err);
    assert_msg_has(&err, "nw/adapter_model.safetensors");
    /* A dangling link is a link: refused before anything looks where it leads. */
    assert_int_equal(symlink("gone", path_in(o.out_dir, "adapter_model.safetensors")), 0);
    load_expect(fx, "nw", 64, DEVIO_E_INVALID, &err);
    assert_msg_has(&err, "adapter_model.safetensors is a symbolic link");
    /* A FIFO is not a regular file, and opening it does not wait for a writer. */
    assert_int_equal(unlink(path_in(o.out_dir, "adapter_model.safetensors")), 0);
    assert_int_equal(mkfifo(path_in(o.out_dir, "adapter_model.safetensors"), 0600), 0);
    load_expect(fx, "nw", 64, DEVIO_E_INVALID, &err);
    assert_msg_has(&err, "not a regular file");
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

/* ---- layout and values of the weights file ---- */

/* Puts a hole of 4 bytes before entry 1. */
static size_t add_hole(st_entry *e, size_t n, void *scratch)
{
    (void)scratch;
    assert_true(n > 1);
    e[1].gap = 4;
    return n;
}

/* Rewrites the header of `p` through jansson, keeping the data bytes. */
static void header_edit(const char *p, void (*edit)(json_t *h))
{
    size_t n;
    uint8_t *b = read_all(p, &n);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--)
        hl = (hl << 8) | b[i];
    json_error_t je;
    json_t *h = json_loadb((const char *)b + 8, (size_t)hl, 0, &je);
    assert_non_null(h);
    edit(h);
    char *s = json_dumps(h, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(h);
    size_t sl = strlen(s), dn = n - 8 - (size_t)hl;
    uint8_t *o = malloc(8 + sl + dn);
    assert_non_null(o);
    for (int i = 0; i < 8; i++)
        o[i] = (uint8_t)((uint64_t)sl >> (8 * i));
    memcpy(o + 8, s, sl);
    memcpy(o + 8 + sl, b + 8 + hl, dn);
    write_all(p, o, 8 + sl + dn);
    free(o);
    free(s);
    free(b);
}

/* The layer-1 q_proj lora_A range put on the layer-0 one (same shape). */
static void overlap_q(json_t *h)
{
    json_t *a0 = json_object_get(json_object_get(h, tname(0, DEVIO_LORA_Q, 'A')), "data_offsets");
    json_t *a1 = json_object_get(json_object_get(h, tname(1, DEVIO_LORA_Q, 'A')), "data_offsets");
    assert_non_null(a0);
    assert_non_null(a1);
    /* Move the later onto the earlier, so the overlap is met before the hole. */
    if (json_integer_value(json_array_get(a0, 0)) > json_integer_value(json_array_get(a1, 0)))
        json_array_set(a0, 0, json_array_get(a1, 0)), json_array_set(a0, 1, json_array_get(a1, 1));
    else
        json_array_set(a1, 0, json_array_get(a0, 0)), json_array_set(a1, 1, json_array_get(a0, 1));
}

static void test_layout_refused(void **state)
{
    fixture *fx = *state;
    devio_mkmodel_adapter_opts o = write_default(fx, "lay");
    devio_error err;
    rewrite_weights(fx, o.out_dir, add_hole, NULL);
    load_expect(fx, "lay", 64, DEVIO_E_MODEL, &err);
    assert_msg_has(&err, "lay/adapter_model.safetensors: data bytes [");
    assert_msg_has(&err, "no holes");

    write_adapter(&o);
    const char *p = path_in(o.out_dir, "adapter_model.safetensors");
    header_edit(p, overlap_q);
    load_expect(fx, "lay", 64, DEVIO_E_MODEL, &err);
    assert_msg_has(&err, "q_proj.lora_A.weight' (data_offsets [");
    assert_msg_has(&err, "overlaps");

    write_adapter(&o);
    assert_int_equal(devio_append_zeros(p, 2), 0);
    load_expect(fx, "lay", 64, DEVIO_E_MODEL, &err);
    assert_msg_has(&err, "after the last tensor");
}

/* Puts the bad value of *scratch (a uint32_t, F32) at element 2 of the
 * layer-1 v_proj lora_B tensor. */
typedef struct poke_arg {
    uint32_t bits;
    uint8_t buf[65536];
} poke_arg;

static size_t poke_v_b(st_entry *e, size_t n, void *scratch)
{
    poke_arg *a = scratch;
    for (size_t i = 0; i < n; i++) {
        if (strcmp(e[i].name, tname(1, DEVIO_LORA_V, 'B')) != 0)
            continue;
        assert_string_equal(e[i].dtype, "F32");
        assert_true(e[i].nbytes <= sizeof a->buf);
        memcpy(a->buf, e[i].data, e[i].nbytes);
        memcpy(a->buf + 8, &a->bits, 4);
        e[i].data = a->buf;
        return n;
    }
    fail_msg("tensor to poke not found");
    return n;
}

static void test_nonfinite_refused(void **state)
{
    fixture *fx = *state;
    static const struct {
        uint32_t bits;
        const char *what;
    } cases[] = {{0x7fc00000u, "holds NaN at element 2"},
                 {0x7f800000u, "holds an infinity at element 2"},
                 {0xff800000u, "holds an infinity at element 2"}};
    static poke_arg arg;
    devio_mkmodel_adapter_opts o = write_default(fx, "nan");
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        write_adapter(&o);
        arg.bits = cases[k].bits;
        rewrite_weights(fx, o.out_dir, poke_v_b, &arg);
        devio_error err;
        load_expect(fx, "nan", 64, DEVIO_E_MODEL, &err);
        assert_msg_has(&err, "nan/adapter_model.safetensors: tensor '");
        assert_msg_has(&err, "layers.1.self_attn.v_proj.lora_B.weight'");
        assert_msg_has(&err, cases[k].what);
    }
    /* The same rewrite with a finite value loads. */
    write_adapter(&o);
    arg.bits = 0x3f800000u;
    rewrite_weights(fx, o.out_dir, poke_v_b, &arg);
    devio_error err;
    devio_adapter *a = load_expect(fx, "nan", 64, DEVIO_OK, &err);
    devio_adapter_free(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
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
        cmocka_unit_test_setup_teardown(test_layout_refused, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_nonfinite_refused, fx_setup, fx_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
