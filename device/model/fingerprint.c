/* fingerprint.c - devio_model_fingerprint: a 128-bit sum (two common/sum64.h sums of other
 * seeds, at memory speed: a model's weights are hashed once per device) over what decides a
 * model's numbers,
 * so that a sequence's state (docs/state.md) is only ever continued on the same model. It
 * covers every field of the config that the loader filled (each written as a little-endian
 * number in a fixed order, so that every target, wasm32 included, hashes the same bytes) and,
 * for every tensor the model has, its dtype, shape and bytes. Not the text metadata (chat
 * template, special tokens) and not where the weights came from: the same weights converted
 * from safetensors to GGUF with the same dtypes give the same fingerprint. */
#include <string.h>

#include "common/sum64.h"
#include "device/model/model.h"

/* Both sums of one stream. */
typedef struct fp_sum {
    devio_sum64 s[2];
} fp_sum;

static void put_bytes(fp_sum *h, const void *p, size_t n)
{
    devio_sum64_update(&h->s[0], p, n);
    devio_sum64_update(&h->s[1], p, n);
}

static void put_u64(fp_sum *h, uint64_t v)
{
    uint8_t b[8];
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(v >> (8 * i));
    put_bytes(h, b, sizeof b);
}

static void put_f32(fp_sum *h, float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    put_u64(h, u);
}

static void put_tensor(fp_sum *h, const devio_tensor *t)
{
    put_u64(h, t->data != NULL);
    if (!t->data)
        return;
    put_u64(h, (uint64_t)t->dtype);
    put_u64(h, t->ndim);
    put_u64(h, t->shape[0]);
    put_u64(h, t->shape[1]);
    uint64_t n = devio_tensor_bytes(t);
    put_u64(h, n);
    put_bytes(h, t->data, (size_t)n);
}

static void put_config(fp_sum *h, const devio_model_config *c)
{
    char arch[sizeof c->architecture] = {0};
    memcpy(arch, c->architecture, strnlen(c->architecture, sizeof arch));
    put_bytes(h, arch, sizeof arch);
    const uint64_t ints[] = {
        (uint64_t)c->arch, c->vocab_size, c->hidden_size, c->intermediate_size, c->n_layers,
        c->n_heads, c->n_kv_heads, c->head_dim, c->max_position_embeddings,
        (uint64_t)c->tie_word_embeddings, (uint64_t)c->attention_bias, c->rotary_dim,
        (uint64_t)c->rope_scaling.type, (uint64_t)c->rope_scaling.truncate,
        (uint64_t)c->qk_norm, c->sliding_window, c->ssm.n_heads, c->ssm.head_dim,
        c->ssm.n_groups, c->ssm.d_state, c->ssm.d_conv, (uint64_t)c->ssm.conv_bias,
        (uint64_t)c->ssm.proj_bias};
    for (size_t i = 0; i < sizeof ints / sizeof *ints; i++)
        put_u64(h, ints[i]);
    const float floats[] = {
        c->rope_theta, c->rms_norm_eps, c->rope_scaling.factor,
        c->rope_scaling.low_freq_factor, c->rope_scaling.high_freq_factor,
        c->rope_scaling.original_max_positions, c->rope_scaling.attention_factor,
        c->rope_scaling.beta_fast, c->rope_scaling.beta_slow, c->embedding_multiplier,
        c->attention_multiplier, c->residual_multiplier, c->logits_scaling, c->ssm.dt_min,
        c->ssm.dt_max, c->ssm.norm_eps};
    for (size_t i = 0; i < sizeof floats / sizeof *floats; i++)
        put_f32(h, floats[i]);
    for (size_t i = 0; i < sizeof c->attn_layers / sizeof *c->attn_layers; i++)
        put_u64(h, c->attn_layers[i]);
}

void devio_model_fingerprint(const devio_model *m, uint8_t out[32])
{
    fp_sum h;
    devio_sum64_init(&h.s[0], 1);
    devio_sum64_init(&h.s[1], 2);
    put_config(&h, &m->cfg);
    put_tensor(&h, &m->embed);
    put_tensor(&h, &m->norm);
    put_u64(&h, m->lm_head.data == m->embed.data); /* tied: its bytes once */
    if (m->lm_head.data != m->embed.data)
        put_tensor(&h, &m->lm_head);
    for (uint32_t i = 0; i < m->cfg.n_layers; i++) {
        const devio_layer *l = &m->layers[i];
        const devio_mixer *x = &l->mixer;
        const devio_tensor *ts[] = {
            &l->attn_norm, &l->wq,       &l->wk,       &l->wv,       &l->wo,
            &l->bq,        &l->bk,       &l->bv,       &l->q_norm,   &l->k_norm,
            &l->ffn_norm,  &l->w_gate,   &l->w_up,     &l->w_down,   &x->in_proj,
            &x->in_bias,   &x->conv_w,   &x->conv_b,   &x->dt_bias,  &x->a_log,
            &x->d_skip,    &x->norm,     &x->out_proj, &x->out_bias};
        put_u64(&h, (uint64_t)l->kind);
        for (size_t k = 0; k < sizeof ts / sizeof *ts; k++)
            put_tensor(&h, ts[k]);
    }
    memset(out, 0, 32);
    for (int k = 0; k < 2; k++) {
        uint64_t v = devio_sum64_final(&h.s[k]);
        for (int i = 0; i < 8; i++)
            out[8 * k + i] = (uint8_t)(v >> (8 * i));
    }
}
