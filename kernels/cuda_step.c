/* cuda_step.c - one step on the GPU: submit packs the batch's tables into a
 * pinned buffer, uploads them with one copy and enqueues every kernel of the
 * forward pass on the backend's stream, then records an event; wait syncs on
 * that event. With max_depth 2 the host packs and enqueues step n+1 while the
 * GPU computes step n. Each layer is attention (here) or a Mamba-2 mixer
 * (cuda_mixer.c), then the MLP unless the model has none. The order of work
 * is the reference's (ref_step.c), so every number is the same. It must
 * never allocate and never block in submit beyond what the CUDA runtime does
 * to enqueue. */
#include <string.h>

#include <cuda_runtime_api.h>

#include "device/status.h"
#include "kernels/cuda_fast.h"
#include "kernels/cuda_gemm.h"
#include "kernels/cuda_step.h"

/* Rows naming an adapter slot must name the generation it holds. */
static devio_status check_adapters(const cuda_state *st, const devio_batch *b, devio_error *err)
{
    for (uint32_t r = 0; r < b->n_rows; r++) {
        const devio_batch_row *row = &b->rows[r];
        if (row->adapter < 0)
            continue;
        const cuda_adapter_slot *sl = &st->slots[row->adapter];
        if (!sl->held || sl->generation != row->adapter_gen)
            return devio_fail_at(err, DEVIO_E_DEVICE, "row", r,
                                 "row %u names adapter slot %d generation %u, not held", r,
                                 row->adapter, row->adapter_gen);
    }
    return DEVIO_OK;
}

/* The SGMV groups of n tokens whose adapter slots are slot[] (cuda_fast.h):
 * n_slots + 1 offsets, then the tokens of slot 0, of slot 1, ... */
static void pack_groups(uint32_t *w, const uint32_t *slot, uint32_t n, uint32_t n_slots)
{
    uint32_t *list = w + n_slots + 1, k = 0;
    for (uint32_t s = 0; s < n_slots; s++) {
        w[s] = k;
        for (uint32_t t = 0; t < n; t++)
            if (slot[t] == s)
                list[k++] = t;
    }
    w[n_slots] = k;
}

/* The batch's tables into host words w, laid out as
 *   tokens[n] pos[n] bt_off[n] slot[n] out_tok[o] out_pos[o] out_bt[o] out_row[o]
 * then, under fast numerics with adapter slots, the SGMV groups of all
 * tokens and of the outputs (slots + 1 + n and slots + 1 + o words), then,
 * for hybrid models, the mixer's row tables (cuda_mixer_pack), then
 * the rows' block tables bt[...] last (so that every offset before follows
 * from a graph's key), and the device views of them. Returns the words used. */
static uint32_t pack(cuda_step *sp, uint32_t *w)
{
    cuda_state *st = sp->st;
    const devio_batch *b = sp->b;
    uint32_t n = b->n_tokens, o = b->n_out, bs = st->cfg.block_size;
    uint32_t *tok = w, *pos = w + n, *bt_off = w + 2 * n, *slot = w + 3 * n;
    uint32_t *out_tok = w + 4 * n, *out_pos = out_tok + o, *out_bt = out_pos + o;
    uint32_t *out_row = out_bt + o, used = 4 * n + 4 * o, nb = 0;
    const uint32_t *d = st->meta;
    const uint32_t *groups_all = NULL, *groups_out = NULL; /* device */
    if (st->fast && st->cfg.adapter_slots > 0) {
        /* filled below, once slot[] and out_row[] are */
        groups_all = d + used;
        used += st->cfg.adapter_slots + 1 + n;
        groups_out = d + used;
        used += st->cfg.adapter_slots + 1 + o;
    }
    sp->mixer_words = st->sh.n_mixers > 0 ? cuda_mixer_pack(sp, w + used, d + used) : 0;
    used += sp->mixer_words;
    uint32_t *bt = w + used;
    for (uint32_t r = 0; r < b->n_rows; r++) {
        const devio_batch_row *row = &b->rows[r];
        uint32_t blocks = (row->pos0 + row->n_tokens + bs - 1) / bs;
        uint32_t keys = row->pos0 + row->n_tokens;
        if (st->sh.window && keys > st->sh.window)
            keys = st->sh.window;
        sp->max_keys = keys > sp->max_keys ? keys : sp->max_keys;
        memcpy(bt + nb, row->blocks, blocks * sizeof *bt);
        for (uint32_t i = 0; i < row->n_tokens; i++) {
            uint32_t t = row->tok_start + i;
            tok[t] = (uint32_t)b->tokens[t];
            pos[t] = b->tok_pos[t];
            bt_off[t] = nb;
            slot[t] = (uint32_t)row->adapter;
        }
        nb += blocks;
    }
    for (uint32_t i = 0; i < o; i++) {
        uint32_t t = b->out_tok[i];
        out_tok[i] = t;
        out_pos[i] = pos[t];
        out_bt[i] = bt_off[t];
        out_row[i] = slot[t];
    }
    if (groups_all) {
        pack_groups(w + (groups_all - d), slot, n, st->cfg.adapter_slots);
        pack_groups(w + (groups_out - d), out_row, o, st->cfg.adapter_slots);
    }
    sp->all = (step_tables){.tokens = (const int32_t *)d, .pos = d + n, .bt_off = d + 2 * n,
                            .slot = (const int32_t *)(d + 3 * n), .bt = d + used,
                            .groups = groups_all};
    sp->out = (step_tables){.pos = d + 4 * n + o, .bt_off = d + 4 * n + 2 * o,
                            .slot = (const int32_t *)(d + 4 * n + 3 * o), .bt = d + used,
                            .out_tok = d + 4 * n, .groups = groups_out};
    return used + nb;
}

