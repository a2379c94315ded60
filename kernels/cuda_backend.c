/* cuda_backend.c - the CUDA backend's life: probe, create (every device
 * allocation, sized by cuda_plan.h), destroy, info, and the plugin entry.
 * Steps are in cuda_step.c, adapter slots in cuda_adapters.c. It must never
 * call the CUDA driver API, never allocate device memory after create
 * (adapter copies go into slots create reserved) but for the GPU sampler's
 * logit processing records (cuda_sampling.c: as large as the largest a step
 * has needed), and never abort: every CUDA error is returned. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "device/numerics/numerics.h"
#include "device/status.h"
#include "kernels/cuda_backend.h"
#include "kernels/cuda_fast.h"
#include "kernels/cuda_gemm.h"
#include "kernels/cuda_state.h"

/* The same sources build the real plugin and the emulated one
 * (kernels/emu/), which the registry knows as cuda-emu. */
#if defined(DEVIO_CUDA_EMULATED)
#define DEVIO_CUDA_BACKEND_NAME "cuda-emu"
#else
#define DEVIO_CUDA_BACKEND_NAME "cuda"
#endif

static devio_status cuda_probe(devio_error *err)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess)
        return devio_fail(err, DEVIO_E_UNSUPPORTED, "no CUDA device: %s: %s",
                          cudaGetErrorName(e), cudaGetErrorString(e));
    if (n == 0)
        return devio_fail(err, DEVIO_E_UNSUPPORTED, "no CUDA device");
    return DEVIO_OK;
}

/* ---- create ---------------------------------------------------------------- */


/* *dst: n floats per row, widened and uploaded: the one tensor `one`, or
 * else the tensor at byte `member` of every layer (offsetof(devio_layer,
 * ...)); an absent tensor gives zeros. */
static devio_status upload_widened(cuda_state *st, float **dst, const devio_tensor *one,
                                   size_t member, size_t n, devio_error *err)
{
    uint32_t rows = one ? 1 : st->sh.n_layers;
    devio_status s = DALLOC(st, *dst, (uint64_t)rows * n * sizeof(float), err);
    float *tmp = calloc(n ? n : 1, sizeof *tmp);
    if (s == DEVIO_OK && !tmp)
        s = devio_fail(err, DEVIO_E_NOMEM, "out of host memory widening weights");
    for (uint32_t i = 0; i < rows && s == DEVIO_OK; i++) {
        const devio_tensor *t =
            one ? one : (const devio_tensor *)((const char *)&st->model->layers[i] + member);
        memset(tmp, 0, n * sizeof *tmp);
        devio_tensor_widen(t, tmp, n);
        s = cuda_check(st, cudaMemcpy(*dst + i * n, tmp, n * sizeof *tmp,
                                      cudaMemcpyHostToDevice),
                       "uploading norms", err);
    }
    free(tmp);
    return s;
}

/* Fast numerics: n weights of one 16-bit or f32 type and one row length
 * stacked into one row-major matrix (*dev), each in its own rows; false
 * (nothing uploaded) when their types or row lengths differ or one is
 * quantized or absent. ptrs[i] receives where weight i's rows start. */
static devio_status upload_stacked(cuda_state *st, const devio_tensor *const *t, int n,
                                   const void **dev, const void **ptrs, int *dt, bool *done,
                                   devio_error *err)
{
    *done = false;
    uint64_t bytes = 0;
    for (int i = 0; i < n; i++) {
        if (!t[i]->data || t[i]->ndim != 2 || t[i]->dtype != t[0]->dtype ||
            t[i]->shape[1] != t[0]->shape[1] || (int)t[i]->dtype > CUDA_BF16)
            return DEVIO_OK;
        bytes += devio_tensor_bytes(t[i]);
    }
    void *p;
    devio_status s = cuda_dalloc(st, &p, bytes, err);
    uint64_t off = 0;
    for (int i = 0; i < n && s == DEVIO_OK; i++) {
        ptrs[i] = (char *)p + off;
        s = cuda_check(st, cudaMemcpy((char *)p + off, t[i]->data, devio_tensor_bytes(t[i]),
                                      cudaMemcpyHostToDevice),
                       "uploading a weight", err);
        off += devio_tensor_bytes(t[i]);
    }
    *dev = p;
    *dt = (int)t[0]->dtype;
    *done = s == DEVIO_OK;
    return s;
}

