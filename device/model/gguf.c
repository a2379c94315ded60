/* gguf.c - reads one GGUF file into memory it owns and checks its header,
 * metadata and tensor table. It must never read outside the file's bytes,
 * trust a count or length before checking it against the bytes left, or
 * crash on bad input: every refusal names the file and the key or tensor. */
#include "device/model/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "device/model/safetensors.h"
#include "device/status.h"

struct devio_gguf_file {
    char *label;
    uint8_t *owned; /* the file's bytes when read from disk (pages), else NULL */
    const uint8_t *base;
    size_t size;
    uint32_t version;
    devio_gguf_kv *kvs; /* in file order */
    size_t n_kvs;
    devio_gguf_tensor *tensors; /* in file order */
    size_t n_tensors;
    size_t *by_name; /* indices of tensors sorted by name */
    size_t *by_key;  /* indices of kvs sorted by key */
};

static const struct {
    uint32_t type;
    const char *name;
    uint32_t block, bytes;
} types[] = {
    {DEVIO_GGML_F32, "F32", 1, 4},       {DEVIO_GGML_F16, "F16", 1, 2},
    {DEVIO_GGML_Q4_0, "Q4_0", 32, 18},   {DEVIO_GGML_Q4_1, "Q4_1", 32, 20},
    {DEVIO_GGML_Q5_0, "Q5_0", 32, 22},   {DEVIO_GGML_Q5_1, "Q5_1", 32, 24},
    {DEVIO_GGML_Q8_0, "Q8_0", 32, 34},   {DEVIO_GGML_Q8_1, "Q8_1", 32, 36},
    {DEVIO_GGML_Q2_K, "Q2_K", 256, 84},  {DEVIO_GGML_Q3_K, "Q3_K", 256, 110},
    {DEVIO_GGML_Q4_K, "Q4_K", 256, 144}, {DEVIO_GGML_Q5_K, "Q5_K", 256, 176},
    {DEVIO_GGML_Q6_K, "Q6_K", 256, 210}, {DEVIO_GGML_Q8_K, "Q8_K", 256, 292},
    {DEVIO_GGML_I8, "I8", 1, 1},         {DEVIO_GGML_I16, "I16", 1, 2},
    {DEVIO_GGML_I32, "I32", 1, 4},       {DEVIO_GGML_I64, "I64", 1, 8},
    {DEVIO_GGML_F64, "F64", 1, 8},       {DEVIO_GGML_BF16, "BF16", 1, 2},
};

static int type_index(uint32_t type)
{
    for (size_t i = 0; i < sizeof types / sizeof *types; i++)
        if (types[i].type == type)
            return (int)i;
    return -1;
}

const char *devio_gguf_type_name(uint32_t type)
{
    int i = type_index(type);
    return i < 0 ? "?" : types[i].name;
}

uint32_t devio_gguf_type_block(uint32_t type)
{
    int i = type_index(type);
    return i < 0 ? 0 : types[i].block;
}

uint32_t devio_gguf_type_bytes(uint32_t type)
{
    int i = type_index(type);
    return i < 0 ? 0 : types[i].bytes;
}

