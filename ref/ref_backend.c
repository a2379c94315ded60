/* ref_backend.c - the reference backend: a Llama forward pass over a paged
 * KV cache, in the operation order of ref/ref_kernels.h. All memory is taken
 * in create; forward never allocates. Weight matrices are used in place,
 * never copied or widened ahead, and read once per step (once per block of
 * about 256 KiB of token activations in long prefills). */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "device/adapter.h"
#include "device/backend.h"
#include "device/numerics.h"
#include "device/status.h"
#include "ref/pool.h"
#include "ref/ref_kernels.h"

typedef struct ref_state {
    const devio_model *model; /* borrowed */
    devio_backend_config cfg;
    uint32_t d, n_heads, n_kv, hd, f, vocab, q_dim, kv_dim;
    uint32_t d_pad, q_pad, f_pad;
    float eps, attn_scale;

    /* n_layers pools of [kv_blocks, n_kv, block_size, hd]: head-major inside
     * a block, so one head's keys are contiguous for attention. */
    float **k_cache, **v_cache;
    size_t block_floats;        /* block_size * kv_dim */
    float *rope_cos, *rope_sin; /* [max_seq_len, hd / 2] */

    /* Norm weights and biases widened once: they are tiny and read per token. */
    float *attn_norm, *ffn_norm; /* [n_layers, d] */
    float *final_norm;           /* [d] */
    float *bq, *bk, *bv;         /* [n_layers, q_dim / kv_dim] or NULL */

    /* Activations, max_batch_tokens rows each; padded rows keep zeros past
     * their width because nothing writes there. */
    float *x;   /* [T, d_pad] residual stream */
    float *h;   /* [T, d_pad] normed input of a projection */
    float *q;   /* [T, q_dim] */
    float *k;   /* [T, kv_dim] */
    float *v;   /* [T, kv_dim] */
    float *att; /* [T, q_pad] attention output */
    float *act; /* [T, f_pad] silu(gate) * up */
    uint32_t *tok_pos;
    const uint32_t **tok_blocks;
    const devio_adapter **tok_adapter; /* [T] the LoRA adapter of each token's row, or NULL */
    uint32_t lora_targets;      /* union of the targets of this step's adapters */
    /* LoRA (unfused path, only when a step's adapters target the module):
     * base outputs before their epilogue, and one token's A x. */
    float *o_tmp;    /* [T, d_pad] o_proj / down_proj outputs */
    float *g_tmp;    /* [T, f_pad] gate_proj outputs */
    float *u_tmp;    /* [T, f_pad] up_proj outputs */
    float *lora_row; /* [max(d, f, q_dim) padded] one widened row of A or B */
    float *lora_a;   /* [max_lora_rank] */
    float **out_ptr; /* [T] logits rows, in batch order of the wanted tokens */

    devio_pool *pool;
    ref_scratch *scratch; /* one per pool thread */
    uint32_t n_scratch;
} ref_state;

static void ref_destroy(void *sp);

static bool tensor_is(const devio_tensor *t, uint64_t rows, uint64_t cols)
{
    if (!t->data)
        return false;
    if (t->dtype != DEVIO_F32 && t->dtype != DEVIO_F16 && t->dtype != DEVIO_BF16)
        return false;
    if (cols == 0)
        return t->ndim == 1 && t->shape[0] == rows;
    return t->ndim == 2 && t->shape[0] == rows && t->shape[1] == cols;
}

/* A bias is either absent or a vector of n. */
static bool bias_ok(const devio_tensor *t, uint64_t n)
{
    return !t->data || tensor_is(t, n, 0);
}

