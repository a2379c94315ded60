/* shape.c - the model shape check and the RoPE tables, done once by the core for every backend.
 * It must never accept a tensor a backend could read outside of, and never compute a forward pass. */
#include <stdlib.h>

#include "device/numerics.h"
#include "device/shape.h"
#include "device/status.h"

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

static devio_status check_layer(const devio_model *m, const devio_model_shape *s, uint32_t i,
                                devio_error *err)
{
    const devio_layer *l = &m->layers[i];
    uint64_t d = s->d, q = s->q_dim, kv = s->kv_dim, f = s->f;
    if (!tensor_is(&l->attn_norm, d, 0) || !tensor_is(&l->ffn_norm, d, 0) ||
        !tensor_is(&l->wq, q, d) || !tensor_is(&l->wk, kv, d) || !tensor_is(&l->wv, kv, d) ||
        !tensor_is(&l->wo, d, q) || !tensor_is(&l->w_gate, f, d) || !tensor_is(&l->w_up, f, d) ||
        !tensor_is(&l->w_down, d, f) || !bias_ok(&l->bq, q) || !bias_ok(&l->bk, kv) ||
        !bias_ok(&l->bv, kv))
        return devio_fail_at(err, DEVIO_E_MODEL, "layer", i,
                             "layer %u has a tensor of the wrong shape or dtype", i);
    /* Backends sweep gate and up together as one fused projection. */
    if (l->w_gate.dtype != l->w_up.dtype)
        return devio_fail_at(err, DEVIO_E_UNSUPPORTED, "layer", i,
                             "layer %u: gate_proj and up_proj differ in dtype", i);
    return DEVIO_OK;
}

devio_status devio_model_shape_get(const devio_model *m, devio_model_shape *out,
                                   devio_error *err)
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
    uint64_t q = (uint64_t)c->n_heads * c->head_dim, kv = (uint64_t)c->n_kv_heads * c->head_dim;
    if (q > UINT32_MAX / 2 || kv > UINT32_MAX / 2)
        return devio_fail(err, DEVIO_E_MODEL, "attention width overflows");
    devio_model_shape s = {
        .n_layers = c->n_layers, .d = c->hidden_size, .n_heads = c->n_heads,
        .n_kv_heads = c->n_kv_heads, .head_dim = c->head_dim, .q_dim = (uint32_t)q,
        .kv_dim = (uint32_t)kv, .f = c->intermediate_size, .vocab = c->vocab_size,
        .eps = c->rms_norm_eps, .attn_scale = devio_rsqrtf((float)c->head_dim),
    };
    if (!tensor_is(&m->embed, s.vocab, s.d) || !tensor_is(&m->lm_head, s.vocab, s.d) ||
        !tensor_is(&m->norm, s.d, 0))
        return devio_fail(err, DEVIO_E_MODEL, "embedding, norm or lm_head has a wrong shape");
    for (uint32_t i = 0; i < s.n_layers; i++) {
        devio_status st = check_layer(m, &s, i, err);
        if (st != DEVIO_OK)
            return st;
        const devio_layer *l = &m->layers[i];
        s.has_bias = s.has_bias || l->bq.data || l->bk.data || l->bv.data;
    }
    *out = s;
    return DEVIO_OK;
}

devio_status devio_rope_tables(float theta, uint32_t head_dim, uint32_t max_seq_len,
                               float **cos_out, float **sin_out, devio_error *err)
{
    uint32_t half = head_dim / 2;
    size_t n = (size_t)max_seq_len * half;
    float *c = calloc(n ? n : 1, sizeof *c), *s = calloc(n ? n : 1, sizeof *s);
    *cos_out = *sin_out = NULL;
    if (!c || !s) {
        free(c);
        free(s);
        return devio_fail(err, DEVIO_E_NOMEM, "out of memory for the RoPE tables");
    }
    for (uint32_t i = 0; i < half; i++) {
        float inv_freq = 1.0f / devio_powf_pos(theta, (float)(2 * i) / (float)head_dim);
        for (uint32_t p = 0; p < max_seq_len; p++) {
            float ang = (float)p * inv_freq;
            c[(size_t)p * half + i] = devio_cosf(ang);
            s[(size_t)p * half + i] = devio_sinf(ang);
        }
    }
    *cos_out = c;
    *sin_out = s;
    return DEVIO_OK;
}
