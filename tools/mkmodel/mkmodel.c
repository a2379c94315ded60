/* mkmodel.c - writes deterministic random Llama models in Hugging Face's on-disk format.
 * It must never hold more than one chunk of one tensor in memory, nor let anything but the options shape its bytes. */
#include "tools/mkmodel/mkmodel.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "device/numerics.h"

#define MK_CHUNK ((size_t)65536) /* elements generated and written per step */
#define MK_NAME_MAX 96u
#define MK_MAX_DIM (1u << 20)

typedef enum mk_init { MK_INIT_LINEAR, MK_INIT_NORM, MK_INIT_BIAS } mk_init;

/* One tensor to write: its name, shape, initialisation and place on disk. */
typedef struct mk_tensor {
    char name[MK_NAME_MAX];
    uint32_t ndim;
    uint64_t shape[2];
    uint64_t nelem;
    mk_init init;
    float scale;     /* linear: 1/sqrt(fan_in); norm and bias: spread */
    uint32_t shard;  /* index of the file it goes to */
    uint64_t offset; /* begin offset inside that file's data section */
} mk_tensor;

typedef struct mk_list {
    mk_tensor *t;
    size_t n;
} mk_list;

/* A growable text buffer for the JSON the writer builds by hand, so that
 * key order and number formatting are fixed by this file alone. */
typedef struct mk_buf {
    char *s;
    size_t len, cap;
    bool oom;
} mk_buf;

static void mk_err(devio_error *err, devio_status s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (err) {
        err->status = s;
        err->detail_key[0] = '\0';
        err->detail_val = 0;
        vsnprintf(err->message, sizeof err->message, fmt, ap);
    }
    va_end(ap);
}

static void buf_printf(mk_buf *b, const char *fmt, ...)
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
static uint64_t mk_dtype_size(devio_dtype t)
{
    return t == DEVIO_F32 ? 4 : 2;
}