/* The KV pool of attention layer li: f32, or f16 under fast numerics. */
static cuda_kv layer_kv(const cuda_state *st, uint32_t li, const step_tables *t)
{
    uint64_t off = (uint64_t)st->layers[li].kv * st->layer_elems;
    cuda_kv kv = {.block_size = st->cfg.block_size, .n_heads = st->sh.n_heads,
                  .n_kv = st->sh.n_kv_heads, .hd = st->sh.head_dim, .rd = st->sh.rotary_dim,
                  .window = st->sh.window, .pos = t->pos, .bt_off = t->bt_off, .bt = t->bt};
    if (st->fast) {
        kv.k16 = (uint16_t *)st->k_cache + off;
        kv.v16 = (uint16_t *)st->v_cache + off;
    } else {
        kv.k = (float *)st->k_cache + off;
        kv.v = (float *)st->v_cache + off;
    }
    return kv;
}

/* First half of layer li: norm, q/k/v (+ bias, + LoRA), Qwen3's q_norm and
 * k_norm (rule 4a: every head of q and of k is a row of hd floats, normed in
 * place), RoPE, K and V stored. */
static devio_status layer_qkv(cuda_step *sp, uint32_t li, uint32_t n)
{
    cuda_state *st = sp->st;
    const cuda_layer *l = &st->layers[li];
    const devio_model_shape *sh = &st->sh;
    uint32_t d = sh->d;
    const float *norm_w = st->attn_norm + (size_t)li * d;
    cuda_epi epi = st->bq ? CUDA_EPI_BIAS : CUDA_EPI_STORE;
    cuda_matvec base = {.n = d, .epi = epi, .x = st->h, .ldx = d, .n_tok = n};
    cuda_matvec q = base, k = base, v = base;
    q.w = l->wq, q.dtype = l->dt_q, q.m = sh->q_dim, q.y = st->q, q.ldy = sh->q_dim;
    k.w = l->wk, k.dtype = l->dt_k, k.m = sh->kv_dim, k.y = st->k, k.ldy = sh->kv_dim;
    v.w = l->wv, v.dtype = l->dt_v, v.m = sh->kv_dim, v.y = st->v, v.ldy = sh->kv_dim;
    if (st->bq) {
        q.bias = st->bq + (size_t)li * sh->q_dim;
        k.bias = st->bk + (size_t)li * sh->kv_dim;
        v.bias = st->bv + (size_t)li * sh->kv_dim;
    }
    devio_status s;
    if (l->w_qkv) {
        /* Fast numerics: q, k and v as one GEMM on the stacked weight, then split. */
        uint32_t w = sh->q_dim + 2 * sh->kv_dim;
        cuda_matvec qkv = base;
        qkv.w = l->w_qkv, qkv.dtype = l->dt_q, qkv.m = w, qkv.y = st->qkv, qkv.ldy = w;
        qkv.bias = st->bqkv ? st->bqkv + (size_t)li * w : NULL;
        cuda_matvec *users[] = {&qkv};
        if ((s = step_norm_for(sp, st->x, norm_w, n, users, 1)) ||
            (s = step_project(sp, qkv, "q_proj, k_proj and v_proj")))
            return s;
        CHECK(sp, cuda_split3(st->qkv, sh->q_dim, sh->kv_dim, sh->kv_dim, st->q, st->k, st->v, n,
                              st->stream),
              "splitting q, k and v");
    } else {
        cuda_matvec *users[] = {&q, &k, &v};
        if ((s = step_norm_for(sp, st->x, norm_w, n, users, 3)) ||
            (s = step_project(sp, q, "q_proj")) || (s = step_project(sp, k, "k_proj")) ||
            (s = step_project(sp, v, "v_proj")))
            return s;
    }
    if ((s = step_lora(sp, li, DEVIO_LORA_Q, &sp->all, st->h, d, st->q, sh->q_dim, sh->q_dim,
                       n)) ||
        (s = step_lora(sp, li, DEVIO_LORA_K, &sp->all, st->h, d, st->k, sh->kv_dim, sh->kv_dim,
                       n)) ||
        (s = step_lora(sp, li, DEVIO_LORA_V, &sp->all, st->h, d, st->v, sh->kv_dim, sh->kv_dim,
                       n)))
        return s;
    if (st->q_norm) {
        uint32_t hd = sh->head_dim;
        CHECK(sp,
              cuda_rmsnorm(st->q, st->q_norm + (size_t)li * hd, st->q, hd, sh->eps,
                           n * sh->n_heads, st->stream),
              "q_norm");
        CHECK(sp,
              cuda_rmsnorm(st->k, st->k_norm + (size_t)li * hd, st->k, hd, sh->eps,
                           n * sh->n_kv_heads, st->stream),
              "k_norm");
    }
    cuda_kv kv = layer_kv(st, li, &sp->all);
    CHECK(sp, cuda_rope_store(&kv, st->q, st->k, st->v, st->rope_cos, st->rope_sin, n, st->stream),
          "RoPE");
    return DEVIO_OK;
}

