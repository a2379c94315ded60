/* cuda_mixer.c - the Mamba-2 mixer layers of the CUDA backend (hybrid Bamba
 * and Mamba2 models, numspec rule 10): what the kernels take (anything else
 * is refused at create), the layers' weights, the state array and the
 * mixer's activations at create, a step's row tables, the mixer's part of a
 * step (in the reference's order: rmsnorm, in_proj (+ bias, + LoRA), conv,
 * scan, gate and gated norm, out_proj (+ bias, + LoRA) into the residual),
 * and ssm_copy. Like the rest of the backend it never allocates device
 * memory after create. */
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "device/status.h"
#include "kernels/cuda_step.h"

_Static_assert(sizeof(cuda_ssm_row) == CUDA_SSM_ROW_WORDS * sizeof(uint32_t),
               "cuda_ssm_row is packed as words");
_Static_assert((int)DEVIO_SNAP_END == CUDA_SNAP_END &&
                   (int)DEVIO_SNAP_EACH == CUDA_SNAP_EACH,
               "snapshot modes");

devio_status cuda_mixer_supported(const devio_model_shape *sh, devio_error *err)
{
    if (sh->n_mixers == 0)
        return DEVIO_OK;
    if (sh->ssm_state > CUDA_SSM_MAX_STATE)
        return devio_fail(err, DEVIO_E_UNSUPPORTED,
                          "the CUDA backend's scan holds at most %u states per channel; this "
                          "model's mixer has %u (d_state)",
                          CUDA_SSM_MAX_STATE, sh->ssm_state);
    if (sh->ssm_conv > CUDA_SSM_MAX_CONV)
        return devio_fail(err, DEVIO_E_UNSUPPORTED,
                          "the CUDA backend's conv takes at most %u taps; this model's mixer "
                          "has %u (d_conv)",
                          CUDA_SSM_MAX_CONV, sh->ssm_conv);
    /* The scan puts heads on a grid's y axis and blocks of 4 channels on z,
     * the conv blocks of 128 channels on y. */
    if (sh->ssm_heads > 65535 || sh->ssm_head_dim > 4u * 65535 || sh->conv_dim > 128u * 65535)
        return devio_fail(err, DEVIO_E_UNSUPPORTED,
                          "the CUDA backend takes at most 65535 mixer heads of at most %u "
                          "channels and a conv of at most %u channels",
                          4u * 65535, 128u * 65535);
    return DEVIO_OK;
}

/* Offsets of a mixer layer's small tensors in its widened buffer. */
typedef struct small_layout {
    size_t conv_w, conv_b, dt_bias, a_log, d_skip, norm, in_bias, out_bias, total;
} small_layout;

static small_layout layout_of(const devio_model_shape *sh)
{
    small_layout o = {0};
    o.conv_b = o.conv_w + (size_t)sh->conv_dim * sh->ssm_conv;
    o.dt_bias = o.conv_b + sh->conv_dim;
    o.a_log = o.dt_bias + sh->ssm_heads;
    o.d_skip = o.a_log + sh->ssm_heads;
    o.norm = o.d_skip + sh->ssm_heads;
    o.in_bias = o.norm + sh->ssm_inner;
    o.out_bias = o.in_bias + sh->in_dim;
    o.total = o.out_bias + sh->d;
    return o;
}

/* One mixer layer's weights: projections as loaded, the rest widened into
 * one buffer with one upload (host scratch tmp of lay->total floats). */
static devio_status layer_create(cuda_state *st, const devio_mixer *x, cuda_mixer_w *w,
                                 const small_layout *lay, float *tmp, devio_error *err)
{
    const devio_model_shape *sh = &st->sh;
    devio_status s;
    /* Strict's kernel and layout under fast numerics too: 16-bit inputs to
     * in_proj and out_proj move a Mamba-2 model's logits past the fast
     * tolerance (docs/backends.md, Fast numerics). */
    if ((s = cuda_upload_strict(st, &x->in_proj, &w->in_proj, &w->dt_in, err)) ||
        (s = cuda_upload_strict(st, &x->out_proj, &w->out_proj, &w->dt_out, err)))
        return s;
    memset(tmp, 0, lay->total * sizeof *tmp);
    devio_tensor_widen(&x->conv_w, tmp + lay->conv_w, (size_t)sh->conv_dim * sh->ssm_conv);
    bool conv_b = devio_tensor_widen(&x->conv_b, tmp + lay->conv_b, sh->conv_dim);
    devio_tensor_widen(&x->dt_bias, tmp + lay->dt_bias, sh->ssm_heads);
    devio_tensor_widen(&x->a_log, tmp + lay->a_log, sh->ssm_heads);
    devio_tensor_widen(&x->d_skip, tmp + lay->d_skip, sh->ssm_heads);
    devio_tensor_widen(&x->norm, tmp + lay->norm, sh->ssm_inner);
    bool in_b = devio_tensor_widen(&x->in_bias, tmp + lay->in_bias, sh->in_dim);
    bool out_b = devio_tensor_widen(&x->out_bias, tmp + lay->out_bias, sh->d);
    float *dev;
    if ((s = cuda_dalloc(st, (void **)&dev, lay->total * sizeof *tmp, err)) ||
        (s = cuda_check(st, cudaMemcpy(dev, tmp, lay->total * sizeof *tmp,
                                       cudaMemcpyHostToDevice),
                        "uploading a mixer's weights", err)))
        return s;
    w->conv_w = dev + lay->conv_w;
    w->conv_b = conv_b ? dev + lay->conv_b : NULL;
    w->dt_bias = dev + lay->dt_bias;
    w->a_log = dev + lay->a_log;
    w->d_skip = dev + lay->d_skip;
    w->norm = dev + lay->norm;
    w->in_bias = in_b ? dev + lay->in_bias : NULL;
    w->out_bias = out_b ? dev + lay->out_bias : NULL;
    return DEVIO_OK;
}