static const char *mk_dtype_name(devio_dtype t)
{
    return t == DEVIO_F32 ? "F32" : t == DEVIO_F16 ? "F16" : "BF16";
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
static float mk_inv_sqrt(uint64_t n)
{
    return 1.0f / devio_num_sqrt((float)n);
}

static void mk_fill(const mk_tensor *t, uint64_t key, uint64_t start, size_t n, float *dst)
{
    for (size_t j = 0; j < n; j++) {
        float u = mk_unit(key, start + j);
        switch (t->init) {
        case MK_INIT_LINEAR:
        case MK_INIT_BIAS:
            dst[j] = u * t->scale;
            break;
        case MK_INIT_NORM:
            dst[j] = 1.0f + u * t->scale;
            break;
        }
    }
}

/* ---- options and the tensor list ---- */

devio_mkmodel_opts devio_mkmodel_opts_default(void)
{
    devio_mkmodel_opts o = {
        .out_dir = NULL,
        .arch = "llama",
        .shards = 1,
        .rope_theta = 10000.0,
        .rms_norm_eps = 1e-5,
        .seed = 0,
    };
    devio_mkmodel_preset("tiny", &o, NULL);
    return o;
}

devio_status devio_mkmodel_preset(const char *name, devio_mkmodel_opts *o, devio_error *err)
{
    if (strcmp(name, "tiny") == 0) {
        o->vocab_size = 256;
        o->hidden_size = 64;
        o->n_layers = 2;
        o->n_heads = 4;
        o->n_kv_heads = 2;
        o->head_dim = 16;
        o->intermediate_size = 128;
        o->max_position_embeddings = 512;
        o->tie_word_embeddings = false;
        o->dtype = DEVIO_F32;
    } else if (strcmp(name, "small") == 0) {
        o->vocab_size = 32000;
        o->hidden_size = 288;
        o->n_layers = 6;
        o->n_heads = 6;
        o->n_kv_heads = 6;
        o->head_dim = 48;
        o->intermediate_size = 768;
        o->max_position_embeddings = 1024;
        o->tie_word_embeddings = true;
        o->dtype = DEVIO_F32;
    } else if (strcmp(name, "bench") == 0) {
        o->vocab_size = 32000;
        o->hidden_size = 768;
        o->n_layers = 12;
        o->n_heads = 12;
        o->n_kv_heads = 12;
        o->head_dim = 64;
        o->intermediate_size = 2048;
        o->max_position_embeddings = 1024;
        o->tie_word_embeddings = false;
        o->dtype = DEVIO_BF16;
    } else {
        mk_err(err, DEVIO_E_INVALID, "unknown preset '%.40s' (tiny, small, bench)", name);
        return DEVIO_E_INVALID;
    }
    o->attention_bias = false;
    return DEVIO_OK;
}

static uint32_t mk_head_dim(const devio_mkmodel_opts *o)
{
    return o->head_dim ? o->head_dim : o->hidden_size / o->n_heads;
}

static devio_status mk_check(const devio_mkmodel_opts *o, devio_error *err)
{
    const char *arch = o->arch ? o->arch : "llama";
    if (strcmp(arch, "bamba") == 0 || strcmp(arch, "mamba2") == 0) {
        mk_err(err, DEVIO_E_UNSUPPORTED,
               "unsupported architecture '%s': this devio-mkmodel writes only llama", arch);
        return DEVIO_E_UNSUPPORTED;
    }
    if (strcmp(arch, "llama") != 0) {
        mk_err(err, DEVIO_E_INVALID, "unknown architecture '%.40s' (llama, bamba, mamba2)", arch);
        return DEVIO_E_INVALID;
    }
    const struct {
        const char *what;
        uint32_t v;
    } dims[] = {
        {"vocab", o->vocab_size},     {"hidden", o->hidden_size}, {"ffn", o->intermediate_size},
        {"layers", o->n_layers},      {"heads", o->n_heads},      {"kv-heads", o->n_kv_heads},
        {"max-pos", o->max_position_embeddings},
    };
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
        if (dims[i].v == 0 || dims[i].v > MK_MAX_DIM) {
            mk_err(err, DEVIO_E_INVALID, "%s must be in [1, %u], got %u", dims[i].what,
                   MK_MAX_DIM, dims[i].v);
            return DEVIO_E_INVALID;
        }
    }
    if (o->n_layers > 1024 || o->n_heads > 1024) {
        mk_err(err, DEVIO_E_INVALID, "layers and heads must be at most 1024");
        return DEVIO_E_INVALID;
    }
    if (o->n_heads % o->n_kv_heads != 0) {
        mk_err(err, DEVIO_E_INVALID, "heads %u is not a multiple of kv-heads %u", o->n_heads,
               o->n_kv_heads);
        return DEVIO_E_INVALID;
    }
    if (o->head_dim == 0 && o->hidden_size % o->n_heads != 0) {
        mk_err(err, DEVIO_E_INVALID, "hidden %u is not a multiple of heads %u (give --head-dim)",
               o->hidden_size, o->n_heads);
        return DEVIO_E_INVALID;
    }
    uint32_t hd = mk_head_dim(o);
    if (hd % 2 != 0 || hd > 1024) {
        mk_err(err, DEVIO_E_INVALID, "head-dim %u must be even and at most 1024", hd);
        return DEVIO_E_INVALID;
    }
    if (!(o->rope_theta > 0.0) || o->rope_theta > 1e12 || !(o->rms_norm_eps > 0.0) ||
        o->rms_norm_eps > 1.0) {
        mk_err(err, DEVIO_E_INVALID, "rope-theta must be in (0, 1e12] and eps in (0, 1]");
        return DEVIO_E_INVALID;
    }
    if (o->dtype != DEVIO_F32 && o->dtype != DEVIO_F16 && o->dtype != DEVIO_BF16) {
        mk_err(err, DEVIO_E_INVALID, "dtype must be f32, f16 or bf16");
        return DEVIO_E_INVALID;
    }
    if (o->shards == 0 || o->shards > 99999) {
        mk_err(err, DEVIO_E_INVALID, "shards must be in [1, 99999]");
        return DEVIO_E_INVALID;
    }
    return DEVIO_OK;
}

