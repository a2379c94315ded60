/* model.c - loads a Hugging Face model directory (config.json + safetensors) into devio_model (config fields: model_config.c).
 * It never computes with the weights and never accepts a tensor whose dtype, shape or range is wrong. */
#include "device/model/model.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "common/path.h"
#include "device/model/model_config.h"
#include "device/model/model_load.h"
#include "device/numerics/numerics.h"
#include "device/numerics/quant.h"
#include "device/model/safetensors.h"
#include "device/status.h"

#define SINGLE_NAME "model.safetensors"
#define INDEX_NAME "model.safetensors.index.json"

/* Everything the model owns besides its tensor views. */
typedef struct model_priv {
    devio_st_file **files; /* weight files, read into memory for the model's life */
    size_t n_files, cap_files;
    struct owned_copy {
        void *p;
        size_t n;
    } *owned; /* aligned copies of tensors stored at unaligned offsets (devio_st_pages) */
    size_t n_owned, cap_owned;
    devio_gguf_file *gguf; /* a GGUF model's file, read into memory for the model's life */
    bool released;         /* devio_model_release_weights */
} model_priv;

/* Load-time state: where each tensor lives. */
typedef struct loader {
    const char *dir;
    model_priv *priv;
    bool sharded;
    bool scan;          /* refuse NaN and infinities in every tensor used */
    json_t *weight_map; /* sharded: tensor name -> shard file name */
    const devio_model_config *cfg; /* a GGUF model: its tensors come from priv->gguf */
    bool *gguf_used;               /* a GGUF model: which of its tensors were loaded */
} loader;

/* ---- files ---- */

/* ---- tensors ---- */

static devio_status priv_add_file(model_priv *p, devio_st_file *f, devio_error *err)
{
    if (p->n_files == p->cap_files) {
        size_t cap = p->cap_files ? p->cap_files * 2 : 4;
        devio_st_file **nf = realloc(p->files, cap * sizeof *nf);
        if (!nf)
            return devio_fail(err, DEVIO_E_NOMEM, "out of memory opening %s", devio_st_label(f));
        p->files = nf;
        p->cap_files = cap;
    }
    p->files[p->n_files++] = f;
    return DEVIO_OK;
}

/* Returns the open file called `name` (a file in the model directory),
 * opening it on first use; `wanted` is named in file-level errors. */
static devio_status loader_file(loader *L, const char *name, const char *wanted,
                                devio_st_file **out, devio_error *err)
{
    for (size_t i = 0; i < L->priv->n_files; i++) {
        if (strcmp(devio_st_label(L->priv->files[i]), name) == 0) {
            *out = L->priv->files[i];
            return DEVIO_OK;
        }
    }
    char *path = devio_path_join(L->dir, name);
    if (!path)
        return devio_fail(err, DEVIO_E_NOMEM, "out of memory opening %s", name);
    devio_st_file *f;
    devio_status st = devio_st_open(path, name, wanted, &f, err);
    free(path);
    if (st != DEVIO_OK)
        return st;
    if ((st = priv_add_file(L->priv, f, err)) != DEVIO_OK) {
        devio_st_close(f);
        return st;
    }
    *out = f;
    return DEVIO_OK;
}