/* Bytes of a metadata scalar of type t; 0 for strings, arrays and unknown. */
static uint32_t scalar_size(uint32_t t)
{
    static const uint8_t size[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return t < sizeof size ? size[t] : 0;
}

/* ---- the cursor --------------------------------------------------------- */

typedef struct cursor {
    const uint8_t *p;
    size_t left;
    const char *label;
    devio_error *err;
} cursor;

static uint64_t le(const uint8_t *p, uint32_t n)
{
    uint64_t v = 0;
    for (uint32_t i = n; i-- > 0;)
        v = (v << 8) | p[i];
    return v;
}

static devio_status short_read(cursor *c, const char *what)
{
    return devio_fail(c->err, DEVIO_E_MODEL, "%.100s: truncated: %s runs past the end of the file",
                      c->label, what);
}

static devio_status take(cursor *c, size_t n, const uint8_t **at, const char *what)
{
    *at = NULL;
    if (n > c->left)
        return short_read(c, what);
    *at = c->p;
    c->p += n;
    c->left -= n;
    return DEVIO_OK;
}

static devio_status take_u(cursor *c, uint32_t n, uint64_t *v, const char *what)
{
    const uint8_t *at = NULL;
    devio_status s = take(c, n, &at, what);
    *v = s == DEVIO_OK && at ? le(at, n) : 0;
    return s;
}

/* A string: 8-byte length, then its bytes (at most max). */
static devio_status take_str(cursor *c, uint64_t max, const uint8_t **s, uint64_t *len,
                             const char *what)
{
    devio_status st = take_u(c, 8, len, what);
    if (st != DEVIO_OK)
        return st;
    if (*len > max)
        return devio_fail(c->err, DEVIO_E_MODEL, "%.100s: %s is %llu bytes, over the limit of %llu",
                          c->label, what, (unsigned long long)*len, (unsigned long long)max);
    return take(c, (size_t)*len, s, what);
}

static devio_status dup_name(cursor *c, const uint8_t *s, uint64_t len, char **out,
                             const char *what)
{
    if (memchr(s, 0, (size_t)len))
        return devio_fail(c->err, DEVIO_E_MODEL, "%.100s: %s holds a NUL byte", c->label, what);
    *out = malloc((size_t)len + 1);
    if (!*out)
        return devio_fail(c->err, DEVIO_E_NOMEM, "%.100s: out of memory", c->label);
    memcpy(*out, s, (size_t)len);
    (*out)[len] = 0;
    return DEVIO_OK;
}

/* Skips a value of type t (arrays recursively, to a bounded depth). */
static devio_status skip_value(cursor *c, uint32_t t, uint32_t depth, const char *key)
{
    char what[160];
    snprintf(what, sizeof what, "the value of '%.100s'", key);
    const uint8_t *at;
    if (t == DEVIO_GGUF_STRING) {
        uint64_t len;
        return take_str(c, UINT64_MAX, &at, &len, what);
    }
    if (t != DEVIO_GGUF_ARRAY) {
        if (!scalar_size(t))
            return devio_fail(c->err, DEVIO_E_MODEL, "%.100s: '%.100s' has value type %u, unknown",
                              c->label, key, t);
        return take(c, scalar_size(t), &at, what);
    }
    if (depth >= DEVIO_GGUF_MAX_ARRAY_DEPTH)
        return devio_fail(c->err, DEVIO_E_MODEL, "%.100s: '%.100s' nests arrays deeper than %d",
                          c->label, key, DEVIO_GGUF_MAX_ARRAY_DEPTH);
    uint64_t et, n;
    devio_status s;
    if ((s = take_u(c, 4, &et, what)) || (s = take_u(c, 8, &n, what)))
        return s;
    if (et != DEVIO_GGUF_STRING && et != DEVIO_GGUF_ARRAY) {
        if (!scalar_size((uint32_t)et))
            return devio_fail(c->err, DEVIO_E_MODEL,
                              "%.100s: '%.100s' is an array of value type %llu, unknown", c->label,
                              key, (unsigned long long)et);
        if (n > c->left / scalar_size((uint32_t)et))
            return short_read(c, what);
        return take(c, (size_t)n * scalar_size((uint32_t)et), &at, what);
    }
    /* Every string or array element takes at least 8 bytes. */
    if (n > c->left / 8)
        return short_read(c, what);
    for (uint64_t i = 0; i < n; i++)
        if ((s = skip_value(c, (uint32_t)et, depth + 1, key)))
            return s;
    return DEVIO_OK;
}

static devio_status parse_kv(cursor *c, devio_gguf_file *f, devio_gguf_kv *kv)
{
    const uint8_t *key;
    uint64_t len, t;
    devio_status s;
    if ((s = take_str(c, DEVIO_GGUF_MAX_KEY, &key, &len, "a metadata key")) ||
        (s = dup_name(c, key, len, &kv->key, "a metadata key")))
        return s;
    if ((s = take_u(c, 4, &t, "a metadata type")))
        return s;
    kv->type = (uint32_t)t;
    kv->val = c->p;
    if (t > DEVIO_GGUF_F64)
        return devio_fail(c->err, DEVIO_E_MODEL, "%.100s: '%.100s' has value type %llu, unknown",
                          f->label, kv->key, (unsigned long long)t);
    if (t == DEVIO_GGUF_ARRAY && c->left >= 12) {
        kv->elem_type = (uint32_t)le(c->p, 4);
        kv->n = le(c->p + 4, 8);
    } else if (t == DEVIO_GGUF_STRING && c->left >= 8) {
        kv->n = le(c->p, 8);
    }
    return skip_value(c, kv->type, 0, kv->key);
}

static devio_status parse_tensor(cursor *c, devio_gguf_file *f, devio_gguf_tensor *t)
{
    const uint8_t *name;
    uint64_t len, v;
    devio_status s;
    if ((s = take_str(c, DEVIO_GGUF_MAX_NAME, &name, &len, "a tensor name")) ||
        (s = dup_name(c, name, len, &t->name, "a tensor name")))
        return s;
    char what[160];
    snprintf(what, sizeof what, "tensor '%.100s'", t->name);
    if ((s = take_u(c, 4, &v, what)))
        return s;
    if (v < 1 || v > DEVIO_GGUF_MAX_DIMS)
        return devio_fail(c->err, DEVIO_E_MODEL, "%.100s: tensor '%.100s' has %llu dimensions, not 1 to %d",
                          f->label, t->name, (unsigned long long)v, DEVIO_GGUF_MAX_DIMS);
    t->ndim = (uint32_t)v;
    uint64_t count = 1;
    for (uint32_t d = 0; d < t->ndim; d++) {
        if ((s = take_u(c, 8, &t->ne[d], what)))
            return s;
        if (t->ne[d] == 0)
            return devio_fail(c->err, DEVIO_E_MODEL, "%.100s: tensor '%.100s' has dimension %u of size 0",
                              f->label, t->name, d);
        if (count > UINT64_MAX / t->ne[d])
            return devio_fail(c->err, DEVIO_E_MODEL,
                              "%.100s: tensor '%.100s': its element count overflows", f->label,
                              t->name);
        count *= t->ne[d];
    }
    if ((s = take_u(c, 4, &v, what)))
        return s;
    t->type = (uint32_t)v;
    uint32_t blk = devio_gguf_type_block(t->type), bytes = devio_gguf_type_bytes(t->type);
    if (!blk)
        return devio_fail(c->err, DEVIO_E_MODEL,
                          "%.100s: tensor '%.100s' has type %llu, which devio does not know",
                          f->label, t->name, (unsigned long long)v);
    if (t->ne[0] % blk != 0)
        return devio_fail(c->err, DEVIO_E_MODEL,
                          "%.100s: tensor '%.100s': rows of %llu are not whole %s blocks of %u",
                          f->label, t->name, (unsigned long long)t->ne[0],
                          devio_gguf_type_name(t->type), blk);
    if (count / blk > UINT64_MAX / bytes)
        return devio_fail(c->err, DEVIO_E_MODEL,
                          "%.100s: tensor '%.100s': its byte count overflows", f->label, t->name);
    t->nbytes = count / blk * bytes;
    return take_u(c, 8, &t->offset, what);
}

static int cmp_name(const void *a, const void *b, void *ctx)
{
    const devio_gguf_tensor *t = ctx;
    return strcmp(t[*(const size_t *)a].name, t[*(const size_t *)b].name);
}

/* Sorts idx by cmp, a merge sort (C11's qsort passes no context). */
static void sort_idx(size_t *idx, size_t *tmp, size_t n, int (*cmp)(const void *, const void *, void *),
                     void *ctx)
{
    if (n < 2)
        return;
    size_t h = n / 2;
    sort_idx(idx, tmp, h, cmp, ctx);
    sort_idx(idx + h, tmp, n - h, cmp, ctx);
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n)
        tmp[k++] = cmp(&idx[j], &idx[i], ctx) < 0 ? idx[j++] : idx[i++];
    while (i < h)
        tmp[k++] = idx[i++];
    while (j < n)
        tmp[k++] = idx[j++];
    memcpy(idx, tmp, n * sizeof *idx);
}

