/* gguf_fixture.c - see gguf_fixture.h. */
#include "tests/gguf_fixture.h"

#include <stdarg.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/testutil.h"

void gb_put(gbuf *b, const void *src, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        assert_non_null(b->p);
    }
    if (n)
        memcpy(b->p + b->n, src, n);
    b->n += n;
}

void gb_u(gbuf *b, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++) {
        uint8_t c = i < 8 ? (uint8_t)(v >> (8 * i)) : 0;
        gb_put(b, &c, 1);
    }
}

void gb_str(gbuf *b, const char *s)
{
    gb_u(b, strlen(s), 8);
    gb_put(b, s, strlen(s));
}

void gb_kv_u32(gbuf *b, const char *key, uint32_t v)
{
    gb_str(b, key);
    gb_u(b, DEVIO_GGUF_U32, 4);
    gb_u(b, v, 4);
}

void gb_kv_f32(gbuf *b, const char *key, float v)
{
    gb_str(b, key);
    gb_u(b, DEVIO_GGUF_F32, 4);
    gb_put(b, &v, 4);
}

void gb_kv_str(gbuf *b, const char *key, const char *v)
{
    gb_str(b, key);
    gb_u(b, DEVIO_GGUF_STRING, 4);
    gb_str(b, v);
}

void gb_pad(gbuf *b, size_t align)
{
    while (b->n % align)
        gb_u(b, 0, 1);
}

void gb_tensor(gbuf *b, const gtinfo *t)
{
    gb_str(b, t->name);
    gb_u(b, t->ndim, 4);
    for (uint32_t d = 0; d < t->ndim; d++)
        gb_u(b, d < 4 ? t->ne[d] : 1, 8);
    gb_u(b, t->type, 4);
    gb_u(b, t->offset, 8);
}

/* ---- a model ------------------------------------------------------------ */

#define MAX_T 512

typedef struct wt {
    char name[64];
    const devio_tensor *t;
    bool interleave; /* q or k of a llama model: heads' rows interleaved */
} wt;

static void add(wt *ts, int *n, const devio_tensor *t, bool il, const char *fmt, uint32_t li)
{
    if (!t->data)
        return;
    assert_true(*n < MAX_T);
    snprintf(ts[*n].name, sizeof ts[*n].name, fmt, li);
    ts[*n].t = t;
    ts[*n].interleave = il;
    (*n)++;
}

/* The type t is written as: a vector as F32, a matrix as its own. */
static uint32_t ggml_type(const devio_tensor *t)
{
    devio_dtype dt = t->ndim > 1 ? t->dtype : DEVIO_F32;
    return dt == DEVIO_F32 ? DEVIO_GGML_F32 : dt == DEVIO_F16 ? DEVIO_GGML_F16 : DEVIO_GGML_BF16;
}

static uint64_t tensor_bytes(const devio_tensor *t)
{
    uint64_t n = t->shape[0] * (t->ndim > 1 ? t->shape[1] : 1);
    return n * (t->ndim > 1 ? devio_dtype_size(t->dtype) : sizeof(float));
}

/* A float or unsigned metadata entry: its key (without the ARCH. prefix
 * unless it starts with "tokenizer.") and value. */
typedef struct kv_num {
    const char *k;
    bool is_f32;
    uint32_t u;
    float f;
} kv_num;

#define MAX_KV 32

/* The model's numeric entries, then e's f32_key and u32_key over them (or
 * added), into kv; their count. */
static size_t numeric_kvs(const devio_model_config *c, const gguf_edits *e, bool granite,
                          kv_num *kv)
{
    const devio_rope_scaling *rs = &c->rope_scaling;
    bool linear = rs->type == DEVIO_ROPE_LINEAR, yarn = rs->type == DEVIO_ROPE_YARN;
    size_t n = 0;
#define U(key, v) (kv[n++] = (kv_num){.k = key, .u = (v)})
#define F(key, v) (kv[n++] = (kv_num){.k = key, .is_f32 = true, .f = (v)})
    U("block_count", c->n_layers);
    U("embedding_length", c->hidden_size);
    U("feed_forward_length", c->intermediate_size);
    U("attention.head_count", e && e->heads ? e->heads : c->n_heads);
    U("attention.head_count_kv", c->n_kv_heads);
    U("attention.key_length", c->head_dim);
    U("attention.value_length", c->head_dim);
    U("context_length", c->max_position_embeddings);
    U("rope.dimension_count", c->rotary_dim);
    F("rope.freq_base", c->rope_theta);
    F("attention.layer_norm_rms_epsilon", c->rms_norm_eps);
    if (linear || yarn) /* as llama.cpp's converter writes them; the type is a string */
        F("rope.scaling.factor", rs->factor);
    if (yarn) {
        U("rope.scaling.original_context_length", (uint32_t)rs->original_max_positions);
        F("rope.scaling.yarn_beta_fast", rs->beta_fast);
        F("rope.scaling.yarn_beta_slow", rs->beta_slow);
    }
    if (granite) {
        F("embedding_scale", c->embedding_multiplier);
        F("residual_scale", c->residual_multiplier);
        F("attention.scale", c->attention_multiplier);
        F("logit_scale", c->logits_scaling);
    }
#undef U
#undef F
    const char *keys[2] = {e ? e->f32_key : NULL, e ? e->u32_key : NULL};
    for (int j = 0; j < 2; j++) {
        if (!keys[j])
            continue;
        size_t i = 0;
        while (i < n && strcmp(kv[i].k, keys[j]) != 0)
            i++;
        n += i == n;
        kv[i] = (kv_num){.k = keys[j], .is_f32 = j == 0, .f = e->f32_val, .u = e->u32_val};
    }
    assert_true(n <= MAX_KV);
    return n;
}

