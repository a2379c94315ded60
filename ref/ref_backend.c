/* ref_backend.c - the reference backend: a Llama forward pass over a paged
 * KV cache, in the operation order of device/numspec.h. All memory is taken
 * in create; a step never allocates. It computes synchronously: submit only
 * checks, wait runs the whole step. Weight matrices are used in place,
 * never copied or widened ahead, and read once per step (once per block of
 * about 256 KiB of token activations in long prefills). */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/adapter.h"
#include "device/backend.h"
#include "device/numerics.h"
#include "device/status.h"
#include "ref/pool.h"
#include "ref/ref_kernels.h"
#include "ref/ref_mixer.h"

typedef struct ref_state {
    const devio_model *model; /* borrowed */
    devio_backend_config cfg; /* its pointers are borrowed from the core */
    uint32_t d, n_heads, n_kv, hd, f, vocab, q_dim, kv_dim;
    uint32_t d_pad, q_pad, f_pad;
    float eps, attn_scale;

    /* n_layers pools of [kv_blocks, n_kv, block_size, hd]: head-major inside
     * a block, so one head's keys are contiguous for attention. */
    float **k_cache, **v_cache;
    size_t block_floats;        /* block_size * kv_dim */
    const float *rope_cos, *rope_sin; /* [max_seq_len, hd / 2], the core's */
    size_t bytes;               /* everything create allocated, for info */

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
    uint32_t *tok_pos;          /* [T] the batch's positions, compacted for the last layer */
    const uint32_t **tok_blocks;
    const devio_adapter **tok_adapter; /* [T] the LoRA adapter of each token's row, or NULL */
    const devio_adapter **slots; /* [adapter_slots] what adapter_add placed, borrowed */
    uint32_t *slot_gen;          /* [adapter_slots] the generation it was placed under */
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

    /* Hybrid models (numspec rule 10): per layer, the mixer's small weights
     * widened (mixer layers only) and its offset inside a state slot; the
     * state and snapshot pools; the mixer's activations. */
    ref_mixer_weights *mix;     /* [n_layers] */
    float **in_bias, **out_bias;/* [n_layers] in_proj / out_proj biases, or NULL */
    size_t *mix_off;            /* [n_layers] */
    float *ssm_slots;           /* [ssm_slots, slot_floats] */
    float *ssm_snaps;           /* [ssm_snapshots, slot_floats] */
    uint32_t in_pad, conv_pad, i_pad;
    float *zx;       /* [T, in_pad] in_proj outputs */
    float *xa;       /* [T, conv_pad] conv outputs */
    float *ym;       /* [T, i_pad] the mixer's output before out_proj */
    float *scan_tmp; /* [threads, ssm_state] */
} ref_state;

static void ref_destroy(void *sp);

/* calloc of a product of counts, counted in st->bytes; NULL on overflow. */
static void *calloc_n(ref_state *st, size_t a, size_t b, size_t size)
{
    if (a != 0 && b > SIZE_MAX / a / (size ? size : 1))
        return NULL;
    size_t n = a * b;
    void *p = calloc(n > 0 ? n : 1, size);
    if (p)
        st->bytes += a * b * size;
    return p;
}

static void widen_tensor(const devio_tensor *t, float *dst, size_t n)
{
    ref_widen(t->dtype, t->data, dst, n);
}

/* The KV pools, zeroed so that no slot ever holds a non-finite value. */
static bool create_kv(ref_state *st, uint32_t L)
{
    st->block_floats = (size_t)st->cfg.block_size * st->kv_dim;
    st->k_cache = calloc_n(st, L, 1, sizeof *st->k_cache);
    st->v_cache = calloc_n(st, L, 1, sizeof *st->v_cache);
    if (!st->k_cache || !st->v_cache)
        return false;
    for (uint32_t i = 0; i < L; i++) {
        if (st->model->layers[i].kind != DEVIO_LAYER_ATTENTION)
            continue; /* a mixer layer keeps no KV */
        st->k_cache[i] = calloc_n(st, st->cfg.kv_blocks, st->block_floats, sizeof(float));
        st->v_cache[i] = calloc_n(st, st->cfg.kv_blocks, st->block_floats, sizeof(float));
        if (!st->k_cache[i] || !st->v_cache[i])
            return false;
    }
    return true;
}

