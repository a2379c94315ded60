/* cuda_fast.h - the fast numerics' kernels (cuda_fast.cu), as C functions that enqueue them on
 * a stream, like cuda_kernels.h's: no CUDA types cross it, 0 = cudaSuccess, device pointers
 * borrowed for the life of the work. Called only under --numerics fast. */
#ifndef DEVIO_CUDA_FAST_H
#define DEVIO_CUDA_FAST_H

#include <stdint.h>

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

#ifdef __cplusplus
}
#endif
#endif
