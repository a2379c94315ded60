/* cuda_plan.c - the memory plan of cuda_plan.h. Every size is a product of
 * counts in uint64_t with an overflow check; nothing here may allocate. */
#include "kernels/cuda_plan.h"

#include "device/adapter/adapter.h"
#include "kernels/cuda_fast.h"
#include "kernels/cuda_sample.h"
#include "kernels/cuda_ssm.h"

/* a * b, or false when it overflows. */
static bool mul(uint64_t a, uint64_t b, uint64_t *out)
{
    if (a != 0 && b > UINT64_MAX / a)
        return false;
    *out = a * b;
    return true;
}

static bool add(uint64_t *acc, uint64_t v)
{
    if (*acc > UINT64_MAX - v)
        return false;
    *acc += v;
    return true;
}

/* a * b * c, or false when it overflows. */
static bool mul3(uint64_t a, uint64_t b, uint64_t c, uint64_t *out)
{
    uint64_t ab;
    return mul(a, b, &ab) && mul(ab, c, out);
}

bool cuda_plan_lora_dims(const devio_model_shape *s, uint32_t t, uint32_t *in, uint32_t *out)
{
    /* A model without attention layers (Mamba2), without an MLP or without
     * mixers (Llama) has no such module: its targets take no room. */
    uint32_t da = s->n_layers > s->n_mixers ? s->d : 0, dm = s->f > 0 ? s->d : 0;
    uint32_t dx = s->n_mixers > 0 ? s->d : 0;
    uint32_t q = s->q_dim, kv = s->kv_dim, f = s->f;
    switch (t) {
    case DEVIO_LORA_Q: *in = da, *out = q; return true;
    case DEVIO_LORA_K: *in = da, *out = kv; return true;
    case DEVIO_LORA_V: *in = da, *out = kv; return true;
    case DEVIO_LORA_O: *in = q, *out = da; return true;
    case DEVIO_LORA_GATE: *in = dm, *out = f; return true;
    case DEVIO_LORA_UP: *in = dm, *out = f; return true;
    case DEVIO_LORA_DOWN: *in = f, *out = dm; return true;
    case DEVIO_LORA_IN_PROJ: *in = dx, *out = s->in_dim; return true;
    case DEVIO_LORA_OUT_PROJ: *in = s->ssm_inner, *out = dx; return true;
    default: *in = *out = 0; return false;
    }
}

/* Floats of one adapter slot: A [rank, in] and B [out, rank] of every module
 * of every layer, at the largest rank. Widths are 32-bit, so their sum is
 * exact in 64 bits. */
static bool lora_slot_floats(const devio_model_shape *s, uint32_t rank, uint64_t *out)
{
    uint64_t io = 0;
    for (uint32_t t = 0; t < DEVIO_LORA_N_TARGETS; t++) {
        uint32_t in, o;
        cuda_plan_lora_dims(s, t, &in, &o);
        io += (uint64_t)in + o;
    }
    return mul3(io, rank, s->n_layers, out);
}

/* Floats a mixer layer's small tensors take widened: in_proj's bias, the
 * conv's weight and bias, dt_bias, A_log, D, the gated norm, out_proj's
 * bias. Sums of 32-bit widths; the one product is checked. */
static bool mixer_small_floats(const devio_model_shape *s, uint64_t *out)
{
    uint64_t conv;
    if (!mul(s->conv_dim, s->ssm_conv, &conv))
        return false;
    *out = conv + s->in_dim + s->conv_dim + 3ull * s->ssm_heads + s->ssm_inner + s->d;
    return true;
}

uint32_t cuda_plan_kv_elem(const devio_backend_config *cfg)
{
    return cfg->numerics == DEVIO_NUMERICS_FAST ? 2u : 4u;
}

/* Device bytes of one sampled row beside its scratch: a job and a result (cuda_sample.h). */
#define CUDA_SAMPLE_ROW_BYTES (sizeof(cuda_sample_job) + sizeof(cuda_sample_out))

/* The buffers only fast numerics take (cuda_backend.c's create_fast and
 * cuda_sampling.c's cuda_sampling_create). */