/* Attention of layer li and o_proj into the residual rows x of n tokens
 * whose query rows are q. */
static devio_status attn_out(cuda_step *sp, uint32_t li, uint32_t n, float *x, const float *q,
                             const step_tables *t)
{
    cuda_state *st = sp->st;
    const cuda_layer *l = &st->layers[li];
    const devio_model_shape *sh = &st->sh;
    cuda_kv kv = layer_kv(st, li, t);
    uint32_t splits = st->fast ? cuda_attn16_splits(n, sp->max_keys) : 0;
    if (st->fast && cuda_attn16_tiled(n, sp->b->n_rows, splits))
        CHECK(sp, cuda_attention16_tiled(&kv, q, sh->attn_scale, st->att, n, st->stream),
              "attention");
    else if (st->fast)
        CHECK(sp,
              cuda_attention16(&kv, q, sh->attn_scale, st->att, n, splits, st->part, st->stream),
              "attention");
    else
        CHECK(sp, cuda_attention(&kv, q, sh->attn_scale, st->att, n, st->smem, st->stream),
              "attention");
    cuda_matvec o = {.w = l->wo, .dtype = l->dt_o, .m = sh->d, .n = sh->q_dim, .x = st->att,
                     .ldx = sh->q_dim, .n_tok = n, .y = x, .ldy = sh->d};
    return step_residual(sp, li, DEVIO_LORA_O, o, t, "o_proj");
}

