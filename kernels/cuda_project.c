/* cuda_project.c - the projections of a step, shared by its attention and MLP (cuda_step.c)
 * and its mixer layers (cuda_mixer.c): rule 3 on strict's kernel or, under fast numerics, on
 * the GEMV or the GEMM (quantized weights widened first), the norm that feeds them, LoRA
 * (rule 3a: per token in strict numerics, grouped by adapter in fast) and the residual add.
 * Everything is enqueued on the step's stream; nothing is allocated. */
#include <cuda_runtime_api.h>

#include "device/status.h"
#include "kernels/cuda_fast.h"
#include "kernels/cuda_gemm.h"
#include "kernels/cuda_step.h"

static bool lora_on(const cuda_step *sp, int target)
{
    return target >= 0 && target < DEVIO_LORA_N_TARGETS &&
           (sp->b->lora_targets & (1u << (unsigned)target));
}

devio_status step_lora(cuda_step *sp, uint32_t li, int target, const step_tables *t,
                       const float *x, uint32_t ldx, float *y, uint32_t ldy, uint32_t max_out,
                       uint32_t n)
{
    cuda_state *st = sp->st;
    if (!lora_on(sp, target))
        return DEVIO_OK;
    if (st->fast)
        CHECK(sp,
              cuda_sgmv(st->mods, st->sh.n_layers * DEVIO_LORA_N_TARGETS,
                        li * DEVIO_LORA_N_TARGETS + (uint32_t)target, st->cfg.adapter_slots,
                        t->groups, x, ldx, y, ldy, st->cfg.max_lora_rank, max_out, st->lora_a,
                        st->stream),
              "LoRA");
    else
        CHECK(sp, cuda_lora(st->mods, st->sh.n_layers * DEVIO_LORA_N_TARGETS,
                        li * DEVIO_LORA_N_TARGETS + (uint32_t)target, t->slot, x, ldx, y, ldy, n,
                        st->cfg.max_lora_rank, max_out, st->lora_a, st->stream),
          "LoRA");
    return DEVIO_OK;
}

static bool quantized(int dtype) { return dtype > CUDA_BF16; }

/* One product of fast numerics: y = alpha * x W^T + beta * y over mv's
 * tokens, by the GEMV (x is mv->x, f32) or the GEMM (x as fast_project laid
 * it out, of type dtype: the weight's, f16 for a quantized one). */
typedef struct fast_in {
    const void *x;
    uint32_t ldx;
    int dtype;
    bool gemv;
} fast_in;

/* A quantized w is widened to f16 in st->deq first (in stream order, so the
 * one buffer serves every projection). */
static devio_status gemm(cuda_step *sp, const cuda_matvec *mv, const void *w, fast_in in,
                         float alpha, float beta, float *y, uint32_t ldy, const char *what)
{
    cuda_state *st = sp->st;
    if (in.gemv) {
        CHECK(sp,
              cuda_gemv(mv->dtype, w, mv->m, mv->n, mv->x, mv->ldx, mv->n_tok, alpha, beta, y,
                        ldy, st->stream),
              what);
        return DEVIO_OK;
    }
    if (quantized(mv->dtype)) {
        CHECK(sp, cuda_dequant16(mv->dtype, w, (uint64_t)mv->m * mv->n, st->deq, st->stream),
              what);
        w = st->deq;
    }
    CHECK(sp,
          cuda_gemm_run(st->gemm, in.dtype, w, mv->m, mv->n, in.x, in.ldx, mv->n_tok, alpha, beta,
                        y, ldy, st->stream),
          what);
    return DEVIO_OK;
}

/* Whether fast numerics run mv on the GEMV: a quantized weight on every batch the GEMV takes
 * (the GEMM would have it widened whole first), the others up to st->gemv_max tokens (timed
 * at create). */
static bool takes_gemv(const cuda_state *st, const cuda_matvec *mv)
{
    uint32_t most = quantized(mv->dtype) ? CUDA_GEMV_MAX_TOK : st->gemv_max;
    return mv->n_tok <= most && cuda_gemv_fits(mv->dtype, mv->n);
}

/* Rule 3 under fast numerics: small batches on the GEMV (takes_gemv), which
 * reads the f32 input as it is and a quantized weight's blocks as they are;
 * larger ones on the GEMM, the input rounded to the weight's 16-bit type (f32
 * weights take it as it is; a quantized weight is widened to f16 and the
 * input rounded to f16).
 * One product per weight, the epilogue folded into alpha and beta (a bias
 * is laid down first; SiLU-and-multiply runs on the two products). */