/* A small tensor of n floats widened into fresh memory; NULL when absent. */
static float *widen_new(ref_state *st, const devio_tensor *t, size_t n, bool *ok)
{
    if (!t->data)
        return NULL;
    float *p = calloc_n(st, n, 1, sizeof(float));
    if (p)
        widen_tensor(t, p, n);
    else
        *ok = false;
    return p;
}

/* Hybrid models: the mixers' small weights, the state pools (zeros) and
 * the mixer's step buffers. */
static bool create_mixers(ref_state *st, uint32_t L)
{
    const devio_model_shape *m = st->cfg.shape;
    if (m->n_mixers == 0)
        return true;
    uint32_t T = st->cfg.max_batch_tokens, H = m->ssm_heads;
    st->mix = calloc_n(st, L, 1, sizeof *st->mix);
    st->in_bias = calloc_n(st, L, 1, sizeof *st->in_bias);
    st->out_bias = calloc_n(st, L, 1, sizeof *st->out_bias);
    st->mix_off = calloc_n(st, L, 1, sizeof *st->mix_off);
    if (!st->mix || !st->in_bias || !st->out_bias || !st->mix_off)
        return false;
    bool ok = true;
    size_t off = 0;
    for (uint32_t i = 0; i < L && ok; i++) {
        const devio_mixer *x = &st->model->layers[i].mixer;
        if (st->model->layers[i].kind != DEVIO_LAYER_MIXER)
            continue;
        ref_mixer_weights *w = &st->mix[i];
        st->mix_off[i] = off;
        off += ref_mixer_layer_floats(m);
        w->conv_w = widen_new(st, &x->conv_w, (size_t)m->conv_dim * m->ssm_conv, &ok);
        /* No conv bias adds zeros: a lane sum is never -0, so v + 0 is v. */
        w->conv_b = x->conv_b.data ? widen_new(st, &x->conv_b, m->conv_dim, &ok)
                                   : calloc_n(st, m->conv_dim, 1, sizeof(float));
        w->dt_bias = widen_new(st, &x->dt_bias, H, &ok);
        w->a = widen_new(st, &x->a_log, H, &ok);
        w->d_skip = widen_new(st, &x->d_skip, H, &ok);
        w->norm = widen_new(st, &x->norm, m->ssm_inner, &ok);
        st->in_bias[i] = widen_new(st, &x->in_bias, m->in_dim, &ok);
        st->out_bias[i] = widen_new(st, &x->out_bias, m->d, &ok);
        if (!ok || !w->conv_b)
            return false;
        for (uint32_t h = 0; h < H; h++)
            w->a[h] = -devio_expf(w->a[h]);
    }
    st->in_pad = ref_pad32(m->in_dim);
    st->conv_pad = ref_pad32(m->conv_dim);
    st->i_pad = ref_pad32(m->ssm_inner);
    st->ssm_slots = calloc_n(st, st->cfg.ssm_slots, m->slot_floats, sizeof(float));
    st->ssm_snaps = calloc_n(st, st->cfg.ssm_snapshots, m->slot_floats, sizeof(float));
    st->zx = calloc_n(st, T, st->in_pad, sizeof(float));
    st->xa = calloc_n(st, T, st->conv_pad, sizeof(float));
    st->ym = calloc_n(st, T, st->i_pad, sizeof(float));
    st->scan_tmp = calloc_n(st, st->cfg.threads, m->ssm_state, sizeof(float));
    /* Residual projections with a bias store their output first. */
    if (!st->o_tmp)
        st->o_tmp = calloc_n(st, T, st->d_pad, sizeof(float));
    return st->ssm_slots && st->ssm_snaps && st->zx && st->xa && st->ym && st->scan_tmp &&
           st->o_tmp;
}