/* A layer's q/k/v and gate/up projections: stacked under fast numerics when
 * they can be (one GEMM each), else one by one. */
static devio_status upload_layer(cuda_state *st, const devio_layer *l, cuda_layer *c,
                                 devio_error *err)
{
    bool qkv = false, gu = false;
    const void *p[3];
    devio_status s = DEVIO_OK;
    if (st->fast) {
        const devio_tensor *a[3] = {&l->wq, &l->wk, &l->wv}, *b[2] = {&l->w_gate, &l->w_up};
        if ((s = upload_stacked(st, a, 3, &c->w_qkv, p, &c->dt_q, &qkv, err)))
            return s;
        if (qkv) {
            c->wq = p[0], c->wk = p[1], c->wv = p[2];
            c->dt_k = c->dt_v = c->dt_q;
        }
        if ((s = upload_stacked(st, b, 2, &c->w_gu, p, &c->dt_mlp, &gu, err)))
            return s;
        if (gu)
            c->w_gate = p[0], c->w_up = p[1];
    }
    int dt_up; /* the shape check made it dt_mlp */
    if (!qkv && ((s = cuda_upload(st, &l->wq, &c->wq, &c->dt_q, err)) ||
                 (s = cuda_upload(st, &l->wk, &c->wk, &c->dt_k, err)) ||
                 (s = cuda_upload(st, &l->wv, &c->wv, &c->dt_v, err))))
        return s;
    if (!gu && ((s = cuda_upload(st, &l->w_gate, &c->w_gate, &c->dt_mlp, err)) ||
                (s = cuda_upload(st, &l->w_up, &c->w_up, &dt_up, err))))
        return s;
    if ((s = cuda_upload(st, &l->wo, &c->wo, &c->dt_o, err)))
        return s;
    return cuda_upload(st, &l->w_down, &c->w_down, &c->dt_down, err);
}

/* The embedding, lm_head and every attention and MLP projection as loaded;
 * each layer's kind and, for attention, its KV pool. */
static devio_status create_weights(cuda_state *st, devio_error *err)
{
    const devio_model *m = st->model;
    uint32_t L = st->sh.n_layers;
    /* Tied, the one copy is lm_head's, lane-major; the embedding reads it so. */
    bool tied = m->lm_head.data == m->embed.data;
    devio_status s = cuda_upload_as(st, &m->embed, tied, !st->fast, &st->embed, &st->dt_embed, err);
    st->embed_lane_major = tied && !st->fast && cuda_lane_major(st->sh.d, st->dt_embed);
    if (s == DEVIO_OK && tied) {
        st->lm_head = st->embed;
        st->dt_lm = st->dt_embed;
    } else if (s == DEVIO_OK) {
        s = cuda_upload(st, &m->lm_head, &st->lm_head, &st->dt_lm, err);
    }
    for (uint32_t i = 0; i < L && s == DEVIO_OK; i++) {
        const devio_layer *l = &m->layers[i];
        cuda_layer *c = &st->layers[i];
        c->mixer = l->kind == DEVIO_LAYER_MIXER;
        if (!c->mixer)
            c->kv = st->n_attn++;
        if ((s = upload_layer(st, l, c, err)))
            break;
    }
    return s;
}

/* Norms and biases widened once (they are tiny and read by every token),
 * Qwen3's q_norm and k_norm, and the core's RoPE tables (any RoPE scaling
 * is in them: nothing here computes a frequency). */
