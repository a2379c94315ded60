/* model_fixture.c - the model tests' shared fixture and file helpers (see model_fixture.h).
 * Test-only; it never reaches a production binary, and a helper that cannot do its job fails the calling test. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/model_fixture.h"
#include "tests/testutil.h"

int fx_setup(void **state)
{
    fixture *fx = calloc(1, sizeof *fx);
    if (!fx)
        return -1;
    snprintf(fx->dir, sizeof fx->dir, "/tmp/devio-model-test-XXXXXX");
    if (!mkdtemp(fx->dir)) {
        free(fx);
        return -1;
    }
    *state = fx;
    return 0;
}

int fx_teardown(void **state)
{
    fixture *fx = *state;
    devio_rmtree(fx->dir);
    free(fx);
    return 0;
}

char *path_in(const char *dir, const char *name)
{
    static _Thread_local char buf[4][512];
    static _Thread_local int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
    return buf[k];
}

devio_mkmodel_opts tiny_opts(const char *dir)
{
    devio_mkmodel_opts o = devio_mkmodel_opts_default();
    o.out_dir = dir;
    o.seed = 7;
    return o;
}

devio_mkmodel_opts arch_opts(const char *arch, const char *preset, const char *dir)
{
    devio_mkmodel_opts o = devio_mkmodel_opts_default();
    o.arch = arch;
    assert_int_equal(devio_mkmodel_preset(preset, &o, NULL), DEVIO_OK);
    o.out_dir = dir;
    o.seed = 7;
    return o;
}

void expect_refusals(const bad_case *cases, size_t n, const char *dir)
{
    for (size_t i = 0; i < n; i++) {
        devio_mkmodel_opts o = arch_opts(cases[i].arch, "tiny", dir);
        cases[i].edit(&o);
        devio_error err = {0};
        devio_status st = devio_mkmodel_write(&o, &err);
        if (st != DEVIO_E_INVALID || !strstr(err.message, cases[i].message))
            print_error("case %zu: status %d, message: %s\n", i, (int)st, err.message);
        assert_int_equal(st, DEVIO_E_INVALID);
        assert_non_null(strstr(err.message, cases[i].message));
    }
    assert_int_equal(access(path_in(dir, "config.json"), F_OK), -1);
    assert_int_equal(access(path_in(dir, "model.safetensors"), F_OK), -1);
}

void write_model(const devio_mkmodel_opts *o)
{
    devio_error err = {0};
    devio_status st = devio_mkmodel_write(o, &err);
    if (st != DEVIO_OK)
        print_error("mkmodel: %s\n", err.message);
    assert_int_equal(st, DEVIO_OK);
}
/* Replaces the first `old` in a text file with `new`; the text must be there. */
void file_sub(const char *path, const char *old, const char *new)
{
    size_t n;
    char *s = (char *)read_all(path, &n);
    char *at = strstr(s, old);
    assert_non_null(at);
    size_t a = (size_t)(at - s), lo = strlen(old), ln = strlen(new);
    char *o = malloc(n - lo + ln);
    assert_non_null(o);
    memcpy(o, s, a);
    memcpy(o + a, new, ln);
    memcpy(o + a + ln, at + lo, n - a - lo);
    write_all(path, o, n - lo + ln);
    free(o);
    free(s);
}

uint64_t header_len(const uint8_t *b)
{
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = (n << 8) | b[i];
    return n;
}