/* Norm weights and biases widened once: they are tiny and read per token. */
static bool create_small_weights(ref_state *st, uint32_t L)
{
    const devio_model *model = st->model;
    st->attn_norm = calloc_n(st, L, st->d, sizeof(float));
    st->ffn_norm = calloc_n(st, L, st->d, sizeof(float));
    st->final_norm = calloc_n(st, st->d, 1, sizeof(float));
    if (!st->attn_norm || !st->ffn_norm || !st->final_norm)
        return false;
    widen_tensor(&model->norm, st->final_norm, st->d);
    for (uint32_t i = 0; i < L; i++) {
        const devio_layer *l = &model->layers[i];
        widen_tensor(&l->attn_norm, st->attn_norm + (size_t)i * st->d, st->d);
        if (l->ffn_norm.data) /* Mamba2 layers have no MLP */
            widen_tensor(&l->ffn_norm, st->ffn_norm + (size_t)i * st->d, st->d);
    }
    if (!st->cfg.shape->has_bias)
        return true;
    /* A layer without one of the biases gets zeros: x + 0 is x (the
     * projection sum is never -0), so the result is the unbiased one. */
    st->bq = calloc_n(st, L, st->q_dim, sizeof(float));
    st->bk = calloc_n(st, L, st->kv_dim, sizeof(float));
    st->bv = calloc_n(st, L, st->kv_dim, sizeof(float));
    if (!st->bq || !st->bk || !st->bv)
        return false;
    for (uint32_t i = 0; i < L; i++) {
        const devio_layer *l = &model->layers[i];
        if (l->bq.data)
            widen_tensor(&l->bq, st->bq + (size_t)i * st->q_dim, st->q_dim);
        if (l->bk.data)
            widen_tensor(&l->bk, st->bk + (size_t)i * st->kv_dim, st->kv_dim);
        if (l->bv.data)
            widen_tensor(&l->bv, st->bv + (size_t)i * st->kv_dim, st->kv_dim);
    }
    return true;
}

/* Activations and per-token tables for max_batch_tokens tokens. */
static bool create_buffers(ref_state *st)
{
    const devio_backend_config *cfg = &st->cfg;
    uint32_t T = cfg->max_batch_tokens, R = cfg->max_lora_rank;
    st->x = calloc_n(st, T, st->d_pad, sizeof(float));
    st->h = calloc_n(st, T, st->d_pad, sizeof(float));
    st->q = calloc_n(st, T, st->q_dim, sizeof(float));
    st->k = calloc_n(st, T, st->kv_dim, sizeof(float));
    st->v = calloc_n(st, T, st->kv_dim, sizeof(float));
    st->att = calloc_n(st, T, st->q_pad, sizeof(float));
    st->act = calloc_n(st, T, st->f_pad, sizeof(float));
    st->tok_pos = calloc_n(st, T, 1, sizeof *st->tok_pos);
    st->tok_blocks = calloc_n(st, T, 1, sizeof *st->tok_blocks);
    st->tok_adapter = calloc_n(st, T, 1, sizeof *st->tok_adapter);
    st->slots = calloc_n(st, cfg->adapter_slots, 1, sizeof *st->slots);
    st->slot_gen = calloc_n(st, cfg->adapter_slots, 1, sizeof *st->slot_gen);
    uint32_t widest = st->d_pad > st->f_pad ? st->d_pad : st->f_pad;
    widest = widest > st->q_pad ? widest : st->q_pad;
    uint32_t inner_pad = ref_pad32(cfg->shape->ssm_inner); /* out_proj's lora_A rows */
    widest = widest > inner_pad ? widest : inner_pad;
    widest = R > widest ? R : widest;
    st->lora_row = calloc_n(st, widest, 1, sizeof(float));
    st->lora_a = calloc_n(st, R ? R : 1, 1, sizeof(float));
    if (R && cfg->adapter_slots) {
        st->o_tmp = calloc_n(st, T, st->d_pad, sizeof(float));
        st->g_tmp = calloc_n(st, T, st->f_pad, sizeof(float));
        st->u_tmp = calloc_n(st, T, st->f_pad, sizeof(float));
        if (!st->o_tmp || !st->g_tmp || !st->u_tmp)
            return false;
    }
    st->out_ptr = calloc_n(st, T, 1, sizeof *st->out_ptr);
    return st->x && st->h && st->q && st->k && st->v && st->att && st->act && st->tok_pos &&
           st->tok_blocks && st->out_ptr && st->tok_adapter && st->slots && st->slot_gen &&
           st->lora_row && st->lora_a;
}