static bool fast_bytes(const devio_backend_config *cfg, cuda_plan *p)
{
    const devio_model_shape *s = cfg->shape;
    uint64_t T = cfg->max_batch_tokens, F = sizeof(float), widest = s->d;
    uint64_t ins[] = {s->q_dim, s->f, s->ssm_inner};
    for (size_t i = 0; i < sizeof ins / sizeof *ins; i++)
        widest = ins[i] > widest ? ins[i] : widest;
    uint64_t qkv = s->q_dim + 2ull * s->kv_dim;
    if (cfg->numerics != DEVIO_NUMERICS_FAST)
        return true;
    if (!mul3(T, widest, 2, &p->fast_buf.x16) || !mul3(T, qkv, F, &p->fast_buf.qkv) ||
        !mul3(T, 2ull * s->f, F, &p->fast_buf.gu) ||
        (s->has_bias && !mul3(s->n_layers, qkv, F, &p->fast_buf.bqkv)) ||
        (s->n_mixers < s->n_layers && !mul3((uint64_t)CUDA_ATTN16_PART_ROWS * s->n_heads,
                                            s->head_dim + 2ull, F, &p->fast_buf.part)) ||
        !mul3(p->logits_rows, 2ull * s->vocab + (uint64_t)CUDA_SAMPLE_ROW_BYTES / F, F,
              &p->fast_buf.sample) ||
        !mul3(cfg->logits_rows, s->vocab, F, &p->fast_buf.logits))
        return false;
    /* A row of more than one chunk has at most twice its tokens / CUDA_SSM_CHUNK chunks. */
    uint64_t chunks = 2 * ((T + CUDA_SSM_CHUNK - 1) / CUDA_SSM_CHUNK), cs;
    if (s->n_mixers > 0 &&
        (!mul3(chunks, s->ssm_inner, s->ssm_state, &cs) || !mul(cs, F, &p->fast_buf.ssm_cs) ||
         !mul3(T, s->ssm_heads, F, &p->fast_buf.ssm_lam)))
        return false;
    return add(&p->fast, p->fast_buf.x16) && add(&p->fast, p->fast_buf.qkv) &&
           add(&p->fast, p->fast_buf.gu) && add(&p->fast, p->fast_buf.bqkv) &&
           add(&p->fast, p->fast_buf.part) && add(&p->fast, p->fast_buf.sample) &&
           add(&p->fast, p->fast_buf.ssm_cs) && add(&p->fast, p->fast_buf.ssm_lam) &&
           add(&p->fast, p->fast_buf.logits);
}

bool cuda_plan_make(const devio_backend_config *cfg, uint64_t weight_bytes, cuda_plan *p)
{
    const devio_model_shape *s = cfg->shape;
    *p = (cuda_plan){.weights = weight_bytes};
    uint64_t L = s->n_layers, T = cfg->max_batch_tokens, F = sizeof(float);
    uint64_t attn = s->n_layers - s->n_mixers, half = s->rotary_dim / 2;
    p->max_blocks_per_seq = (uint32_t)(((uint64_t)cfg->max_seq_len + cfg->block_size - 1) /
                                       cfg->block_size);

    /* Norms, q/k/v biases, Qwen3's q_norm and k_norm, the final norm, RoPE
     * cos and sin, the mixers' small tensors. Sums of a few 32-bit widths
     * are exact in 64 bits; products are checked. */
    uint64_t per_layer = 2 * (uint64_t)s->d + s->q_dim + 2 * (uint64_t)s->kv_dim, small, rope;
    if (s->qk_norm)
        per_layer += 2 * (uint64_t)s->head_dim;
    uint64_t per_mixer, mixers;
    if (!mul(L, per_layer, &small) || !add(&small, s->d) ||
        !mul3(cfg->max_seq_len, half, 2, &rope) || !add(&small, rope) ||
        !mixer_small_floats(s, &per_mixer) || !mul(per_mixer, s->n_mixers, &mixers) ||
        !add(&small, mixers) || !mul(small, F, &p->small))
        return false;

    uint64_t block_elems;
    if (!mul(cfg->block_size, s->kv_dim, &block_elems) ||
        !mul3(block_elems, cuda_plan_kv_elem(cfg) * 2, attn, &p->kv_block) ||
        !mul(p->kv_block, cfg->kv_blocks, &p->kv))
        return false;

    if (!mul(s->slot_floats, F, &p->ssm_slot) ||
        !mul(p->ssm_slot, (uint64_t)cfg->ssm_slots + cfg->ssm_snapshots, &p->ssm))
        return false;

    /* x, h, x2, o_tmp [T, d]; q, q2, att [T, q_dim]; k, v [T, kv_dim];
     * act, g_tmp, u_tmp [T, f]; lora_a [T, rank]; the mixer's zx [T, in_dim],
     * xa [T, conv_dim], y and y2 [T, I] (all 0 wide without mixers). */
    uint64_t per_tok = 4 * (uint64_t)s->d + 3 * (uint64_t)s->q_dim + 2 * (uint64_t)s->kv_dim +
                       3 * (uint64_t)s->f + cfg->max_lora_rank + s->in_dim + s->conv_dim +
                       2 * (uint64_t)s->ssm_inner;
    if (!mul3(per_tok, F, T, &p->activations))
        return false;

    /* At most one output per token, and never more than the slots it names. */
    p->logits_rows = cfg->max_batch_tokens < cfg->logits_rows ? cfg->max_batch_tokens
                                                                : cfg->logits_rows;
    if (!mul3(p->logits_rows, s->vocab, F, &p->logits))
        return false;

    uint64_t slot_floats;
    if (!lora_slot_floats(s, cfg->max_lora_rank, &slot_floats) ||
        !mul(slot_floats, F, &p->lora_slot) || !mul(p->lora_slot, cfg->adapter_slots, &p->lora))
        return false;

    /* tokens, pos, bt_off, slot, out_tok, out_pos, out_bt_off, out_row per
     * token, and every row's block table; with mixers, every row's
     * cuda_ssm_row and its snapshot slots (EACH: one per token, END: one);
     * under fast numerics with adapter slots, the SGMV groups of all tokens
     * and of the outputs. */
    uint64_t words = 8 * T + (uint64_t)cfg->max_rows * p->max_blocks_per_seq;
    if (cfg->numerics == DEVIO_NUMERICS_FAST && cfg->adapter_slots > 0)
        words += 2 * ((uint64_t)cfg->adapter_slots + 1) + 2 * T; /* SGMV groups */
    if (s->n_mixers > 0)
        words += (uint64_t)cfg->max_rows * (CUDA_SSM_ROW_WORDS + 1) + T;
    if (words > UINT32_MAX / 4)
        return false;
    p->meta_words = (uint32_t)words;
    p->meta = words * 4;
    if (!fast_bytes(cfg, p))
        return false;

    uint64_t total = 0;
    if (!add(&total, p->weights) || !add(&total, p->small) || !add(&total, p->kv) ||
        !add(&total, p->ssm) || !add(&total, p->activations) || !add(&total, p->logits) ||
        !add(&total, p->lora) || !add(&total, p->meta) || !add(&total, p->fast))
        return false;
    p->total = total;
    return true;
}