/* The header and the metadata of gguf_write_model: n tensors follow. */
static void put_meta(gbuf *b, const devio_model_config *c, const gguf_edits *e, const char *arch,
                     bool granite, int n)
{
    char key[128];
#define KEY(k) (snprintf(key, sizeof key, strncmp(k, "tokenizer.", 10) ? "%s.%s" : "%.0s%s", \
                         arch, k),                                                          \
                key)
    kv_num kv[MAX_KV];
    size_t n_num = numeric_kvs(c, e, granite, kv), n_kv = 1 + (e && e->n_tokens ? 1 : 0);
    const devio_rope_scaling *rs = &c->rope_scaling;
    bool scaled = rs->type == DEVIO_ROPE_LINEAR || rs->type == DEVIO_ROPE_YARN;
    n_kv += scaled + (e && e->extra_key ? 1 : 0);
    for (size_t i = 0; i < n_num; i++)
        n_kv += !e || !e->drop_key || strcmp(e->drop_key, kv[i].k) != 0;
    gb_put(b, "GGUF", 4);
    gb_u(b, 3, 4);
    gb_u(b, (uint64_t)n, 8);
    gb_u(b, n_kv, 8);
    gb_kv_str(b, "general.architecture", arch);
    for (size_t i = 0; i < n_num; i++) {
        if (e && e->drop_key && strcmp(e->drop_key, kv[i].k) == 0)
            continue;
        if (kv[i].is_f32)
            gb_kv_f32(b, KEY(kv[i].k), kv[i].f);
        else
            gb_kv_u32(b, KEY(kv[i].k), kv[i].u);
    }
    if (scaled)
        gb_kv_str(b, KEY("rope.scaling.type"), rs->type == DEVIO_ROPE_YARN ? "yarn" : "linear");
    if (e && e->extra_key)
        gb_kv_str(b, KEY(e->extra_key), e->extra_val);
    if (e && e->n_tokens) { /* an array of strings "t0", "t1", ... */
        gb_str(b, "tokenizer.ggml.tokens");
        gb_u(b, DEVIO_GGUF_ARRAY, 4);
        gb_u(b, DEVIO_GGUF_STRING, 4);
        gb_u(b, e->n_tokens, 8);
        for (uint32_t i = 0; i < e->n_tokens; i++) {
            char tok[16];
            snprintf(tok, sizeof tok, "t%u", i);
            gb_str(b, tok);
        }
    }
#undef KEY
}