/* The MLP of layer li with its norm and residual, on the rows x of n tokens. */
static devio_status mlp(cuda_step *sp, uint32_t li, uint32_t n, float *x, const step_tables *t)
{
    cuda_state *st = sp->st;
    const cuda_layer *l = &st->layers[li];
    const devio_model_shape *sh = &st->sh;
    uint32_t d = sh->d, f = sh->f;
    const float *norm_w = st->ffn_norm + (size_t)li * d;
    devio_status s;
    cuda_matvec gu = {.w = l->w_gate, .w2 = l->w_up, .dtype = l->dt_mlp, .m = f, .n = d,
                      .epi = CUDA_EPI_SILU_MUL, .x = st->h, .ldx = d, .n_tok = n, .y = st->act,
                      .ldy = f};
    if (sp->b->lora_targets & ((1u << DEVIO_LORA_GATE) | (1u << DEVIO_LORA_UP))) {
        /* Unfused: gate and up stored, adapted, then silu(gate) * up as the
         * fused epilogue computes it, so rows without LoRA keep their bits. */
        cuda_matvec g = gu, u = gu;
        g.epi = u.epi = CUDA_EPI_STORE;
        g.w2 = u.w2 = NULL;
        u.w = l->w_up;
        g.y = st->g_tmp;
        u.y = st->u_tmp;
        cuda_matvec *users[] = {&g, &u};
        if ((s = step_norm_for(sp, x, norm_w, n, users, 2)) ||
            (s = step_project(sp, g, "gate_proj")) || (s = step_project(sp, u, "up_proj")) ||
            (s = step_lora(sp, li, DEVIO_LORA_GATE, t, st->h, d, st->g_tmp, f, f, n)) ||
            (s = step_lora(sp, li, DEVIO_LORA_UP, t, st->h, d, st->u_tmp, f, f, n)))
            return s;
        CHECK(sp, cuda_silu_mul(st->g_tmp, st->u_tmp, st->act, f, n, st->stream), "silu");
    } else if (l->w_gu) {
        /* Fast numerics: gate and up as one GEMM on the stacked weight. */
        cuda_matvec both = gu;
        both.w = l->w_gu, both.w2 = NULL, both.m = 2 * f, both.epi = CUDA_EPI_STORE;
        both.y = st->gu, both.ldy = 2 * f;
        cuda_matvec *users[] = {&both};
        if ((s = step_norm_for(sp, x, norm_w, n, users, 1)) ||
            (s = step_project(sp, both, "gate_proj and up_proj")))
            return s;
        CHECK(sp, cuda_silu_mul_pairs(st->gu, st->act, f, n, st->stream), "silu");
    } else {
        cuda_matvec *users[] = {&gu};
        if ((s = step_norm_for(sp, x, norm_w, n, users, 1)) ||
            (s = step_project(sp, gu, "gate_proj and up_proj")))
            return s;
    }
    cuda_matvec down = {.w = l->w_down, .dtype = l->dt_down, .m = d, .n = f, .x = st->act,
                        .ldx = f, .n_tok = n, .y = x, .ldy = d};
    return step_residual(sp, li, DEVIO_LORA_DOWN, down, t, "down_proj");
}

/* What of layer li moves state, for every token: attention's q, K and V
 * (K and V stored), or the mixer up to its gated norm. */
static devio_status layer_first(cuda_step *sp, uint32_t li, uint32_t n)
{
    if (sp->st->layers[li].mixer)
        return cuda_mixer_first(sp, li, n);
    return layer_qkv(sp, li, n);
}

/* The rest of layer li on n tokens whose residual rows are x and whose
 * rows of what layer_first left (q, or the mixer's gated norm) are carry:
 * attention and o_proj or the mixer's out_proj, then the MLP. */
static devio_status layer_second(cuda_step *sp, uint32_t li, uint32_t n, float *x,
                                 const float *carry, const step_tables *t)
{
    devio_status s = sp->st->layers[li].mixer ? cuda_mixer_out(sp, li, n, x, carry, t)
                                              : attn_out(sp, li, n, x, carry, t);
    if (s == DEVIO_OK && sp->st->sh.has_mlp)
        s = mlp(sp, li, n, x, t);
    return s;
}

/* Past the last layer's state (K and V, or the mixer's state) only the
 * tokens whose logits are wanted go on, gathered in batch order; then the
 * final norm. */
static devio_status outputs(cuda_step *sp)
{
    cuda_state *st = sp->st;
    const devio_model_shape *sh = &st->sh;
    uint32_t o = sp->b->n_out, L = sh->n_layers;
    bool mixer = st->layers[L - 1].mixer;
    float *carry = mixer ? st->my2 : st->q2;
    CHECK(sp, cuda_gather(st->x2, st->x, sp->out.out_tok, sh->d, o, st->stream), "gather");
    CHECK(sp,
          cuda_gather(carry, mixer ? st->my : st->q, sp->out.out_tok,
                      mixer ? sh->ssm_inner : sh->q_dim, o, st->stream),
          "gather");
    devio_status s = layer_second(sp, L - 1, o, st->x2, carry, &sp->out);
    if (s != DEVIO_OK)
        return s;
    CHECK(sp, cuda_rmsnorm(st->x2, st->final_norm, st->h, sh->d, sh->eps, o, st->stream),
          "rmsnorm");
    return DEVIO_OK;
}

