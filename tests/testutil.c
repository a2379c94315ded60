/* testutil.c - temp-dir models for tests.
 * Test-only; never linked into production binaries. */
#define _XOPEN_SOURCE 700
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/testutil.h"

#include <setjmp.h>
#include <stdarg.h>
#include <cmocka.h>

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

uint8_t *devio_read_file(const char *path, size_t *size)
{
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return NULL;
    uint8_t *b = NULL;
    long n = -1;
    if (fseek(fp, 0, SEEK_END) == 0 && (n = ftell(fp)) >= 0 && fseek(fp, 0, SEEK_SET) == 0)
        b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, fp) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(fp);
    if (b) {
        b[n] = 0;
        *size = (size_t)n;
    }
    return b;
}

int devio_write_file(const char *path, const void *data, size_t size)
{
    FILE *fp = fopen(path, "wb");
    if (!fp)
        return -1;
    int ok = fwrite(data, 1, size, fp) == size;
    return fclose(fp) == 0 && ok ? 0 : -1;
}

uint8_t *read_all(const char *path, size_t *size)
{
    uint8_t *b = devio_read_file(path, size);
    assert_non_null(b);
    return b;
}

void write_all(const char *path, const void *data, size_t size)
{
    assert_int_equal(devio_write_file(path, data, size), 0);
}

int devio_append_zeros(const char *path, size_t n)
{
    FILE *fp = fopen(path, "ab");
    if (!fp)
        return -1;
    int ok = 1;
    for (size_t i = 0; i < n && ok; i++)
        ok = fputc(0, fp) != EOF;
    return fclose(fp) == 0 && ok ? 0 : -1;
}