static int cmp_key(const void *a, const void *b, void *ctx)
{
    const devio_gguf_kv *k = ctx;
    return strcmp(k[*(const size_t *)a].key, k[*(const size_t *)b].key);
}

/* The keys sorted for lookup; two entries of one key are refused. */
static devio_status index_keys(devio_gguf_file *f, devio_error *err)
{
    size_t n = f->n_kvs;
    size_t *tmp = malloc((n ? n : 1) * sizeof *tmp);
    f->by_key = malloc((n ? n : 1) * sizeof *f->by_key);
    if (!tmp || !f->by_key) {
        free(tmp);
        return devio_fail(err, DEVIO_E_NOMEM, "%.100s: out of memory", f->label);
    }
    for (size_t i = 0; i < n; i++)
        f->by_key[i] = i;
    sort_idx(f->by_key, tmp, n, cmp_key, f->kvs);
    free(tmp);
    for (size_t i = 1; i < n; i++)
        if (strcmp(f->kvs[f->by_key[i - 1]].key, f->kvs[f->by_key[i]].key) == 0)
            return devio_fail(err, DEVIO_E_MODEL, "%.100s: metadata key '%.100s' appears twice",
                              f->label, f->kvs[f->by_key[i]].key);
    return DEVIO_OK;
}

static int cmp_offset(const void *a, const void *b, void *ctx)
{
    const devio_gguf_tensor *t = ctx;
    uint64_t x = t[*(const size_t *)a].offset, y = t[*(const size_t *)b].offset;
    return x < y ? -1 : x > y;
}