static void mk_add(mk_list *L, const char *name, uint32_t ndim, uint64_t s0, uint64_t s1,
                   mk_init init, float scale)
{
    mk_tensor *t = &L->t[L->n++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = ndim;
    t->shape[0] = s0;
    t->shape[1] = ndim == 2 ? s1 : 0;
    t->nelem = ndim == 2 ? s0 * s1 : s0;
    t->init = init;
    t->scale = scale;
}

static int mk_cmp(const void *a, const void *b)
{
    return strcmp(((const mk_tensor *)a)->name, ((const mk_tensor *)b)->name);
}

/* Builds every tensor of the model, sorted by name (the order of both the
 * header and the data), with shards and offsets assigned. */
static devio_status mk_list_build(const devio_mkmodel_opts *o, mk_list *L, devio_error *err)
{
    const uint64_t V = o->vocab_size, d = o->hidden_size, f = o->intermediate_size;
    const uint64_t q = (uint64_t)o->n_heads * mk_head_dim(o);
    const uint64_t kv = (uint64_t)o->n_kv_heads * mk_head_dim(o);
    size_t per_layer = 9 + (o->attention_bias ? 3 : 0);
    size_t n = 2 + (o->tie_word_embeddings ? 0 : 1) + per_layer * o->n_layers;
    L->n = 0;
    L->t = calloc(n, sizeof *L->t);
    if (!L->t) {
        mk_err(err, DEVIO_E_NOMEM, "out of memory for %zu tensor entries", n);
        return DEVIO_E_NOMEM;
    }
    const float norm_spread = 0.1f, bias_spread = 0.05f;
    mk_add(L, "model.embed_tokens.weight", 2, V, d, MK_INIT_LINEAR, mk_inv_sqrt(d));
    mk_add(L, "model.norm.weight", 1, d, 0, MK_INIT_NORM, norm_spread);
    if (!o->tie_word_embeddings)
        mk_add(L, "lm_head.weight", 2, V, d, MK_INIT_LINEAR, mk_inv_sqrt(d));
    char name[MK_NAME_MAX];
#define MK_LAYER(suffix, nd, a, b, init, scale)                                   \
    do {                                                                          \
        snprintf(name, sizeof name, "model.layers.%u." suffix, i);                \
        mk_add(L, name, nd, a, b, init, scale);                                   \
    } while (0)
    for (uint32_t i = 0; i < o->n_layers; i++) {
        MK_LAYER("input_layernorm.weight", 1, d, 0, MK_INIT_NORM, norm_spread);
        MK_LAYER("self_attn.q_proj.weight", 2, q, d, MK_INIT_LINEAR, mk_inv_sqrt(d));
        MK_LAYER("self_attn.k_proj.weight", 2, kv, d, MK_INIT_LINEAR, mk_inv_sqrt(d));
        MK_LAYER("self_attn.v_proj.weight", 2, kv, d, MK_INIT_LINEAR, mk_inv_sqrt(d));
        MK_LAYER("self_attn.o_proj.weight", 2, d, q, MK_INIT_LINEAR, mk_inv_sqrt(q));
        if (o->attention_bias) {
            MK_LAYER("self_attn.q_proj.bias", 1, q, 0, MK_INIT_BIAS, bias_spread);
            MK_LAYER("self_attn.k_proj.bias", 1, kv, 0, MK_INIT_BIAS, bias_spread);
            MK_LAYER("self_attn.v_proj.bias", 1, kv, 0, MK_INIT_BIAS, bias_spread);
        }
        MK_LAYER("post_attention_layernorm.weight", 1, d, 0, MK_INIT_NORM, norm_spread);
        MK_LAYER("mlp.gate_proj.weight", 2, f, d, MK_INIT_LINEAR, mk_inv_sqrt(d));
        MK_LAYER("mlp.up_proj.weight", 2, f, d, MK_INIT_LINEAR, mk_inv_sqrt(d));
        MK_LAYER("mlp.down_proj.weight", 2, d, f, MK_INIT_LINEAR, mk_inv_sqrt(f));
    }
#undef MK_LAYER
    qsort(L->t, L->n, sizeof *L->t, mk_cmp);

    if (o->shards > L->n) {
        mk_err(err, DEVIO_E_INVALID, "%u shards requested but the model has only %zu tensors",
               o->shards, L->n);
        free(L->t);
        L->t = NULL;
        return DEVIO_E_INVALID;
    }
    /* Fill shards in name order, moving on before a tensor would take the
     * shard past an equal share of the bytes still to place, or when every
     * remaining shard still needs a tensor; the last takes what is left. */
    const uint64_t es = mk_dtype_size(o->dtype);
    uint64_t total = 0;
    for (size_t i = 0; i < L->n; i++)
        total += L->t[i].nelem * es;
    uint64_t target = (total + o->shards - 1) / o->shards, left = total;
    uint32_t s = 0;
    uint64_t acc = 0;
    for (size_t i = 0; i < L->n; i++) {
        uint64_t bytes = L->t[i].nelem * es;
        if (acc > 0 && s + 1 < o->shards &&
            (acc + bytes > target || L->n - i <= (size_t)(o->shards - 1 - s))) {
            s++;
            acc = 0;
            target = (left + (o->shards - s) - 1) / (o->shards - s);
        }
        left -= bytes;
        L->t[i].shard = s;
        L->t[i].offset = acc;
        acc += bytes;
    }
    return DEVIO_OK;
}

uint64_t devio_mkmodel_param_count(const devio_mkmodel_opts *o)
{
    const uint64_t V = o->vocab_size, d = o->hidden_size, f = o->intermediate_size;
    const uint64_t hd = o->head_dim ? o->head_dim : (o->n_heads ? d / o->n_heads : 0);
    const uint64_t q = o->n_heads * hd, kv = o->n_kv_heads * hd;
    uint64_t layer = 2 * d + q * d + 2 * kv * d + d * q + 3 * f * d;
    if (o->attention_bias)
        layer += q + 2 * kv;
    return V * d * (o->tie_word_embeddings ? 1 : 2) + d + layer * o->n_layers;
}

/* Elements [start, start+n) of tensor `name` of a written list, as the
 * writer produces them (`what` names the file set in the error). */
static devio_status mk_list_values(const mk_list *L, uint64_t seed, const char *name,
                                   uint64_t start, size_t n, float *dst, const char *what,
                                   devio_error *err)
{
    const mk_tensor *t = NULL;
    for (size_t i = 0; i < L->n; i++)
        if (strcmp(L->t[i].name, name) == 0)
            t = &L->t[i];
    if (!t || start > t->nelem || n > t->nelem - start) {
        mk_err(err, DEVIO_E_INVALID, "tensor '%.80s' %s%s", name,
               t ? "range is out of bounds" : "is not part of this ", t ? "" : what);
        return DEVIO_E_INVALID;
    }
    mk_fill(t, mk_key(seed, t->name), start, n, dst);
    return DEVIO_OK;
}

devio_status devio_mkmodel_values(const devio_mkmodel_opts *o, const char *name, uint64_t start,
                                  size_t n, float *dst, devio_error *err)
{
    devio_status st = mk_check(o, err);
    if (st != DEVIO_OK)
        return st;
    mk_list L;
    devio_mkmodel_opts one = *o;
    one.shards = 1;
    if ((st = mk_list_build(&one, &L, err)) != DEVIO_OK)
        return st;
    st = mk_list_values(&L, o->seed, name, start, n, dst, "model", err);
    free(L.t);
    return st;
}

/* ---- files ---- */

/* mkdir -p: creates each missing component of `dir`. */
static devio_status mk_mkdirs(const char *dir, devio_error *err)
{
    size_t n = strlen(dir);
    char *p = malloc(n + 1);
    if (!p) {
        mk_err(err, DEVIO_E_NOMEM, "out of memory");
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
            mk_err(err, DEVIO_E_IO, "cannot create directory '%.150s': %s", p, strerror(errno));
            st = DEVIO_E_IO;
            break;
        }
        p[i] = c;
    }
    if (st == DEVIO_OK) {
        struct stat sb;
        if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
            mk_err(err, DEVIO_E_IO, "'%.150s' is not a directory", dir);
            st = DEVIO_E_IO;
        }
    }
    free(p);
    return st;
}

