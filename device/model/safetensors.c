/* safetensors.c - reads one .safetensors file into memory it owns and checks its header.
 * It must never read outside the file, trust a length it has not checked, crash on bad input,
 * or keep the file mapped: a file changed or truncated on disk must not change what was read. */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */
#include "device/model/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdbool.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "device/status.h"

#ifndef __wasi__
#include <sys/mman.h>
#endif

struct devio_st_file {
    char *label;
    uint8_t *base; /* whole file: anonymous pages (native) or malloc'd (WASI), read-only once read */
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

/* The whole file's bytes, read through fd into memory nobody else can
 * reach. Natively that is an anonymous mapping, page-aligned like the file
 * mapping it replaces and made read-only once filled; under WASI the heap.
 * A file mapping is not used on purpose: its pages follow the file, so an
 * in-place write would change the numbers and a truncation would SIGBUS. */
static uint8_t *st_alloc(size_t n)
{
#ifdef __wasi__
    return malloc(n ? n : 1);
#else
    void *p = mmap(NULL, n ? n : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
#endif
}

static void st_free_bytes(devio_st_file *f)
{
    if (!f->base)
        return;
#ifdef __wasi__
    free(f->base);
#else
    munmap(f->base, f->size ? f->size : 1);
#endif
    f->base = NULL;
}

void *devio_st_pages(size_t n) { return st_alloc(n); }

void devio_st_pages_free(void *p, size_t n)
{
    if (!p)
        return;
#ifdef __wasi__
    (void)n;
    free(p);
#else
    munmap(p, n ? n : 1);
#endif
}

void devio_st_pages_release(void *p, size_t n)
{
#ifdef __wasi__
    (void)p;
    (void)n;
#else
    /* Replacing the pages discards them; the new ones are never touched. */
    if (p)
        mmap(p, n ? n : 1, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1,
             0);
#endif
}

void devio_st_release(devio_st_file *f)
{
    if (f && f->base)
        devio_st_pages_release(f->base, f->size);
}

/* True when two fstat results describe the same, unchanged file. */
static bool st_same_file(const struct stat *a, const struct stat *b)
{
    return a->st_dev == b->st_dev && a->st_ino == b->st_ino && a->st_size == b->st_size &&
           a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec;
}

devio_status devio_st_read_fd(int fd, const char *label, uint64_t min_size, const char *ctx,
                              uint8_t **base, size_t *size_out, devio_error *err)
{
    *base = NULL;
    *size_out = 0;
    struct stat sb, after;
    if (fstat(fd, &sb) != 0)
        return devio_fail(err, DEVIO_E_IO, "%.100s: cannot stat: %s%s", label, strerror(errno),
                          ctx);
    if (!S_ISREG(sb.st_mode))
        return devio_fail(err, DEVIO_E_MODEL, "%.100s: not a regular file%s", label, ctx);
    if ((uint64_t)sb.st_size < min_size)
        return devio_fail(err, DEVIO_E_MODEL,
                          "%.100s: file is %lld bytes, shorter than its %llu-byte header%s",
                          label, (long long)sb.st_size, (unsigned long long)min_size, ctx);
    if ((uint64_t)sb.st_size > (uint64_t)SIZE_MAX)
        return devio_fail(err, DEVIO_E_MODEL,
                          "%.100s: file of %lld bytes is too large for this build%s", label,
                          (long long)sb.st_size, ctx);
    size_t size = (size_t)sb.st_size;
    uint8_t *buf = st_alloc(size);
    if (!buf)
        return devio_fail(err, DEVIO_E_NOMEM, "%.100s: cannot allocate %zu bytes%s", label, size,
                          ctx);
    for (size_t got = 0; got < size;) {
        ssize_t n = pread(fd, buf + got, size - got, (off_t)got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            devio_fail(err, DEVIO_E_IO, "%.100s: read failed at byte %zu: %s%s", label, got,
                       n < 0 ? strerror(errno) : "unexpected end of file (changed while read?)",
                       ctx);
            devio_st_pages_free(buf, size);
            return DEVIO_E_IO;
        }
        got += (size_t)n;
    }
    if (fstat(fd, &after) != 0 || !st_same_file(&sb, &after)) {
        devio_st_pages_free(buf, size);
        return devio_fail(err, DEVIO_E_IO, "%.100s: changed while being read; try again%s", label,
                          ctx);
    }
#ifndef __wasi__
    (void)mprotect(buf, size, PROT_READ); /* a stray write faults instead of changing weights */
#endif
    *base = buf;
    *size_out = size;
    return DEVIO_OK;
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

/* Entries in the order of their bytes: by start, an empty one before a
 * non-empty one at the same start. */
static int st_cmp_offset(const void *a, const void *b)
{
    const devio_st_tensor *x = *(const devio_st_tensor *const *)a;
    const devio_st_tensor *y = *(const devio_st_tensor *const *)b;
    if (x->data != y->data)
        return x->data < y->data ? -1 : 1;
    if (x->nbytes != y->nbytes)
        return x->nbytes < y->nbytes ? -1 : 1;
    return 0;
}

/* The format's rule that the data section is entirely indexed and has no
 * holes (it keeps a file from hiding a second payload): the ranges, in
 * offset order, start at 0, each begins where the previous ended, and the
 * last ends at the end of the file. */
static devio_status st_check_layout(devio_st_file *f, const uint8_t *data, uint64_t data_size,
                                    const char *ctx, devio_error *err)
{
    size_t n = f->n_tensors;
    const devio_st_tensor **by = malloc((n ? n : 1) * sizeof *by);
    if (!by)
        return devio_fail(err, DEVIO_E_NOMEM, "%.100s: out of memory checking the layout",
                          f->label);
    for (size_t i = 0; i < n; i++)
        by[i] = &f->tensors[i];
    qsort(by, n, sizeof *by, st_cmp_offset);
    devio_status st = DEVIO_OK;
    uint64_t at = 0;
    for (size_t i = 0; i < n && st == DEVIO_OK; i++) {
        uint64_t begin = (uint64_t)(by[i]->data - data);
        if (begin < at)
            st = devio_fail(err, DEVIO_E_MODEL,
                            "%.100s: tensor '%.80s' (data_offsets [%llu, %llu]) overlaps tensor "
                            "'%.80s' (which ends at %llu)%s",
                            f->label, by[i]->name, (unsigned long long)begin,
                            (unsigned long long)(begin + by[i]->nbytes), by[i - 1]->name,
                            (unsigned long long)at, ctx);
        else if (begin > at)
            st = devio_fail(err, DEVIO_E_MODEL,
                            "%.100s: data bytes [%llu, %llu) before tensor '%.80s' belong to no "
                            "tensor; the format allows no holes%s",
                            f->label, (unsigned long long)at, (unsigned long long)begin,
                            by[i]->name, ctx);
        at = begin + by[i]->nbytes;
    }
    if (st == DEVIO_OK && at != data_size)
        st = devio_fail(err, DEVIO_E_MODEL,
                        "%.100s: data bytes [%llu, %llu) after the last tensor%s%.80s%s belong "
                        "to no tensor; the format allows no holes%s",
                        f->label, (unsigned long long)at, (unsigned long long)data_size,
                        n ? " '" : "", n ? by[n - 1]->name : "", n ? "'" : "", ctx);
    free(by);
    return st;
}

devio_status devio_st_open(const char *path, const char *label, const char *wanted,
                           devio_st_file **out, devio_error *err)
{
    *out = NULL;
    char ctx[128] = "";
    if (wanted)
        snprintf(ctx, sizeof ctx, " (needed for tensor '%.80s')", wanted);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        /* A weights file that is not there makes the model directory malformed. */
        devio_status s = errno == ENOENT ? DEVIO_E_MODEL : DEVIO_E_IO;
        return devio_fail(err, s, "%.100s: cannot open: %s%s", label, strerror(errno), ctx);
    }
    devio_status st = devio_st_open_fd(fd, label, wanted, out, err);
    close(fd);
    return st;
}

devio_status devio_st_open_fd(int fd, const char *label, const char *wanted, devio_st_file **out,
                              devio_error *err)
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
    st = devio_st_read_fd(fd, f->label, 8, ctx, &f->base, &f->size, err);
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
    if ((st = st_check_layout(f, data, data_size, ctx, err)) != DEVIO_OK)
        goto out_json;
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

/* ---- finiteness ---- */

#define ST_SCAN_BLOCK 1024

/* Index of the first element of p[0, n) (`size` bytes each, 4 or 2) whose
 * exponent field `m` is all ones (NaN or an infinity: F32 0x7f800000, F16
 * 0x7c00, BF16 0x7f80), or n. Full blocks are scanned without a branch so
 * the compiler can vectorise the all-finite common case; size is a
 * constant at every call, so each call keeps one load width. */
static inline __attribute__((always_inline)) uint32_t st_elem(const uint8_t *p, uint64_t i,
                                                                int size)
{
    if (size == 4) {
        uint32_t u;
        memcpy(&u, p + i * 4, sizeof u);
        return u;
    }
    uint16_t h;
    memcpy(&h, p + i * 2, sizeof h);
    return h;
}

static inline __attribute__((always_inline)) uint64_t st_first_nonfinite(const uint8_t *p,
                                                                         uint64_t n, int size,
                                                                         uint32_t m)
{
    uint64_t i = 0;
    for (; n - i >= ST_SCAN_BLOCK; i += ST_SCAN_BLOCK) {
        uint32_t bad = 0;
        for (uint32_t k = 0; k < ST_SCAN_BLOCK; k++)
            bad |= (uint32_t)((st_elem(p, i + k, size) & m) == m);
        if (bad)
            break;
    }
    for (; i < n; i++)
        if ((st_elem(p, i, size) & m) == m)
            return i;
    return n;
}

devio_status devio_weights_check_finite(const char *label, const char *name, devio_dtype dt,
                                        const void *data, uint64_t nbytes, devio_error *err)
{
    /* Element size, exponent mask, sign bit. */
    int size;
    uint32_t m, sign;
    switch (dt) {
    case DEVIO_F32:
        size = 4, m = 0x7f800000u, sign = 0x80000000u;
        break;
    case DEVIO_F16:
        size = 2, m = 0x7c00u, sign = 0x8000u;
        break;
    case DEVIO_BF16:
        size = 2, m = 0x7f80u, sign = 0x8000u;
        break;
    default:
        return DEVIO_OK;
    }
    uint64_t n = nbytes / (uint64_t)size;
    uint64_t bad = size == 4 ? st_first_nonfinite(data, n, 4, m)
                             : st_first_nonfinite(data, n, 2, m);
    if (bad == n)
        return DEVIO_OK;
    /* NaN when the mantissa below the all-ones exponent is not zero. */
    bool nan = (st_elem(data, bad, size) & ~(m | sign)) != 0;
    return devio_fail(err, DEVIO_E_MODEL,
                      "%.100s: tensor '%.80s' holds %s at element %llu of %llu; non-finite "
                      "weights are refused",
                      label, name, nan ? "NaN" : "an infinity", (unsigned long long)bad,
                      (unsigned long long)n);
}

/* "[2, 3]": t's shape, cut to fit cap. */
static void shape_str(const devio_st_tensor *t, char *dst, size_t cap)
{
    size_t g = 0;
    dst[0] = '\0';
    for (uint32_t i = 0; i < t->ndim && g < cap; i++)
        g += (size_t)snprintf(dst + g, cap - g, "%s%llu", i ? ", " : "",
                              (unsigned long long)t->shape[i]);
}

devio_status devio_st_view(const devio_st_file *f, const devio_st_tensor *t, const char *label,
                           const devio_st_want *w, devio_tensor *out, void **copy,
                           devio_error *err)
{
    if (!t->supported)
        return devio_fail(err, w->refuse,
                          "%.100s: tensor '%.90s' has dtype %s; only F32, F16 and BF16 are "
                          "supported",
                          label, t->name, t->dtype_str);
    uint64_t want[3] = {w->s0, w->ndim == 3 ? 1 : w->s1, w->s1};
    bool ok = t->ndim == w->ndim;
    for (uint32_t i = 0; ok && i < w->ndim; i++)
        ok = t->shape[i] == want[i];
    if (!ok) {
        char got[96], exp[48];
        shape_str(t, got, sizeof got);
        if (w->ndim == 1)
            snprintf(exp, sizeof exp, "%llu", (unsigned long long)w->s0);
        else
            snprintf(exp, sizeof exp, "%llu, %s%llu", (unsigned long long)w->s0,
                     w->ndim == 3 ? "1, " : "", (unsigned long long)w->s1);
        return devio_fail(err, w->refuse, "%.100s: tensor '%.90s' has shape [%s], expected [%s]%s%s%s",
                          label, t->name, got, exp, w->why ? " (" : "", w->why ? w->why : "",
                          w->why ? ")" : "");
    }
    devio_status st = w->scan ? devio_st_check_finite(f, t, err) : DEVIO_OK;
    if (st != DEVIO_OK)
        return st;
    void *own = NULL;
    /* safetensors does not promise aligned offsets; readers of the view may
     * load whole elements, so give them an aligned copy when needed. */
    if ((uintptr_t)t->data % devio_dtype_size(t->dtype) != 0) {
        own = devio_st_pages((size_t)t->nbytes);
        if (!own)
            return devio_fail(err, DEVIO_E_NOMEM,
                              "%.100s: tensor '%.90s': out of memory for an aligned copy", label,
                              t->name);
        memcpy(own, t->data, (size_t)t->nbytes);
    }
    *out = (devio_tensor){.dtype = t->dtype, .ndim = w->ndim == 3 ? 2 : w->ndim,
                          .shape = {w->s0, w->ndim >= 2 ? w->s1 : 0},
                          .data = own ? own : t->data};
    *copy = own;
    return DEVIO_OK;
}

devio_status devio_st_check_finite(const devio_st_file *f, const devio_st_tensor *t,
                                   devio_error *err)
{
    if (!t->supported)
        return DEVIO_OK;
    return devio_weights_check_finite(f->label, t->name, t->dtype, t->data, t->nbytes, err);
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

const uint8_t *devio_st_bytes(const devio_st_file *f, size_t *size)
{
    *size = f->size;
    return f->base;
}
