/* ref_backend.c - the reference backend's life and its table: create (the paged KV cache,
 * SSM state slots and snapshots, widened norms and biases, step activations), destroy,
 * info, adapter slots and state copies. All memory is taken here, in create; the forward
 * step itself is ref_step.c (wait), which never allocates. It computes synchronously:
 * submit does nothing, wait runs the whole step. Projection weights are packed once, here,
 * into panels in their own dtype (ref_gemm.h), and the model's pages of them are handed
 * back to the kernel: a step reads only the panels. */
#define _DEFAULT_SOURCE /* madvise */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if !defined(__wasi__)
#include <sys/mman.h>
#include <unistd.h>
#endif

#include "device/numerics/numerics.h"
#include "device/status.h"
#include "ref/ref_state.h"

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

/* calloc_n's, 64-byte aligned (posix_memalign, then zeroed). */
static void *calloc_aligned(ref_state *st, size_t n, size_t size)
{
    void *p = NULL;
    if (size != 0 && n > SIZE_MAX / size)
        return NULL;
    if (posix_memalign(&p, 64, n * size > 0 ? n * size : 64) != 0)
        return NULL;
    memset(p, 0, n * size);
    st->bytes += n * size;
    return p;
}

/* The KV pools, zeroed so that no slot ever holds a non-finite value. */
static bool create_kv(ref_state *st, uint32_t L)
{
    st->block_elems = (size_t)st->cfg.block_size * st->kv_dim;
    st->k_cache = calloc_n(st, L, 1, sizeof *st->k_cache);
    st->v_cache = calloc_n(st, L, 1, sizeof *st->v_cache);
    if (!st->k_cache || !st->v_cache)
        return false;
    for (uint32_t i = 0; i < L; i++) {
        if (st->model->layers[i].kind != DEVIO_LAYER_ATTENTION)
            continue; /* a mixer layer keeps no KV */
        st->k_cache[i] = calloc_n(st, st->cfg.kv_blocks, st->block_elems, sizeof(ref_kv));
        st->v_cache[i] = calloc_n(st, st->cfg.kv_blocks, st->block_elems, sizeof(ref_kv));
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
        devio_tensor_widen(t, p, n);
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
    devio_tensor_widen(&model->norm, st->final_norm, st->d);
    for (uint32_t i = 0; i < L; i++) {
        const devio_layer *l = &model->layers[i];
        devio_tensor_widen(&l->attn_norm, st->attn_norm + (size_t)i * st->d, st->d);
        if (l->ffn_norm.data) /* Mamba2 layers have no MLP */
            devio_tensor_widen(&l->ffn_norm, st->ffn_norm + (size_t)i * st->d, st->d);
    }
    if (st->cfg.shape->qk_norm) {
        st->q_norm = calloc_n(st, L, st->hd, sizeof(float));
        st->k_norm = calloc_n(st, L, st->hd, sizeof(float));
        if (!st->q_norm || !st->k_norm)
            return false;
        for (uint32_t i = 0; i < L; i++) {
            const devio_layer *l = &model->layers[i];
            if (l->q_norm.data) { /* attention layers */
                devio_tensor_widen(&l->q_norm, st->q_norm + (size_t)i * st->hd, st->hd);
                devio_tensor_widen(&l->k_norm, st->k_norm + (size_t)i * st->hd, st->hd);
            }
        }
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
            devio_tensor_widen(&l->bq, st->bq + (size_t)i * st->q_dim, st->q_dim);
        if (l->bk.data)
            devio_tensor_widen(&l->bk, st->bk + (size_t)i * st->kv_dim, st->kv_dim);
        if (l->bv.data)
            devio_tensor_widen(&l->bv, st->bv + (size_t)i * st->kv_dim, st->kv_dim);
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

/* Ask the kernel to page out [p, p + n): the model's bytes are anonymous
 * memory (device/model/safetensors.c), so with swap they are written out and come
 * back if anything reads them again, and without swap nothing happens.
 * MADV_PAGEOUT never discards data, so this is only ever a hint; where it
 * does nothing a model's projections are resident twice (its bytes and the
 * panels: docs/operations.md gives the cost). */
static void release_pages(const void *p, size_t n)
{
#if !defined(__wasi__) && defined(MADV_PAGEOUT)
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = ((uintptr_t)p + page - 1) & ~(page - 1);
    uintptr_t b = ((uintptr_t)p + n) & ~(page - 1);
    if (b > a)
        (void)madvise((void *)a, b - a, MADV_PAGEOUT);
#else
    (void)p;
    (void)n;
#endif
}

/* One projection weight packed into panels, counted in st->bytes. An
 * absent tensor leaves p empty. The model's copy is released unless the
 * embedding lookup reads it (a tied head). */
static bool pack_one(ref_state *st, ref_panels *p, const devio_tensor *t)
{
    if (!t->data)
        return true;
    if (ref_panels_pack(p, st->pool, t->data, t->dtype, (uint32_t)t->shape[0],
                        (uint32_t)t->shape[1]) != 0)
        return false;
    st->bytes += p->bytes;
    if (t->data != st->model->embed.data)
        release_pages(t->data,
                      (size_t)(t->shape[0] * devio_dtype_row_bytes(t->dtype, t->shape[1])));
    return true;
}

/* Every projection of every layer, and the logits head (the embedding's
 * rows when tied: packed all the same, the lookup keeps reading the model's bytes). */
static bool pack_weights(ref_state *st, uint32_t L)
{
    st->panels = calloc_n(st, L, REF_W_N, sizeof *st->panels);
    if (!st->panels)
        return false;
    for (uint32_t li = 0; li < L; li++) {
        const devio_layer *l = &st->model->layers[li];
        ref_panels *p = st->panels + (size_t)li * REF_W_N;
        const devio_tensor *t[REF_W_N] = {
            [REF_WQ] = &l->wq,        [REF_WK] = &l->wk,   [REF_WV] = &l->wv,
            [REF_WO] = &l->wo,        [REF_WGATE] = &l->w_gate, [REF_WUP] = &l->w_up,
            [REF_WDOWN] = &l->w_down, [REF_WIN] = &l->mixer.in_proj,
            [REF_WOUT] = &l->mixer.out_proj,
        };
        for (uint32_t k = 0; k < REF_W_N; k++)
            if (!pack_one(st, &p[k], t[k]))
                return false;
    }
    return pack_one(st, &st->lm_panels, &st->model->lm_head);
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
        uint32_t threads = st->cfg.threads; /* st is gone after ref_destroy */
        ref_destroy(st);
        return devio_fail(err, DEVIO_E_DEVICE, "cannot start %u compute threads", threads);
    }
    st->n_scratch = devio_pool_threads(st->pool);
    st->scratch = calloc_n(st, st->n_scratch, 1, sizeof *st->scratch);
    if (!st->scratch)
        goto out_nomem;
    /* The widest input of any projection: packed x and widened panels. */
    uint32_t max_in = st->d > st->q_dim ? st->d : st->q_dim;
    max_in = max_in > st->f ? max_in : st->f;
    max_in = max_in > m->ssm_inner ? max_in : m->ssm_inner;
    for (uint32_t i = 0; i < st->n_scratch; i++) {
        if (ref_scratch_init(&st->scratch[i], cfg->max_seq_len, st->hd, max_in) != 0)
            goto out_nomem;
    }
    st->work.xpack =
        calloc_aligned(st, ref_gemm_xpack_floats(cfg->max_batch_tokens, max_in), sizeof(float));
    if (!st->work.xpack || !pack_weights(st, m->n_layers))
        goto out_nomem;
    st->work.pool = st->pool;
    st->work.scratch = st->scratch;
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
    for (size_t i = 0; st->panels && i < (size_t)st->cfg.shape->n_layers * REF_W_N; i++)
        ref_panels_free(&st->panels[i]);
    ref_panels_free(&st->lm_panels);
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
        /* A create that failed part-way may have the mixers but not the biases. */
        void *mb[] = {w->conv_w, w->conv_b, w->dt_bias, w->a, w->d_skip, w->norm,
                      st->in_bias ? st->in_bias[i] : NULL, st->out_bias ? st->out_bias[i] : NULL};
        for (size_t k = 0; k < sizeof mb / sizeof *mb; k++)
            free(mb[k]);
    }
    void *bufs[] = {st->k_cache, st->v_cache, st->attn_norm, st->ffn_norm, st->final_norm,
                    st->q_norm, st->k_norm, st->mix, st->in_bias, st->out_bias, st->mix_off, st->ssm_slots,
                    st->ssm_snaps, st->zx, st->xa, st->ym, st->scan_tmp,
                    st->bq, st->bk, st->bv, st->x, st->h, st->q, st->k, st->v, st->att,
                    st->act, st->tok_pos, st->tok_blocks, st->tok_adapter, st->slots,
                    st->slot_gen, st->lora_row, st->lora_a, st->o_tmp, st->g_tmp, st->u_tmp,
                    st->out_ptr, st->panels, st->work.xpack};
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
    out->kv_elem_bytes = sizeof(ref_kv);
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

/* The cache's bytes of one state part (backend.h): a K or V half of an
 * attention layer's block in this build's KV element (ref_kv: binary16 in
 * the cpu backend's copies, whose cfg says strict), or a slot; *n its size. */
static void *state_at(ref_state *st, devio_state_ref w, size_t *n)
{
    *n = w.part == DEVIO_STATE_SSM ? st->cfg.shape->slot_floats * sizeof(float)
                                   : st->block_elems * sizeof(ref_kv);
    if (w.part == DEVIO_STATE_SSM)
        return (w.ssm.snapshot ? st->ssm_snaps : st->ssm_slots) +
               (size_t)w.ssm.index * st->cfg.shape->slot_floats;
    uint32_t li = 0;
    for (uint32_t a = 0;; li++) /* the model layer of attention ordinal w.layer */
        if (st->model->layers[li].kind == DEVIO_LAYER_ATTENTION && a++ == w.layer)
            break;
    ref_kv *half = w.part == DEVIO_STATE_K ? st->k_cache[li] : st->v_cache[li];
    return half + (size_t)w.block * st->block_elems;
}

static devio_status ref_state_read(void *sp, devio_state_ref w, void *dst, devio_error *err)
{
    (void)err;
    size_t n;
    const void *at = state_at(sp, w, &n);
    memcpy(dst, at, n);
    return DEVIO_OK;
}

static devio_status ref_state_write(void *sp, devio_state_ref w, const void *src,
                                    devio_error *err)
{
    (void)err;
    size_t n;
    void *at = state_at(sp, w, &n);
    memcpy(at, src, n);
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

/* Built once per instruction-set path with -Ddevio_ref_backend=devio_ref_backend_PATH
 * (ref_isa_renames in ref/isa.bzl), so that every path's copy links into one binary;
 * ref_isa.c defines devio_ref_backend itself, forwarding to the path picked at open.
 * The WASI build compiles this file once without the renames: there this is the table. */
const devio_backend_ops devio_ref_backend = {
    .abi = DEVIO_BACKEND_ABI,
    .name = "ref",
    .create = ref_create,
    .destroy = ref_destroy,
    .info = ref_info,
    .submit = ref_submit,
    .wait = ref_step_run,
    .adapter_add = ref_adapter_add,
    .adapter_remove = ref_adapter_remove,
    .ssm_copy = ref_ssm_copy,
    .state_read = ref_state_read,
    .state_write = ref_state_write,
};
