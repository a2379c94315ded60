/* ref_step.c - one forward step of the reference backend: embedding, every layer (attention
 * or Mamba-2 mixer, then the MLP), the final norm and the logits, in the order of
 * device/numerics/numspec.h. It never allocates; the state it works in is made by ref_backend.c. */
#include <string.h>

#include "device/numerics/numerics.h"
#include "device/status.h"
#include "ref/ref_kv.h"
#include "ref/ref_state.h"

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

/* Qwen3 (rule 4a): every q and k head RMSNormed over head_dim, in place. */
static void qk_norm_rows(ref_state *st, uint32_t li, uint32_t n_tok)
{
    const float *qw = st->q_norm + (size_t)li * st->hd, *kw = st->k_norm + (size_t)li * st->hd;
    float *tmp = st->lora_row;
    for (uint32_t t = 0; t < n_tok; t++) {
        for (uint32_t h = 0; h < st->n_heads + st->n_kv; h++) {
            bool is_q = h < st->n_heads;
            float *x = is_q ? st->q + (size_t)t * st->q_dim + (size_t)h * st->hd
                            : st->k + (size_t)t * st->kv_dim + (size_t)(h - st->n_heads) * st->hd;
            memcpy(tmp, x, st->hd * sizeof(float));
            ref_rmsnorm(x, tmp, is_q ? qw : kw, st->hd, st->eps);
        }
    }
}

/* First half of layer li: norm, q/k/v, RoPE, and K and V into the cache. */
static void layer_qkv(ref_state *st, uint32_t li, uint32_t n_tok)
{
    const ref_panels *P = st->panels + (size_t)li * REF_W_N;
    uint32_t rd = st->cfg.shape->rotary_dim, half = rd / 2;
    ref_kv *kc = st->k_cache[li], *vc = st->v_cache[li];
    uint32_t bs = st->cfg.block_size;

    rmsnorm_rows(st, st->h, st->x, st->attn_norm + (size_t)li * st->d, n_tok);

    ref_matmul qkv[3] = {
        {.w = &P[REF_WQ], .x = st->h, .ldx = st->d_pad, .n_tok = n_tok, .y = st->q, .ldy = st->q_dim},
        {.w = &P[REF_WK], .x = st->h, .ldx = st->d_pad, .n_tok = n_tok, .y = st->k, .ldy = st->kv_dim},
        {.w = &P[REF_WV], .x = st->h, .ldx = st->d_pad, .n_tok = n_tok, .y = st->v, .ldy = st->kv_dim},
    };
    if (st->bq) {
        qkv[0].epi = qkv[1].epi = qkv[2].epi = REF_EPI_BIAS;
        qkv[0].bias = st->bq + (size_t)li * st->q_dim;
        qkv[1].bias = st->bk + (size_t)li * st->kv_dim;
        qkv[2].bias = st->bv + (size_t)li * st->kv_dim;
    }
    ref_matmul_run(&st->work, qkv, 3);
    lora_add(st, li, DEVIO_LORA_Q, st->h, st->d_pad, st->q, st->q_dim, n_tok);
    lora_add(st, li, DEVIO_LORA_K, st->h, st->d_pad, st->k, st->kv_dim, n_tok);
    lora_add(st, li, DEVIO_LORA_V, st->h, st->d_pad, st->v, st->kv_dim, n_tok);
    if (st->q_norm)
        qk_norm_rows(st, li, n_tok);

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
            ref_kv_put(kc + slot, st->k + src, st->hd);
            ref_kv_put(vc + slot, st->v + src, st->hd);
        }
    }
}

/* x += W in (+ bias) (REF_EPI_ADD; x + (W in) * r with Granite's residual
 * multiplier r, rule 7); with a bias, or when the step's adapters target
 * the module, the projection is stored, biased, adapted, then added:
 * z = dot + b, z' = z + u*s, x + z' * r (numspec rules 3, 3a, 7). */
