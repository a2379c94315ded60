/* cuda_gemm.h - the one GEMM of the CUDA backend's fast numerics (--numerics fast):
 * Y = alpha * X W^T + beta * Y with W and X in one input type, f32 accumulation in any
 * order, f32 out. cuBLASLt behind it on a GPU (cuda_gemm_lt.c, opened with dlopen so that
 * strict numerics never need it); a host GEMM of the same types under the emulator
 * (emu/emu_gemm.cc). No CUDA types cross it; pointers are device memory, borrowed for the
 * life of the enqueued work. Strict numerics never call it. */
#ifndef DEVIO_CUDA_GEMM_H
#define DEVIO_CUDA_GEMM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cuda_gemm cuda_gemm;

/* The GEMM library, or NULL with why (no cuBLASLt to load, say). */
cuda_gemm *cuda_gemm_open(char *why, size_t why_len);
void cuda_gemm_close(cuda_gemm *g);
/* Which GEMM this is, for GET /v1/device: "cublasLt" or "host (emulated)". */
const char *cuda_gemm_name(const cuda_gemm *g);

/* Enqueue on stream, for t < n_tok and o < m:
 *   y[t * ldy + o] = alpha * sum_i w[o * n + i] * x[t * ldx + i] + beta * y[t * ldy + o]
 * w row-major [m, n] and x of dtype (CUDA_F32, CUDA_F16 or CUDA_BF16 of cuda_kernels.h, the
 * same for both), the products and sums in f32 (f16 and bf16 widen exactly), y f32; beta 0
 * never reads y. 0, or the library's error as a nonzero int. */
int cuda_gemm_run(cuda_gemm *g, int dtype, const void *w, uint32_t m, uint32_t n, const void *x,
                  uint32_t ldx, uint32_t n_tok, float alpha, float beta, float *y, uint32_t ldy,
                  void *stream);

#ifdef __cplusplus
}
#endif
#endif
