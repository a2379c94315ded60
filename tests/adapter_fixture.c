/* adapter_fixture.c - the adapter tests' shared fixture and file helpers (see adapter_fixture.h).
 * Test-only; it never reaches a production binary, and a helper that cannot do its job fails the calling test. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tests/adapter_fixture.h"
#include "tests/testutil.h"

int fx_setup(void **state)
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

int fx_teardown(void **state)
{
    fixture *fx = *state;
    devio_model_free(fx->model);
    devio_rmtree(fx->dir);
    free(fx);
    return 0;
}

const char *path_in(const char *dir, const char *name)
{
    static _Thread_local char buf[4][512];
    static _Thread_local int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
    return buf[k];
}

devio_mkmodel_adapter_opts ad_opts(fixture *fx, const char *out_dir)
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

void write_adapter(const devio_mkmodel_adapter_opts *o)
{
    devio_error err = {0};
    devio_status st = devio_mkmodel_write_adapter(o, &err);
    if (st != DEVIO_OK)
        print_error("mkmodel adapter: %s\n", err.message);
    assert_int_equal(st, DEVIO_OK);
}

/* Writes the default q/v adapter at root/rel and returns its options. */
devio_mkmodel_adapter_opts write_default(fixture *fx, const char *rel)
{
    devio_mkmodel_adapter_opts o = ad_opts(fx, path_in(fx->root, rel));
    write_adapter(&o);
    return o;
}

/* Loads root/rel with max rank 64 and expects status `want`; returns the
 * adapter (NULL on failure, which is also asserted). */
devio_adapter *load_expect(const fixture *fx, const char *rel, uint32_t max_rank,
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

void assert_msg_has(const devio_error *err, const char *needle)
{
    if (!strstr(err->message, needle))
        print_error("message '%s' lacks '%s'\n", err->message, needle);
    assert_non_null(strstr(err->message, needle));
}

/* ---- file helpers ---- */

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

void config_set(const char *dir, const char *key, json_t *val)
{
    kv e = {key, val};
    edit_config(dir, set_kv, &e);
}

/* Writes a safetensors file: header sorted by jansson, padded to 8 bytes,
 * data in entry order. */
void st_write(const char *path, const st_entry *e, size_t n)
{
    st_write_shifted(path, e, n, 0);
}

void st_write_shifted(const char *path, const st_entry *e, size_t n, size_t shift)
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
    size_t hl = strlen(hs), padded = (hl + 7) / 8 * 8 + shift;
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
size_t st_entries(const char *path, devio_st_file **f, st_entry *e, size_t cap)
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

const char *tname(uint32_t layer, devio_lora_target t, char ab)
{
    static _Thread_local char buf[4][160];
    static _Thread_local int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "base_model.model.model.layers.%u.%s.%s.lora_%c.weight",
             layer, t <= DEVIO_LORA_O ? "self_attn" : "mlp", devio_lora_target_name(t), ab);
    return buf[k];
}