static devio_status ref_create(const devio_model *model, const devio_backend_config *cfg,
                               void **state, devio_error *err)
{
    *state = NULL;
    if (cfg->numerics != DEVIO_NUMERICS_STRICT)
        return devio_fail(err, DEVIO_E_UNSUPPORTED,
                          "the reference computes strict numerics only (fast needs a backend "
                          "with fast kernels)");
    if (cfg->block_size == 0 || cfg->kv_blocks == 0 || cfg->max_batch_tokens == 0 ||
        cfg->max_rows == 0 || cfg->max_seq_len == 0 || !cfg->shape || !cfg->rope_cos ||
        !cfg->logits_host)
        return devio_fail(err, DEVIO_E_INVALID, "backend configuration has a zero size");
    ref_state *st = calloc(1, sizeof *st);
    if (!st)
        return devio_fail(err, DEVIO_E_NOMEM, "out of memory for the reference backend");
    const devio_model_shape *m = cfg->shape;
    st->model = model;
    st->cfg = *cfg;
    if (st->cfg.threads == 0)
        st->cfg.threads = 1;
    st->d = m->d;
    st->n_heads = m->n_heads;
    st->n_kv = m->n_kv_heads;
    st->hd = m->head_dim;
    st->f = m->f;
    st->vocab = m->vocab;
    st->q_dim = m->q_dim;
    st->kv_dim = m->kv_dim;
    st->d_pad = ref_pad32(st->d);
    st->q_pad = ref_pad32(st->q_dim);
    st->f_pad = ref_pad32(st->f);
    st->eps = m->eps;
    st->attn_scale = m->attn_scale;
    st->rope_cos = cfg->rope_cos;
    st->rope_sin = cfg->rope_sin;
    if (!create_kv(st, m->n_layers) || !create_small_weights(st, m->n_layers) ||
        !create_buffers(st) || !create_mixers(st, m->n_layers))
        goto out_nomem;
    st->pool = devio_pool_create(st->cfg.threads);
    if (!st->pool) {
        ref_destroy(st);
        return devio_fail(err, DEVIO_E_DEVICE, "cannot start %u compute threads", st->cfg.threads);
    }
    st->n_scratch = devio_pool_threads(st->pool);
    st->scratch = calloc_n(st, st->n_scratch, 1, sizeof *st->scratch);
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
    for (uint32_t i = 0; i < st->cfg.shape->n_layers; i++) {
        if (st->k_cache)
            free(st->k_cache[i]);
        if (st->v_cache)
            free(st->v_cache[i]);
    }
    for (uint32_t i = 0; st->mix && i < st->cfg.shape->n_layers; i++) {
        ref_mixer_weights *w = &st->mix[i];
        void *mb[] = {w->conv_w, w->conv_b, w->dt_bias, w->a, w->d_skip, w->norm,
                      st->in_bias[i], st->out_bias[i]};
        for (size_t k = 0; k < sizeof mb / sizeof *mb; k++)
            free(mb[k]);
    }
    void *bufs[] = {st->k_cache, st->v_cache, st->attn_norm, st->ffn_norm, st->final_norm,
                    st->mix, st->in_bias, st->out_bias, st->mix_off, st->ssm_slots,
                    st->ssm_snaps, st->zx, st->xa, st->ym, st->scan_tmp,
                    st->bq, st->bk, st->bv, st->x, st->h, st->q, st->k, st->v, st->att,
                    st->act, st->tok_pos, st->tok_blocks, st->tok_adapter, st->slots,
                    st->slot_gen, st->lora_row, st->lora_a, st->o_tmp, st->g_tmp, st->u_tmp,
                    st->out_ptr};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        free(bufs[i]);
    free(st);
}