devio_status cuda_mixer_create(cuda_state *st, devio_error *err)
{
    const devio_model_shape *sh = &st->sh;
    if (sh->n_mixers == 0)
        return DEVIO_OK;
    small_layout lay = layout_of(sh);
    uint64_t per_mixer = (uint64_t)sh->conv_dim * (sh->ssm_conv - 1) +
                         (uint64_t)sh->ssm_inner * sh->ssm_state;
    float *tmp = malloc(lay.total * sizeof *tmp);
    if (!tmp)
        return devio_fail(err, DEVIO_E_NOMEM, "out of host memory widening a mixer's weights");
    devio_status s = DEVIO_OK;
    uint64_t m = 0;
    for (uint32_t li = 0; li < sh->n_layers && s == DEVIO_OK; li++) {
        if (!st->layers[li].mixer)
            continue;
        st->layers[li].mx.state_off = m++ * per_mixer;
        s = layer_create(st, &st->model->layers[li].mixer, &st->layers[li].mx, &lay, tmp, err);
    }
    free(tmp);
    if (s != DEVIO_OK)
        return s;
    uint64_t T = st->cfg.max_batch_tokens, F = sizeof(float);
    if (st->fast && ((s = cuda_dalloc(st, (void **)&st->ssm_cs, st->plan.fast_buf.ssm_cs, err)) ||
                     (s = cuda_dalloc(st, (void **)&st->ssm_lam, st->plan.fast_buf.ssm_lam, err))))
        return s;
    if ((s = cuda_dalloc(st, (void **)&st->ssm, st->plan.ssm, err)) ||
        (s = cuda_dalloc(st, (void **)&st->zx, T * sh->in_dim * F, err)) ||
        (s = cuda_dalloc(st, (void **)&st->xa, T * sh->conv_dim * F, err)) ||
        (s = cuda_dalloc(st, (void **)&st->my, T * sh->ssm_inner * F, err)))
        return s;
    return cuda_dalloc(st, (void **)&st->my2, T * sh->ssm_inner * F, err);
}

uint32_t cuda_mixer_pack(cuda_step *sp, uint32_t *w, const uint32_t *dev)
{
    const devio_batch *b = sp->b;
    uint32_t nr = b->n_rows, ns = 0, *snaps = w + (size_t)nr * CUDA_SSM_ROW_WORDS;
    for (uint32_t r = 0; r < nr; r++) {
        const devio_batch_row *row = &b->rows[r];
        uint32_t n_snap = devio_snapshots_of(row->snapshot, row->n_tokens);
        cuda_ssm_row x = {.tok_start = row->tok_start, .n_tokens = row->n_tokens,
                          .slot = (uint32_t)row->ssm_slot, .fresh = row->pos0 == 0,
                          .snap_mode = n_snap ? (uint32_t)row->snapshot : CUDA_SNAP_NONE,
                          .snap_off = ns};
        memcpy(w + (size_t)r * CUDA_SSM_ROW_WORDS, &x, sizeof x);
        /* Snapshot j of the state array is index ssm_slots + j. */
        for (uint32_t i = 0; i < n_snap; i++)
            snaps[ns++] = sp->st->cfg.ssm_slots + (uint32_t)row->snap_slots[i];
    }
    sp->ssm_rows = (const cuda_ssm_row *)dev;
    sp->ssm_snaps = dev + (size_t)nr * CUDA_SSM_ROW_WORDS;
    /* Fast numerics scan in chunks unless a row keeps a snapshot after each token. */
    sp->ssm_chunks = 0;
    for (uint32_t r = 0; r < nr && sp->st->fast; r++) {
        if (b->rows[r].snapshot == DEVIO_SNAP_EACH) {
            sp->ssm_chunks = 0;
            break;
        }
        sp->ssm_chunks += (b->rows[r].n_tokens + CUDA_SSM_CHUNK - 1) / CUDA_SSM_CHUNK;
    }
    return nr * CUDA_SSM_ROW_WORDS + ns;
}

