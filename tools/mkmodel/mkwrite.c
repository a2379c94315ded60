/* mkwrite.c - the part of devio-mkmodel that models and adapters share: seeded tensor values, JSON text and safetensors files.
 * It must never hold more than one chunk of one tensor in memory, nor let anything but the tensor list and the seed shape its bytes. */
#include "tools/mkmodel/mkwrite.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "device/numerics/numerics.h"

void mk_buf_printf(mk_buf *b, const char *fmt, ...)
{
    if (b->oom)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->s ? b->s + b->len : NULL, b->s ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = true;
            return;
        }
        if (b->s && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap ? b->cap : 1024;
        while (cap <= b->len + (size_t)n)
            cap *= 2;
        char *ns = realloc(b->s, cap);
        if (!ns) {
            b->oom = true;
            return;
        }
        b->s = ns;
        b->cap = cap;
    }
}

/* ---- numbers ---- */

/* Local twins of devio_dtype_size/_str, so the writer links without the loader. */
uint64_t mk_dtype_size(devio_dtype t)
{
    return t == DEVIO_F32 ? 4 : 2;
}

static const char *mk_dtype_name(devio_dtype t)
{
    return t == DEVIO_F32 ? "F32" : t == DEVIO_F16 ? "F16" : "BF16";
}

const char *mk_torch_dtype(devio_dtype t)
{
    return t == DEVIO_F32 ? "float32" : t == DEVIO_F16 ? "float16" : "bfloat16";
}

/* splitmix64's output function; used counter-style so element i of a tensor
 * is a pure function of (seed, name, i) and chunks need no carried state. */
static uint64_t mk_mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t mk_key(uint64_t seed, const char *name)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (const unsigned char *p = (const unsigned char *)name; *p; p++)
        h = (h ^ *p) * 0x100000001b3ull;
    return mk_mix(seed ^ mk_mix(h));
}

/* Uniform in [-1, 1), exactly representable (24 random bits). */
static float mk_unit(uint64_t key, uint64_t i)
{
    uint64_t r = mk_mix(key + (i + 1) * 0x9e3779b97f4a7c15ull);
    float u = (float)(r >> 40) * 0x1p-24f;
    return 2.0f * u - 1.0f;
}

/* 1/sqrt(n) from correctly rounded binary32 operations: the same bits on
 * every platform, and no libm. */
float mk_inv_sqrt(uint64_t n)
{
    return 1.0f / devio_num_sqrt((float)n);
}

/* 1 - exp(-x) for x in (0, 1]: a series below 1/4, where 1 - expf(-x)
 * would cancel away most of the bits of a small dt. */
static float mk_one_minus_exp_neg(float x)
{
    if (x >= 0.25f)
        return 1.0f - devio_expf(-x);
    /* x (1 - x/2 (1 - x/3 (... (1 - x/7)))): the first omitted term is below 4e-10 x. */
    float s = 1.0f;
    for (int k = 7; k >= 2; k--)
        s = 1.0f - x / (float)k * s;
    return x * s;
}

/* Mamba-2's dt_bias: dt log-uniform in [lo, hi), then the inverse of
 * softplus, dt + log(-expm1(-dt)), as Hugging Face initialises it. */
static float mk_dt_bias(float u01, float lo, float hi)
{
    float llo = devio_logf(lo), lhi = devio_logf(hi);
    float dt = devio_expf(llo + u01 * (lhi - llo));
    return dt + devio_logf(mk_one_minus_exp_neg(dt));
}

static void mk_fill(const mk_tensor *t, uint64_t key, uint64_t start, size_t n, float *dst)
{
    for (size_t j = 0; j < n; j++) {
        float u = mk_unit(key, start + j);
        float u01 = 0.5f * u + 0.5f; /* exact: u has 24 bits */
        switch (t->init) {
        case MK_INIT_LINEAR:
        case MK_INIT_BIAS:
            dst[j] = u * t->scale;
            break;
        case MK_INIT_NORM:
            dst[j] = 1.0f + u * t->scale;
            break;
        case MK_INIT_A_LOG:
            dst[j] = devio_logf(t->lo + u01 * (t->hi - t->lo));
            break;
        case MK_INIT_DT_BIAS:
            dst[j] = mk_dt_bias(u01, t->lo, t->hi);
            break;
        }
    }
}

