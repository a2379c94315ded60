/* cuda_plan.c - the memory plan of cuda_plan.h. Every size is a product of
 * counts in uint64_t with an overflow check; nothing here may allocate. */
#include "kernels/cuda_plan.h"

#include "device/adapter.h"

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

/* Floats of one adapter slot: A [rank, in] and B [out, rank] of every module
 * of every layer, at the largest rank. Widths are 32-bit, so their sum is
 * exact in 64 bits. */
static bool lora_slot_floats(const devio_model_shape *s, uint32_t rank, uint64_t *out)
{
    uint64_t d = s->d, q = s->q_dim, kv = s->kv_dim, f = s->f;
    uint64_t io = (d + q) + (d + kv) + (d + kv) + (q + d) + (d + f) + (d + f) + (f + d);
    return mul3(io, rank, s->n_layers, out);
}

bool cuda_plan_make(const devio_backend_config *cfg, uint64_t weight_bytes, cuda_plan *p)
{
    const devio_model_shape *s = cfg->shape;
    *p = (cuda_plan){.weights = weight_bytes};
    uint64_t L = s->n_layers, T = cfg->max_batch_tokens, F = sizeof(float);
    uint64_t half = s->head_dim / 2;
    p->max_blocks_per_seq = (uint32_t)(((uint64_t)cfg->max_seq_len + cfg->block_size - 1) /
                                       cfg->block_size);

    /* Norms, q/k/v biases, the final norm, RoPE cos and sin. Sums of a few
     * 32-bit widths are exact in 64 bits; products are checked. */
    uint64_t per_layer = 2 * (uint64_t)s->d + s->q_dim + 2 * (uint64_t)s->kv_dim, small, rope;
    if (!mul(L, per_layer, &small) || !add(&small, s->d) ||
        !mul3(cfg->max_seq_len, half, 2, &rope) || !add(&small, rope) ||
        !mul(small, F, &p->small))
        return false;

    uint64_t block_floats;
    if (!mul(cfg->block_size, s->kv_dim, &block_floats) ||
        !mul3(block_floats, F * 2, L, &p->kv_block) ||
        !mul(p->kv_block, cfg->kv_blocks, &p->kv))
        return false;

    /* x, h, x2, o_tmp [T, d]; q, q2, att [T, q_dim]; k, v [T, kv_dim];
     * act, g_tmp, u_tmp [T, f]; lora_a [T, rank]. */
    uint64_t per_tok = 4 * (uint64_t)s->d + 3 * (uint64_t)s->q_dim + 2 * (uint64_t)s->kv_dim +
                       3 * (uint64_t)s->f + cfg->max_lora_rank;
    if (!mul3(per_tok, F, T, &p->activations))
        return false;

    /* At most one output per token, and never more than the slots it names. */
    p->logits_rows = cfg->max_batch_tokens < cfg->logits_slots ? cfg->max_batch_tokens
                                                                : cfg->logits_slots;
    if (!mul3(p->logits_rows, s->vocab, F, &p->logits))
        return false;

    uint64_t slot_floats;
    if (!lora_slot_floats(s, cfg->max_lora_rank, &slot_floats) ||
        !mul(slot_floats, F, &p->lora_slot) || !mul(p->lora_slot, cfg->adapter_slots, &p->lora))
        return false;

    /* tokens, pos, bt_off, slot, out_tok, out_pos, out_bt_off, out_slot per
     * token, and every row's block table. */
    uint64_t words = 8 * T + (uint64_t)cfg->max_rows * p->max_blocks_per_seq;
    if (words > UINT32_MAX / 4)
        return false;
    p->meta_words = (uint32_t)words;
    p->meta = words * 4;

    uint64_t total = 0;
    if (!add(&total, p->weights) || !add(&total, p->small) || !add(&total, p->kv) ||
        !add(&total, p->activations) || !add(&total, p->logits) || !add(&total, p->lora) ||
        !add(&total, p->meta))
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
    if (budget <= rest || p->kv_block == 0)
        return 0;
    uint64_t n = (budget - rest) / p->kv_block;
    return n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
}

uint64_t cuda_plan_tensor_bytes(const devio_tensor *t)
{
    if (!t->data)
        return 0;
    uint64_t n = 1;
    for (uint32_t i = 0; i < t->ndim; i++)
        n *= t->shape[i];
    return n * devio_dtype_size(t->dtype);
}

uint64_t cuda_plan_weight_bytes(const devio_model *m)
{
    uint64_t total = cuda_plan_tensor_bytes(&m->embed);
    if (m->lm_head.data != m->embed.data)
        total += cuda_plan_tensor_bytes(&m->lm_head);
    for (uint32_t i = 0; i < m->cfg.n_layers; i++) {
        const devio_layer *l = &m->layers[i];
        const devio_tensor *big[] = {&l->wq, &l->wk, &l->wv, &l->wo, &l->w_gate, &l->w_up,
                                     &l->w_down};
        for (size_t k = 0; k < sizeof big / sizeof *big; k++)
            total += cuda_plan_tensor_bytes(big[k]);
    }
    return total;
}