static devio_status check_model(const devio_model *m, devio_error *err)
{
    const devio_model_config *c = &m->cfg;
    if (c->hidden_size == 0 || c->n_heads == 0 || c->n_kv_heads == 0 || c->head_dim == 0 ||
        c->vocab_size == 0 || c->intermediate_size == 0 || c->n_layers == 0 || !m->layers)
        return devio_fail(err, DEVIO_E_MODEL, "model has an empty dimension");
    if (c->n_heads % c->n_kv_heads != 0)
        return devio_fail(err, DEVIO_E_MODEL, "n_heads %u is not a multiple of n_kv_heads %u",
                          c->n_heads, c->n_kv_heads);
    if (c->head_dim % 2 != 0)
        return devio_fail(err, DEVIO_E_MODEL, "head_dim %u is odd", c->head_dim);
    uint64_t d = c->hidden_size, q = (uint64_t)c->n_heads * c->head_dim;
    uint64_t kv = (uint64_t)c->n_kv_heads * c->head_dim, f = c->intermediate_size;
    if (!tensor_is(&m->embed, c->vocab_size, d) || !tensor_is(&m->lm_head, c->vocab_size, d) ||
        !tensor_is(&m->norm, d, 0))
        return devio_fail(err, DEVIO_E_MODEL, "embedding, norm or lm_head has a wrong shape");
    for (uint32_t i = 0; i < c->n_layers; i++) {
        const devio_layer *l = &m->layers[i];
        if (!tensor_is(&l->attn_norm, d, 0) || !tensor_is(&l->ffn_norm, d, 0) ||
            !tensor_is(&l->wq, q, d) || !tensor_is(&l->wk, kv, d) || !tensor_is(&l->wv, kv, d) ||
            !tensor_is(&l->wo, d, q) || !tensor_is(&l->w_gate, f, d) ||
            !tensor_is(&l->w_up, f, d) || !tensor_is(&l->w_down, d, f) ||
            !bias_ok(&l->bq, q) || !bias_ok(&l->bk, kv) || !bias_ok(&l->bv, kv))
            return devio_fail_at(err, DEVIO_E_MODEL, "layer", i,
                                 "layer %u has a tensor of the wrong shape or dtype", i);
        /* gate and up are swept together as one fused projection. */
        if (l->w_gate.dtype != l->w_up.dtype)
            return devio_fail_at(err, DEVIO_E_UNSUPPORTED, "layer", i,
                                 "layer %u: gate_proj and up_proj differ in dtype", i);
    }
    return DEVIO_OK;
}

/* calloc of a product of counts, NULL on overflow. */
static void *calloc_n(size_t a, size_t b, size_t size)
{
    if (a != 0 && b > SIZE_MAX / a)
        return NULL;
    return calloc(a * b, size);
}

static void widen_tensor(const devio_tensor *t, float *dst, size_t n)
{
    ref_widen(t->dtype, t->data, dst, n);
}