static char *mk_path(const char *dir, const char *name, const char *suffix)
{
    size_t n = strlen(dir) + strlen(name) + strlen(suffix) + 2;
    char *p = malloc(n);
    if (p)
        snprintf(p, n, "%s/%s%s", dir, name, suffix);
    return p;
}

/* Writes `len` bytes of `data` to DIR/NAME through DIR/NAME.tmp and a rename,
 * so a reader never sees a half-written file under the final name. */
static devio_status mk_write_small(const char *dir, const char *name, const char *data,
                                   size_t len, devio_error *err)
{
    char *tmp = mk_path(dir, name, ".tmp"), *fin = mk_path(dir, name, "");
    devio_status st = DEVIO_OK;
    if (!tmp || !fin) {
        mk_err(err, DEVIO_E_NOMEM, "out of memory");
        st = DEVIO_E_NOMEM;
        goto out;
    }
    FILE *fp = fopen(tmp, "wb");
    if (!fp) {
        mk_err(err, DEVIO_E_IO, "cannot create '%.150s': %s", tmp, strerror(errno));
        st = DEVIO_E_IO;
        goto out;
    }
    bool ok = fwrite(data, 1, len, fp) == len;
    ok = (fclose(fp) == 0) && ok;
    if (!ok || rename(tmp, fin) != 0) {
        mk_err(err, DEVIO_E_IO, "cannot write '%.150s': %s", fin, strerror(errno));
        unlink(tmp);
        st = DEVIO_E_IO;
    }
out:
    free(tmp);
    free(fin);
    return st;
}


static void mk_shard_name(char *dst, size_t cap, uint32_t shard, uint32_t shards)
{
    if (shards == 1)
        snprintf(dst, cap, "model.safetensors");
    else
        snprintf(dst, cap, "model-%05u-of-%05u.safetensors", shard + 1, shards);
}

/* Header: sorted keys, compact, padded with spaces so the data section
 * starts at a multiple of 8 bytes (as the reference writer does). */
