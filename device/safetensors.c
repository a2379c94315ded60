/* safetensors.c - maps (native) or reads (WASI) one .safetensors file and checks its header.
 * It must never read outside the file, trust a length it has not checked, or crash on bad input. */
#include "device/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "device/status.h"

#ifndef __wasi__
#include <sys/mman.h>
#endif

struct devio_st_file {
    char *label;
    uint8_t *base; /* whole file: mapped (native) or malloc'd (WASI) */
    size_t size;
    devio_st_tensor *tensors; /* sorted by name */
    size_t n_tensors;
};

/* Element sizes of every dtype the safetensors format defines, so that the
 * byte range of a tensor we will not use can still be checked. */
static const struct {
    const char *name;
    uint32_t size;
} st_dtypes[] = {
    {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4},
    {"I16", 2}, {"I8", 1},  {"U64", 8}, {"U32", 4},  {"U16", 2}, {"U8", 1},
    {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1},
};

static int st_cmp_tensor(const void *a, const void *b)
{
    const devio_st_tensor *x = a, *y = b;
    return strcmp(x->name, y->name);
}

/* Brings the whole file into memory: a read-only private mapping natively,
 * a heap copy under WASI where mmap is only emulated (and copies anyway). */
static devio_status st_load_bytes(devio_st_file *f, const char *path, const char *ctx,
                                  devio_error *err)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        /* A weights file that is not there makes the model directory malformed. */
        devio_status s = errno == ENOENT ? DEVIO_E_MODEL : DEVIO_E_IO;
        devio_fail(err, s, "%.100s: cannot open: %s%s", f->label, strerror(errno), ctx);
        return s;
    }
    devio_status st = DEVIO_OK;
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        devio_fail(err, DEVIO_E_IO, "%.100s: cannot stat: %s%s", f->label, strerror(errno), ctx);
        st = DEVIO_E_IO;
        goto out_close;
    }
    if (!S_ISREG(sb.st_mode)) {
        devio_fail(err, DEVIO_E_MODEL, "%.100s: not a regular file%s", f->label, ctx);
        st = DEVIO_E_MODEL;
        goto out_close;
    }
    if (sb.st_size < 8) {
        devio_fail(err, DEVIO_E_MODEL,
                   "%.100s: file is %lld bytes, shorter than the 8-byte header length%s", f->label,
                   (long long)sb.st_size, ctx);
        st = DEVIO_E_MODEL;
        goto out_close;
    }
    if ((uint64_t)sb.st_size > (uint64_t)SIZE_MAX) {
        devio_fail(err, DEVIO_E_MODEL, "%.100s: file of %lld bytes is too large for this build%s",
                   f->label, (long long)sb.st_size, ctx);
        st = DEVIO_E_MODEL;
        goto out_close;
    }
    f->size = (size_t)sb.st_size;
#ifdef __wasi__
    f->base = malloc(f->size);
    if (!f->base) {
        devio_fail(err, DEVIO_E_NOMEM, "%.100s: cannot allocate %zu bytes%s", f->label, f->size,
                   ctx);
        st = DEVIO_E_NOMEM;
        goto out_close;
    }
    for (size_t got = 0; got < f->size;) {
        ssize_t n = read(fd, f->base + got, f->size - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            devio_fail(err, DEVIO_E_IO, "%.100s: read failed at byte %zu: %s%s", f->label, got,
                       n < 0 ? strerror(errno) : "unexpected end of file", ctx);
            st = DEVIO_E_IO;
            free(f->base);
            f->base = NULL;
            goto out_close;
        }
        got += (size_t)n;
    }
#else
    void *p = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
        devio_fail(err, DEVIO_E_IO, "%.100s: mmap of %zu bytes failed: %s%s", f->label, f->size,
                   strerror(errno), ctx);
        st = DEVIO_E_IO;
        goto out_close;
    }
    f->base = p;
#endif
out_close:
    close(fd);
    return st;
}

static void st_free_bytes(devio_st_file *f)
{
    if (!f->base)
        return;
#ifdef __wasi__
    free(f->base);
#else
    munmap(f->base, f->size);
#endif
    f->base = NULL;
}

/* Reads a JSON integer that must be >= 0. */
static bool st_uint(const json_t *v, uint64_t *out)
{
    if (!json_is_integer(v))
        return false;
    json_int_t x = json_integer_value(v);
    if (x < 0)
        return false;
    *out = (uint64_t)x;
    return true;
}