/* ---- the tensor list ---- */

static mk_tensor *mk_push(mk_list *L, const char *name, uint32_t ndim, const uint64_t *shape,
                          mk_init init)
{
    mk_tensor *t = &L->t[L->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = ndim;
    t->nelem = 1;
    for (uint32_t i = 0; i < ndim; i++) {
        t->shape[i] = shape[i];
        t->nelem *= shape[i];
    }
    t->init = init;
    return t;
}

void mk_add(mk_list *L, const char *name, uint32_t ndim, uint64_t s0, uint64_t s1, mk_init init,
            float scale)
{
    const uint64_t shape[2] = {s0, s1};
    mk_push(L, name, ndim, shape, init)->scale = scale;
}

void mk_add_3d(mk_list *L, const char *name, uint64_t s0, uint64_t s1, uint64_t s2,
               mk_init init, float scale)
{
    const uint64_t shape[3] = {s0, s1, s2};
    mk_push(L, name, 3, shape, init)->scale = scale;
}

void mk_add_range(mk_list *L, const char *name, uint64_t n, mk_init init, float lo, float hi)
{
    mk_tensor *t = mk_push(L, name, 1, &n, init);
    t->lo = lo;
    t->hi = hi;
}

static int mk_cmp(const void *a, const void *b)
{
    return strcmp(((const mk_tensor *)a)->name, ((const mk_tensor *)b)->name);
}

void mk_list_sort(mk_list *L)
{
    qsort(L->t, L->n, sizeof *L->t, mk_cmp);
}

/* Elements [start, start+n) of tensor `name` of a written list, as the
 * writer produces them (`what` names the file set in the error). */
devio_status mk_list_values(const mk_list *L, uint64_t seed, const char *name, uint64_t start,
                            size_t n, float *dst, const char *what, devio_error *err)
{
    const mk_tensor *t = NULL;
    for (size_t i = 0; i < L->n; i++)
        if (strcmp(L->t[i].name, name) == 0)
            t = &L->t[i];
    if (!t || start > t->nelem || n > t->nelem - start) {
        devio_fail(err, DEVIO_E_INVALID, "tensor '%.80s' %s%s", name,
                   t ? "range is out of bounds" : "is not part of this ", t ? "" : what);
        return DEVIO_E_INVALID;
    }
    mk_fill(t, mk_key(seed, t->name), start, n, dst);
    return DEVIO_OK;
}

/* ---- files ---- */

/* mkdir -p: creates each missing component of `dir`. */
devio_status mk_mkdirs(const char *dir, devio_error *err)
{
    size_t n = strlen(dir);
    char *p = malloc(n + 1);
    if (!p) {
        devio_fail(err, DEVIO_E_NOMEM, "out of memory");
        return DEVIO_E_NOMEM;
    }
    memcpy(p, dir, n + 1);
    devio_status st = DEVIO_OK;
    for (size_t i = 1; i <= n; i++) {
        if (p[i] != '/' && p[i] != '\0')
            continue;
        char c = p[i];
        p[i] = '\0';
        if (mkdir(p, 0777) != 0 && errno != EEXIST) {
            devio_fail(err, DEVIO_E_IO, "cannot create directory '%.150s': %s", p, strerror(errno));
            st = DEVIO_E_IO;
            break;
        }
        p[i] = c;
    }
    if (st == DEVIO_OK) {
        struct stat sb;
        if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
            devio_fail(err, DEVIO_E_IO, "'%.150s' is not a directory", dir);
            st = DEVIO_E_IO;
        }
    }
    free(p);
    return st;
}

char *mk_path(const char *dir, const char *name, const char *suffix)
{
    size_t n = strlen(dir) + strlen(name) + strlen(suffix) + 2;
    char *p = malloc(n);
    if (p)
        snprintf(p, n, "%s/%s%s", dir, name, suffix);
    return p;
}