static void residual_proj(ref_state *st, uint32_t li, devio_lora_target target, ref_matmul *mm,
                          const float *bias, uint32_t n_tok)
{
    bool lora = target < DEVIO_LORA_N_TARGETS && (st->lora_targets & (1u << target));
    float r = st->cfg.shape->res_mult;
    if (!lora && !bias) {
        if (r != 1.0f) {
            mm->epi = REF_EPI_ADD_SCALED;
            mm->scale = r;
        }
        ref_matmul_run(&st->work, mm, 1);
        return;
    }
    float *x = mm->y;
    mm->epi = bias ? REF_EPI_BIAS : REF_EPI_STORE;
    mm->bias = bias;
    mm->y = st->o_tmp;
    ref_matmul_run(&st->work, mm, 1);
    if (lora)
        lora_add(st, li, target, mm->x, mm->ldx, st->o_tmp, st->d_pad, n_tok);
    for (uint32_t t = 0; t < n_tok; t++)
        for (uint32_t i = 0; i < st->d; i++) {
            size_t k = (size_t)t * st->d_pad + i;
            x[k] = x[k] + (r != 1.0f ? st->o_tmp[k] * r : st->o_tmp[k]);
        }
}

/* Attention of layer li and o_proj into the residual. */
static void layer_attn_out(ref_state *st, uint32_t li, uint32_t n_tok)
{
    const ref_panels *P = st->panels + (size_t)li * REF_W_N;
    const ref_kv *kc = st->k_cache[li], *vc = st->v_cache[li];
    uint32_t bs = st->cfg.block_size;

    ref_attention at = {
        .q = st->q, .ldq = st->q_dim, .k_cache = kc, .v_cache = vc,
        .block_size = bs, .n_heads = st->n_heads, .n_kv_heads = st->n_kv, .head_dim = st->hd,
        .n_tok = n_tok, .tok_pos = st->tok_pos, .tok_blocks = st->tok_blocks,
        .scale = st->attn_scale, .window = st->cfg.shape->window, .out = st->att,
        .ldo = st->q_pad,
    };
    ref_attention_run(st->pool, st->scratch, &at);

    ref_matmul o = {.w = &P[REF_WO], .epi = REF_EPI_ADD, .x = st->att, .ldx = st->q_pad, .n_tok = n_tok,
                    .y = st->x, .ldy = st->d_pad};
    residual_proj(st, li, DEVIO_LORA_O, &o, NULL, n_tok);
}

/* The MLP of layer li with its norm and residual. */
static void layer_mlp(ref_state *st, uint32_t li, uint32_t n_tok)
{
    const ref_panels *P = st->panels + (size_t)li * REF_W_N;
    rmsnorm_rows(st, st->h, st->x, st->ffn_norm + (size_t)li * st->d, n_tok);

    ref_matmul gu = {.w = &P[REF_WGATE], .w2 = &P[REF_WUP], .epi = REF_EPI_SILU_MUL, .x = st->h,
                     .ldx = st->d_pad, .n_tok = n_tok, .y = st->act, .ldy = st->f_pad};
    if (st->lora_targets & ((1u << DEVIO_LORA_GATE) | (1u << DEVIO_LORA_UP))) {
        /* Unfused: gate and up stored, adapted, then silu(gate) * up as the
         * fused epilogue computes it, so rows without LoRA keep their bits. */
        ref_matmul pair[2] = {gu, gu};
        pair[0].epi = pair[1].epi = REF_EPI_STORE;
        pair[0].w2 = pair[1].w2 = NULL;
        pair[1].w = &P[REF_WUP];
        pair[0].y = st->g_tmp;
        pair[1].y = st->u_tmp;
        ref_matmul_run(&st->work, pair, 2);
        lora_add(st, li, DEVIO_LORA_GATE, st->h, st->d_pad, st->g_tmp, st->f_pad, n_tok);
        lora_add(st, li, DEVIO_LORA_UP, st->h, st->d_pad, st->u_tmp, st->f_pad, n_tok);
        for (uint32_t t = 0; t < n_tok; t++)
            for (uint32_t i = 0; i < st->f; i++) {
                size_t k = (size_t)t * st->f_pad + i;
                st->act[k] = devio_siluf(st->g_tmp[k]) * st->u_tmp[k];
            }
    } else {
        ref_matmul_run(&st->work, &gu, 1);
    }

    ref_matmul down = {.w = &P[REF_WDOWN], .epi = REF_EPI_ADD, .x = st->act, .ldx = st->f_pad, .n_tok = n_tok,
                       .y = st->x, .ldy = st->d_pad};
    residual_proj(st, li, DEVIO_LORA_DOWN, &down, NULL, n_tok);
}