/* Validates one header entry and fills t. Every failure names the tensor. */
static devio_status st_parse_entry(devio_st_file *f, const char *name, const json_t *v,
                                   const uint8_t *data, uint64_t data_size,
                                   devio_st_tensor *t, devio_error *err)
{
    const char *lab = f->label;
    if (!json_is_object(v))
        return devio_fail(err, DEVIO_E_MODEL,
                          "%.100s: tensor '%.80s': header entry is not an object", lab, name);
    const json_t *jd = json_object_get(v, "dtype");
    const json_t *js = json_object_get(v, "shape");
    const json_t *jo = json_object_get(v, "data_offsets");
    if (!json_is_string(jd) || !json_is_array(js) || !json_is_array(jo)) {
        devio_fail(err, DEVIO_E_MODEL,
                   "%.100s: tensor '%.80s': entry needs string dtype, array shape and "
                   "array data_offsets",
                   lab, name);
        return DEVIO_E_MODEL;
    }
    const char *ds = json_string_value(jd);
    uint32_t esize = 0;
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
        if (strcmp(ds, st_dtypes[i].name) == 0)
            esize = st_dtypes[i].size;
    if (esize == 0)
        return devio_fail(err, DEVIO_E_MODEL, "%.100s: tensor '%.80s': unknown dtype '%.20s'", lab,
                          name, ds);
    snprintf(t->dtype_str, sizeof t->dtype_str, "%s", ds);
    t->supported = true;
    if (strcmp(ds, "F32") == 0)
        t->dtype = DEVIO_F32;
    else if (strcmp(ds, "F16") == 0)
        t->dtype = DEVIO_F16;
    else if (strcmp(ds, "BF16") == 0)
        t->dtype = DEVIO_BF16;
    else
        t->supported = false;

    size_t nd = json_array_size(js);
    if (nd > DEVIO_ST_MAX_DIMS)
        return devio_fail(err, DEVIO_E_MODEL, "%.100s: tensor '%.80s': %zu dimensions (at most %d)",
                          lab, name, nd, DEVIO_ST_MAX_DIMS);
    t->ndim = (uint32_t)nd;
    uint64_t nelem = 1;
    bool overflow = false;
    for (size_t i = 0; i < nd; i++) {
        uint64_t d;
        if (!st_uint(json_array_get(js, i), &d)) {
            devio_fail(err, DEVIO_E_MODEL,
                       "%.100s: tensor '%.80s': shape[%zu] is not a non-negative integer", lab,
                       name, i);
            return DEVIO_E_MODEL;
        }
        t->shape[i] = d;
        if (d != 0 && nelem > UINT64_MAX / d)
            overflow = true;
        else
            nelem *= d;
    }
    if (overflow || nelem > UINT64_MAX / esize)
        return devio_fail(err, DEVIO_E_MODEL, "%.100s: tensor '%.80s': shape is too large", lab,
                          name);
    uint64_t begin, end;
    if (json_array_size(jo) != 2 || !st_uint(json_array_get(jo, 0), &begin) ||
        !st_uint(json_array_get(jo, 1), &end)) {
        devio_fail(err, DEVIO_E_MODEL,
                   "%.100s: tensor '%.80s': data_offsets must be two non-negative integers", lab,
                   name);
        return DEVIO_E_MODEL;
    }
    if (end < begin) {
        devio_fail(err, DEVIO_E_MODEL,
                   "%.100s: tensor '%.80s': data_offsets end %llu is before begin %llu", lab, name,
                   (unsigned long long)end, (unsigned long long)begin);
        return DEVIO_E_MODEL;
    }
    if (end > data_size) {
        devio_fail(err, DEVIO_E_MODEL,
                   "%.100s: tensor '%.80s': data_offsets [%llu, %llu] run past the data section "
                   "of %llu bytes (file truncated?)",
                   lab, name, (unsigned long long)begin, (unsigned long long)end,
                   (unsigned long long)data_size);
        return DEVIO_E_MODEL;
    }
    if (end - begin != nelem * esize) {
        devio_fail(err, DEVIO_E_MODEL,
                   "%.100s: tensor '%.80s': %llu data bytes, but shape and dtype %s need %llu", lab,
                   name, (unsigned long long)(end - begin), ds,
                   (unsigned long long)(nelem * esize));
        return DEVIO_E_MODEL;
    }
    t->nbytes = end - begin;
    t->data = data + begin;
    return DEVIO_OK;
}