/* Closes fp, which holds DIR/NAME.tmp, and renames it to `fin` when every
 * write went well (ok); otherwise removes it. */
static devio_status mk_finish(FILE *fp, bool ok, const char *tmp, const char *fin,
                              devio_error *err)
{
    ok = (fclose(fp) == 0) && ok;
    if (!ok || rename(tmp, fin) != 0) {
        devio_fail(err, DEVIO_E_IO, "cannot write '%.150s': %s", fin, strerror(errno));
        unlink(tmp);
        return DEVIO_E_IO;
    }
    return DEVIO_OK;
}

/* Writes `len` bytes of `data` to DIR/NAME through DIR/NAME.tmp and a rename,
 * so a reader never sees a half-written file under the final name. */
static devio_status mk_write_small(const char *dir, const char *name, const char *data,
                                   size_t len, devio_error *err)
{
    char *tmp = mk_path(dir, name, ".tmp"), *fin = mk_path(dir, name, "");
    devio_status st = DEVIO_OK;
    if (!tmp || !fin) {
        devio_fail(err, DEVIO_E_NOMEM, "out of memory");
        st = DEVIO_E_NOMEM;
        goto out;
    }
    FILE *fp = fopen(tmp, "wb");
    if (!fp) {
        devio_fail(err, DEVIO_E_IO, "cannot create '%.150s': %s", tmp, strerror(errno));
        st = DEVIO_E_IO;
        goto out;
    }
    st = mk_finish(fp, fwrite(data, 1, len, fp) == len, tmp, fin, err);
out:
    free(tmp);
    free(fin);
    return st;
}

devio_status mk_write_json(const char *dir, const char *name, const mk_buf *b, devio_error *err)
{
    if (b->oom) {
        devio_fail(err, DEVIO_E_NOMEM, "out of memory");
        return DEVIO_E_NOMEM;
    }
    return mk_write_small(dir, name, b->s, b->len, err);
}

devio_status mk_chunk_alloc(mk_chunk *c, devio_error *err)
{
    c->f = malloc(MK_CHUNK * sizeof *c->f);
    c->bytes = malloc(MK_CHUNK * sizeof(float));
    if (!c->f || !c->bytes) {
        mk_chunk_free(c);
        devio_fail(err, DEVIO_E_NOMEM, "out of memory");
        return DEVIO_E_NOMEM;
    }
    return DEVIO_OK;
}

void mk_chunk_free(mk_chunk *c)
{
    free(c->f);
    free(c->bytes);
    c->f = NULL;
    c->bytes = NULL;
}

/* Header: sorted keys, compact, padded with spaces so the data section
 * starts at a multiple of 8 bytes (as the reference writer does). */