static devio_status ref_create(const devio_model *model, const devio_backend_config *cfg,
                               void **state, devio_error *err)
{
    *state = NULL;
    devio_status s = check_model(model, err);
    if (s != DEVIO_OK)
        return s;
    if (cfg->block_size == 0 || cfg->kv_blocks == 0 || cfg->max_batch_tokens == 0 ||
        cfg->max_rows == 0 || cfg->max_seq_len == 0)
        return devio_fail(err, DEVIO_E_INVALID, "backend configuration has a zero size");

    ref_state *st = calloc(1, sizeof *st);
    if (!st)
        return devio_fail(err, DEVIO_E_NOMEM, "out of memory for the reference backend");
    const devio_model_config *c = &model->cfg;
    st->model = model;
    st->cfg = *cfg;
    if (st->cfg.threads == 0)
        st->cfg.threads = 1;
    st->d = c->hidden_size;
    st->n_heads = c->n_heads;
    st->n_kv = c->n_kv_heads;
    st->hd = c->head_dim;
    st->f = c->intermediate_size;
    st->vocab = c->vocab_size;
    st->q_dim = c->n_heads * c->head_dim;
    st->kv_dim = c->n_kv_heads * c->head_dim;
    st->d_pad = ref_pad32(st->d);
    st->q_pad = ref_pad32(st->q_dim);
    st->f_pad = ref_pad32(st->f);
    st->eps = c->rms_norm_eps;
    st->attn_scale = devio_rsqrtf((float)st->hd);
    uint32_t L = c->n_layers, T = cfg->max_batch_tokens, half = st->hd / 2;

    /* KV pools, zeroed so that no slot ever holds a non-finite value. */
    st->block_floats = (size_t)cfg->block_size * st->kv_dim;
    st->k_cache = calloc(L, sizeof *st->k_cache);
    st->v_cache = calloc(L, sizeof *st->v_cache);
    if (!st->k_cache || !st->v_cache)
        goto out_nomem;
    for (uint32_t i = 0; i < L; i++) {
        st->k_cache[i] = calloc_n(cfg->kv_blocks, st->block_floats, sizeof(float));
        st->v_cache[i] = calloc_n(cfg->kv_blocks, st->block_floats, sizeof(float));
        if (!st->k_cache[i] || !st->v_cache[i])
            goto out_nomem;
    }

    /* RoPE table of rule 4. */
    st->rope_cos = calloc_n(cfg->max_seq_len, half, sizeof(float));
    st->rope_sin = calloc_n(cfg->max_seq_len, half, sizeof(float));
    if (!st->rope_cos || !st->rope_sin)
        goto out_nomem;
    for (uint32_t i = 0; i < half; i++) {
        float inv_freq = 1.0f / devio_powf_pos(c->rope_theta, (float)(2 * i) / (float)st->hd);
        for (uint32_t p = 0; p < cfg->max_seq_len; p++) {
            float ang = (float)p * inv_freq;
            st->rope_cos[(size_t)p * half + i] = devio_cosf(ang);
            st->rope_sin[(size_t)p * half + i] = devio_sinf(ang);
        }
    }

    st->attn_norm = calloc_n(L, st->d, sizeof(float));
    st->ffn_norm = calloc_n(L, st->d, sizeof(float));
    st->final_norm = calloc(st->d, sizeof(float));
    if (!st->attn_norm || !st->ffn_norm || !st->final_norm)
        goto out_nomem;
    widen_tensor(&model->norm, st->final_norm, st->d);
    bool has_bias = false;
    for (uint32_t i = 0; i < L; i++) {
        const devio_layer *l = &model->layers[i];
        widen_tensor(&l->attn_norm, st->attn_norm + (size_t)i * st->d, st->d);
        widen_tensor(&l->ffn_norm, st->ffn_norm + (size_t)i * st->d, st->d);
        has_bias = has_bias || l->bq.data || l->bk.data || l->bv.data;
    }
    if (has_bias) {
        /* A layer without one of the biases gets zeros: x + 0 is x (the
         * projection sum is never -0), so the result is the unbiased one. */
        st->bq = calloc_n(L, st->q_dim, sizeof(float));
        st->bk = calloc_n(L, st->kv_dim, sizeof(float));
        st->bv = calloc_n(L, st->kv_dim, sizeof(float));
        if (!st->bq || !st->bk || !st->bv)
            goto out_nomem;
        for (uint32_t i = 0; i < L; i++) {
            const devio_layer *l = &model->layers[i];
            if (l->bq.data)
                widen_tensor(&l->bq, st->bq + (size_t)i * st->q_dim, st->q_dim);
            if (l->bk.data)
                widen_tensor(&l->bk, st->bk + (size_t)i * st->kv_dim, st->kv_dim);
            if (l->bv.data)
                widen_tensor(&l->bv, st->bv + (size_t)i * st->kv_dim, st->kv_dim);
        }
    }

    st->x = calloc_n(T, st->d_pad, sizeof(float));
    st->h = calloc_n(T, st->d_pad, sizeof(float));
    st->q = calloc_n(T, st->q_dim, sizeof(float));
    st->k = calloc_n(T, st->kv_dim, sizeof(float));
    st->v = calloc_n(T, st->kv_dim, sizeof(float));
    st->att = calloc_n(T, st->q_pad, sizeof(float));
    st->act = calloc_n(T, st->f_pad, sizeof(float));
    st->tok_pos = calloc(T, sizeof *st->tok_pos);
    st->tok_blocks = calloc(T, sizeof *st->tok_blocks);
    st->tok_adapter = calloc(T, sizeof *st->tok_adapter);
    uint32_t widest = st->d_pad > st->f_pad ? st->d_pad : st->f_pad;
    widest = widest > st->q_pad ? widest : st->q_pad;
    if (cfg->max_lora_rank > widest)
        widest = cfg->max_lora_rank;
    st->lora_row = calloc_n(widest, 1, sizeof(float));
    st->lora_a = calloc_n(cfg->max_lora_rank ? cfg->max_lora_rank : 1, 1, sizeof(float));
    if (cfg->max_lora_rank) {
        st->o_tmp = calloc_n(T, st->d_pad, sizeof(float));
        st->g_tmp = calloc_n(T, st->f_pad, sizeof(float));
        st->u_tmp = calloc_n(T, st->f_pad, sizeof(float));
    }
    st->out_ptr = calloc(T, sizeof *st->out_ptr);
    if (!st->x || !st->h || !st->q || !st->k || !st->v || !st->att || !st->act ||
        !st->tok_pos || !st->tok_blocks || !st->out_ptr || !st->tok_adapter ||
        !st->lora_row || !st->lora_a ||
        (cfg->max_lora_rank && (!st->o_tmp || !st->g_tmp || !st->u_tmp)))
        goto out_nomem;

    st->pool = devio_pool_create(st->cfg.threads);
    if (!st->pool) {
        ref_destroy(st);
        return devio_fail(err, DEVIO_E_DEVICE, "cannot start %u compute threads", st->cfg.threads);
    }
    st->n_scratch = devio_pool_threads(st->pool);
    st->scratch = calloc(st->n_scratch, sizeof *st->scratch);
    if (!st->scratch)
        goto out_nomem;
    uint32_t max_in = st->d > st->q_dim ? st->d : st->q_dim;
    max_in = max_in > st->f ? max_in : st->f;
    for (uint32_t i = 0; i < st->n_scratch; i++) {
        if (ref_scratch_init(&st->scratch[i], max_in, cfg->max_seq_len, st->hd) != 0)
            goto out_nomem;
    }
    *state = st;
    return DEVIO_OK;

out_nomem:
    ref_destroy(st);
    return devio_fail(err, DEVIO_E_NOMEM, "out of memory for the KV pool or step buffers");
}