devio_status devio_st_open(const char *path, const char *label, const char *wanted,
                           devio_st_file **out, devio_error *err)
{
    *out = NULL;
    char ctx[128] = "";
    if (wanted)
        snprintf(ctx, sizeof ctx, " (needed for tensor '%.80s')", wanted);
    devio_status st;
    devio_st_file *f = calloc(1, sizeof *f);
    if (!f)
        return devio_fail(err, DEVIO_E_NOMEM, "out of memory opening %.100s", label);
    f->label = strdup(label);
    if (!f->label) {
        devio_fail(err, DEVIO_E_NOMEM, "out of memory opening %.100s", label);
        st = DEVIO_E_NOMEM;
        goto out_free;
    }
    st = st_load_bytes(f, path, ctx, err);
    if (st != DEVIO_OK)
        goto out_free;

    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | f->base[i];
    uint64_t room = (uint64_t)f->size - 8;
    if (hlen > room) {
        devio_fail(err, DEVIO_E_MODEL,
                   "%.100s: header length %llu is larger than the %llu bytes after it%s", f->label,
                   (unsigned long long)hlen, (unsigned long long)room, ctx);
        st = DEVIO_E_MODEL;
        goto out_free;
    }
    if (hlen > DEVIO_ST_MAX_HEADER) {
        devio_fail(err, DEVIO_E_MODEL, "%.100s: header length %llu exceeds the %llu-byte limit%s",
                   f->label, (unsigned long long)hlen, (unsigned long long)DEVIO_ST_MAX_HEADER,
                   ctx);
        st = DEVIO_E_MODEL;
        goto out_free;
    }
    json_error_t jerr;
    json_t *root = json_loadb((const char *)f->base + 8, (size_t)hlen, JSON_REJECT_DUPLICATES,
                              &jerr);
    if (!root) {
        devio_fail(err, DEVIO_E_MODEL, "%.100s: header is not valid JSON (%.60s)%s", f->label,
                   jerr.text, ctx);
        st = DEVIO_E_MODEL;
        goto out_free;
    }
    if (!json_is_object(root)) {
        devio_fail(err, DEVIO_E_MODEL, "%.100s: header is not a JSON object%s", f->label, ctx);
        st = DEVIO_E_MODEL;
        goto out_json;
    }
    size_t n = json_object_size(root);
    if (json_object_get(root, "__metadata__"))
        n--;
    f->tensors = calloc(n ? n : 1, sizeof *f->tensors);
    if (!f->tensors) {
        devio_fail(err, DEVIO_E_NOMEM, "%.100s: out of memory for %zu header entries", f->label, n);
        st = DEVIO_E_NOMEM;
        goto out_json;
    }
    const uint8_t *data = f->base + 8 + hlen;
    uint64_t data_size = room - hlen;
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val)
    {
        if (strcmp(key, "__metadata__") == 0)
            continue;
        devio_st_tensor *t = &f->tensors[f->n_tensors];
        st = st_parse_entry(f, key, val, data, data_size, t, err);
        if (st != DEVIO_OK)
            goto out_json;
        t->name = strdup(key);
        if (!t->name) {
            devio_fail(err, DEVIO_E_NOMEM, "%.100s: out of memory", f->label);
            st = DEVIO_E_NOMEM;
            goto out_json;
        }
        f->n_tensors++;
    }
    qsort(f->tensors, f->n_tensors, sizeof *f->tensors, st_cmp_tensor);
    json_decref(root);
    *out = f;
    return DEVIO_OK;

out_json:
    json_decref(root);
out_free:
    devio_st_close(f);
    return st;
}

void devio_st_close(devio_st_file *f)
{
    if (!f)
        return;
    for (size_t i = 0; i < f->n_tensors; i++)
        free(f->tensors[i].name);
    free(f->tensors);
    st_free_bytes(f);
    free(f->label);
    free(f);
}

const devio_st_tensor *devio_st_find(const devio_st_file *f, const char *name)
{
    size_t lo = 0, hi = f->n_tensors;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(name, f->tensors[mid].name);
        if (c == 0)
            return &f->tensors[mid];
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return NULL;
}

size_t devio_st_count(const devio_st_file *f)
{
    return f->n_tensors;
}

const devio_st_tensor *devio_st_at(const devio_st_file *f, size_t i)
{
    return i < f->n_tensors ? &f->tensors[i] : NULL;
}

const char *devio_st_label(const devio_st_file *f)
{
    return f->label;
}