static void mk_header(const mk_list *L, uint32_t shard, devio_dtype dt, mk_buf *b)
{
    const uint64_t es = mk_dtype_size(dt);
    mk_buf_printf(b, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (size_t i = 0; i < L->n; i++) {
        const mk_tensor *t = &L->t[i];
        if (t->shard != shard)
            continue;
        mk_buf_printf(b, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", t->name, mk_dtype_name(dt));
        for (uint32_t d = 0; d < t->ndim; d++)
            mk_buf_printf(b, "%s%llu", d ? "," : "", (unsigned long long)t->shape[d]);
        mk_buf_printf(b, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)t->offset,
                      (unsigned long long)(t->offset + t->nelem * es));
    }
    mk_buf_printf(b, "}");
    while (!b->oom && (8 + b->len) % 8 != 0)
        mk_buf_printf(b, " ");
}

/* Writes the tensors of L that belong to `shard` as the safetensors file
 * DIR/NAME (through NAME.tmp and a rename), one chunk at a time. */
devio_status mk_write_st(const char *dir, const char *name, const mk_list *L, uint32_t shard,
                         devio_dtype dtype, uint64_t seed, const mk_chunk *ck, devio_error *err)
{
    float *fbuf = ck->f;
    uint8_t *obuf = ck->bytes;
    mk_buf hb = {0};
    mk_header(L, shard, dtype, &hb);
    char *tmp = mk_path(dir, name, ".tmp"), *fin = mk_path(dir, name, "");
    devio_status st = DEVIO_OK;
    FILE *fp = NULL;
    if (hb.oom || !tmp || !fin) {
        devio_fail(err, DEVIO_E_NOMEM, "out of memory");
        st = DEVIO_E_NOMEM;
        goto out;
    }
    fp = fopen(tmp, "wb");
    if (!fp) {
        devio_fail(err, DEVIO_E_IO, "cannot create '%.150s': %s", tmp, strerror(errno));
        st = DEVIO_E_IO;
        goto out;
    }
    uint8_t len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (uint8_t)((uint64_t)hb.len >> (8 * i));
    bool ok = fwrite(len8, 1, 8, fp) == 8 && fwrite(hb.s, 1, hb.len, fp) == hb.len;
    for (size_t i = 0; ok && i < L->n; i++) {
        const mk_tensor *t = &L->t[i];
        if (t->shard != shard)
            continue;
        uint64_t key = mk_key(seed, t->name);
        for (uint64_t at = 0; ok && at < t->nelem; at += MK_CHUNK) {
            size_t n = (size_t)(t->nelem - at < MK_CHUNK ? t->nelem - at : MK_CHUNK);
            mk_fill(t, key, at, n, fbuf);
            size_t bytes;
            /* Explicit little-endian bytes: the format's byte order, whatever the host's. */
            if (dtype == DEVIO_F32) {
                for (size_t j = 0; j < n; j++) {
                    uint32_t u;
                    memcpy(&u, &fbuf[j], 4);
                    obuf[4 * j] = (uint8_t)u;
                    obuf[4 * j + 1] = (uint8_t)(u >> 8);
                    obuf[4 * j + 2] = (uint8_t)(u >> 16);
                    obuf[4 * j + 3] = (uint8_t)(u >> 24);
                }
                bytes = 4 * n;
            } else {
                for (size_t j = 0; j < n; j++) {
                    uint16_t h = dtype == DEVIO_BF16 ? devio_f32_to_bf16_rne(fbuf[j])
                                                     : devio_f32_to_f16_rne(fbuf[j]);
                    obuf[2 * j] = (uint8_t)h;
                    obuf[2 * j + 1] = (uint8_t)(h >> 8);
                }
                bytes = 2 * n;
            }
            ok = fwrite(obuf, 1, bytes, fp) == bytes;
        }
    }
    st = mk_finish(fp, ok, tmp, fin, err);
out:
    free(hb.s);
    free(tmp);
    free(fin);
    return st;
}

/* Shortest decimal that reads back as the same double, written as a JSON
 * float (a trailing ".0" when it would otherwise look like an integer). */
void mk_json_double(mk_buf *b, double v)
{
    char s[40];
    if (v > -1e15 && v < 1e15 && (double)(long long)v == v) {
        /* Integral values such as rope_theta read best as "10000.0". */
        mk_buf_printf(b, "%lld.0", (long long)v);
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(s, sizeof s, "%.*g", prec, v);
        if (strtod(s, NULL) == v)
            break;
    }
    if (!strpbrk(s, ".eEn"))
        strcat(s, ".0");
    mk_buf_printf(b, "%s", s);
}

void mk_kv_u(mk_buf *b, const char *key, uint64_t v)
{
    mk_buf_printf(b, "  \"%s\": %llu,\n", key, (unsigned long long)v);
}

void mk_kv_b(mk_buf *b, const char *key, bool v)
{
    mk_buf_printf(b, "  \"%s\": %s,\n", key, v ? "true" : "false");
}

void mk_kv_f(mk_buf *b, const char *key, double v)
{
    mk_buf_printf(b, "  \"%s\": ", key);
    mk_json_double(b, v);
    mk_buf_printf(b, ",\n");
}

void mk_kv_s(mk_buf *b, const char *key, const char *v)
{
    mk_buf_printf(b, "  \"%s\": \"%s\",\n", key, v);
}