static void mk_header(const mk_list *L, uint32_t shard, devio_dtype dt, mk_buf *b)
{
    const uint64_t es = mk_dtype_size(dt);
    buf_printf(b, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (size_t i = 0; i < L->n; i++) {
        const mk_tensor *t = &L->t[i];
        if (t->shard != shard)
            continue;
        buf_printf(b, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", t->name, mk_dtype_name(dt));
        if (t->ndim == 2)
            buf_printf(b, "%llu,%llu", (unsigned long long)t->shape[0],
                       (unsigned long long)t->shape[1]);
        else
            buf_printf(b, "%llu", (unsigned long long)t->shape[0]);
        buf_printf(b, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)t->offset,
                   (unsigned long long)(t->offset + t->nelem * es));
    }
    buf_printf(b, "}");
    while (!b->oom && (8 + b->len) % 8 != 0)
        buf_printf(b, " ");
}

/* Writes the tensors of L that belong to `shard` as the safetensors file
 * DIR/NAME (through NAME.tmp and a rename), one chunk at a time. */
static devio_status mk_write_st(const char *dir, const char *name, const mk_list *L,
                                uint32_t shard, devio_dtype dtype, uint64_t seed, float *fbuf,
                                uint8_t *obuf, devio_error *err)
{
    mk_buf hb = {0};
    mk_header(L, shard, dtype, &hb);
    char *tmp = mk_path(dir, name, ".tmp"), *fin = mk_path(dir, name, "");
    devio_status st = DEVIO_OK;
    FILE *fp = NULL;
    if (hb.oom || !tmp || !fin) {
        mk_err(err, DEVIO_E_NOMEM, "out of memory");
        st = DEVIO_E_NOMEM;
        goto out;
    }
    fp = fopen(tmp, "wb");
    if (!fp) {
        mk_err(err, DEVIO_E_IO, "cannot create '%.150s': %s", tmp, strerror(errno));
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
    ok = (fclose(fp) == 0) && ok;
    if (!ok || rename(tmp, fin) != 0) {
        mk_err(err, DEVIO_E_IO, "cannot write '%.150s': %s", fin, strerror(errno));
        unlink(tmp);
        st = DEVIO_E_IO;
    }
out:
    free(hb.s);
    free(tmp);
    free(fin);
    return st;
}

static devio_status mk_write_shard(const devio_mkmodel_opts *o, const mk_list *L,
                                   uint32_t shard, float *fbuf, uint8_t *obuf, devio_error *err)
{
    char name[64];
    mk_shard_name(name, sizeof name, shard, o->shards);
    return mk_write_st(o->out_dir, name, L, shard, o->dtype, o->seed, fbuf, obuf, err);
}

/* Shortest decimal that reads back as the same double, written as a JSON
 * float (a trailing ".0" when it would otherwise look like an integer). */
static void mk_json_double(mk_buf *b, double v)
{
    char s[40];
    if (v > -1e15 && v < 1e15 && (double)(long long)v == v) {
        /* Integral values such as rope_theta read best as "10000.0". */
        buf_printf(b, "%lld.0", (long long)v);
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(s, sizeof s, "%.*g", prec, v);
        if (strtod(s, NULL) == v)
            break;
    }
    if (!strpbrk(s, ".eEn"))
        strcat(s, ".0");
    buf_printf(b, "%s", s);
}

static const char *mk_torch_dtype(devio_dtype t)
{
    switch (t) {
    case DEVIO_F16:
        return "float16";
    case DEVIO_BF16:
        return "bfloat16";
    case DEVIO_F32:
        break;
    }
    return "float32";
}

static void mk_config(const devio_mkmodel_opts *o, mk_buf *b)
{
    const char *tf[2] = {"false", "true"};
    /* q/k/v biases without an o_proj bias is Qwen2's layout; Llama's
     * attention_bias would bias o_proj too, which devio does not model. */
    buf_printf(b, "{\n  \"architectures\": [\"%s\"],\n",
               o->attention_bias ? "Qwen2ForCausalLM" : "LlamaForCausalLM");
    buf_printf(b, "  \"attention_bias\": %s,\n", tf[o->attention_bias]);
    buf_printf(b, "  \"attention_dropout\": 0.0,\n");
    buf_printf(b, "  \"bos_token_id\": %u,\n", o->vocab_size > 1 ? 1u : 0u);
    buf_printf(b, "  \"eos_token_id\": %u,\n", o->vocab_size > 2 ? 2u : 0u);
    buf_printf(b, "  \"head_dim\": %u,\n", mk_head_dim(o));
    buf_printf(b, "  \"hidden_act\": \"silu\",\n");
    buf_printf(b, "  \"hidden_size\": %u,\n", o->hidden_size);
    buf_printf(b, "  \"initializer_range\": 0.02,\n");
    buf_printf(b, "  \"intermediate_size\": %u,\n", o->intermediate_size);
    buf_printf(b, "  \"max_position_embeddings\": %u,\n", o->max_position_embeddings);
    buf_printf(b, "  \"mlp_bias\": false,\n");
    buf_printf(b, "  \"model_type\": \"%s\",\n", o->attention_bias ? "qwen2" : "llama");
    buf_printf(b, "  \"num_attention_heads\": %u,\n", o->n_heads);
    buf_printf(b, "  \"num_hidden_layers\": %u,\n", o->n_layers);
    buf_printf(b, "  \"num_key_value_heads\": %u,\n", o->n_kv_heads);
    buf_printf(b, "  \"rms_norm_eps\": ");
    mk_json_double(b, o->rms_norm_eps);
    buf_printf(b, ",\n  \"rope_scaling\": null,\n  \"rope_theta\": ");
    mk_json_double(b, o->rope_theta);
    buf_printf(b, ",\n  \"tie_word_embeddings\": %s,\n", tf[o->tie_word_embeddings]);
    buf_printf(b, "  \"torch_dtype\": \"%s\",\n", mk_torch_dtype(o->dtype));
    buf_printf(b, "  \"use_cache\": true,\n");
    buf_printf(b, "  \"vocab_size\": %u\n}\n", o->vocab_size);
}

static void mk_index(const devio_mkmodel_opts *o, const mk_list *L, mk_buf *b)
{
    const uint64_t es = mk_dtype_size(o->dtype);
    uint64_t total = 0;
    for (size_t i = 0; i < L->n; i++)
        total += L->t[i].nelem * es;
    buf_printf(b, "{\n  \"metadata\": {\n    \"total_size\": %llu\n  },\n  \"weight_map\": {",
               (unsigned long long)total);
    char name[64];
    for (size_t i = 0; i < L->n; i++) {
        mk_shard_name(name, sizeof name, L->t[i].shard, o->shards);
        buf_printf(b, "%s\n    \"%s\": \"%s\"", i ? "," : "", L->t[i].name, name);
    }
    buf_printf(b, "\n  }\n}\n");
}

/* Removes the other layout's entry file, so the directory never offers a
 * stale single file next to a fresh index (or the reverse). */
static devio_status mk_unlink_stale(const char *dir, const char *name, devio_error *err)
{
    char *p = mk_path(dir, name, "");
    if (!p) {
        mk_err(err, DEVIO_E_NOMEM, "out of memory");
        return DEVIO_E_NOMEM;
    }
    devio_status st = DEVIO_OK;
    if (unlink(p) != 0 && errno != ENOENT) {
        mk_err(err, DEVIO_E_IO, "cannot remove stale '%.150s': %s", p, strerror(errno));
        st = DEVIO_E_IO;
    }
    free(p);
    return st;
}

devio_status devio_mkmodel_write(const devio_mkmodel_opts *o, devio_error *err)
{
    devio_status st = mk_check(o, err);
    if (st != DEVIO_OK)
        return st;
    if (!o->out_dir || !o->out_dir[0]) {
        mk_err(err, DEVIO_E_INVALID, "no output directory given");
        return DEVIO_E_INVALID;
    }
    /* Every option is checked before the file system is touched. */
    mk_list L = {0};
    if ((st = mk_list_build(o, &L, err)) != DEVIO_OK)
        return st;
    mk_buf cb = {0}, ib = {0};
    float *fbuf = malloc(MK_CHUNK * sizeof *fbuf);
    uint8_t *obuf = malloc(MK_CHUNK * sizeof(float));
    if (!fbuf || !obuf) {
        mk_err(err, DEVIO_E_NOMEM, "out of memory");
        st = DEVIO_E_NOMEM;
        goto out;
    }
    if ((st = mk_mkdirs(o->out_dir, err)) != DEVIO_OK)
        goto out;
    if ((st = mk_unlink_stale(o->out_dir,
                              o->shards == 1 ? "model.safetensors.index.json"
                                             : "model.safetensors",
                              err)) != DEVIO_OK)
        goto out;
    for (uint32_t s = 0; s < o->shards; s++)
        if ((st = mk_write_shard(o, &L, s, fbuf, obuf, err)) != DEVIO_OK)
            goto out;
    if (o->shards > 1) {
        mk_index(o, &L, &ib);
        if (ib.oom) {
            mk_err(err, DEVIO_E_NOMEM, "out of memory");
            st = DEVIO_E_NOMEM;
            goto out;
        }
        if ((st = mk_write_small(o->out_dir, "model.safetensors.index.json", ib.s, ib.len,
                                 err)) != DEVIO_OK)
            goto out;
    }
    mk_config(o, &cb);
    if (cb.oom) {
        mk_err(err, DEVIO_E_NOMEM, "out of memory");
        st = DEVIO_E_NOMEM;
        goto out;
    }
    st = mk_write_small(o->out_dir, "config.json", cb.s, cb.len, err);
out:
    free(cb.s);
    free(ib.s);
    free(fbuf);
    free(obuf);
    free(L.t);
    return st;
}

/* ---- PEFT LoRA adapters ---- */

#define MK_MAX_RANK 65536u

devio_mkmodel_adapter_opts devio_mkmodel_adapter_opts_default(void)
{
    devio_mkmodel_adapter_opts o = {
        .rank = 8,
        .alpha = 8.0,
        .targets = (1u << DEVIO_LORA_Q) | (1u << DEVIO_LORA_V),
        .dtype = DEVIO_F32,
        .seed = 0,
    };
    return o;
}

static devio_status mk_adapter_check(const devio_mkmodel_adapter_opts *o, devio_error *err)
{
    if (!o->model_dir || !o->model_dir[0]) {
        mk_err(err, DEVIO_E_INVALID, "no base model directory given");
        return DEVIO_E_INVALID;
    }
    if (o->rank == 0 || o->rank > MK_MAX_RANK) {
        mk_err(err, DEVIO_E_INVALID, "rank must be in [1, %u], got %u", MK_MAX_RANK, o->rank);
        return DEVIO_E_INVALID;
    }
    /* Written as !(x > 0) so that a NaN is refused too; float range because
     * the loader keeps alpha in binary32. */
    if (!(o->alpha > 0.0) || o->alpha > 3.0e38) {
        mk_err(err, DEVIO_E_INVALID, "alpha must be in (0, 3e38], got %g", o->alpha);
        return DEVIO_E_INVALID;
    }
    if (o->targets == 0 || (o->targets & ~DEVIO_LORA_ALL_TARGETS) != 0) {
        mk_err(err, DEVIO_E_INVALID, "targets must name at least one of q_proj k_proj v_proj "
               "o_proj gate_proj up_proj down_proj");
        return DEVIO_E_INVALID;
    }
    if (o->dtype != DEVIO_F32 && o->dtype != DEVIO_F16 && o->dtype != DEVIO_BF16) {
        mk_err(err, DEVIO_E_INVALID, "dtype must be f32, f16 or bf16");
        return DEVIO_E_INVALID;
    }
    return DEVIO_OK;
}

static void mk_adapter_name(char *dst, size_t cap, uint32_t layer, devio_lora_target t, char ab)
{
    const char *block = t <= DEVIO_LORA_O ? "self_attn" : "mlp";
    snprintf(dst, cap, "base_model.model.model.layers.%u.%s.%s.lora_%c.weight", layer, block,
             devio_lora_target_name(t), ab);
}

/* Every lora_A and lora_B tensor of the adapter, sorted by name, packed into
 * one file. Shapes come from the loaded base model, the same views the
 * adapter loader checks against. */
static devio_status mk_adapter_list(const devio_mkmodel_adapter_opts *o, mk_list *L,
                                    devio_error *err)
{
    L->t = NULL;
    L->n = 0;
    devio_status st = mk_adapter_check(o, err);
    if (st != DEVIO_OK)
        return st;
    devio_model *m = NULL;
    if ((st = devio_model_load(o->model_dir, &m, err)) != DEVIO_OK)
        return st;
    size_t n_targets = 0;
    for (int t = 0; t < DEVIO_LORA_N_TARGETS; t++)
        n_targets += (o->targets >> t) & 1u;
    size_t n = (size_t)m->cfg.n_layers * n_targets * 2;
    L->t = calloc(n, sizeof *L->t);
    if (!L->t) {
        mk_err(err, DEVIO_E_NOMEM, "out of memory for %zu tensor entries", n);
        devio_model_free(m);
        return DEVIO_E_NOMEM;
    }
    const float b_scale = 0.5f * mk_inv_sqrt(o->rank);
    char name[MK_NAME_MAX];
    for (uint32_t i = 0; i < m->cfg.n_layers; i++) {
        for (int t = 0; t < DEVIO_LORA_N_TARGETS; t++) {
            if (!((o->targets >> t) & 1u))
                continue;
            uint64_t out_dim, in_dim;
            devio_lora_target_dims(m, i, (devio_lora_target)t, &out_dim, &in_dim);
            mk_adapter_name(name, sizeof name, i, (devio_lora_target)t, 'A');
            mk_add(L, name, 2, o->rank, in_dim, MK_INIT_LINEAR, mk_inv_sqrt(in_dim));
            mk_adapter_name(name, sizeof name, i, (devio_lora_target)t, 'B');
            mk_add(L, name, 2, out_dim, o->rank, MK_INIT_LINEAR, b_scale);
        }
    }
    devio_model_free(m);
    qsort(L->t, L->n, sizeof *L->t, mk_cmp);
    const uint64_t es = mk_dtype_size(o->dtype);
    uint64_t at = 0;
    for (size_t i = 0; i < L->n; i++) {
        L->t[i].shard = 0;
        L->t[i].offset = at;
        at += L->t[i].nelem * es;
    }
    return DEVIO_OK;
}

/* A JSON string literal for arbitrary bytes of a path. */
static void mk_json_string(mk_buf *b, const char *s)
{
    buf_printf(b, "\"");
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            buf_printf(b, "\\%c", *p);
        else if (*p < 0x20)
            buf_printf(b, "\\u%04x", *p);
        else
            buf_printf(b, "%c", *p);
    }
    buf_printf(b, "\"");
}

/* PEFT's save_pretrained layout: sorted keys, two-space indent. */
static void mk_adapter_config(const devio_mkmodel_adapter_opts *o, mk_buf *b)
{
    /* target_modules sorted by name, as a set printed by PEFT would be. */
    static const devio_lora_target by_name[DEVIO_LORA_N_TARGETS] = {
        DEVIO_LORA_DOWN, DEVIO_LORA_GATE, DEVIO_LORA_K, DEVIO_LORA_O,
        DEVIO_LORA_Q,    DEVIO_LORA_UP,   DEVIO_LORA_V,
    };
    buf_printf(b, "{\n  \"base_model_name_or_path\": ");
    mk_json_string(b, o->model_dir);
    buf_printf(b, ",\n  \"bias\": \"none\",\n");
    buf_printf(b, "  \"fan_in_fan_out\": false,\n");
    buf_printf(b, "  \"inference_mode\": true,\n");
    if (o->alpha < 1e15 && (double)(long long)o->alpha == o->alpha)
        buf_printf(b, "  \"lora_alpha\": %lld,\n", (long long)o->alpha); /* PEFT's int */
    else {
        buf_printf(b, "  \"lora_alpha\": ");
        mk_json_double(b, o->alpha);
        buf_printf(b, ",\n");
    }
    buf_printf(b, "  \"lora_dropout\": 0.0,\n");
    buf_printf(b, "  \"peft_type\": \"LORA\",\n");
    buf_printf(b, "  \"r\": %u,\n", o->rank);
    buf_printf(b, "  \"target_modules\": [");
    bool first = true;
    for (int i = 0; i < DEVIO_LORA_N_TARGETS; i++) {
        if (!((o->targets >> by_name[i]) & 1u))
            continue;
        buf_printf(b, "%s\n    \"%s\"", first ? "" : ",", devio_lora_target_name(by_name[i]));
        first = false;
    }
    buf_printf(b, "\n  ],\n");
    buf_printf(b, "  \"task_type\": \"CAUSAL_LM\",\n");
    buf_printf(b, "  \"use_rslora\": %s\n}\n", o->use_rslora ? "true" : "false");
}

devio_status devio_mkmodel_write_adapter(const devio_mkmodel_adapter_opts *o, devio_error *err)
{
    if (!o->out_dir || !o->out_dir[0]) {
        mk_err(err, DEVIO_E_INVALID, "no output directory given");
        return DEVIO_E_INVALID;
    }
    /* Options and the base model are checked before the file system is touched. */
    mk_list L = {0};
    devio_status st = mk_adapter_list(o, &L, err);
    if (st != DEVIO_OK)
        return st;
    mk_buf cb = {0};
    float *fbuf = malloc(MK_CHUNK * sizeof *fbuf);
    uint8_t *obuf = malloc(MK_CHUNK * sizeof(float));
    if (!fbuf || !obuf) {
        mk_err(err, DEVIO_E_NOMEM, "out of memory");
        st = DEVIO_E_NOMEM;
        goto out;
    }
    if ((st = mk_mkdirs(o->out_dir, err)) != DEVIO_OK)
        goto out;
    if ((st = mk_write_st(o->out_dir, "adapter_model.safetensors", &L, 0, o->dtype, o->seed,
                          fbuf, obuf, err)) != DEVIO_OK)
        goto out;
    /* The config last, as for models: a directory with a config is complete. */
    mk_adapter_config(o, &cb);
    if (cb.oom) {
        mk_err(err, DEVIO_E_NOMEM, "out of memory");
        st = DEVIO_E_NOMEM;
        goto out;
    }
    st = mk_write_small(o->out_dir, "adapter_config.json", cb.s, cb.len, err);
out:
    free(cb.s);
    free(fbuf);
    free(obuf);
    free(L.t);
    return st;
}

devio_status devio_mkmodel_adapter_values(const devio_mkmodel_adapter_opts *o, const char *name,
                                          uint64_t start, size_t n, float *dst,
                                          devio_error *err)
{
    mk_list L;
    devio_status st = mk_adapter_list(o, &L, err);
    if (st != DEVIO_OK)
        return st;
    st = mk_list_values(&L, o->seed, name, start, n, dst, "adapter", err);
    free(L.t);
    return st;
}