/* The data section: every tensor inside it, aligned, no two overlapping,
 * no two of one name. */
static devio_status check_layout(devio_gguf_file *f, uint64_t data_off, uint64_t align,
                                 devio_error *err)
{
    uint64_t data_size = f->size - data_off;
    size_t n = f->n_tensors;
    size_t *tmp = malloc((n ? n : 1) * sizeof *tmp);
    f->by_name = malloc((n ? n : 1) * sizeof *f->by_name);
    if (!tmp || !f->by_name) {
        free(tmp);
        return devio_fail(err, DEVIO_E_NOMEM, "%.100s: out of memory", f->label);
    }
    devio_status s = DEVIO_OK;
    for (size_t i = 0; i < n && s == DEVIO_OK; i++) {
        devio_gguf_tensor *t = &f->tensors[i];
        f->by_name[i] = i;
        if (t->offset % align != 0)
            s = devio_fail(err, DEVIO_E_MODEL,
                           "%.100s: tensor '%.100s' starts at offset %llu, not a multiple of the "
                           "alignment %llu",
                           f->label, t->name, (unsigned long long)t->offset,
                           (unsigned long long)align);
        else if (t->offset > data_size || t->nbytes > data_size - t->offset)
            s = devio_fail(err, DEVIO_E_MODEL,
                           "%.100s: tensor '%.100s' (%llu bytes at offset %llu) runs past the end "
                           "of the data section (%llu bytes)",
                           f->label, t->name, (unsigned long long)t->nbytes,
                           (unsigned long long)t->offset, (unsigned long long)data_size);
        else
            t->data = f->base + data_off + t->offset;
    }
    if (s == DEVIO_OK) {
        sort_idx(f->by_name, tmp, n, cmp_offset, f->tensors);
        for (size_t i = 1; i < n && s == DEVIO_OK; i++) {
            const devio_gguf_tensor *a = &f->tensors[f->by_name[i - 1]];
            const devio_gguf_tensor *b = &f->tensors[f->by_name[i]];
            if (a->offset + a->nbytes > b->offset)
                s = devio_fail(err, DEVIO_E_MODEL,
                               "%.100s: tensors '%.100s' and '%.100s' overlap", f->label, a->name,
                               b->name);
        }
    }
    if (s == DEVIO_OK) {
        sort_idx(f->by_name, tmp, n, cmp_name, f->tensors);
        for (size_t i = 1; i < n && s == DEVIO_OK; i++)
            if (strcmp(f->tensors[f->by_name[i - 1]].name, f->tensors[f->by_name[i]].name) == 0)
                s = devio_fail(err, DEVIO_E_MODEL, "%.100s: tensor '%.100s' appears twice",
                               f->label, f->tensors[f->by_name[i]].name);
    }
    free(tmp);
    return s;
}