static devio_status create_small(cuda_state *st, devio_error *err)
{
    const devio_model_shape *sh = &st->sh;
    size_t rope = (size_t)st->cfg.max_seq_len * (sh->rotary_dim / 2) * sizeof(float);
    devio_status s;
    if ((s = upload_widened(st, &st->final_norm, &st->model->norm, 0, sh->d, err)) ||
        (s = upload_widened(st, &st->attn_norm, NULL, offsetof(devio_layer, attn_norm), sh->d,
                            err)) ||
        (s = upload_widened(st, &st->ffn_norm, NULL, offsetof(devio_layer, ffn_norm), sh->d,
                            err)) ||
        (s = DALLOC(st, st->rope_cos, rope, err)) || (s = DALLOC(st, st->rope_sin, rope, err)))
        return s;
    if (rope > 0 &&
        ((s = cuda_check(st, cudaMemcpy(st->rope_cos, st->cfg.rope_cos, rope,
                                        cudaMemcpyHostToDevice),
                         "uploading RoPE tables", err)) ||
         (s = cuda_check(st, cudaMemcpy(st->rope_sin, st->cfg.rope_sin, rope,
                                        cudaMemcpyHostToDevice),
                         "uploading RoPE tables", err))))
        return s;
    /* Every attention layer has both (the core's shape check); a mixer
     * layer's rows stay zero and are never read. */
    if (sh->qk_norm &&
        ((s = upload_widened(st, &st->q_norm, NULL, offsetof(devio_layer, q_norm), sh->head_dim,
                             err)) ||
         (s = upload_widened(st, &st->k_norm, NULL, offsetof(devio_layer, k_norm), sh->head_dim,
                             err))))
        return s;
    /* A layer without one of the biases gets zeros: x + 0 is x, as in the reference. */
    if (!sh->has_bias)
        return DEVIO_OK;
    if ((s = upload_widened(st, &st->bq, NULL, offsetof(devio_layer, bq), sh->q_dim, err)) ||
        (s = upload_widened(st, &st->bk, NULL, offsetof(devio_layer, bk), sh->kv_dim, err)))
        return s;
    return upload_widened(st, &st->bv, NULL, offsetof(devio_layer, bv), sh->kv_dim, err);
}

static devio_status create_buffers(cuda_state *st, devio_error *err)
{
    const devio_model_shape *sh = &st->sh;
    uint64_t T = st->cfg.max_batch_tokens, F = sizeof(float);
    uint64_t d = T * sh->d * F, q = T * sh->q_dim * F, kv = T * sh->kv_dim * F, f = T * sh->f * F;
    st->kv_elem = cuda_plan_kv_elem(&st->cfg);
    st->block_elems = st->cfg.block_size * sh->kv_dim;
    st->layer_elems = (uint64_t)st->cfg.kv_blocks * st->block_elems;
    uint64_t pool = st->plan.kv / 2;
    devio_status s;
    if ((s = DALLOC(st, st->k_cache, pool, err)) || (s = DALLOC(st, st->v_cache, pool, err)) ||
        (s = DALLOC(st, st->x, d, err)) || (s = DALLOC(st, st->x2, d, err)) ||
        (s = DALLOC(st, st->h, d, err)) || (s = DALLOC(st, st->o_tmp, d, err)) ||
        (s = DALLOC(st, st->q, q, err)) || (s = DALLOC(st, st->q2, q, err)) ||
        (s = DALLOC(st, st->att, q, err)) || (s = DALLOC(st, st->k, kv, err)) ||
        (s = DALLOC(st, st->v, kv, err)) || (s = DALLOC(st, st->act, f, err)) ||
        (s = DALLOC(st, st->g_tmp, f, err)) || (s = DALLOC(st, st->u_tmp, f, err)) ||
        (s = DALLOC(st, st->lora_a, T * st->cfg.max_lora_rank * F, err)) ||
        (s = DALLOC(st, st->logits, st->plan.logits, err)) ||
        (s = DALLOC(st, st->meta, st->plan.meta, err)))
        return s;
    uint32_t n_mods = st->cfg.adapter_slots * sh->n_layers * DEVIO_LORA_N_TARGETS;
    st->slots = calloc(st->cfg.adapter_slots ? st->cfg.adapter_slots : 1, sizeof *st->slots);
    st->host_mods = calloc(n_mods ? n_mods : 1, sizeof *st->host_mods);
    st->host_meta = calloc(st->cfg.max_depth, sizeof *st->host_meta);
    st->done = calloc(st->cfg.max_depth, sizeof *st->done);
    if (!st->slots || !st->host_mods || !st->host_meta || !st->done)
        return devio_fail(err, DEVIO_E_NOMEM, "out of host memory for the CUDA backend");
    if ((s = DALLOC(st, st->mods, (uint64_t)n_mods * sizeof *st->mods, err)))
        return s;
    for (uint32_t i = 0; i < st->cfg.adapter_slots; i++)
        if ((s = DALLOC(st, st->slots[i].mem, st->plan.lora_slot, err)))
            return s;
    for (uint32_t i = 0; i < st->cfg.max_depth; i++) {
        if ((s = cuda_check(st, cudaMallocHost((void **)&st->host_meta[i], st->plan.meta),
                            "cudaMallocHost", err)) ||
            (s = cuda_check(st, cudaEventCreateWithFlags(&st->done[i], cudaEventDisableTiming),
                            "cudaEventCreate", err)))
            return s;
    }
    return DEVIO_OK;
}