void devio_rmtree(const char *dir)
{
    nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

int devio_fixture_make(devio_fixture *f, devio_mkmodel_opts o)
{
    memset(f, 0, sizeof *f);
    const char *tmp = getenv("TEST_TMPDIR");
    snprintf(f->dir, sizeof f->dir, "%s/devio-model-XXXXXX", tmp ? tmp : "/tmp");
    if (!mkdtemp(f->dir))
        return -1;
    o.out_dir = f->dir;
    devio_error err = {0};
    if (devio_mkmodel_write(&o, &err) != DEVIO_OK) {
        fprintf(stderr, "mkmodel: %s\n", err.message);
        return -1;
    }
    if (devio_model_load(f->dir, &f->model, &err) != DEVIO_OK) {
        fprintf(stderr, "load: %s\n", err.message);
        return -1;
    }
    return 0;
}

int devio_fixture_preset(devio_fixture *f, const char *preset, devio_dtype dtype, uint64_t seed)
{
    devio_mkmodel_opts o = devio_mkmodel_opts_default();
    devio_error err = {0};
    if (devio_mkmodel_preset(preset, &o, &err) != DEVIO_OK)
        return -1;
    o.dtype = dtype;
    o.seed = seed;
    return devio_fixture_make(f, o);
}

int devio_fixture_arch(devio_fixture *f, const char *preset, const char *arch, uint64_t seed)
{
    devio_mkmodel_opts o = devio_mkmodel_opts_default();
    o.arch = arch;
    if (devio_mkmodel_preset(preset, &o, NULL) != DEVIO_OK)
        return -1;
    o.seed = seed;
    return devio_fixture_make(f, o);
}

void devio_fixture_free(devio_fixture *f)
{
    devio_model_free(f->model);
    f->model = NULL;
    if (f->dir[0])
        devio_rmtree(f->dir);
    f->dir[0] = '\0';
}

uint64_t devio_test_seq(devio_device *d)
{
    uint64_t s = 0;
    assert_int_equal(devio_seq_create(d, &s, NULL), DEVIO_OK);
    return s;
}

void devio_test_tokens(int32_t *t, uint32_t n, uint32_t salt, uint32_t vocab)
{
    for (uint32_t i = 0; i < n; i++)
        t[i] = (int32_t)((i * 37u + salt * 11u + 3u) % vocab);
}

float *devio_test_step(devio_device *d, uint64_t seq, const int32_t *tok, uint32_t n,
                       devio_snapshot snap, devio_status want)
{
    devio_row row = {.seq = seq, .tokens = tok, .n_tokens = n, .logits = DEVIO_LOGITS_LAST,
                     .snapshot = snap};
    devio_plan plan = {.rows = &row, .n_rows = 1};
    uint64_t t;
    devio_error err = {0};
    assert_int_equal(devio_launch(d, &plan, &t, &err), want);
    if (want != DEVIO_OK)
        return NULL;
    devio_step_result r;
    assert_int_equal(devio_await(d, t, -1, &r, &err), DEVIO_OK);
    uint32_t vocab = devio_model_of(d)->cfg.vocab_size;
    float *out = malloc(vocab * sizeof *out);
    assert_non_null(out);
    assert_int_equal(devio_logits_read(d, r.rows[0].logits, 0, 1, out, NULL, &err), DEVIO_OK);
    devio_effect rel = {.kind = DEVIO_EFFECT_RELEASE, .logits = r.rows[0].logits};
    devio_outcome o;
    assert_int_equal(devio_apply(d, &rel, &o, &err), DEVIO_OK);
    devio_step_result_free(&r);
    return out;
}

uint8_t *devio_test_export(devio_device *d, uint64_t seq, bool snapshots, size_t piece,
                           size_t *n)
{
    devio_export *x = NULL;
    uint64_t total = 0;
    devio_error err = {0};
    assert_int_equal(devio_export_open(d, seq, snapshots, &x, &total, &err), DEVIO_OK);
    uint8_t *b = malloc((size_t)total + 1);
    assert_non_null(b);
    size_t got = 0, k = 1;
    while (k > 0) {
        assert_true(got <= total);
        size_t cap = (size_t)total + 1 - got < piece ? (size_t)total + 1 - got : piece;
        assert_int_equal(devio_export_read(x, b + got, cap, &k, &err), DEVIO_OK);
        got += k;
    }
    devio_export_close(x);
    assert_int_equal(got, total);
    *n = got;
    return b;
}

devio_status devio_test_import(devio_device *d, const uint8_t *b, size_t n, size_t piece,
                               uint64_t max_bytes, uint64_t *seq, devio_error *err)
{
    devio_import *m = NULL;
    devio_status s = devio_import_open(d, max_bytes, &m, err);
    for (size_t at = 0; s == DEVIO_OK && at < n; at += piece)
        s = devio_import_write(m, b + at, n - at < piece ? n - at : piece, err);
    if (s == DEVIO_OK)
        s = devio_import_finish(m, seq, err);
    devio_import_close(m);
    return s;
}

void devio_test_steps_alike(devio_device *a, uint64_t sa, devio_device *b, uint64_t sb,
                            uint32_t steps, uint32_t salt)
{
    uint32_t V = devio_model_of(a)->cfg.vocab_size;
    for (uint32_t i = 0; i < steps; i++) {
        int32_t tok;
        devio_test_tokens(&tok, 1, salt + i, V);
        float *la = devio_test_step(a, sa, &tok, 1, DEVIO_SNAP_NONE, DEVIO_OK);
        float *lb = devio_test_step(b, sb, &tok, 1, DEVIO_SNAP_NONE, DEVIO_OK);
        assert_memory_equal(la, lb, V * sizeof *la);
        free(la);
        free(lb);
    }
}

uint64_t devio_test_move(devio_device *from, uint64_t seq, bool snapshots, devio_device *to)
{
    size_t n;
    uint8_t *b = devio_test_export(from, seq, snapshots, 333, &n);
    uint64_t id = 0;
    devio_error err = {0};
    devio_status s = devio_test_import(to, b, n, 1000, 0, &id, &err);
    if (s != DEVIO_OK)
        fail_msg("import: %s", err.message);
    free(b);
    return id;
}

int devio_run_tests(const char *name, const struct CMUnitTest *tests, size_t n,
                    int (*setup)(void **), int (*teardown)(void **))
{
    const char *total = getenv("TEST_TOTAL_SHARDS"), *index = getenv("TEST_SHARD_INDEX");
    const char *status = getenv("TEST_SHARD_STATUS_FILE");
    unsigned long k = total ? strtoul(total, NULL, 10) : 1;
    unsigned long first = index ? strtoul(index, NULL, 10) : 0;
    if (status) { /* tells Bazel the sharding is honoured */
        FILE *fp = fopen(status, "w");
        if (fp)
            fclose(fp);
    }
    if (k <= 1 || first >= k)
        return _cmocka_run_group_tests(name, tests, n, setup, teardown);
    struct CMUnitTest *mine = malloc(n * sizeof *mine);
    if (!mine)
        return 1;
    size_t m = 0;
    for (size_t t = first; t < n; t += k)
        mine[m++] = tests[t];
    int rc = _cmocka_run_group_tests(name, mine, m, setup, teardown);
    free(mine);
    return rc;
}