static devio_status parse_header(devio_gguf_file *f, devio_error *err)
{
    cursor c = {f->base, f->size, f->label, err};
    const uint8_t *magic;
    uint64_t version, n_tensors, n_kv;
    devio_status s;
    if ((s = take(&c, 4, &magic, "the magic")))
        return s;
    if (!magic || memcmp(magic, "GGUF", 4) != 0)
        return devio_fail(err, DEVIO_E_MODEL, "%.100s: not a GGUF file (no GGUF magic)", f->label);
    if ((s = take_u(&c, 4, &version, "the version")))
        return s;
    if (version != 2 && version != 3)
        return devio_fail(err, DEVIO_E_MODEL, "%.100s: GGUF version %llu; devio reads 2 and 3",
                          f->label, (unsigned long long)version);
    f->version = (uint32_t)version;
    if ((s = take_u(&c, 8, &n_tensors, "the tensor count")) ||
        (s = take_u(&c, 8, &n_kv, "the metadata count")))
        return s;
    /* A metadata entry takes at least 13 bytes, a tensor entry at least 32. */
    if (n_kv > c.left / 13 || n_tensors > c.left / 32)
        return devio_fail(err, DEVIO_E_MODEL,
                          "%.100s: header claims %llu tensors and %llu metadata entries, more "
                          "than the file's %zu bytes can hold",
                          f->label, (unsigned long long)n_tensors, (unsigned long long)n_kv,
                          f->size);
    f->kvs = calloc(n_kv ? n_kv : 1, sizeof *f->kvs);
    f->tensors = calloc(n_tensors ? n_tensors : 1, sizeof *f->tensors);
    if (!f->kvs || !f->tensors)
        return devio_fail(err, DEVIO_E_NOMEM, "%.100s: out of memory", f->label);
    for (uint64_t i = 0; i < n_kv; i++) {
        s = parse_kv(&c, f, &f->kvs[f->n_kvs]);
        if (f->kvs[f->n_kvs].key)
            f->n_kvs++; /* owned from here, freed with the file */
        if (s)
            return s;
    }
    if ((s = index_keys(f, err)))
        return s;
    uint64_t align = 32;
    const devio_gguf_kv *a = devio_gguf_find_kv(f, "general.alignment");
    if (a && (!devio_gguf_get_u64(f, "general.alignment", &align) || align == 0 ||
              (align & (align - 1)) != 0 || align > 65536))
        return devio_fail(err, DEVIO_E_MODEL,
                          "%.100s: general.alignment must be a power of two up to 65536",
                          f->label);
    for (uint64_t i = 0; i < n_tensors; i++) {
        s = parse_tensor(&c, f, &f->tensors[f->n_tensors]);
        if (f->tensors[f->n_tensors].name)
            f->n_tensors++;
        if (s)
            return s;
    }
    uint64_t used = f->size - c.left;
    uint64_t data_off = (used + align - 1) / align * align;
    if (data_off > f->size)
        data_off = f->size; /* no data: only an empty tensor table passes check_layout */
    return check_layout(f, data_off, align, err);
}

devio_status devio_gguf_parse(const uint8_t *bytes, size_t size, const char *label,
                              devio_gguf_file **out, devio_error *err)
{
    *out = NULL;
    devio_gguf_file *f = calloc(1, sizeof *f);
    if (!f || !(f->label = strdup(label))) {
        free(f);
        return devio_fail(err, DEVIO_E_NOMEM, "out of memory opening %.100s", label);
    }
    f->base = bytes;
    f->size = size;
    devio_status s = parse_header(f, err);
    if (s != DEVIO_OK) {
        devio_gguf_close(f);
        return s;
    }
    *out = f;
    return DEVIO_OK;
}

devio_status devio_gguf_open_fd(int fd, const char *label, devio_gguf_file **out,
                                devio_error *err)
{
    *out = NULL;
    uint8_t *base;
    size_t size;
    devio_status s = devio_st_read_fd(fd, label, 24, "", &base, &size, err);
    if (s != DEVIO_OK)
        return s;
    if ((s = devio_gguf_parse(base, size, label, out, err)) != DEVIO_OK) {
        devio_st_pages_free(base, size);
        return s;
    }
    (*out)->owned = base;
    return DEVIO_OK;
}

devio_status devio_gguf_open(const char *path, const char *label, devio_gguf_file **out,
                             devio_error *err)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return devio_fail(err, errno == ENOENT ? DEVIO_E_MODEL : DEVIO_E_IO,
                          "%.100s: cannot open: %s", label, strerror(errno));
    devio_status s = devio_gguf_open_fd(fd, label, out, err);
    close(fd);
    return s;
}

void devio_gguf_close(devio_gguf_file *f)
{
    if (!f)
        return;
    for (size_t i = 0; i < f->n_kvs; i++)
        free(f->kvs[i].key);
    for (size_t i = 0; i < f->n_tensors; i++)
        free(f->tensors[i].name);
    free(f->kvs);
    free(f->tensors);
    free(f->by_name);
    free(f->by_key);
    if (f->owned)
        devio_st_pages_free(f->owned, f->size);
    free(f->label);
    free(f);
}

void devio_gguf_release(devio_gguf_file *f)
{
    if (f && f->owned)
        devio_st_pages_release(f->owned, f->size);
}

/* ---- lookups ------------------------------------------------------------ */