static devio_status attention_fits(cuda_state *st, const struct cudaDeviceProp *p,
                                   devio_error *err);

/* The device, its fit for the plan, and the attention kernel's shared memory. */
static devio_status create_device(cuda_state *st, devio_error *err)
{
    devio_status s = cuda_probe(err);
    if (s != DEVIO_OK)
        return s;
    struct cudaDeviceProp p;
    size_t free_b = 0, total_b = 0;
    if ((s = cuda_check(st, cudaSetDevice(0), "cudaSetDevice", err)) ||
        (s = cuda_check(st, cudaGetDeviceProperties(&p, 0), "cudaGetDeviceProperties", err)) ||
        (s = cuda_check(st, cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo", err)))
        return s;
    snprintf(st->name, sizeof st->name, "%.120s", p.name);
    snprintf(st->cc, sizeof st->cc, "%d.%d", p.major, p.minor);
    st->memory_total = total_b;
    uint64_t budget = cuda_plan_budget(free_b, total_b);
    if (st->plan.total > budget)
        return devio_fail(err, DEVIO_E_NOMEM,
                          "the CUDA backend needs %llu MiB (KV pool of %u blocks: %llu MiB) and "
                          "%llu MiB of %s are free to it; at most %u KV blocks fit (--kv-blocks)",
                          (unsigned long long)(st->plan.total >> 20), st->cfg.kv_blocks,
                          (unsigned long long)(st->plan.kv >> 20),
                          (unsigned long long)(budget >> 20), st->name,
                          cuda_plan_kv_fit(&st->plan, budget));
    if ((s = cuda_check(st, cuda_rmsnorm_prepare(st->sh.d), "preparing rmsnorm", err)) ||
        (st->sh.n_mixers < st->sh.n_layers && (s = attention_fits(st, &p, err))))
        return s;
    return cuda_check(st, cudaStreamCreateWithFlags(&st->stream, cudaStreamNonBlocking),
                      "cudaStreamCreate", err);
}

/* What attention asks of the device. Fast attention stages chunks of keys,
 * so its shared memory does not grow with them; strict attention keeps a
 * score per key a token reads (max_seq_len, or the sliding window). */
static devio_status attention_fits(cuda_state *st, const struct cudaDeviceProp *p,
                                   devio_error *err)
{
    if (st->fast && (st->sh.head_dim % 2 != 0 || st->sh.head_dim > CUDA_ATTN16_MAX_HD))
        return devio_fail(err, DEVIO_E_UNSUPPORTED,
                          "--numerics fast on the CUDA backend takes an even head_dim of at "
                          "most %u, not %u",
                          CUDA_ATTN16_MAX_HD, st->sh.head_dim);
    if (st->fast)
        return DEVIO_OK;
    uint32_t keys = st->cfg.max_seq_len;
    if (st->sh.window > 0 && st->sh.window < keys)
        keys = st->sh.window;
    st->smem = cuda_attention_smem(keys, st->sh.head_dim);
    if (st->smem > p->sharedMemPerBlockOptin)
        return devio_fail(err, DEVIO_E_UNSUPPORTED,
                          "%s %u needs %u KiB of shared memory per attention block, "
                          "%s has %zu KiB",
                          keys < st->cfg.max_seq_len ? "the sliding window of" : "--max-seq-len",
                          keys, st->smem >> 10, st->name,
                          (size_t)p->sharedMemPerBlockOptin >> 10);
    return cuda_check(st, cuda_attention_prepare(st->smem), "preparing attention", err);
}

static void cuda_destroy(void *sp);

#if !defined(DEVIO_CUDA_EMULATED)
/* Milliseconds of 20 products of nt tokens by w [m, n] (after one to warm
 * up): the GEMV, or the GEMM with the rounding of its input; -1 on error. */
static float time_product(cuda_state *st, bool gemv, uint32_t nt, const void *w, int dt,
                          uint32_t m, uint32_t n, float *y)
{
    cudaEvent_t a = NULL, b = NULL;
    float ms = -1.0f;
    int e = cudaEventCreate(&a) || cudaEventCreate(&b);
    for (int rep = 0; rep < 21 && !e; rep++) {
        if (rep == 1)
            e = cudaEventRecord(a, st->stream);
        e = e || (gemv ? cuda_gemv(dt, w, m, n, st->h, n, nt, 1.0f, 0.0f, y, m, st->stream)
                       : cuda_round16(st->h, n, st->x16, n, nt, dt, st->stream) ||
                             cuda_gemm_run(st->gemm, dt, w, m, n, st->x16, n, nt, 1.0f, 0.0f, y,
                                           m, st->stream));
    }
    if (!e && !cudaEventRecord(b, st->stream) && !cudaEventSynchronize(b))
        cudaEventElapsedTime(&ms, a, b);
    if (a)
        cudaEventDestroy(a);
    if (b)
        cudaEventDestroy(b);
    (void)cudaGetLastError();
    return ms;
}
#endif

/* How many tokens a batch may have to take the GEMV rather than the GEMM:
 * DEVIO_CUDA_GEMV (0 to 8) when set; under the emulator otherwise 0 (its
 * host GEMM stands for cuBLASLt, and no timing means anything); on a GPU
 * the most tokens, of 8, 4, 2 and 1, for which the GEMV beats the GEMM on
 * the first layer's widest 16-bit weight, timed here. */
static uint32_t gemv_reach(cuda_state *st)
{
    const char *env = getenv("DEVIO_CUDA_GEMV");
    if (env && *env) {
        unsigned long v = strtoul(env, NULL, 10);
        return v > CUDA_GEMV_MAX_TOK ? CUDA_GEMV_MAX_TOK : (uint32_t)v;
    }
#if defined(DEVIO_CUDA_EMULATED)
    (void)st;
    return 0;
#else
    for (uint32_t i = 0; i < st->sh.n_layers; i++) {
        const cuda_layer *l = &st->layers[i];
        bool gu = l->w_gu != NULL;
        const void *w = gu ? l->w_gu : l->w_qkv;
        uint32_t m = gu ? 2 * st->sh.f : st->sh.q_dim + 2 * st->sh.kv_dim;
        int dt = gu ? l->dt_mlp : l->dt_q;
        if (!w || dt == CUDA_F32 || !cuda_gemv_fits(dt, st->sh.d))
            continue;
        for (uint32_t nt = CUDA_GEMV_MAX_TOK; nt >= 1; nt /= 2) {
            if (nt > st->cfg.max_batch_tokens) /* the buffers' rows */
                continue;
            float g = time_product(st, true, nt, w, dt, m, st->sh.d, gu ? st->gu : st->qkv);
            float b = time_product(st, false, nt, w, dt, m, st->sh.d, gu ? st->gu : st->qkv);
            if (g > 0 && b > 0 && g < b)
                return nt;
        }
        return 0;
    }
    return 0;
#endif
}

/* Fast numerics: the GEMM library and the 16-bit staging of its inputs. */
static devio_status create_fast(cuda_state *st, devio_error *err)
{
    if (!st->fast)
        return DEVIO_OK;
    char why[200] = "";
    if (!(st->gemm = cuda_gemm_open(why, sizeof why)))
        return devio_fail(err, DEVIO_E_UNSUPPORTED, "--numerics fast on the CUDA backend: %s",
                          why);
    const devio_model_shape *sh = &st->sh;
    uint64_t F = sizeof(float), qkv = sh->q_dim + 2ull * sh->kv_dim;
    devio_status s;
    if ((s = DALLOC(st, st->x16, st->plan.fast_buf.x16, err)) ||
        (s = DALLOC(st, st->qkv, st->plan.fast_buf.qkv, err)) ||
        (s = DALLOC(st, st->gu, st->plan.fast_buf.gu, err)) ||
        (st->plan.fast_buf.part && (s = DALLOC(st, st->part, st->plan.fast_buf.part, err))) ||
        (st->plan.fast_buf.deq && (s = DALLOC(st, st->deq, st->plan.fast_buf.deq, err))) ||
        !sh->has_bias)
        return s;
    /* bq, bk and bv of each layer side by side, for the stacked q/k/v GEMM. */
    float *row = calloc(qkv, F);
    if (!row)
        return devio_fail(err, DEVIO_E_NOMEM, "out of host memory stacking biases");
    s = DALLOC(st, st->bqkv, st->plan.fast_buf.bqkv, err);
    for (uint32_t i = 0; i < sh->n_layers && s == DEVIO_OK; i++) {
        const devio_layer *l = &st->model->layers[i];
        const devio_tensor *b[3] = {&l->bq, &l->bk, &l->bv};
        uint32_t at[3] = {0, sh->q_dim, sh->q_dim + sh->kv_dim}, n[3] = {sh->q_dim, sh->kv_dim,
                                                                          sh->kv_dim};
        memset(row, 0, qkv * F);
        for (int k = 0; k < 3; k++)
            devio_tensor_widen(b[k], row + at[k], n[k]);
        s = cuda_check(st, cudaMemcpy(st->bqkv + i * qkv, row, qkv * F, cudaMemcpyHostToDevice),
                       "uploading biases", err);
    }
    free(row);
    return s;
}

static devio_status cuda_create(const devio_model *model, const devio_backend_config *cfg,
                                void **state, devio_error *err)
{
    *state = NULL;
    devio_status s = cuda_mixer_supported(cfg->shape, err);
    if (s != DEVIO_OK)
        return s;
    /* Kernels put a step's tokens, a layer's heads or the layers on a grid's y axis. */
    if (cfg->max_batch_tokens > 65535 || cfg->shape->n_heads > 65535 ||
        cfg->shape->n_layers > 65535)
        return devio_fail(err, DEVIO_E_INVALID,
                          "the CUDA backend takes at most 65535 tokens per step "
                          "(--max-batch-tokens), heads and layers");
    cuda_state *st = calloc(1, sizeof *st);
    if (!st)
        return devio_fail(err, DEVIO_E_NOMEM, "out of host memory for the CUDA backend");
    pthread_mutex_init(&st->fail_mu, NULL);
    st->model = model;
    st->cfg = *cfg;
    st->sh = *cfg->shape;
    st->cfg.shape = &st->sh;
    st->fast = cfg->numerics == DEVIO_NUMERICS_FAST;
    const char *graphs = getenv("DEVIO_CUDA_GRAPHS");
    st->graphs_on = !(graphs && strcmp(graphs, "0") == 0);
    st->layers = calloc(st->sh.n_layers ? st->sh.n_layers : 1, sizeof *st->layers);
    if (!st->layers)
        s = devio_fail(err, DEVIO_E_NOMEM, "out of host memory for the CUDA backend");
    else if (!cuda_plan_for(model, &st->cfg, &st->plan))
        s = devio_fail(err, DEVIO_E_INVALID, "the CUDA backend's memory plan overflows");
    if (s == DEVIO_OK && !(s = create_device(st, err)) && !(s = create_weights(st, err)) &&
        !(s = create_small(st, err)) && !(s = create_buffers(st, err)) &&
        !(s = create_fast(st, err)) && !(s = cuda_sampling_create(st, err)))
        s = cuda_mixer_create(st, err);
    /* Every upload and memset of create went through the default stream,
     * which the (non-blocking) step stream does not wait for. */
    if (s == DEVIO_OK)
        s = cuda_check(st, cudaDeviceSynchronize(), "finishing the uploads", err);
    if (s == DEVIO_OK && st->fast)
        st->gemv_max = gemv_reach(st);
    if (s != DEVIO_OK) {
        cuda_destroy(st);
        return s;
    }
    *state = st;
    return DEVIO_OK;
}

static void cuda_destroy(void *sp)
{
    cuda_state *st = sp;
    if (!st)
        return;
    if (st->stream)
        cudaStreamSynchronize(st->stream);
    for (int i = 0; i < CUDA_GRAPHS; i++)
        if (st->graphs[i].exec)
            cudaGraphExecDestroy(st->graphs[i].exec);
    for (uint32_t i = 0; st->host_meta && i < st->cfg.max_depth; i++)
        if (st->host_meta[i])
            cudaFreeHost(st->host_meta[i]);
    for (uint32_t i = 0; st->done && i < st->cfg.max_depth; i++)
        if (st->done[i])
            cudaEventDestroy(st->done[i]);
    for (uint32_t i = 0; i < st->n_allocs; i++)
        cudaFree(st->allocs[i]);
    if (st->stream)
        cudaStreamDestroy(st->stream);
    cuda_gemm_close(st->gemm);
    cuda_sampling_destroy(st);
    free(st->allocs);
    free(st->layers);
    free(st->slots);
    free(st->host_mods);
    free(st->host_meta);
    free(st->done);
    pthread_mutex_destroy(&st->fail_mu);
    free(st);
}

static void version(char *buf, size_t n, int v)
{
    if (v > 0)
        snprintf(buf, n, "%d.%d", v / 1000, v % 1000 / 10);
}

static void cuda_info(void *sp, devio_device_info *out)
{
    cuda_state *st = sp;
    snprintf(out->device, sizeof out->device, "%s", st->name);
    snprintf(out->compute_capability, sizeof out->compute_capability, "%s", st->cc);
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
        (void)cudaGetLastError();
        total_b = st->memory_total;
    }
    out->memory_total = total_b;
    out->memory_free = free_b;
    out->memory_used = st->bytes;
    out->kv_elem_bytes = st->kv_elem;
    int v = 0;
    if (cudaDriverGetVersion(&v) == cudaSuccess)
        version(out->driver, sizeof out->driver, v);
    if (cudaRuntimeGetVersion(&v) == cudaSuccess)
        version(out->runtime, sizeof out->runtime, v);
    if (atomic_load(&st->failed)) {
        pthread_mutex_lock(&st->fail_mu);
        snprintf(out->failure, sizeof out->failure, "%s", st->failure);
        pthread_mutex_unlock(&st->fail_mu);
    }
}

/* The most KV blocks the GPU holds beside everything else cfg asks for. */
static uint32_t cuda_kv_blocks_fit(const devio_model *model, const devio_backend_config *cfg)
{
    cuda_plan p;
    size_t free_b = 0, total_b = 0;
    if (cuda_probe(NULL) != DEVIO_OK || cudaSetDevice(0) != cudaSuccess ||
        cudaMemGetInfo(&free_b, &total_b) != cudaSuccess ||
        !cuda_plan_for(model, cfg, &p)) {
        (void)cudaGetLastError();
        return 0;
    }
    return cuda_plan_kv_fit(&p, cuda_plan_budget(free_b, total_b));
}

const devio_backend_ops devio_cuda_backend = {
    .abi = DEVIO_BACKEND_ABI,
    .name = DEVIO_CUDA_BACKEND_NAME,
    .copies_weights = true, /* uploaded at create; only shapes are read after */
    .probe = cuda_probe,
    .create = cuda_create,
    .destroy = cuda_destroy,
    .info = cuda_info,
    .submit = cuda_submit,
    .wait = cuda_wait,
    .adapter_add = cuda_adapter_add,
    .adapter_remove = cuda_adapter_remove,
    .kv_blocks_fit = cuda_kv_blocks_fit,
    .ssm_copy = cuda_ssm_copy,
    .state_read = cuda_state_read,
    .state_write = cuda_state_write,
    .sample = cuda_sample_batch,
    .logits_read = cuda_logits_read,
};

const devio_backend_ops *devio_backend_plugin(void);
const devio_backend_ops *devio_backend_plugin(void) { return &devio_cuda_backend; }