static void ref_destroy(void *sp)
{
    ref_state *st = sp;
    if (!st)
        return;
    devio_pool_free(st->pool);
    if (st->scratch) {
        for (uint32_t i = 0; i < st->n_scratch; i++)
            ref_scratch_fini(&st->scratch[i]);
        free(st->scratch);
    }
    uint32_t L = st->model->cfg.n_layers;
    for (uint32_t i = 0; i < L; i++) {
        if (st->k_cache)
            free(st->k_cache[i]);
        if (st->v_cache)
            free(st->v_cache[i]);
    }
    free(st->k_cache);
    free(st->v_cache);
    free(st->rope_cos);
    free(st->rope_sin);
    free(st->attn_norm);
    free(st->ffn_norm);
    free(st->final_norm);
    free(st->bq);
    free(st->bk);
    free(st->bv);
    free(st->x);
    free(st->h);
    free(st->q);
    free(st->k);
    free(st->v);
    free(st->att);
    free(st->act);
    free(st->tok_pos);
    free(st->tok_blocks);
    free(st->tok_adapter);
    free(st->lora_row);
    free(st->lora_a);
    free(st->o_tmp);
    free(st->g_tmp);
    free(st->u_tmp);
    free(st->out_ptr);
    free(st);
}

/* The core validates plans; these checks only keep a malformed batch from
 * reading or writing outside the buffers. Nothing is changed before they pass. */
