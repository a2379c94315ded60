/* testutil.c - temp-dir models for tests.
 * Test-only; never linked into production binaries. */
#define _XOPEN_SOURCE 700
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/testutil.h"

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

void devio_fixture_free(devio_fixture *f)
{
    devio_model_free(f->model);
    f->model = NULL;
    if (f->dir[0])
        devio_rmtree(f->dir);
    f->dir[0] = '\0';
}
