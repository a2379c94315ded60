/* shape.c - the model shape check and the RoPE tables, done once by the core for every backend.
 * It must never accept a tensor a backend could read outside of, and never compute a forward pass. */
#include <stdlib.h>

#include "device/numerics/numerics.h"
#include "device/numerics/quant.h"
#include "device/backend/shape.h"
#include "device/status.h"

static bool tensor_is(const devio_tensor *t, uint64_t rows, uint64_t cols)
{
    if (!t->data)
        return false;
    /* A quantized tensor is a matrix of whole blocks per row (device/numerics/quant.h). */
    if (devio_dtype_quantized(t->dtype))
        return cols != 0 && t->ndim == 2 && t->shape[0] == rows && t->shape[1] == cols &&
               cols % devio_quant_block(devio_dtype_ggml(t->dtype)) == 0;
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

static devio_status check_attention(const devio_layer *l, const devio_model_shape *s)
{
    uint64_t d = s->d, q = s->q_dim, kv = s->kv_dim, hd = s->head_dim;
    bool ok = tensor_is(&l->wq, q, d) && tensor_is(&l->wk, kv, d) && tensor_is(&l->wv, kv, d) &&
              tensor_is(&l->wo, d, q) && bias_ok(&l->bq, q) && bias_ok(&l->bk, kv) &&
              bias_ok(&l->bv, kv) &&
              (!s->qk_norm || (tensor_is(&l->q_norm, hd, 0) && tensor_is(&l->k_norm, hd, 0)));
    return ok ? DEVIO_OK : DEVIO_E_MODEL;
}

static devio_status check_mixer(const devio_mixer *x, const devio_model_shape *s)
{
    uint64_t d = s->d, H = s->ssm_heads;
    bool ok = tensor_is(&x->in_proj, s->in_dim, d) && tensor_is(&x->conv_w, s->conv_dim, s->ssm_conv) &&
              tensor_is(&x->dt_bias, H, 0) && tensor_is(&x->a_log, H, 0) &&
              tensor_is(&x->d_skip, H, 0) && tensor_is(&x->norm, s->ssm_inner, 0) &&
              tensor_is(&x->out_proj, d, s->ssm_inner) && bias_ok(&x->in_bias, s->in_dim) &&
              bias_ok(&x->conv_b, s->conv_dim) && bias_ok(&x->out_bias, d) &&
              (x->conv_b.data != NULL) == s->conv_bias &&
              (x->in_bias.data != NULL) == s->proj_bias && (x->out_bias.data != NULL) == s->proj_bias;
    return ok ? DEVIO_OK : DEVIO_E_MODEL;
}

static devio_status check_layer(const devio_model *m, const devio_model_shape *s, uint32_t i,
                                devio_error *err)
{
    const devio_layer *l = &m->layers[i];
    uint64_t d = s->d, f = s->f;
    devio_status st = l->kind == DEVIO_LAYER_MIXER ? check_mixer(&l->mixer, s)
                                                   : check_attention(l, s);
    bool mlp_ok = !s->has_mlp ||
                  (tensor_is(&l->ffn_norm, d, 0) && tensor_is(&l->w_gate, f, d) &&
                   tensor_is(&l->w_up, f, d) && tensor_is(&l->w_down, d, f));
    if (st != DEVIO_OK || !mlp_ok || !tensor_is(&l->attn_norm, d, 0))
        return devio_fail_at(err, DEVIO_E_MODEL, "layer", i,
                             "layer %u has a tensor of the wrong shape or dtype", i);
    /* Backends sweep gate and up together as one fused projection. */
    if (s->has_mlp && l->w_gate.dtype != l->w_up.dtype)
        return devio_fail_at(err, DEVIO_E_UNSUPPORTED, "layer", i,
                             "layer %u: gate_proj and up_proj differ in dtype", i);
    return DEVIO_OK;
}

/* The mixer's dimensions and one state slot's size (backend.h). */
static devio_status ssm_shape(const devio_model_config *c, devio_model_shape *s, devio_error *err)
{
    const devio_ssm_config *m = &c->ssm;
    if (m->n_heads == 0 || m->head_dim == 0 || m->n_groups == 0 || m->d_state == 0 ||
        m->d_conv == 0 || m->n_heads % m->n_groups != 0)
        return devio_fail(err, DEVIO_E_MODEL, "the mixer has an empty or uneven dimension");
    s->ssm_heads = m->n_heads;
    s->ssm_head_dim = m->head_dim;
    s->ssm_groups = m->n_groups;
    s->ssm_state = m->d_state;
    s->ssm_conv = m->d_conv;
    uint64_t inner = (uint64_t)m->n_heads * m->head_dim;
    uint64_t conv = inner + 2ull * m->n_groups * m->d_state, in = inner + conv + m->n_heads;
    if (in > UINT32_MAX / 4)
        return devio_fail(err, DEVIO_E_MODEL, "mixer width overflows");
    s->ssm_inner = (uint32_t)inner;
    s->conv_dim = (uint32_t)conv;
    s->in_dim = (uint32_t)in;
    s->conv_bias = m->conv_bias;
    s->proj_bias = m->proj_bias;
    s->dt_min = m->dt_min;
    s->dt_max = m->dt_max;
    s->ssm_eps = m->norm_eps;
    s->slot_floats = (uint64_t)s->n_mixers *
                     (conv * (m->d_conv - 1) + inner * (uint64_t)m->d_state);
    return DEVIO_OK;
}

devio_status devio_model_shape_get(const devio_model *m, devio_model_shape *out,
                                   devio_error *err)
{
    const devio_model_config *c = &m->cfg;
    bool mamba2 = c->arch == DEVIO_ARCH_MAMBA2;
    if (c->hidden_size == 0 || c->vocab_size == 0 || c->n_layers == 0 || !m->layers ||
        (!mamba2 && (c->n_heads == 0 || c->n_kv_heads == 0 || c->head_dim == 0 ||
                     c->intermediate_size == 0)))
        return devio_fail(err, DEVIO_E_MODEL, "model has an empty dimension");
    if (c->n_kv_heads && c->n_heads % c->n_kv_heads != 0)
        return devio_fail(err, DEVIO_E_MODEL, "n_heads %u is not a multiple of n_kv_heads %u",
                          c->n_heads, c->n_kv_heads);
    if (c->head_dim % 2 != 0 || c->rotary_dim % 2 != 0 || c->rotary_dim > c->head_dim)
        return devio_fail(err, DEVIO_E_MODEL, "head_dim %u or rotary_dim %u is odd", c->head_dim,
                          c->rotary_dim);
    uint64_t q = (uint64_t)c->n_heads * c->head_dim, kv = (uint64_t)c->n_kv_heads * c->head_dim;
    if (q > UINT32_MAX / 2 || kv > UINT32_MAX / 2)
        return devio_fail(err, DEVIO_E_MODEL, "attention width overflows");
    devio_model_shape s = {
        .n_layers = c->n_layers, .d = c->hidden_size, .n_heads = c->n_heads,
        .n_kv_heads = c->n_kv_heads, .head_dim = c->head_dim, .q_dim = (uint32_t)q,
        .kv_dim = (uint32_t)kv, .f = c->intermediate_size, .vocab = c->vocab_size,
        .eps = c->rms_norm_eps,
        .attn_scale = c->attention_multiplier > 0.0f ? c->attention_multiplier
                      : c->head_dim                  ? devio_rsqrtf((float)c->head_dim)
                                                     : 0.0f,
        .rotary_dim = c->rotary_dim, .has_mlp = !mamba2, .qk_norm = c->qk_norm,
        .window = c->sliding_window,
        /* 1 (an exact identity) unless the config says otherwise. */
        .emb_mult = c->embedding_multiplier > 0.0f ? c->embedding_multiplier : 1.0f,
        .res_mult = c->residual_multiplier > 0.0f ? c->residual_multiplier : 1.0f,
        .logit_scale = c->logits_scaling > 0.0f ? c->logits_scaling : 1.0f,
    };
    for (uint32_t i = 0; i < s.n_layers; i++) {
        if (m->layers[i].kind == DEVIO_LAYER_MIXER)
            s.n_mixers++;
        else
            s.n_attn++;
    }
    if (s.n_attn > 0 && (s.n_heads == 0 || s.head_dim == 0))
        return devio_fail(err, DEVIO_E_MODEL, "attention layers without heads");
    if (s.n_mixers > 0) {
        devio_status st = ssm_shape(c, &s, err);
        if (st != DEVIO_OK)
            return st;
    }
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

/* llama3: frequencies whose wavelength exceeds original / low_freq_factor
 * are divided by factor, those below original / high_freq_factor kept, and
 * those between interpolated smoothly (transformers' definition). */
static float llama3_inv_freq(const devio_rope_scaling *r, float inv)
{
    float wavelen = 6.28318530718f / inv;
    float low_wavelen = r->original_max_positions / r->low_freq_factor;
    float high_wavelen = r->original_max_positions / r->high_freq_factor;
    if (wavelen > low_wavelen)
        return inv / r->factor;
    if (wavelen < high_wavelen)
        return inv;
    float smooth = (r->original_max_positions / wavelen - r->low_freq_factor) /
                   (r->high_freq_factor - r->low_freq_factor);
    return (1.0f - smooth) * (inv / r->factor) + smooth * inv;
}

/* yarn's correction dimension of `rotations` turns over the original
 * context, for rd dimensions and base theta. */
static float yarn_dim(float rotations, uint32_t rd, float theta, float orig)
{
    return ((float)rd * devio_logf(orig / (rotations * 6.28318530718f))) /
           (2.0f * devio_logf(theta));
}

/* yarn: interpolated (inv / factor) and extrapolated (inv) frequencies
 * blended by a linear ramp over the correction range [low, high]. */
static float yarn_inv_freq(const devio_rope_scaling *r, float theta, uint32_t rd, uint32_t i,
                           float pos_freq)
{
    float low = yarn_dim(r->beta_fast, rd, theta, r->original_max_positions);
    float high = yarn_dim(r->beta_slow, rd, theta, r->original_max_positions);
    if (r->truncate) {
        float fl = (float)(int64_t)low, ce = (float)(int64_t)high;
        low = fl > low ? fl - 1.0f : fl;   /* floor */
        high = ce < high ? ce + 1.0f : ce; /* ceil */
    }
    low = low > 0.0f ? low : 0.0f;
    high = high < (float)(rd - 1) ? high : (float)(rd - 1);
    if (low == high)
        high = high + 0.001f;
    float ramp = ((float)i - low) / (high - low);
    ramp = ramp < 0.0f ? 0.0f : ramp > 1.0f ? 1.0f : ramp;
    float extrapolation = 1.0f - ramp;
    float interp = 1.0f / (r->factor * pos_freq), extrap = 1.0f / pos_freq;
    return interp * (1.0f - extrapolation) + extrap * extrapolation;
}

float devio_rope_inv_freq(const devio_model_config *c, uint32_t rd, uint32_t i)
{
    float pos_freq = devio_powf_pos(c->rope_theta, (float)(2 * i) / (float)rd);
    float inv = 1.0f / pos_freq;
    const devio_rope_scaling *r = &c->rope_scaling;
    switch (r->type) {
    case DEVIO_ROPE_LINEAR: return inv / r->factor;
    case DEVIO_ROPE_LLAMA3: return llama3_inv_freq(r, inv);
    case DEVIO_ROPE_YARN: return yarn_inv_freq(r, c->rope_theta, rd, i, pos_freq);
    case DEVIO_ROPE_DEFAULT: break;
    }
    return inv;
}

devio_status devio_rope_tables(const devio_model_config *cfg, uint32_t rd, uint32_t max_seq_len,
                               float **cos_out, float **sin_out, devio_error *err)
{
    uint32_t half = rd / 2;
    size_t n = (size_t)max_seq_len * half;
    float *c = calloc(n ? n : 1, sizeof *c), *s = calloc(n ? n : 1, sizeof *s);
    *cos_out = *sin_out = NULL;
    if (!c || !s) {
        free(c);
        free(s);
        return devio_fail(err, DEVIO_E_NOMEM, "out of memory for the RoPE tables");
    }
    /* yarn scales cos and sin; x * 1 is x for every other model. */
    float af = cfg->rope_scaling.type == DEVIO_ROPE_YARN ? cfg->rope_scaling.attention_factor
                                                          : 1.0f;
    for (uint32_t i = 0; i < half; i++) {
        float inv_freq = devio_rope_inv_freq(cfg, rd, i);
        for (uint32_t p = 0; p < max_seq_len; p++) {
            float ang = (float)p * inv_freq;
            c[(size_t)p * half + i] = devio_cosf(ang) * af;
            s[(size_t)p * half + i] = devio_sinf(ang) * af;
        }
    }
    *cos_out = c;
    *sin_out = s;
    return DEVIO_OK;
}