/* lm_head (divided by Granite's logits_scaling, rule 8) for outputs i0 ..
 * i0 + k into the staging rows. */
static devio_status lm_head(cuda_step *sp, uint32_t i0, uint32_t k)
{
    const cuda_state *st = sp->st;
    const devio_model_shape *sh = &st->sh;
    cuda_matvec lm = {.w = st->lm_head, .dtype = st->dt_lm, .m = sh->vocab, .n = sh->d,
                      .x = st->h + (size_t)i0 * sh->d, .ldx = sh->d, .n_tok = k,
                      .y = st->logits, .ldy = sh->vocab,
                      .epi = sh->logit_scale != 1.0f ? CUDA_EPI_DIV : CUDA_EPI_STORE,
                      .scale = sh->logit_scale};
    return step_project(sp, lm, "lm_head");
}

/* Outputs i0 .. i0 + k from the staging rows into their slots: of the host arena (strict), of
 * dlogits (fast), but those only a sample the GPU takes reads (cuda_sampling.c). */
static devio_status copy_logits(cuda_step *sp, uint32_t i0, uint32_t k)
{
    cuda_state *st = sp->st;
    size_t row = (size_t)st->sh.vocab * sizeof(float);
    for (uint32_t i = 0; i < k; i++) {
        size_t at = (size_t)sp->b->out_row[i0 + i] * st->sh.vocab;
        if (!cuda_sampling_skips(st, sp->ring, sp->b, sp->b->out_row[i0 + i]))
            CHECK(sp,
                  cudaMemcpyAsync(st->fast ? st->dlogits + at : st->cfg.logits_host + at,
                                  (const char *)st->logits + i * row, row,
                                  st->fast ? cudaMemcpyDeviceToDevice : cudaMemcpyDeviceToHost,
                                  st->stream),
                  "copying logits");
    }
    return DEVIO_OK;
}

/* The step's computation from the embedding to the outputs' final norm,
 * and lm_head for the first `first_lm` outputs (what a graph holds). */
static devio_status forward(cuda_step *sp, uint32_t first_lm)
{
    cuda_state *st = sp->st;
    uint32_t L = st->sh.n_layers, n = sp->b->n_tokens;
    CHECK(sp,
          cuda_embed(st->embed, st->dt_embed, st->embed_lane_major, st->sh.d, sp->all.tokens, n,
                     st->sh.emb_mult, st->x, st->stream),
          "embedding");
    devio_status s = DEVIO_OK;
    for (uint32_t li = 0; li + 1 < L && s == DEVIO_OK; li++)
        if (!(s = layer_first(sp, li, n)))
            s = layer_second(sp, li, n, st->x, st->layers[li].mixer ? st->my : st->q, &sp->all);
    if (s == DEVIO_OK)
        s = layer_first(sp, L - 1, n);
    if (s == DEVIO_OK && sp->b->n_out > 0)
        s = outputs(sp);
    if (s == DEVIO_OK && first_lm > 0)
        s = lm_head(sp, 0, first_lm);
    return s;
}

static cuda_graph_key graph_key(const cuda_step *sp)
{
    const devio_batch *b = sp->b;
    bool fast = sp->st->fast;
    return (cuda_graph_key){
        .n_tokens = b->n_tokens, .n_rows = b->n_rows, .n_out = b->n_out,
        .n_snaps = sp->mixer_words, .lora_targets = b->lora_targets,
        .splits_all = fast ? cuda_attn16_splits(b->n_tokens, sp->max_keys) : 0,
        .splits_out = fast ? cuda_attn16_splits(b->n_out, sp->max_keys) : 0,
        .ssm_chunks = sp->ssm_chunks};
}

/* The step as a graph: the one captured for its key, or captured now into
 * the least recently used entry. With at most max_depth steps in flight
 * that entry's graph is not among theirs (CUDA_GRAPHS > max_depth). */