/* A shard name must be a plain file inside the model directory. */
static bool shard_name_ok(const char *s)
{
    return s[0] != '\0' && strcmp(s, ".") != 0 && strcmp(s, "..") != 0 && !strchr(s, '/') &&
           !strchr(s, '\\');
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Opens every shard the index names and checks each mapped tensor is in its
 * shard, so that a broken index fails at load, whichever tensors we use. */
static devio_status loader_check_index(loader *L, devio_error *err)
{
    size_t n = json_object_size(L->weight_map);
    const char **keys = malloc((n ? n : 1) * sizeof *keys);
    if (!keys)
        return devio_fail(err, DEVIO_E_NOMEM, INDEX_NAME ": out of memory");
    size_t k = 0;
    const char *key;
    json_t *val;
    json_object_foreach(L->weight_map, key, val)
    {
        keys[k++] = key;
    }
    /* Sorted, so the first error reported does not depend on hash order. */
    qsort(keys, n, sizeof *keys, cmp_str);
    devio_status st = DEVIO_OK;
    for (size_t i = 0; i < n; i++) {
        const char *shard = json_string_value(json_object_get(L->weight_map, keys[i]));
        if (!shard || !shard_name_ok(shard)) {
            devio_fail(err, DEVIO_E_MODEL,
                       INDEX_NAME ": tensor '%.80s' maps to '%.60s', not a file name in the "
                                  "model directory",
                       keys[i], shard ? shard : "(not a string)");
            st = DEVIO_E_MODEL;
            break;
        }
        devio_st_file *f;
        if ((st = loader_file(L, shard, keys[i], &f, err)) != DEVIO_OK)
            break;
        if (!devio_st_find(f, keys[i])) {
            devio_fail(err, DEVIO_E_MODEL,
                       INDEX_NAME ": tensor '%.80s' is mapped to '%.60s', which does not contain it",
                       keys[i], shard);
            st = DEVIO_E_MODEL;
            break;
        }
    }
    free(keys);
    return st;
}

static devio_status priv_own(model_priv *p, void *buf, size_t n, devio_error *err)
{
    if (p->n_owned == p->cap_owned) {
        size_t cap = p->cap_owned ? p->cap_owned * 2 : 8;
        struct owned_copy *no = realloc(p->owned, cap * sizeof *no);
        if (!no)
            return devio_fail(err, DEVIO_E_NOMEM, "out of memory copying tensors");
        p->owned = no;
        p->cap_owned = cap;
    }
    p->owned[p->n_owned++] = (struct owned_copy){buf, n};
    return DEVIO_OK;
}

/* Fetches `name` and checks it is [s0] (ndim 1), [s0, s1] (ndim 2) or
 * [s0, 1, s1] (ndim 3, a depthwise conv1d weight, held as [s0, s1]).
 * Absent and not required: out->data = NULL and DEVIO_OK. */
static devio_status loader_tensor(loader *L, const char *name, bool required, uint32_t ndim,
                                  uint64_t s0, uint64_t s1, devio_tensor *out, devio_error *err)
{
    memset(out, 0, sizeof *out);
    devio_status st;
    if (L->priv->gguf) {
        void *copy;
        size_t n;
        st = devio_gguf_model_tensor(L->priv->gguf, L->cfg, name, required, ndim == 3 ? 2 : ndim,
                                     s0, s1, L->scan, L->gguf_used, out, &copy, &n, err);
        if (st == DEVIO_OK && copy && (st = priv_own(L->priv, copy, n, err)) != DEVIO_OK)
            devio_st_pages_free(copy, n);
        return st;
    }
    const char *fname = SINGLE_NAME;
    if (L->sharded) {
        const json_t *v = json_object_get(L->weight_map, name);
        if (!v) {
            if (!required)
                return DEVIO_OK;
            return devio_fail(err, DEVIO_E_MODEL,
                              INDEX_NAME ": tensor '%.80s' is missing from weight_map", name);
        }
        fname = json_string_value(v); /* checked by loader_check_index */
    }
    devio_st_file *f;
    st = loader_file(L, fname, name, &f, err);
    if (st != DEVIO_OK)
        return st;
    const devio_st_tensor *t = devio_st_find(f, name);
    if (!t) {
        if (!required)
            return DEVIO_OK;
        return devio_fail(err, DEVIO_E_MODEL, "%.100s: tensor '%.80s' is missing", fname, name);
    }
    devio_st_want want = {.ndim = ndim, .s0 = s0, .s1 = s1, .refuse = DEVIO_E_MODEL,
                          .scan = L->scan};
    void *copy;
    st = devio_st_view(f, t, fname, &want, out, &copy, err);
    if (st == DEVIO_OK && copy &&
        (st = priv_own(L->priv, copy, (size_t)t->nbytes, err)) != DEVIO_OK) {
        devio_st_pages_free(copy, (size_t)t->nbytes);
        memset(out, 0, sizeof *out);
    }
    return st;
}

/* One tensor of a layer: the name after the layer's prefix, where it goes,
 * its shape (see loader_tensor) and whether it may be absent. */
typedef struct part {
    const char *suffix;
    devio_tensor *dst;
    uint32_t ndim;
    uint64_t s0, s1;
    bool optional;
} part;

static devio_status load_parts(loader *L, const char *prefix, uint32_t li, const part *parts,
                               size_t n, devio_error *err)
{
    char name[160];
    for (size_t i = 0; i < n; i++) {
        if (!parts[i].dst)
            continue; /* a part this model does not have */
        snprintf(name, sizeof name, "%s%u.%s", prefix, li, parts[i].suffix);
        devio_status st = loader_tensor(L, name, !parts[i].optional, parts[i].ndim, parts[i].s0,
                                        parts[i].s1, parts[i].dst, err);
        if (st != DEVIO_OK)
            return st;
    }
    return DEVIO_OK;
}

/* The attention half of a layer (q, k, v, o and the optional biases). */
static devio_status load_attention(loader *L, const char *prefix, const devio_model_config *c,
                                   uint32_t li, devio_layer *ly, devio_error *err)
{
    const uint64_t d = c->hidden_size, q = (uint64_t)c->n_heads * c->head_dim,
                   kv = (uint64_t)c->n_kv_heads * c->head_dim;
    bool b = c->attention_bias;
    const part parts[] = {
        {"self_attn.q_proj.weight", &ly->wq, 2, q, d, false},
        {"self_attn.k_proj.weight", &ly->wk, 2, kv, d, false},
        {"self_attn.v_proj.weight", &ly->wv, 2, kv, d, false},
        {"self_attn.o_proj.weight", &ly->wo, 2, d, q, false},
        {"self_attn.q_proj.bias", b ? &ly->bq : NULL, 1, q, 0, false},
        {"self_attn.k_proj.bias", b ? &ly->bk : NULL, 1, kv, 0, false},
        {"self_attn.v_proj.bias", b ? &ly->bv : NULL, 1, kv, 0, false},
        {"self_attn.q_norm.weight", c->qk_norm ? &ly->q_norm : NULL, 1, c->head_dim, 0, false},
        {"self_attn.k_norm.weight", c->qk_norm ? &ly->k_norm : NULL, 1, c->head_dim, 0, false},
    };
    return load_parts(L, prefix, li, parts, sizeof parts / sizeof *parts, err);
}

/* A Mamba-2 mixer under `mod` ("mamba." for Bamba, "mixer." for Mamba2). */
static devio_status load_mixer(loader *L, const char *prefix, const char *mod,
                               const devio_model_config *c, uint32_t li, devio_mixer *mx,
                               devio_error *err)
{
    const devio_ssm_config *s = &c->ssm;
    const uint64_t d = c->hidden_size, H = s->n_heads, I = H * s->head_dim,
                   conv = I + 2ull * s->n_groups * s->d_state, in = I + conv + H;
    const struct {
        const char *name;
        devio_tensor *dst;
        uint32_t ndim;
        uint64_t s0, s1;
        bool present;
    } t[] = {
        {"in_proj.weight", &mx->in_proj, 2, in, d, true},
        {"in_proj.bias", &mx->in_bias, 1, in, 0, s->proj_bias},
        {"conv1d.weight", &mx->conv_w, 3, conv, s->d_conv, true},
        {"conv1d.bias", &mx->conv_b, 1, conv, 0, s->conv_bias},
        {"dt_bias", &mx->dt_bias, 1, H, 0, true},
        {"A_log", &mx->a_log, 1, H, 0, true},
        {"D", &mx->d_skip, 1, H, 0, true},
        {"norm.weight", &mx->norm, 1, I, 0, true},
        {"out_proj.weight", &mx->out_proj, 2, d, I, true},
        {"out_proj.bias", &mx->out_bias, 1, d, 0, s->proj_bias},
    };
    char suffix[10][48];
    part parts[10];
    for (size_t i = 0; i < 10; i++) {
        snprintf(suffix[i], sizeof suffix[i], "%s%s", mod, t[i].name);
        parts[i] = (part){suffix[i], t[i].present ? t[i].dst : NULL, t[i].ndim, t[i].s0,
                          t[i].s1, false};
    }
    return load_parts(L, prefix, li, parts, 10, err);
}

/* The MLP half of a layer: its norm and gate, up, down under `mlp`. */
static devio_status load_mlp(loader *L, const char *prefix, const char *norm, const char *mlp,
                             const devio_model_config *c, uint32_t li, devio_layer *ly,
                             devio_error *err)
{
    const uint64_t d = c->hidden_size, f = c->intermediate_size;
    char n[64], g[64], u[64], dn[64];
    snprintf(n, sizeof n, "%s.weight", norm);
    snprintf(g, sizeof g, "%s.gate_proj.weight", mlp);
    snprintf(u, sizeof u, "%s.up_proj.weight", mlp);
    snprintf(dn, sizeof dn, "%s.down_proj.weight", mlp);
    const part parts[] = {
        {n, &ly->ffn_norm, 1, d, 0, false},
        {g, &ly->w_gate, 2, f, d, false},
        {u, &ly->w_up, 2, f, d, false},
        {dn, &ly->w_down, 2, d, f, false},
    };
    return load_parts(L, prefix, li, parts, sizeof parts / sizeof *parts, err);
}

static devio_status load_layer(loader *L, const devio_model_config *c, uint32_t li,
                               devio_layer *ly, devio_error *err)
{
    memset(ly, 0, sizeof *ly);
    const uint64_t d = c->hidden_size;
    bool mamba2 = c->arch == DEVIO_ARCH_MAMBA2;
    const char *prefix = mamba2 ? "backbone.layers." : "model.layers.";
    const part norm = {mamba2 ? "norm.weight" : "input_layernorm.weight", &ly->attn_norm, 1, d, 0,
                       false};
    devio_status st = load_parts(L, prefix, li, &norm, 1, err);
    if (st != DEVIO_OK)
        return st;
    ly->kind = devio_config_layer_is_attn(c, li) ? DEVIO_LAYER_ATTENTION : DEVIO_LAYER_MIXER;
    if (ly->kind == DEVIO_LAYER_ATTENTION)
        st = load_attention(L, prefix, c, li, ly, err);
    else
        st = load_mixer(L, prefix, mamba2 ? "mixer." : "mamba.", c, li, &ly->mixer, err);
    if (st != DEVIO_OK || mamba2)
        return st;
    if (c->arch == DEVIO_ARCH_BAMBA)
        return load_mlp(L, prefix, "pre_ff_layernorm", "feed_forward", c, li, ly, err);
    return load_mlp(L, prefix, "post_attention_layernorm", "mlp", c, li, ly, err);
}

static bool host_is_little_endian(void)
{
    const uint16_t one = 1;
    uint8_t b;
    memcpy(&b, &one, 1);
    return b == 1;
}

/* Existence only: a file that exists but cannot be read must fail later
 * with its own error, not look absent. */
static devio_status file_exists(const char *dir, const char *name, bool *yes, devio_error *err)
{
    char *path = devio_path_join(dir, name);
    if (!path)
        return devio_fail(err, DEVIO_E_NOMEM, "out of memory");
    struct stat sb;
    /* Only "no such file" is absent; any other failure of stat leaves the
     * file to the open that follows, which names the error. */
    *yes = stat(path, &sb) == 0 || (errno != ENOENT && errno != ENOTDIR);
    free(path);
    return DEVIO_OK;
}

/* The config of `dir`: its config.json, or, for a GGUF file, the file
 * (*gguf, the caller's) and its metadata as that config. */
static devio_status open_config(const char *dir, devio_gguf_file **gguf, json_t **cfg,
                                devio_error *err)
{
    if (!devio_model_path_is_gguf(dir))
        return devio_model_load_json(dir, DEVIO_MODEL_CONFIG_NAME, cfg, err);
    const char *base = strrchr(dir, '/');
    devio_status st = devio_gguf_open(dir, base ? base + 1 : dir, gguf, err);
    if (st == DEVIO_OK && (st = devio_gguf_model_config(*gguf, cfg, err)) != DEVIO_OK) {
        devio_gguf_close(*gguf);
        *gguf = NULL;
    }
    return st;
}

/* Every tensor m's config names into m: the embedding, each layer, the
 * final norm and lm_head (the embedding when tied); then, for a GGUF file,
 * every tensor of the file used or refused. */
static devio_status load_tensors(loader *L, devio_model *m, devio_error *err)
{
    const devio_model_config *c = &m->cfg;
    devio_status st;
    const uint64_t V = c->vocab_size, d = c->hidden_size;
    bool mamba2 = c->arch == DEVIO_ARCH_MAMBA2;
    /* Mamba2 checkpoints name the embedding backbone.embeddings (older
     * ones backbone.embedding). */
    const char *embed = mamba2 ? "backbone.embeddings.weight" : "model.embed_tokens.weight";
    if ((st = loader_tensor(L, embed, !mamba2, 2, V, d, &m->embed, err)))
        return st;
    if (mamba2 && !m->embed.data &&
        (st = loader_tensor(L, "backbone.embedding.weight", true, 2, V, d, &m->embed, err)))
        return st;
    for (uint32_t i = 0; i < c->n_layers; i++)
        if ((st = load_layer(L, c, i, &m->layers[i], err)) != DEVIO_OK)
            return st;
    const char *norm = mamba2                          ? "backbone.norm_f.weight"
                       : c->arch == DEVIO_ARCH_BAMBA ? "model.final_layernorm.weight"
                                                     : "model.norm.weight";
    if ((st = loader_tensor(L, norm, true, 1, d, 0, &m->norm, err)))
        return st;
    if (c->tie_word_embeddings) {
        /* transformers ties lm_head to the embedding even when the file
         * stores a copy, so the copy is never read. */
        m->lm_head = m->embed;
    } else {
        if ((st = loader_tensor(L, "lm_head.weight", false, 2, V, d, &m->lm_head, err)))
            return st;
        if (!m->lm_head.data)
            return devio_fail(err, DEVIO_E_MODEL,
                              "%s: tensor 'lm_head.weight' is missing and "
                              DEVIO_MODEL_CONFIG_NAME " has tie_word_embeddings false",
                              L->sharded ? INDEX_NAME : SINGLE_NAME);
    }
    /* Every tensor of a GGUF file used or refused: one devio would not
     * compute with would make the file serve another model than it holds. */
    if (L->priv->gguf)
        return devio_gguf_model_unused(L->priv->gguf, c, L->gguf_used, err);
    return DEVIO_OK;
}

devio_model_params devio_model_params_default(void)
{
    return (devio_model_params){.skip_weight_scan = false};
}

devio_status devio_model_load(const char *dir, devio_model **out, devio_error *err)
{
    return devio_model_load_with(dir, NULL, out, err);
}

devio_status devio_model_load_with(const char *dir, const devio_model_params *p,
                                   devio_model **out, devio_error *err)
{
    *out = NULL;
    const devio_model_params defaults = devio_model_params_default();
    if (!p)
        p = &defaults;
    if (!host_is_little_endian()) {
        devio_fail(err, DEVIO_E_UNSUPPORTED, "safetensors data is little-endian; this host is not");
        return DEVIO_E_UNSUPPORTED;
    }
    json_t *cfg_json = NULL, *index = NULL;
    devio_gguf_file *gguf = NULL;
    bool *gguf_used = NULL; /* load-time only: which of a GGUF file's tensors were used */
    devio_status st = open_config(dir, &gguf, &cfg_json, err);
    if (st != DEVIO_OK)
        return st;

    devio_model *m = calloc(1, sizeof *m);
    model_priv *priv = calloc(1, sizeof *priv);
    if (!m || !priv) {
        free(m);
        free(priv);
        devio_gguf_close(gguf);
        devio_fail(err, DEVIO_E_NOMEM, "out of memory loading the model");
        st = DEVIO_E_NOMEM;
        goto out_json;
    }
    m->priv = priv;
    priv->gguf = gguf;
    if ((st = devio_model_config_parse(cfg_json, &m->cfg, err)) != DEVIO_OK) {
        if (gguf) /* the config was made from the file's metadata */
            devio_error_prefix(err, "%.100s, its metadata read as ", devio_gguf_label(gguf));
        goto out_model;
    }
    const devio_model_config *c = &m->cfg;
    if ((st = gguf ? devio_gguf_model_text(gguf, c->vocab_size, &m->text, err)
                   : devio_model_text_from_dir(dir, cfg_json, c->vocab_size, &m->text, err)))
        goto out_model;
    if (gguf && !(gguf_used = calloc(devio_gguf_tensor_count(gguf) + 1, sizeof *gguf_used))) {
        devio_fail(err, DEVIO_E_NOMEM, "out of memory loading the model");
        st = DEVIO_E_NOMEM;
        goto out_model;
    }
    m->layers = calloc(c->n_layers, sizeof *m->layers);
    if (!m->layers) {
        devio_fail(err, DEVIO_E_NOMEM, "out of memory for %u layers", c->n_layers);
        st = DEVIO_E_NOMEM;
        goto out_model;
    }

    loader L = {.dir = dir, .priv = priv, .scan = !p->skip_weight_scan, .cfg = c,
                .gguf_used = gguf_used};
    bool single = gguf != NULL, sharded = false;
    if (!gguf && ((st = file_exists(dir, SINGLE_NAME, &single, err)) ||
                  (st = file_exists(dir, INDEX_NAME, &sharded, err))))
        goto out_model;
    if (!single && sharded) {
        if ((st = devio_model_load_json(dir, INDEX_NAME, &index, err)) != DEVIO_OK)
            goto out_model;
        L.weight_map = json_object_get(index, "weight_map");
        if (!json_is_object(L.weight_map)) {
            devio_fail(err, DEVIO_E_MODEL, INDEX_NAME ": 'weight_map' is missing or not an object");
            st = DEVIO_E_MODEL;
            goto out_model;
        }
        L.sharded = true;
        if ((st = loader_check_index(&L, err)) != DEVIO_OK)
            goto out_model;
    } else if (!single) {
        devio_fail(err, DEVIO_E_MODEL,
                   "model directory '%.120s' has neither " SINGLE_NAME " nor " INDEX_NAME, dir);
        st = DEVIO_E_MODEL;
        goto out_model;
    }

    if ((st = load_tensors(&L, m, err)) != DEVIO_OK)
        goto out_model;
    free(gguf_used);
    json_decref(index);
    json_decref(cfg_json);
    *out = m;
    return DEVIO_OK;

out_model:
    devio_model_free(m);
out_json:
    free(gguf_used);
    json_decref(index);
    json_decref(cfg_json);
    return st;
}

void devio_model_free(devio_model *m)
{
    if (!m)
        return;
    model_priv *p = m->priv;
    if (p) {
        for (size_t i = 0; i < p->n_files; i++)
            devio_st_close(p->files[i]);
        free(p->files);
        devio_gguf_close(p->gguf);
        for (size_t i = 0; i < p->n_owned; i++)
            devio_st_pages_free(p->owned[i].p, p->owned[i].n);
        free(p->owned);
        free(p);
    }
    free(m->text.chat_template);
    free(m->layers);
    free(m);
}

uint64_t devio_kv_block_bytes(const devio_model_config *c, uint32_t block_size, bool fast)
{
    uint64_t layers = 0;
    for (uint32_t i = 0; i < c->n_layers; i++)
        layers += devio_config_layer_is_attn(c, i) ? 1u : 0u;
    uint64_t elem = fast ? sizeof(uint16_t) : sizeof(float);
    return layers * c->n_kv_heads * c->head_dim * 2u * elem * block_size;
}

static uint32_t dtype_bit(const devio_tensor *t)
{
    return t->data ? 1u << t->dtype : 0u;
}

uint32_t devio_model_dtypes(const devio_model *m)
{
    uint32_t bits = dtype_bit(&m->embed) | dtype_bit(&m->lm_head) | dtype_bit(&m->norm);
    for (uint32_t i = 0; i < m->cfg.n_layers; i++) {
        const devio_layer *l = &m->layers[i];
        const devio_tensor *ts[] = {&l->attn_norm, &l->wq,     &l->wk,     &l->wv,
                                    &l->wo,        &l->ffn_norm, &l->w_gate, &l->w_up,
                                    &l->w_down,    &l->mixer.in_proj, &l->mixer.out_proj};
        for (size_t k = 0; k < sizeof ts / sizeof *ts; k++)
            bits |= dtype_bit(ts[k]);
    }
    return bits;
}

void devio_model_release_weights(devio_model *m)
{
    model_priv *p = m ? m->priv : NULL;
    if (!p || p->released)
        return;
    for (size_t i = 0; i < p->n_files; i++)
        devio_st_release(p->files[i]);
    devio_gguf_release(p->gguf);
    for (size_t i = 0; i < p->n_owned; i++)
        devio_st_pages_release(p->owned[i].p, p->owned[i].n);
    p->released = true;
}

bool devio_model_weights_released(const devio_model *m)
{
    return m && m->priv && ((const model_priv *)m->priv)->released;
}