devio_status cuda_mixer_first(cuda_step *sp, uint32_t li, uint32_t n)
{
    cuda_state *st = sp->st;
    const devio_model_shape *sh = &st->sh;
    const cuda_mixer_w *w = &st->layers[li].mx;
    uint32_t d = sh->d;
    CHECK(sp, cuda_rmsnorm(st->x, st->attn_norm + (size_t)li * d, st->h, d, sh->eps, n, st->stream),
          "rmsnorm");
    cuda_matvec in = {.strict = 1, .w = w->in_proj, .dtype = w->dt_in, .m = sh->in_dim, .n = d,
                      .bias = w->in_bias, .epi = w->in_bias ? CUDA_EPI_BIAS : CUDA_EPI_STORE,
                      .x = st->h, .ldx = d, .n_tok = n, .y = st->zx, .ldy = sh->in_dim};
    devio_status s;
    if ((s = step_project(sp, in, "in_proj")) ||
        (s = step_lora(sp, li, DEVIO_LORA_IN_PROJ, &sp->all, st->h, d, st->zx, sh->in_dim,
                       sh->in_dim, n)))
        return s;
    cuda_ssm m = {
        .H = sh->ssm_heads, .P = sh->ssm_head_dim, .G = sh->ssm_groups, .N = sh->ssm_state,
        .K = sh->ssm_conv, .I = sh->ssm_inner, .conv_dim = sh->conv_dim, .in_dim = sh->in_dim,
        .dt_min = sh->dt_min, .dt_max = sh->dt_max, .eps = sh->ssm_eps,
        .rows = sp->ssm_rows, .n_rows = sp->b->n_rows, .snaps = sp->ssm_snaps,
        .state = st->ssm, .slot_floats = sh->slot_floats, .layer_off = w->state_off,
        .conv_w = w->conv_w, .conv_b = w->conv_b, .dt_bias = w->dt_bias, .a_log = w->a_log,
        .d_skip = w->d_skip, .norm = w->norm, .zx = st->zx, .xa = st->xa, .y = st->my,
    };
    if (n == sp->b->n_rows) /* a decode step, one token a row: one kernel */
        CHECK(sp, cuda_ssm_conv_scan(&m, st->stream), "the mixer's conv and scan");
    else {
        CHECK(sp, cuda_ssm_conv(&m, st->stream), "the mixer's conv");
        if (sp->ssm_chunks)
            CHECK(sp, cuda_ssm_scan_chunked(&m, sp->ssm_chunks, st->ssm_cs, st->ssm_lam,
                                            st->stream),
                  "the mixer's scan");
        else
            CHECK(sp, cuda_ssm_scan(&m, st->stream), "the mixer's scan");
    }
    CHECK(sp, cuda_ssm_gate_norm(&m, n, st->stream), "the mixer's gated norm");
    return DEVIO_OK;
}

devio_status cuda_mixer_out(cuda_step *sp, uint32_t li, uint32_t n, float *x, const float *y,
                            const step_tables *t)
{
    const devio_model_shape *sh = &sp->st->sh;
    const cuda_mixer_w *w = &sp->st->layers[li].mx;
    cuda_matvec o = {.strict = 1, .w = w->out_proj, .dtype = w->dt_out, .m = sh->d,
                     .n = sh->ssm_inner,
                     .bias = w->out_bias, .x = y, .ldx = sh->ssm_inner, .n_tok = n, .y = x,
                     .ldy = sh->d};
    return step_residual(sp, li, DEVIO_LORA_OUT_PROJ, o, t, "out_proj");
}

/* Slot i at index i of the state array, snapshot j at ssm_slots + j. */
static bool ssm_index(const cuda_state *st, devio_ssm_ref r, uint64_t *index)
{
    if (r.index >= (r.snapshot ? st->cfg.ssm_snapshots : st->cfg.ssm_slots))
        return false;
    *index = (r.snapshot ? st->cfg.ssm_slots : 0) + (uint64_t)r.index;
    return true;
}

devio_status cuda_ssm_copy(void *state, devio_ssm_ref dst, devio_ssm_ref src, devio_error *err)
{
    cuda_state *st = state;
    devio_status s = cuda_refuse_if_failed(st, err);
    if (s != DEVIO_OK)
        return s;
    uint64_t di, si, n = st->sh.slot_floats;
    if (!st->ssm || !ssm_index(st, dst, &di) || !ssm_index(st, src, &si) || di == si)
        return devio_fail(err, DEVIO_E_INVALID, "state copy %s %u <- %s %u is out of range",
                          dst.snapshot ? "snapshot" : "slot", dst.index,
                          src.snapshot ? "snapshot" : "slot", src.index);
    /* On the step stream, so that it follows every step that wrote src;
     * nothing is in flight when effects call it, and it returns complete. */
    if ((s = cuda_check(st, cudaMemcpyAsync(st->ssm + di * n, st->ssm + si * n, n * sizeof(float),
                                            cudaMemcpyDeviceToDevice, st->stream),
                        "copying a state slot", err)))
        return s;
    return cuda_check(st, cudaStreamSynchronize(st->stream), "copying a state slot", err);
}