static devio_status graph_step(cuda_step *sp)
{
    cuda_state *st = sp->st;
    cuda_graph_key key = graph_key(sp);
    cuda_graph *g = NULL, *lru = &st->graphs[0];
    for (int i = 0; i < CUDA_GRAPHS && !g; i++) {
        cuda_graph *e = &st->graphs[i];
        if (e->exec && memcmp(&e->key, &key, sizeof key) == 0)
            g = e;
        else if (e->used < lru->used)
            lru = e;
    }
    if (!g) {
        g = lru;
        if (g->exec) {
            CHECK(sp, cudaGraphExecDestroy(g->exec), "dropping a graph");
            g->exec = NULL;
        }
        cudaGraph_t graph = NULL;
        CHECK(sp, cudaStreamBeginCapture(st->stream, cudaStreamCaptureModeThreadLocal),
              "capturing a graph");
        devio_status s = forward(sp, sp->b->n_out);
        int e = cudaStreamEndCapture(st->stream, &graph);
        if (s == DEVIO_OK && e == 0)
            e = cudaGraphInstantiate(&g->exec, graph, 0);
        if (graph)
            cudaGraphDestroy(graph);
        if (s != DEVIO_OK)
            return s;
        CHECK(sp, e, "capturing a graph");
        g->key = key;
        st->graph_captures++;
    }
    g->used = ++st->graph_clock;
    st->graph_launches++;
    CHECK(sp, cudaGraphLaunch(g->exec, st->stream), "launching a graph");
    return copy_logits(sp, 0, sp->b->n_out);
}

static devio_status enqueue(cuda_step *sp, uint32_t ring)
{
    cuda_state *st = sp->st;
    const devio_batch *b = sp->b;
    uint32_t words = pack(sp, st->host_meta[ring]);
    CHECK(sp, cudaMemcpyAsync(st->meta, st->host_meta[ring], (size_t)words * 4,
                              cudaMemcpyHostToDevice, st->stream),
          "uploading the step");
    for (uint32_t c = 0; c < b->n_copies; c++)
        CHECK(sp, cuda_copy_block(st->k_cache, st->v_cache, st->n_attn,
                                  st->layer_elems * st->kv_elem / 2,
                                  st->block_elems * st->kv_elem / 2, b->copy_src[c],
                                  b->copy_dst[c], st->stream),
              "copying a KV block");
    if (b->n_tokens == 0)
        return DEVIO_OK;
    if (st->graphs_on && b->n_tokens <= CUDA_GRAPH_MAX_TOKENS && b->n_out <= st->plan.logits_rows)
        return graph_step(sp);
    devio_status s = forward(sp, 0);
    for (uint32_t i0 = 0; i0 < b->n_out && s == DEVIO_OK; i0 += st->plan.logits_rows) {
        uint32_t k = b->n_out - i0 < st->plan.logits_rows ? b->n_out - i0 : st->plan.logits_rows;
        if (!(s = lm_head(sp, i0, k)))
            s = copy_logits(sp, i0, k);
    }
    return s;
}

devio_status cuda_submit(void *state, const devio_batch *b, devio_error *err)
{
    cuda_state *st = state;
    devio_status s = cuda_refuse_if_failed(st, err);
    if (s != DEVIO_OK)
        return s;
    uint64_t n = atomic_load(&st->submitted);
    if (n - atomic_load(&st->waited) >= st->cfg.max_depth)
        return devio_fail(err, DEVIO_E_DEVICE, "more than %u steps submitted", st->cfg.max_depth);
    if ((s = check_adapters(st, b, err)) != DEVIO_OK)
        return s;
    uint32_t ring = (uint32_t)(n % st->cfg.max_depth);
    cuda_sampling_prepare(st, ring, b);
    cuda_step sp = {.st = st, .b = b, .ring = ring, .err = err};
    if ((s = enqueue(&sp, ring)) == DEVIO_OK)
        s = cuda_check(st, cudaEventRecord(st->done[ring], st->stream), "cudaEventRecord", err);
    if (s != DEVIO_OK)
        return s;
    atomic_store(&st->submitted, n + 1);
    return DEVIO_OK;
}

devio_status cuda_wait(void *state, const devio_batch *b, devio_error *err)
{
    cuda_state *st = state;
    uint64_t n = atomic_load(&st->waited);
    if (n >= atomic_load(&st->submitted))
        return devio_fail(err, DEVIO_E_DEVICE, "wait without a submitted step");
    /* The ring slot (and its pinned tables) is free for reuse only once
     * its step has finished: `waited` moves after the sync. */
    uint32_t ring = (uint32_t)(n % st->cfg.max_depth);
    devio_status s = cuda_check(st, cudaEventSynchronize(st->done[ring]), "the step", err);
    if (s == DEVIO_OK)
        s = cuda_sampling_finish(st, ring, b, err);
    atomic_store(&st->waited, n + 1);
    return s;
}