/* A whole mixer layer's first half (numspec rule 10) over every token of
 * the batch: norm, in_proj, conv, recurrence, gated norm, out_proj into the
 * residual. Every token runs: each one moves its row's state. */
static void layer_mixer(ref_state *st, const devio_batch *b, uint32_t li, uint32_t n_tok)
{
    const ref_panels *P = st->panels + (size_t)li * REF_W_N;
    const devio_model_shape *m = st->cfg.shape;
    rmsnorm_rows(st, st->h, st->x, st->attn_norm + (size_t)li * st->d, n_tok);
    ref_matmul in = {.w = &P[REF_WIN], .epi = st->in_bias[li] ? REF_EPI_BIAS : REF_EPI_STORE,
                     .bias = st->in_bias[li], .x = st->h, .ldx = st->d_pad, .n_tok = n_tok,
                     .y = st->zx, .ldy = st->in_pad};
    ref_matmul_run(&st->work, &in, 1);
    lora_add(st, li, DEVIO_LORA_IN_PROJ, st->h, st->d_pad, st->zx, st->in_pad, n_tok);
    ref_mixer mx = {.shape = m, .batch = b, .w = &st->mix[li], .zx = st->zx, .ldzx = st->in_pad,
                    .xa = st->xa, .ldxa = st->conv_pad, .y = st->ym, .ldy = st->i_pad,
                    .slots = st->ssm_slots, .snaps = st->ssm_snaps, .layer_off = st->mix_off[li],
                    .tmp = st->scan_tmp};
    ref_mixer_run(st->pool, &mx);
    ref_matmul out = {.w = &P[REF_WOUT], .epi = REF_EPI_ADD, .x = st->ym, .ldx = st->i_pad,
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

devio_status ref_step_run(void *sp, const devio_batch *b, devio_error *err)
{
    ref_state *st = sp;
    devio_status s = prepare(st, b, err);
    if (s != DEVIO_OK)
        return s;
    uint32_t n_tok = b->n_tokens;
    const devio_model *m = st->model;
    uint32_t L = st->cfg.shape->n_layers;

    for (uint32_t c = 0; c < b->n_copies; c++) {
        size_t src = (size_t)b->copy_src[c] * st->block_elems;
        size_t dst = (size_t)b->copy_dst[c] * st->block_elems;
        if (src == dst)
            continue;
        for (uint32_t li = 0; li < L; li++) {
            if (!st->k_cache[li])
                continue;
            memcpy(st->k_cache[li] + dst, st->k_cache[li] + src, st->block_elems * sizeof(ref_kv));
            memcpy(st->v_cache[li] + dst, st->v_cache[li] + src, st->block_elems * sizeof(ref_kv));
        }
    }
    if (n_tok == 0)
        return DEVIO_OK;

    size_t row_bytes = (size_t)devio_dtype_row_bytes(m->embed.dtype, st->d);
    for (uint32_t t = 0; t < n_tok; t++) {
        const char *row = (const char *)m->embed.data + (size_t)b->tokens[t] * row_bytes;
        float *x = st->x + (size_t)t * st->d_pad;
        ref_widen(m->embed.dtype, row, x, st->d);
        if (st->cfg.shape->emb_mult != 1.0f) /* Granite, rule 1 */
            for (uint32_t i = 0; i < st->d; i++)
                x[i] = x[i] * st->cfg.shape->emb_mult;
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
        st->out_ptr[i] = st->cfg.logits_host + (size_t)b->out_row[i] * st->vocab;
    }
    if (b->n_out > 0) {
        layer_second(st, last, b->n_out);
        rmsnorm_rows(st, st->h, st->x, st->final_norm, b->n_out);
        ref_matmul lm = {.w = &st->lm_panels, .x = st->h, .ldx = st->d_pad, .n_tok = b->n_out,
                         .y_rows = st->out_ptr};
        ref_matmul_run(&st->work, &lm, 1);
        float ls = st->cfg.shape->logit_scale;
        for (uint32_t i = 0; i < b->n_out && ls != 1.0f; i++) /* Granite, rule 8 */
            for (uint32_t v = 0; v < st->vocab; v++)
                st->out_ptr[i][v] = st->out_ptr[i][v] / ls;
    }
    return DEVIO_OK;
}