uint32_t devio_gguf_version(const devio_gguf_file *f) { return f->version; }
const char *devio_gguf_label(const devio_gguf_file *f) { return f->label; }
size_t devio_gguf_kv_count(const devio_gguf_file *f) { return f->n_kvs; }
size_t devio_gguf_tensor_count(const devio_gguf_file *f) { return f->n_tensors; }

const devio_gguf_kv *devio_gguf_kv_at(const devio_gguf_file *f, size_t i)
{
    return i < f->n_kvs ? &f->kvs[i] : NULL;
}

const devio_gguf_tensor *devio_gguf_tensor_at(const devio_gguf_file *f, size_t i)
{
    return i < f->n_tensors ? &f->tensors[i] : NULL;
}

size_t devio_gguf_tensor_index(const devio_gguf_file *f, const devio_gguf_tensor *t)
{
    return (size_t)(t - f->tensors);
}

/* Binary search of idx[0, n), sorted by the string at each item's start
 * (name and key lead devio_gguf_tensor and devio_gguf_kv). */
static const void *find_sorted(const size_t *idx, size_t n, const void *items, size_t item_size,
                               const char *want)
{
    size_t lo = 0, hi = idx ? n : 0;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const void *it = (const char *)items + idx[mid] * item_size;
        int c = strcmp(*(char *const *)it, want);
        if (c == 0)
            return it;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

const devio_gguf_kv *devio_gguf_find_kv(const devio_gguf_file *f, const char *key)
{
    return find_sorted(f->by_key, f->n_kvs, f->kvs, sizeof *f->kvs, key);
}

const devio_gguf_tensor *devio_gguf_find_tensor(const devio_gguf_file *f, const char *name)
{
    return find_sorted(f->by_name, f->n_tensors, f->tensors, sizeof *f->tensors, name);
}

bool devio_gguf_get_u64(const devio_gguf_file *f, const char *key, uint64_t *out)
{
    const devio_gguf_kv *kv = devio_gguf_find_kv(f, key);
    if (!kv)
        return false;
    switch (kv->type) {
    case DEVIO_GGUF_U8:
    case DEVIO_GGUF_U16:
    case DEVIO_GGUF_U32:
    case DEVIO_GGUF_U64:
        *out = le(kv->val, scalar_size(kv->type));
        return true;
    case DEVIO_GGUF_I8:
    case DEVIO_GGUF_I16:
    case DEVIO_GGUF_I32:
    case DEVIO_GGUF_I64: {
        uint32_t n = scalar_size(kv->type);
        uint64_t v = le(kv->val, n);
        if (n < 8 && (v >> (8 * n - 1)) & 1)
            return false; /* negative */
        if (n == 8 && (v >> 63))
            return false;
        *out = v;
        return true;
    }
    default:
        return false;
    }
}

bool devio_gguf_get_u32(const devio_gguf_file *f, const char *key, uint32_t *out)
{
    uint64_t v;
    if (!devio_gguf_get_u64(f, key, &v) || v > UINT32_MAX)
        return false;
    *out = (uint32_t)v;
    return true;
}

bool devio_gguf_get_f32(const devio_gguf_file *f, const char *key, float *out)
{
    const devio_gguf_kv *kv = devio_gguf_find_kv(f, key);
    if (!kv)
        return false;
    if (kv->type == DEVIO_GGUF_F32) {
        uint32_t b = (uint32_t)le(kv->val, 4);
        memcpy(out, &b, 4);
        return true;
    }
    if (kv->type == DEVIO_GGUF_F64) {
        uint64_t b = le(kv->val, 8);
        double d;
        memcpy(&d, &b, 8);
        *out = (float)d;
        return true;
    }
    uint64_t u;
    if (devio_gguf_get_u64(f, key, &u) && u <= (1u << 24)) {
        *out = (float)u;
        return true;
    }
    return false;
}

bool devio_gguf_get_bool(const devio_gguf_file *f, const char *key, bool *out)
{
    const devio_gguf_kv *kv = devio_gguf_find_kv(f, key);
    if (!kv || kv->type != DEVIO_GGUF_BOOL || kv->val[0] > 1)
        return false;
    *out = kv->val[0] == 1;
    return true;
}

const char *devio_gguf_get_str(const devio_gguf_file *f, const char *key, uint64_t *len)
{
    const devio_gguf_kv *kv = devio_gguf_find_kv(f, key);
    if (!kv || kv->type != DEVIO_GGUF_STRING)
        return NULL;
    *len = kv->n;
    return (const char *)kv->val + 8;
}