static void ref_info(void *sp, devio_device_info *out)
{
    ref_state *st = sp;
#if defined(__x86_64__)
    const char *arch = "x86-64";
#elif defined(__aarch64__)
    const char *arch = "arm64";
#elif defined(__wasm__)
    const char *arch = "wasm32";
#else
    const char *arch = "host";
#endif
    snprintf(out->device, sizeof out->device, "%s CPU, %u thread%s (reference)", arch,
             st->n_scratch, st->n_scratch == 1 ? "" : "s");
    out->memory_used = st->bytes;
}

static devio_status ref_adapter_add(void *sp, uint32_t slot, uint32_t generation,
                                    const devio_adapter *a, devio_error *err)
{
    ref_state *st = sp;
    if (slot >= st->cfg.adapter_slots)
        return devio_fail(err, DEVIO_E_INVALID, "adapter slot %u of %u", slot,
                          st->cfg.adapter_slots);
    if (a->rank == 0 || a->rank > st->cfg.max_lora_rank || a->n_layers != st->cfg.shape->n_layers)
        return devio_fail(err, DEVIO_E_INVALID, "adapter '%s' of rank %u does not fit this backend",
                          a->name, a->rank);
    /* Host weights are used in place: nothing to copy. */
    st->slots[slot] = a;
    st->slot_gen[slot] = generation;
    return DEVIO_OK;
}

static void ref_adapter_remove(void *sp, uint32_t slot, uint32_t generation)
{
    ref_state *st = sp;
    if (slot < st->cfg.adapter_slots && st->slot_gen[slot] == generation)
        st->slots[slot] = NULL;
}

/* Per-token tables of a checked batch: positions, block tables, adapters.
 * A row naming a slot that holds another generation is refused. */
static devio_status prepare(ref_state *st, const devio_batch *b, devio_error *err)
{
    for (uint32_t r = 0; r < b->n_rows; r++) {
        const devio_batch_row *row = &b->rows[r];
        const devio_adapter *ad = NULL;
        if (row->adapter >= 0) {
            ad = st->slots[row->adapter];
            if (!ad || st->slot_gen[row->adapter] != row->adapter_gen)
                return devio_fail_at(err, DEVIO_E_DEVICE, "row", r,
                                     "row %u names adapter slot %d generation %u, not held", r,
                                     row->adapter, row->adapter_gen);
        }
        for (uint32_t i = 0; i < row->n_tokens; i++) {
            uint32_t t = row->tok_start + i;
            st->tok_pos[t] = b->tok_pos[t];
            st->tok_blocks[t] = row->blocks;
            st->tok_adapter[t] = ad;
        }
    }
    st->lora_targets = b->lora_targets;
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
    uint32_t rd = st->cfg.shape->rotary_dim, half = rd / 2;
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
        ref_rope(st->q + (size_t)t * st->q_dim, st->n_heads, st->hd, rd, cs, sn);
        ref_rope(st->k + (size_t)t * st->kv_dim, st->n_kv, st->hd, rd, cs, sn);
        size_t blk = st->tok_blocks[t][pos / bs];
        for (uint32_t g = 0; g < st->n_kv; g++) {
            size_t slot = ((blk * st->n_kv + g) * bs + pos % bs) * st->hd;
            size_t src = (size_t)t * st->kv_dim + (size_t)g * st->hd;
            memcpy(kc + slot, st->k + src, st->hd * sizeof(float));
            memcpy(vc + slot, st->v + src, st->hd * sizeof(float));
        }
    }
}

/* x += W in (+ bias) (REF_EPI_ADD); with a bias, or when the step's
 * adapters target the module, the projection is stored, biased, adapted,
 * then added: z = dot + b, z' = z + u*s, x + z' (numspec rules 3, 3a). */
