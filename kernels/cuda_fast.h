/* cuda_fast.h - the fast numerics' kernels (cuda_fast.cu), as C functions that enqueue them on
 * a stream, like cuda_kernels.h's: no CUDA types cross it, 0 = cudaSuccess, device pointers
 * borrowed for the life of the work. Called only under --numerics fast. */
#ifndef DEVIO_CUDA_FAST_H
#define DEVIO_CUDA_FAST_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/cuda_kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* dst [n_tok, n] packed = the rows of x [n_tok, ldx]
 * rounded to dtype (CUDA_F16 or CUDA_BF16, to nearest even): a GEMM's 16-bit input. */
int cuda_round16(const float *x, uint32_t ldx, void *dst, uint32_t n, uint32_t n_tok, int dtype,
                 void *stream);
/* y[t, o] = bias[o] for n_tok rows of m (ldy apart): the bias a GEMM then adds to. */
int cuda_bias_rows(float *y, uint32_t ldy, const float *bias, uint32_t m, uint32_t n_tok,
                   void *stream);
/* The rows of src [n_tok, a + b + c] split into da [n_tok, a], db [n_tok, b] and dc
 * [n_tok, c]: a fused q/k/v GEMM's output into q, k and v. */
int cuda_split3(const float *src, uint32_t a, uint32_t b, uint32_t c, float *da, float *db,
                float *dc, uint32_t n_tok, void *stream);
/* act[t, i] = silu(gu[t, i]) * gu[t, f + i]: SiLU-and-multiply on a fused gate/up GEMM's
 * output [n_tok, 2 f]. */
int cuda_silu_mul_pairs(const float *gu, float *act, uint32_t f, uint32_t n_tok, void *stream);

/* dst[i] = element i (i < n) of w, a quantized weight (CUDA_Q8_0 ... CUDA_Q6_K, rows of whole
 * blocks as uploaded) widened exactly and rounded to f16 (nearest even, past its range kept at
 * +-65504): a quantized projection as the GEMM's f16 input. */
int cuda_dequant16(int dtype, const void *w, uint64_t n, uint16_t *dst, void *stream);

/* The GEMV of small batches beside cuda_gemm.h's GEMM: for t < n_tok <= CUDA_GEMV_MAX_TOK,
 *   y[t * ldy + o] = alpha * sum_i w[o * n + i] * x[t * ldx + i] + beta * y[t * ldy + o]
 * with w row-major [m, n] of dtype (CUDA_F32, CUDA_F16 or CUDA_BF16) read 16 bytes per lane
 * and widened exactly, or quantized (CUDA_Q8_0 ... CUDA_Q6_K, rows of whole blocks as
 * uploaded) with each element widened from its block as it is loaded, exactly; x read as f32
 * (not rounded to 16 bits), products and sums in f32 in an order of its own; beta 0 never
 * reads y. A warp per output row. cuda_gemv_fits: 16-bit and f32 rows whose bytes are a
 * multiple of 16 (the loads' alignment), quantized rows of whole blocks. */
#define CUDA_GEMV_MAX_TOK 8u
int cuda_gemv_fits(int dtype, uint32_t n);
int cuda_gemv(int dtype, const void *w, uint32_t m, uint32_t n, const float *x, uint32_t ldx,
              uint32_t n_tok, float alpha, float beta, float *y, uint32_t ldy, void *stream);

/* Rule 3a's LoRA under fast numerics, grouped by adapter (SGMV): seg holds, for n_slots adapter
 * slots, n_slots + 1 offsets into the token list that follows them (the tokens of slot s are
 * list[seg[s] .. seg[s + 1])). For each slot with tokens whose module mods[s * per_slot + idx] is
 * adapted, a[t] = A x[t] (shrink, the A rows read once per 8 tokens of the slot) then
 * y[t] = y[t] + (B a[t]) * scale (expand, a thread per output row of B); a_buf holds
 * [tokens, max_rank] floats. Products and sums in f32 in an order of their own. */
int cuda_sgmv(const cuda_lora_mod *mods, uint32_t per_slot, uint32_t idx, uint32_t n_slots,
              const uint32_t *seg, const float *x, uint32_t ldx, float *y, uint32_t ldy,
              uint32_t max_rank, uint32_t max_out, float *a_buf, void *stream);

/* Paged attention over f16 K and V pools (kv->k16, kv->v16): rule 6's softmax and sums, in an
 * order of its own. A block serves up to 8 heads of one GQA group, so each key of the group is
 * read once for all of them. A token's keys are cut into `splits` contiguous ranges computed
 * apart (flash-decoding) and then combined in range order: the same step always gives the same
 * bits. splits 1 writes out directly; more need part, CUDA_ATTN16_PART_ROWS * n_heads * (hd + 2)
 * floats. head_dim even and at most CUDA_ATTN16_MAX_HD. */
#define CUDA_ATTN16_MAX_HD 256u
#define CUDA_ATTN16_PART_ROWS 64u /* n_tok * splits at most, when splits > 1 */
/* The ranges a step of n_tok tokens, the longest reading max_keys keys, is cut into: 1 for
 * batches past half of CUDA_ATTN16_PART_ROWS tokens (they fill the GPU as they are), else one
 * per 64 keys, at most 32 and at most CUDA_ATTN16_PART_ROWS / n_tok. */
uint32_t cuda_attn16_splits(uint32_t n_tok, uint32_t max_keys);
int cuda_attention16(const cuda_kv *kv, const float *q, float scale, float *out, uint32_t n_tok,
                     uint32_t splits, float *part, void *stream);
/* The same attention for prefill, tiled over queries as well as keys: a block serves up to 8
 * tokens (each run of them that shares a block table, one row's, together) with the heads of a
 * GQA group, so each chunk of a row's keys is read once for all of its tokens. One range per
 * token (no combine); the same step gives the same bits. cuda_attn16_tiled: whether a step of
 * n_tok tokens over n_rows rows takes it, that is with splits 1 and at least
 * CUDA_ATTN16_TILE_ROW_TOKENS tokens a row on average (decode batches stay per token). */
#define CUDA_ATTN16_TILE_ROW_TOKENS 4u
bool cuda_attn16_tiled(uint32_t n_tok, uint32_t n_rows, uint32_t splits);
int cuda_attention16_tiled(const cuda_kv *kv, const float *q, float scale, float *out,
                           uint32_t n_tok, void *stream);

#ifdef __cplusplus
}
#endif
#endif