void gguf_write_model(const devio_model *m, const gguf_edits *e, const char *path)
{
    const devio_model_config *c = &m->cfg;
    bool granite = strcmp(c->architecture, "GraniteForCausalLM") == 0;
    /* llama.cpp's converter interleaves q and k of llama and granite alike. */
    bool llama = granite || strcmp(c->architecture, "LlamaForCausalLM") == 0;
    const char *arch = e && e->arch ? e->arch
                       : granite    ? "granite"
                       : llama      ? "llama"
                       : c->qk_norm ? "qwen3"
                                    : "qwen2";
    static wt ts[MAX_T];
    int n = 0;
    add(ts, &n, &m->embed, false, "token_embd.weight", 0);
    for (uint32_t i = 0; i < c->n_layers; i++) {
        const devio_layer *l = &m->layers[i];
        add(ts, &n, &l->attn_norm, false, "blk.%u.attn_norm.weight", i);
        add(ts, &n, &l->wq, llama, "blk.%u.attn_q.weight", i);
        add(ts, &n, &l->wk, llama, "blk.%u.attn_k.weight", i);
        add(ts, &n, &l->wv, false, "blk.%u.attn_v.weight", i);
        add(ts, &n, &l->wo, false, "blk.%u.attn_output.weight", i);
        add(ts, &n, &l->bq, llama, "blk.%u.attn_q.bias", i);
        add(ts, &n, &l->bk, llama, "blk.%u.attn_k.bias", i);
        add(ts, &n, &l->bv, false, "blk.%u.attn_v.bias", i);
        add(ts, &n, &l->q_norm, false, "blk.%u.attn_q_norm.weight", i);
        add(ts, &n, &l->k_norm, false, "blk.%u.attn_k_norm.weight", i);
        add(ts, &n, &l->ffn_norm, false, "blk.%u.ffn_norm.weight", i);
        add(ts, &n, &l->w_gate, false, "blk.%u.ffn_gate.weight", i);
        add(ts, &n, &l->w_up, false, "blk.%u.ffn_up.weight", i);
        add(ts, &n, &l->w_down, false, "blk.%u.ffn_down.weight", i);
    }
    add(ts, &n, &m->norm, false, "output_norm.weight", 0);
    if (!c->tie_word_embeddings)
        add(ts, &n, &m->lm_head, false, "output.weight", 0);
    float ones[512];
    for (size_t i = 0; i < sizeof ones / sizeof *ones; i++)
        ones[i] = 1.0f;
    assert_true(c->head_dim / 2 <= sizeof ones / sizeof *ones);
    devio_tensor extra = {.data = ones, .dtype = DEVIO_F32, .ndim = 1,
                          .shape = {c->head_dim / 2, 0}};
    if (e && e->extra_tensor)
        add(ts, &n, &extra, false, e->extra_tensor, 0);

    gbuf b = {0};
    put_meta(&b, c, e, arch, granite, n);
    uint64_t off = 0, offs[MAX_T], sizes[MAX_T];
    for (int i = 0; i < n; i++) {
        const devio_tensor *t = ts[i].t;
        bool two = t->ndim > 1;
        uint32_t type = ggml_type(t);
        gtinfo gi = {ts[i].name, two ? 2u : 1u, {two ? t->shape[1] : t->shape[0], t->shape[0]},
                     type, off};
        if (e && e->reshape && strcmp(e->reshape, ts[i].name) == 0) {
            uint64_t x = gi.ne[0];
            gi.ne[0] = gi.ne[1];
            gi.ne[1] = x;
        }
        sizes[i] = tensor_bytes(t);
        if (e && e->retype && strcmp(e->retype, ts[i].name) == 0) {
            gi.type = e->type;
            sizes[i] = gi.ne[0] / devio_gguf_type_block(e->type) * devio_gguf_type_bytes(e->type) *
                       (two ? gi.ne[1] : 1);
        }
        offs[i] = off;
        gb_tensor(&b, &gi);
        off += (sizes[i] + 31) / 32 * 32;
    }
    gb_pad(&b, 32);
    size_t data0 = b.n;
    for (int i = 0; i < n; i++) {
        const devio_tensor *t = ts[i].t;
        uint64_t bytes = tensor_bytes(t);
        const uint8_t *src = t->data;
        assert_int_equal(b.n - data0, offs[i]);
        if (sizes[i] != bytes) { /* retyped: any bytes of the new size */
            for (uint64_t k = 0; k < sizes[i]; k++)
                gb_u(&b, k * 7u, 1);
        } else if (t->ndim == 1 && t->dtype != DEVIO_F32) { /* widened exactly */
            float *w = malloc((size_t)bytes);
            assert_non_null(w);
            assert_true(devio_tensor_widen(t, w, (size_t)t->shape[0]));
            gb_put(&b, w, (size_t)bytes);
            free(w);
        } else if (ts[i].interleave) {
            /* llama.cpp's order: Hugging Face's row j * hd/2 + i of a head at 2i + j. */
            uint32_t hd = c->head_dim;
            uint64_t rows = t->shape[0];
            size_t rb = (size_t)(bytes / rows);
            for (uint64_t h = 0; h < rows / hd; h++)
                for (uint32_t i2 = 0; i2 < hd / 2; i2++)
                    for (uint32_t j = 0; j < 2; j++)
                        gb_put(&b, src + (h * hd + j * (hd / 2) + i2) * rb, rb);
        } else {
            gb_put(&b, src, (size_t)bytes);
        }
        gb_pad(&b, 32);
    }
    write_all(path, b.p, b.n);
    free(b.p);
}