static void residual_proj(ref_state *st, uint32_t li, devio_lora_target target, ref_matmul *mm,
                          const float *bias, uint32_t n_tok)
{
    bool lora = target < DEVIO_LORA_N_TARGETS && (st->lora_targets & (1u << target));
    if (!lora && !bias) {
        ref_matmul_run(st->pool, st->scratch, mm, 1);
        return;
    }
    float *x = mm->y;
    mm->epi = bias ? REF_EPI_BIAS : REF_EPI_STORE;
    mm->bias = bias;
    mm->y = st->o_tmp;
    ref_matmul_run(st->pool, st->scratch, mm, 1);
    if (lora)
        lora_add(st, li, target, mm->x, mm->ldx, st->o_tmp, st->d_pad, n_tok);
    for (uint32_t t = 0; t < n_tok; t++)
        for (uint32_t i = 0; i < st->d; i++) {
            size_t k = (size_t)t * st->d_pad + i;
            x[k] = x[k] + st->o_tmp[k];
        }
}

/* Attention of layer li and o_proj into the residual. */
static void layer_attn_out(ref_state *st, uint32_t li, uint32_t n_tok)
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
    residual_proj(st, li, DEVIO_LORA_O, &o, NULL, n_tok);
}

/* The MLP of layer li with its norm and residual. */
static void layer_mlp(ref_state *st, uint32_t li, uint32_t n_tok)
{
    const devio_layer *l = &st->model->layers[li];
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
    residual_proj(st, li, DEVIO_LORA_DOWN, &down, NULL, n_tok);
}

/* A whole mixer layer's first half (numspec rule 10) over every token of
 * the batch: norm, in_proj, conv, recurrence, gated norm, out_proj into the
 * residual. Every token runs: each one moves its row's state. */
static void layer_mixer(ref_state *st, const devio_batch *b, uint32_t li, uint32_t n_tok)
{
    const devio_mixer *x = &st->model->layers[li].mixer;
    const devio_model_shape *m = st->cfg.shape;
    rmsnorm_rows(st, st->h, st->x, st->attn_norm + (size_t)li * st->d, n_tok);
    ref_matmul in = {.w = x->in_proj.data, .dtype = x->in_proj.dtype, .m = m->in_dim, .n = st->d,
                     .epi = st->in_bias[li] ? REF_EPI_BIAS : REF_EPI_STORE,
                     .bias = st->in_bias[li], .x = st->h, .ldx = st->d_pad, .n_tok = n_tok,
                     .y = st->zx, .ldy = st->in_pad};
    ref_matmul_run(st->pool, st->scratch, &in, 1);
    lora_add(st, li, DEVIO_LORA_IN_PROJ, st->h, st->d_pad, st->zx, st->in_pad, n_tok);
    ref_mixer mx = {.shape = m, .batch = b, .w = &st->mix[li], .zx = st->zx, .ldzx = st->in_pad,
                    .xa = st->xa, .ldxa = st->conv_pad, .y = st->ym, .ldy = st->i_pad,
                    .slots = st->ssm_slots, .snaps = st->ssm_snaps, .layer_off = st->mix_off[li],
                    .tmp = st->scan_tmp};
    ref_mixer_run(st->pool, &mx);
    ref_matmul out = {.w = x->out_proj.data, .dtype = x->out_proj.dtype, .m = st->d,
                      .n = m->ssm_inner, .epi = REF_EPI_ADD, .x = st->ym, .ldx = st->i_pad,
                      .n_tok = n_tok, .y = st->x, .ldy = st->d_pad};
    residual_proj(st, li, DEVIO_LORA_OUT_PROJ, &out, st->out_bias[li], n_tok);
}

/* What of layer li writes state, for every token: attention's K and V, or
 * the whole mixer. */
static void layer_first(ref_state *st, const devio_batch *b, uint32_t li, uint32_t n_tok)
{
    if (st->model->layers[li].kind == DEVIO_LAYER_MIXER)
        layer_mixer(st, b, li, n_tok);
    else
        layer_qkv(st, li, n_tok);
}

/* The rest of layer li, which only the tokens that go on need. */
static void layer_second(ref_state *st, uint32_t li, uint32_t n_tok)
{
    if (st->model->layers[li].kind == DEVIO_LAYER_ATTENTION)
        layer_attn_out(st, li, n_tok);
    if (st->cfg.shape->has_mlp)
        layer_mlp(st, li, n_tok);
}