static devio_status check_batch(ref_state *st, const devio_batch *b, devio_error *err)
{
    const devio_backend_config *cfg = &st->cfg;
    if (b->n_tokens > cfg->max_batch_tokens || b->n_rows > cfg->max_rows)
        return devio_fail(err, DEVIO_E_TOO_LARGE, "batch of %u tokens in %u rows over the limits",
                          b->n_tokens, b->n_rows);
    for (uint32_t t = 0; t < b->n_tokens; t++)
        st->tok_pos[t] = UINT32_MAX;
    st->lora_targets = 0;
    for (uint32_t r = 0; r < b->n_rows; r++) {
        const devio_batch_row *row = &b->rows[r];
        if (row->n_tokens == 0)
            continue;
        if (row->tok_start > b->n_tokens || row->n_tokens > b->n_tokens - row->tok_start ||
            row->pos0 > cfg->max_seq_len || row->n_tokens > cfg->max_seq_len - row->pos0 ||
            !row->blocks)
            return devio_fail_at(err, DEVIO_E_INVALID, "row", r, "row %u lies outside the batch", r);
        if (row->adapter && (row->adapter->rank == 0 || row->adapter->rank > cfg->max_lora_rank ||
                             row->adapter->n_layers != st->model->cfg.n_layers))
            return devio_fail_at(err, DEVIO_E_INVALID, "row", r,
                                 "row %u: adapter of rank %u does not fit this backend", r,
                                 row->adapter->rank);
        if (row->adapter)
            st->lora_targets |= row->adapter->targets;
        uint32_t end = row->pos0 + row->n_tokens;
        for (uint32_t i = 0; i < (end + cfg->block_size - 1) / cfg->block_size; i++)
            if (row->blocks[i] >= cfg->kv_blocks)
                return devio_fail_at(err, DEVIO_E_INVALID, "row", r, "row %u names KV block %u",
                                     r, row->blocks[i]);
        for (uint32_t i = 0; i < row->n_tokens; i++) {
            uint32_t t = row->tok_start + i;
            if (st->tok_pos[t] != UINT32_MAX)
                return devio_fail_at(err, DEVIO_E_INVALID, "row", r,
                                     "token %u belongs to two rows", t);
            st->tok_pos[t] = row->pos0 + i;
            st->tok_blocks[t] = row->blocks;
            st->tok_adapter[t] = row->adapter;
        }
    }
    for (uint32_t t = 0; t < b->n_tokens; t++) {
        if (st->tok_pos[t] == UINT32_MAX)
            return devio_fail(err, DEVIO_E_INVALID, "token %u belongs to no row", t);
        if (b->tokens[t] < 0 || (uint32_t)b->tokens[t] >= st->vocab)
            return devio_fail(err, DEVIO_E_INVALID, "token id %d outside the vocabulary",
                              b->tokens[t]);
        if (b->out_index && b->out_index[t] >= 0 && (uint32_t)b->out_index[t] >= b->n_out)
            return devio_fail(err, DEVIO_E_INVALID, "token %u has logits index %d of %u", t,
                              b->out_index[t], b->n_out);
    }
    for (uint32_t c = 0; c < b->n_copies; c++)
        if (b->copy_src[c] >= cfg->kv_blocks || b->copy_dst[c] >= cfg->kv_blocks)
            return devio_fail(err, DEVIO_E_INVALID, "block copy %u names a block outside the pool", c);
    return DEVIO_OK;
}

/* y[t] += scale * B (A x[t]) for the tokens whose adapter adapts `target`
 * of layer li, in the order backend.h states: a = A x and u = B a by the
 * lane rule, then y + u * scale. One thread: LoRA work is rank-sized. */