/* Rewrites a safetensors file with `header` (raw text) and the old data. */
void header_set_raw(const char *path, const char *header, size_t hlen)
{
    size_t n;
    uint8_t *b = read_all(path, &n);
    uint64_t old = header_len(b);
    size_t data = n - 8 - (size_t)old;
    uint8_t *o = malloc(8 + hlen + data);
    assert_non_null(o);
    for (int i = 0; i < 8; i++)
        o[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
    memcpy(o + 8, header, hlen);
    memcpy(o + 8 + hlen, b + 8 + old, data);
    write_all(path, o, 8 + hlen + data);
    free(o);
    free(b);
}

json_t *header_load(const char *path)
{
    size_t n;
    uint8_t *b = read_all(path, &n);
    json_error_t je;
    json_t *h = json_loadb((const char *)b + 8, (size_t)header_len(b), 0, &je);
    assert_non_null(h);
    free(b);
    return h;
}

/* Stores `h` (consumed) as the header of `path`, keeping the data. */
void header_store(const char *path, json_t *h)
{
    char *s = json_dumps(h, JSON_COMPACT | JSON_SORT_KEYS);
    assert_non_null(s);
    header_set_raw(path, s, strlen(s));
    free(s);
    json_decref(h);
}

void tensor_drop(const char *path, const char *name)
{
    size_t n;
    uint8_t *b = read_all(path, &n);
    uint64_t hl = header_len(b);
    json_t *h = header_load(path);
    json_t *off = json_object_get(json_object_get(h, name), "data_offsets");
    assert_non_null(off);
    uint64_t lo = (uint64_t)json_integer_value(json_array_get(off, 0));
    uint64_t hi = (uint64_t)json_integer_value(json_array_get(off, 1));
    json_object_del(h, name);
    const char *key;
    json_t *val;
    json_object_foreach(h, key, val)
    {
        json_t *o = json_object_get(val, "data_offsets");
        if (!o || (uint64_t)json_integer_value(json_array_get(o, 0)) < hi)
            continue;
        for (size_t i = 0; i < 2; i++)
            json_array_set_new(o, i,
                               json_integer(json_integer_value(json_array_get(o, i)) -
                                            (json_int_t)(hi - lo)));
    }
    uint8_t *data = b + 8 + hl;
    size_t dn = n - 8 - (size_t)hl;
    memmove(data + lo, data + hi, dn - (size_t)hi);
    char *s = json_dumps(h, JSON_COMPACT | JSON_SORT_KEYS);
    assert_non_null(s);
    size_t sl = strlen(s), total = 8 + sl + dn - (size_t)(hi - lo);
    uint8_t *o = malloc(total);
    assert_non_null(o);
    for (int i = 0; i < 8; i++)
        o[i] = (uint8_t)((uint64_t)sl >> (8 * i));
    memcpy(o + 8, s, sl);
    memcpy(o + 8 + sl, data, dn - (size_t)(hi - lo));
    write_all(path, o, total);
    free(o);
    free(s);
    json_decref(h);
    free(b);
}

/* Loading must fail with `want`, leave *out NULL and name both strings. */
void expect_fail(const char *dir, devio_status want, const char *s1, const char *s2)
{
    devio_model *m = (devio_model *)&m; /* not NULL, so the reset is observable */
    devio_error err;
    memset(&err, 0, sizeof err);
    devio_status st = devio_model_load(dir, &m, &err);
    if (st != want || (s1 && !strstr(err.message, s1)) || (s2 && !strstr(err.message, s2)))
        print_error("status %d, message: %s\n", (int)st, err.message);
    assert_int_equal(st, want);
    assert_int_equal(err.status, want);
    assert_null(m);
    if (s1)
        assert_non_null(strstr(err.message, s1));
    if (s2)
        assert_non_null(strstr(err.message, s2));
}

devio_model *load_ok(const char *dir)
{
    devio_model *m = NULL;
    devio_error err = {0};
    devio_status st = devio_model_load(dir, &m, &err);
    if (st != DEVIO_OK)
        print_error("load: %s\n", err.message);
    assert_int_equal(st, DEVIO_OK);
    assert_non_null(m);
    return m;
}

/* ---- reading back what devio-mkmodel wrote ---- */

json_t *cfg_get(json_t *c, const char *key)
{
    json_t *v = json_object_get(c, key);
    if (!v)
        print_error("config key %s is missing\n", key);
    assert_non_null(v);
    return v;
}

int64_t cfg_int(json_t *c, const char *key)
{
    json_t *v = cfg_get(c, key);
    if (!json_is_integer(v))
        print_error("config key %s is not an integer\n", key);
    assert_true(json_is_integer(v));
    return (int64_t)json_integer_value(v);
}

bool cfg_bool(json_t *c, const char *key)
{
    json_t *v = cfg_get(c, key);
    assert_true(json_is_boolean(v));
    return json_is_true(v);
}

void cfg_str(json_t *c, const char *key, const char *want)
{
    json_t *v = cfg_get(c, key);
    assert_true(json_is_string(v));
    assert_string_equal(json_string_value(v), want);
}

void header_shape_is(json_t *h, const shape_want *w, const char *dt)
{
    json_t *t = json_object_get(h, w->name);
    if (!t)
        print_error("tensor %s is missing\n", w->name);
    assert_non_null(t);
    if (dt)
        cfg_str(t, "dtype", dt);
    json_t *shape = json_object_get(t, "shape");
    assert_int_equal(json_array_size(shape), w->ndim);
    for (uint32_t i = 0; i < w->ndim; i++)
        assert_int_equal(json_integer_value(json_array_get(shape, i)), w->s[i]);
}

uint64_t header_params(json_t *h)
{
    uint64_t total = 0;
    const char *k;
    json_t *t;
    json_object_foreach(h, k, t) {
        if (strcmp(k, "__metadata__") == 0)
            continue;
        uint64_t n = 1;
        json_t *d;
        size_t i;
        json_array_foreach(json_object_get(t, "shape"), i, d)
            n *= (uint64_t)json_integer_value(d);
        total += n;
    }
    return total;
}

float *tensor_f32(const char *dir, const char *name, size_t *n)
{
    size_t size;
    uint8_t *b = read_all(path_in(dir, "model.safetensors"), &size);
    json_t *h = header_load(path_in(dir, "model.safetensors"));
    json_t *off = json_object_get(json_object_get(h, name), "data_offsets");
    assert_non_null(off);
    size_t a = (size_t)json_integer_value(json_array_get(off, 0));
    size_t e = (size_t)json_integer_value(json_array_get(off, 1));
    size_t base = 8 + (size_t)header_len(b);
    assert_true(base + e <= size);
    *n = (e - a) / 4;
    float *v = malloc(e - a + 4);
    assert_non_null(v);
    memcpy(v, b + base + a, e - a); /* little-endian host: what the writer assumes of us */
    json_decref(h);
    free(b);
    return v;
}

bool files_equal(const char *a, const char *b)
{
    size_t na, nb;
    uint8_t *x = read_all(a, &na), *y = read_all(b, &nb);
    bool eq = na == nb && memcmp(x, y, na) == 0;
    free(x);
    free(y);
    return eq;
}

const char *write_arch(const fixture *fx, uint64_t seed, const char *arch)
{
    devio_mkmodel_opts o = devio_mkmodel_opts_default();
    o.arch = arch;
    assert_int_equal(devio_mkmodel_preset("tiny", &o, NULL), DEVIO_OK);
    o.out_dir = fx->dir;
    o.seed = seed;
    write_model(&o);
    return path_in(fx->dir, "config.json");
}

void expect_deterministic(devio_mkmodel_opts o, const char *dir, const char *name)
{
    char a[192], b[192], c[192];
    snprintf(a, sizeof a, "%s/%s-a", dir, name);
    snprintf(b, sizeof b, "%s/%s-b", dir, name);
    snprintf(c, sizeof c, "%s/%s-c", dir, name);
    o.out_dir = a;
    write_model(&o);
    o.out_dir = b;
    write_model(&o);
    o.out_dir = c;
    o.seed = 8;
    write_model(&o);
    assert_true(files_equal(path_in(a, "model.safetensors"), path_in(b, "model.safetensors")));
    assert_true(files_equal(path_in(a, "config.json"), path_in(b, "config.json")));
    assert_false(files_equal(path_in(a, "model.safetensors"), path_in(c, "model.safetensors")));
    /* The seed changes the weights, never the config. */
    assert_true(files_equal(path_in(a, "config.json"), path_in(c, "config.json")));
}