/* The whole step, on the calling thread (the pool's threads help). */
static devio_status ref_wait(void *sp, const devio_batch *b, devio_error *err)
{
    ref_state *st = sp;
    devio_status s = prepare(st, b, err);
    if (s != DEVIO_OK)
        return s;
    uint32_t n_tok = b->n_tokens;
    const devio_model *m = st->model;
    uint32_t L = st->cfg.shape->n_layers;

    for (uint32_t c = 0; c < b->n_copies; c++) {
        size_t src = (size_t)b->copy_src[c] * st->block_floats;
        size_t dst = (size_t)b->copy_dst[c] * st->block_floats;
        if (src == dst)
            continue;
        for (uint32_t li = 0; li < L; li++) {
            if (!st->k_cache[li])
                continue;
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

    /* A sequence that starts here starts from the zero state. */
    size_t slot_floats = st->cfg.shape->slot_floats;
    for (uint32_t r = 0; r < b->n_rows && slot_floats; r++)
        if (b->rows[r].pos0 == 0)
            memset(st->ssm_slots + (size_t)b->rows[r].ssm_slot * slot_floats, 0,
                   slot_floats * sizeof(float));

    uint32_t last = L - 1;
    for (uint32_t li = 0; li < last; li++) {
        layer_first(st, b, li, n_tok);
        layer_second(st, li, n_tok);
    }
    layer_first(st, b, last, n_tok);
    /* Past the last layer's K and V only the tokens whose logits are wanted
     * matter: they move to the front, in batch order, and only they go on
     * (a prefill asking for its last logits skips most of a layer). */
    for (uint32_t i = 0; i < b->n_out; i++) {
        uint32_t t = b->out_tok[i];
        if (i != t) {
            memcpy(st->q + (size_t)i * st->q_dim, st->q + (size_t)t * st->q_dim,
                   st->q_dim * sizeof(float));
            memcpy(st->x + (size_t)i * st->d_pad, st->x + (size_t)t * st->d_pad,
                   st->d * sizeof(float));
            st->tok_pos[i] = st->tok_pos[t];
            st->tok_blocks[i] = st->tok_blocks[t];
            st->tok_adapter[i] = st->tok_adapter[t];
        }
        st->out_ptr[i] = st->cfg.logits_host + (size_t)b->out_slot[i] * st->vocab;
    }
    if (b->n_out > 0) {
        layer_second(st, last, b->n_out);
        rmsnorm_rows(st, st->h, st->x, st->final_norm, b->n_out);
        ref_matmul lm = {.w = m->lm_head.data, .dtype = m->lm_head.dtype, .m = st->vocab,
                         .n = st->d, .x = st->h, .ldx = st->d_pad, .n_tok = b->n_out,
                         .y_rows = st->out_ptr};
        ref_matmul_run(st->pool, st->scratch, &lm, 1);
    }
    return DEVIO_OK;
}

/* One whole state slot or snapshot onto another (effects, nothing in flight). */
static devio_status ref_ssm_copy(void *sp, devio_ssm_ref dst, devio_ssm_ref src, devio_error *err)
{
    (void)err;
    ref_state *st = sp;
    size_t n = st->cfg.shape->slot_floats;
    float *d = (dst.snapshot ? st->ssm_snaps : st->ssm_slots) + (size_t)dst.index * n;
    const float *s = (src.snapshot ? st->ssm_snaps : st->ssm_slots) + (size_t)src.index * n;
    memcpy(d, s, n * sizeof(float));
    return DEVIO_OK;
}

/* Nothing to enqueue: the step runs in wait, which the core calls next for it. */
static devio_status ref_submit(void *sp, const devio_batch *b, devio_error *err)
{
    (void)sp;
    (void)b;
    (void)err;
    return DEVIO_OK;
}

const devio_backend_ops devio_ref_backend = {
    .abi = DEVIO_BACKEND_ABI,
    .name = "ref",
    .create = ref_create,
    .destroy = ref_destroy,
    .info = ref_info,
    .submit = ref_submit,
    .wait = ref_wait,
    .adapter_add = ref_adapter_add,
    .adapter_remove = ref_adapter_remove,
    .ssm_copy = ref_ssm_copy,
};