static void lora_add(ref_state *st, uint32_t li, devio_lora_target target, const float *x,
                     size_t ldx, float *y, size_t ldy, uint32_t n_tok)
{
    if (!(st->lora_targets & (1u << target)))
        return;
    for (uint32_t t = 0; t < n_tok; t++) {
        const devio_adapter *ad = st->tok_adapter[t];
        if (!ad || !(ad->targets & (1u << target)))
            continue;
        const devio_lora_module *m = &ad->mods[(size_t)li * DEVIO_LORA_N_TARGETS + target];
        if (!m->a.data)
            continue; /* a layer the adapter does not transform */
        uint32_t r = ad->rank, in = (uint32_t)m->a.shape[1], out = (uint32_t)m->b.shape[0];
        size_t asz = devio_dtype_size(m->a.dtype), bsz = devio_dtype_size(m->b.dtype);
        const float *xt = x + (size_t)t * ldx;
        for (uint32_t j = 0; j < r; j++) {
            ref_widen(m->a.dtype, (const char *)m->a.data + (size_t)j * in * asz, st->lora_row,
                      in);
            st->lora_a[j] = devio_lane_dot(st->lora_row, xt, in);
        }
        float *yt = y + (size_t)t * ldy;
        for (uint32_t o = 0; o < out; o++) {
            ref_widen(m->b.dtype, (const char *)m->b.data + (size_t)o * r * bsz, st->lora_row, r);
            float u = devio_lane_dot(st->lora_row, st->lora_a, r);
            yt[o] = yt[o] + u * ad->scale;
        }
    }
}

static void rmsnorm_rows(ref_state *st, float *y, const float *x, const float *w, uint32_t n_tok)
{
    for (uint32_t t = 0; t < n_tok; t++)
        ref_rmsnorm(y + (size_t)t * st->d_pad, x + (size_t)t * st->d_pad, w, st->d, st->eps);
}

/* First half of layer li: norm, q/k/v, RoPE, and K and V into the cache. */
static void layer_qkv(ref_state *st, uint32_t li, uint32_t n_tok)
{
    const devio_layer *l = &st->model->layers[li];
    uint32_t half = st->hd / 2;
    float *kc = st->k_cache[li], *vc = st->v_cache[li];
    uint32_t bs = st->cfg.block_size;

    rmsnorm_rows(st, st->h, st->x, st->attn_norm + (size_t)li * st->d, n_tok);

    ref_matmul qkv[3] = {
        {.w = l->wq.data, .dtype = l->wq.dtype, .m = st->q_dim, .n = st->d,
         .x = st->h, .ldx = st->d_pad, .n_tok = n_tok, .y = st->q, .ldy = st->q_dim},
        {.w = l->wk.data, .dtype = l->wk.dtype, .m = st->kv_dim, .n = st->d,
         .x = st->h, .ldx = st->d_pad, .n_tok = n_tok, .y = st->k, .ldy = st->kv_dim},
        {.w = l->wv.data, .dtype = l->wv.dtype, .m = st->kv_dim, .n = st->d,
         .x = st->h, .ldx = st->d_pad, .n_tok = n_tok, .y = st->v, .ldy = st->kv_dim},
    };
    if (st->bq) {
        qkv[0].epi = qkv[1].epi = qkv[2].epi = REF_EPI_BIAS;
        qkv[0].bias = st->bq + (size_t)li * st->q_dim;
        qkv[1].bias = st->bk + (size_t)li * st->kv_dim;
        qkv[2].bias = st->bv + (size_t)li * st->kv_dim;
    }
    ref_matmul_run(st->pool, st->scratch, qkv, 3);
    lora_add(st, li, DEVIO_LORA_Q, st->h, st->d_pad, st->q, st->q_dim, n_tok);
    lora_add(st, li, DEVIO_LORA_K, st->h, st->d_pad, st->k, st->kv_dim, n_tok);
    lora_add(st, li, DEVIO_LORA_V, st->h, st->d_pad, st->v, st->kv_dim, n_tok);

    for (uint32_t t = 0; t < n_tok; t++) {
        uint32_t pos = st->tok_pos[t];
        const float *cs = st->rope_cos + (size_t)pos * half;
        const float *sn = st->rope_sin + (size_t)pos * half;
        ref_rope(st->q + (size_t)t * st->q_dim, st->n_heads, st->hd, cs, sn);
        ref_rope(st->k + (size_t)t * st->kv_dim, st->n_kv, st->hd, cs, sn);
        size_t blk = st->tok_blocks[t][pos / bs];
        for (uint32_t g = 0; g < st->n_kv; g++) {
            size_t slot = ((blk * st->n_kv + g) * bs + pos % bs) * st->hd;
            size_t src = (size_t)t * st->kv_dim + (size_t)g * st->hd;
            memcpy(kc + slot, st->k + src, st->hd * sizeof(float));
            memcpy(vc + slot, st->v + src, st->hd * sizeof(float));
        }
    }
}