uint64_t cuda_plan_budget(uint64_t free_bytes, uint64_t total_bytes)
{
    uint64_t reserve = CUDA_PLAN_RESERVE_BYTES + total_bytes / 1000 * CUDA_PLAN_RESERVE_PER_MILLE;
    return free_bytes > reserve ? free_bytes - reserve : 0;
}

uint32_t cuda_plan_kv_fit(const cuda_plan *p, uint64_t budget)
{
    uint64_t rest = p->total - p->kv;
    if (budget < rest)
        return 0;
    if (p->kv_block == 0)
        return UINT32_MAX;
    uint64_t n = (budget - rest) / p->kv_block;
    return n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
}

uint64_t cuda_plan_weight_bytes(const devio_model *m)
{
    uint64_t total = devio_tensor_bytes(&m->embed);
    if (m->lm_head.data != m->embed.data)
        total += devio_tensor_bytes(&m->lm_head);
    for (uint32_t i = 0; i < m->cfg.n_layers; i++) {
        const devio_layer *l = &m->layers[i];
        const devio_tensor *big[] = {&l->wq, &l->wk, &l->wv, &l->wo, &l->w_gate, &l->w_up,
                                     &l->w_down, &l->mixer.in_proj, &l->mixer.out_proj};
        for (size_t k = 0; k < sizeof big / sizeof *big; k++)
            total += devio_tensor_bytes(big[k]);
    }
    return total;
}

uint64_t cuda_plan_dequant_elems(const devio_model *m)
{
    uint64_t most = 0;
    const devio_tensor *heads[] = {&m->embed, &m->lm_head};
    for (size_t k = 0; k < 2; k++)
        if (heads[k]->data && devio_dtype_quantized(heads[k]->dtype) &&
            heads[k]->shape[0] * heads[k]->shape[1] > most)
            most = heads[k]->shape[0] * heads[k]->shape[1];
    for (uint32_t i = 0; i < m->cfg.n_layers; i++) {
        const devio_layer *l = &m->layers[i];
        const devio_tensor *big[] = {&l->wq, &l->wk, &l->wv, &l->wo, &l->w_gate, &l->w_up,
                                     &l->w_down};
        for (size_t k = 0; k < sizeof big / sizeof *big; k++)
            if (big[k]->data && devio_dtype_quantized(big[k]->dtype) &&
                big[k]->shape[0] * big[k]->shape[1] > most)
                most = big[k]->shape[0] * big[k]->shape[1];
    }
    return most;
}

bool cuda_plan_for(const devio_model *m, const devio_backend_config *cfg, cuda_plan *p)
{
    if (!cuda_plan_make(cfg, cuda_plan_weight_bytes(m), p))
        return false;
    if (cfg->numerics != DEVIO_NUMERICS_FAST)
        return true;
    return mul(cuda_plan_dequant_elems(m), 2, &p->fast_buf.deq) &&
           add(&p->fast, p->fast_buf.deq) && add(&p->total, p->fast_buf.deq);
}