static devio_status fast_project(cuda_step *sp, const cuda_matvec *mv, const char *what)
{
    cuda_state *st = sp->st;
    fast_in in = {.x = mv->x, .ldx = mv->ldx,
                  .dtype = quantized(mv->dtype) ? CUDA_F16 : mv->dtype,
                  .gemv = takes_gemv(st, mv)};
    if (in.dtype != CUDA_F32 && !in.gemv && mv->x16) {
        in.x = mv->x16; /* the norm laid it down (norm_for) */
        in.ldx = mv->n;
    } else if (in.dtype != CUDA_F32 && !in.gemv) {
        CHECK(sp, cuda_round16(mv->x, mv->ldx, st->x16, mv->n, mv->n_tok, in.dtype, st->stream),
              what);
        in.x = st->x16;
        in.ldx = mv->n;
    }
    devio_status s;
    switch (mv->epi) {
    case CUDA_EPI_BIAS:
        CHECK(sp, cuda_bias_rows(mv->y, mv->ldy, mv->bias, mv->m, mv->n_tok, st->stream), what);
        return gemm(sp, mv, mv->w, in, 1.0f, 1.0f, mv->y, mv->ldy, what);
    case CUDA_EPI_ADD: return gemm(sp, mv, mv->w, in, 1.0f, 1.0f, mv->y, mv->ldy, what);
    case CUDA_EPI_ADD_SCALED: return gemm(sp, mv, mv->w, in, mv->scale, 1.0f, mv->y, mv->ldy, what);
    case CUDA_EPI_DIV:
        return gemm(sp, mv, mv->w, in, 1.0f / mv->scale, 0.0f, mv->y, mv->ldy, what);
    case CUDA_EPI_SILU_MUL:
        if ((s = gemm(sp, mv, mv->w, in, 1.0f, 0.0f, st->g_tmp, mv->m, what)) ||
            (s = gemm(sp, mv, mv->w2, in, 1.0f, 0.0f, st->u_tmp, mv->m, what)))
            return s;
        CHECK(sp, cuda_silu_mul(st->g_tmp, st->u_tmp, mv->y, mv->m, mv->n_tok, st->stream), what);
        return DEVIO_OK;
    case CUDA_EPI_STORE: break;
    }
    return gemm(sp, mv, mv->w, in, 1.0f, 0.0f, mv->y, mv->ldy, what);
}

/* Whether fast numerics take mv: every projection not marked strict, a quantized one past
 * CUDA_GEMV_MAX_TOK tokens only when the widening buffer is there (it is whenever the model
 * has a quantized projection). */
static bool fast_takes(const cuda_state *st, const cuda_matvec *mv)
{
    return st->fast && !mv->strict &&
           (!quantized(mv->dtype) || mv->n_tok <= CUDA_GEMV_MAX_TOK || st->deq);
}

devio_status step_project(cuda_step *sp, cuda_matvec mv, const char *what)
{
    if (fast_takes(sp->st, &mv))
        return fast_project(sp, &mv, what);
    CHECK(sp, cuda_project(&mv, sp->st->stream), what);
    return DEVIO_OK;
}

/* The 16-bit type fast_project rounds a projection's input to for the GEMM,
 * or -1 when it takes the GEMV, strict's kernel or the f32 input as it is. */
static int gemm_input16(const cuda_state *st, const cuda_matvec *mv)
{
    if (!fast_takes(st, mv) || takes_gemv(st, mv))
        return -1;
    return quantized(mv->dtype) ? CUDA_F16 : mv->dtype == CUDA_F32 ? -1 : mv->dtype;
}

devio_status step_norm_for(cuda_step *sp, const float *x, const float *w, uint32_t n,
                           cuda_matvec **users, uint32_t n_use)
{
    cuda_state *st = sp->st;
    int t16 = gemm_input16(st, users[0]);
    for (uint32_t i = 1; i < n_use; i++)
        t16 = gemm_input16(st, users[i]) == t16 ? t16 : -1;
    CHECK(sp,
          cuda_rmsnorm16(x, w, st->h, t16 >= 0 ? st->x16 : NULL, t16, st->sh.d, st->sh.eps, n,
                         st->stream),
          "rmsnorm");
    for (uint32_t i = 0; i < n_use && t16 >= 0; i++)
        users[i]->x16 = st->x16;
    return DEVIO_OK;
}

devio_status step_residual(cuda_step *sp, uint32_t li, int target, cuda_matvec mv,
                           const step_tables *t, const char *what)
{
    cuda_state *st = sp->st;
    float r = st->sh.res_mult; /* Granite's residual_multiplier (rule 7), else 1 */
    if (!lora_on(sp, target) && !mv.bias) {
        mv.epi = r != 1.0f ? CUDA_EPI_ADD_SCALED : CUDA_EPI_ADD;
        mv.scale = r;
        return step_project(sp, mv, what);
    }
    float *x = mv.y;
    mv.epi = mv.bias ? CUDA_EPI_BIAS : CUDA_EPI_STORE;
    mv.y = st->o_tmp;
    devio_status s = step_project(sp, mv, what);
    if (s == DEVIO_OK)
        s = step_lora(sp, li, target, t, mv.x, mv.ldx, st->o_tmp, mv.ldy, mv.m, mv.n_tok);
    if (s == DEVIO_OK)
        CHECK(sp, cuda_add(x, st->o_tmp, r, mv.m, mv.n_tok, st->stream), "residual add");
    return s;
}