/* x += W in (REF_EPI_ADD); when the step's adapters target the module, the
 * projection is stored, adapted, then added: the same x + z as fused. */
static void residual_proj(ref_state *st, uint32_t li, devio_lora_target target, ref_matmul *mm,
                          uint32_t n_tok)
{
    if (!(st->lora_targets & (1u << target))) {
        ref_matmul_run(st->pool, st->scratch, mm, 1);
        return;
    }
    float *x = mm->y;
    mm->epi = REF_EPI_STORE;
    mm->y = st->o_tmp;
    ref_matmul_run(st->pool, st->scratch, mm, 1);
    lora_add(st, li, target, mm->x, mm->ldx, st->o_tmp, st->d_pad, n_tok);
    for (uint32_t t = 0; t < n_tok; t++)
        for (uint32_t i = 0; i < st->d; i++) {
            size_t k = (size_t)t * st->d_pad + i;
            x[k] = x[k] + st->o_tmp[k];
        }
}

/* Second half of layer li: attention, o_proj, the MLP, both residuals. */
static void layer_rest(ref_state *st, uint32_t li, uint32_t n_tok)
{
    const devio_layer *l = &st->model->layers[li];
    float *kc = st->k_cache[li], *vc = st->v_cache[li];
    uint32_t bs = st->cfg.block_size;

    ref_attention at = {
        .q = st->q, .ldq = st->q_dim, .k_cache = kc, .v_cache = vc,
        .block_size = bs, .n_heads = st->n_heads, .n_kv_heads = st->n_kv, .head_dim = st->hd,
        .n_tok = n_tok, .tok_pos = st->tok_pos, .tok_blocks = st->tok_blocks,
        .scale = st->attn_scale, .out = st->att, .ldo = st->q_pad,
    };
    ref_attention_run(st->pool, st->scratch, &at);

    ref_matmul o = {.w = l->wo.data, .dtype = l->wo.dtype, .m = st->d, .n = st->q_dim,
                    .epi = REF_EPI_ADD, .x = st->att, .ldx = st->q_pad, .n_tok = n_tok,
                    .y = st->x, .ldy = st->d_pad};
    residual_proj(st, li, DEVIO_LORA_O, &o, n_tok);

    rmsnorm_rows(st, st->h, st->x, st->ffn_norm + (size_t)li * st->d, n_tok);

    ref_matmul gu = {.w = l->w_gate.data, .w2 = l->w_up.data, .dtype = l->w_gate.dtype,
                     .m = st->f, .n = st->d, .epi = REF_EPI_SILU_MUL, .x = st->h,
                     .ldx = st->d_pad, .n_tok = n_tok, .y = st->act, .ldy = st->f_pad};
    if (st->lora_targets & ((1u << DEVIO_LORA_GATE) | (1u << DEVIO_LORA_UP))) {
        /* Unfused: gate and up stored, adapted, then silu(gate) * up as the
         * fused epilogue computes it, so rows without LoRA keep their bits. */
        ref_matmul pair[2] = {gu, gu};
        pair[0].epi = pair[1].epi = REF_EPI_STORE;
        pair[0].w2 = pair[1].w2 = NULL;
        pair[1].w = l->w_up.data;
        pair[0].y = st->g_tmp;
        pair[1].y = st->u_tmp;
        ref_matmul_run(st->pool, st->scratch, pair, 2);
        lora_add(st, li, DEVIO_LORA_GATE, st->h, st->d_pad, st->g_tmp, st->f_pad, n_tok);
        lora_add(st, li, DEVIO_LORA_UP, st->h, st->d_pad, st->u_tmp, st->f_pad, n_tok);
        for (uint32_t t = 0; t < n_tok; t++)
            for (uint32_t i = 0; i < st->f; i++) {
                size_t k = (size_t)t * st->f_pad + i;
                st->act[k] = devio_siluf(st->g_tmp[k]) * st->u_tmp[k];
            }
    } else {
        ref_matmul_run(st->pool, st->scratch, &gu, 1);
    }

    ref_matmul down = {.w = l->w_down.data, .dtype = l->w_down.dtype, .m = st->d, .n = st->f,
                       .epi = REF_EPI_ADD, .x = st->act, .ldx = st->f_pad, .n_tok = n_tok,
                       .y = st->x, .ldy = st->d_pad};
    residual_proj(st, li, DEVIO_LORA_DOWN, &down, n_tok);
}

static devio_status ref_forward(void *sp, const devio_batch *b, devio_error *err)
{
    ref_state *st = sp;
    devio_status s = check_batch(st, b, err);
    if (s != DEVIO_OK)
        return s;
    uint32_t n_tok = b->n_tokens;
    const devio_model *m = st->model;

    for (uint32_t c = 0; c < b->n_copies; c++) {
        size_t src = (size_t)b->copy_src[c] * st->block_floats;
        size_t dst = (size_t)b->copy_dst[c] * st->block_floats;
        if (src == dst)
            continue;
        for (uint32_t li = 0; li < m->cfg.n_layers; li++) {
            memcpy(st->k_cache[li] + dst, st->k_cache[li] + src, st->block_floats * sizeof(float));
            memcpy(st->v_cache[li] + dst, st->v_cache[li] + src, st->block_floats * sizeof(float));
        }
    }
    if (n_tok == 0)
        return DEVIO_OK;

    size_t esz = m->embed.dtype == DEVIO_F32 ? 4u : 2u;
    for (uint32_t t = 0; t < n_tok; t++) {
        const char *row = (const char *)m->embed.data + (size_t)b->tokens[t] * st->d * esz;
        ref_widen(m->embed.dtype, row, st->x + (size_t)t * st->d_pad, st->d);
    }

    uint32_t last = m->cfg.n_layers - 1;
    for (uint32_t li = 0; li < last; li++) {
        layer_qkv(st, li, n_tok);
        layer_rest(st, li, n_tok);
    }
    layer_qkv(st, last, n_tok);
    /* Past the last layer's K and V only the tokens whose logits are wanted
     * matter: they move to the front, in batch order, and only they go on
     * (a prefill asking for its last logits skips most of a layer). */
    uint32_t n_out = 0;
    for (uint32_t t = 0; b->out_index && t < n_tok; t++) {
        if (b->out_index[t] < 0)
            continue;
        if (n_out != t) {
            memcpy(st->q + (size_t)n_out * st->q_dim, st->q + (size_t)t * st->q_dim,
                   st->q_dim * sizeof(float));
            memcpy(st->x + (size_t)n_out * st->d_pad, st->x + (size_t)t * st->d_pad,
                   st->d * sizeof(float));
            st->tok_pos[n_out] = st->tok_pos[t];
            st->tok_blocks[n_out] = st->tok_blocks[t];
            st->tok_adapter[n_out] = st->tok_adapter[t];
        }
        st->out_ptr[n_out++] = b->out_rows[b->out_index[t]];
    }
    if (n_out > 0) {
        layer_rest(st, last, n_out);
        rmsnorm_rows(st, st->h, st->x, st->final_norm, n_out);
        ref_matmul lm = {.w = m->lm_head.data, .dtype = m->lm_head.dtype, .m = st->vocab,
                         .n = st->d, .x = st->h, .ldx = st->d_pad, .n_tok = n_out,
                         .y_rows = st->out_ptr};
        ref_matmul_run(st->pool, st->scratch, &lm, 1);
    }
    return DEVIO_OK;
}

const devio_backend_ops devio_ref_backend = {
    .version = DEVIO_BACKEND_VERSION,
    .name = "ref",
    .create = ref_create,
    .destroy = ref_destroy,
    .forward = ref_forward,
};
