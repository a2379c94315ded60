/* cuda_fast.cu - the kernels of the CUDA backend's fast numerics (--numerics fast), around the
 * GEMMs of cuda_gemm.h: the 16-bit rounding of a GEMM's input and the bias rows it adds to.
 * Strict numerics never launch them; fast numerics promise a tolerance, not bits. */
#include <cuda_runtime.h>
#include <stdint.h>

#include "device/numerics.h"
#include "kernels/cuda_fast.h"
#include "kernels/cuda_kernels.h"
#include "kernels/cuda_warp.cuh"

__global__ void k_round16(const float *x, uint32_t ldx, uint16_t *dst, uint32_t n, int bf16)
{
    uint32_t t = blockIdx.y;
    for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        float v = x[(size_t)t * ldx + i];
        dst[(size_t)t * n + i] = bf16 ? devio_f32_to_bf16_rne(v) : devio_f32_to_f16_rne(v);
    }
}

int cuda_round16(const float *x, uint32_t ldx, void *dst, uint32_t n, uint32_t n_tok, int dtype,
                 void *stream)
{
    if (n == 0 || n_tok == 0)
        return 0;
    dim3 grid(cuda_blocks_for(n, 256), n_tok);
    LAUNCH((k_round16), grid, 256, 0, (cudaStream_t)stream, x, ldx, (uint16_t *)dst, n,
           dtype == CUDA_BF16);
    return cuda_launched();
}

__global__ void k_bias_rows(float *y, uint32_t ldy, const float *bias, uint32_t m)
{
    uint32_t t = blockIdx.y;
    for (uint32_t o = blockIdx.x * blockDim.x + threadIdx.x; o < m; o += gridDim.x * blockDim.x)
        y[(size_t)t * ldy + o] = bias[o];
}

int cuda_bias_rows(float *y, uint32_t ldy, const float *bias, uint32_t m, uint32_t n_tok,
                   void *stream)
{
    if (m == 0 || n_tok == 0)
        return 0;
    dim3 grid(cuda_blocks_for(m, 256), n_tok);
    LAUNCH((k_bias_rows), grid, 256, 0, (cudaStream_t)stream, y, ldy, bias, m);
    return cuda_launched();
}

__global__ void k_split3(const float *src, uint32_t a, uint32_t b, uint32_t c, float *da,
                         float *db, float *dc)
{
    uint32_t t = blockIdx.y, w = a + b + c;
    const float *row = src + (size_t)t * w;
    for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < w; i += gridDim.x * blockDim.x) {
        if (i < a)
            da[(size_t)t * a + i] = row[i];
        else if (i < a + b)
            db[(size_t)t * b + i - a] = row[i];
        else
            dc[(size_t)t * c + i - a - b] = row[i];
    }
}

int cuda_split3(const float *src, uint32_t a, uint32_t b, uint32_t c, float *da, float *db,
                float *dc, uint32_t n_tok, void *stream)
{
    if (n_tok == 0 || a + b + c == 0)
        return 0;
    dim3 grid(cuda_blocks_for(a + b + c, 256), n_tok);
    LAUNCH((k_split3), grid, 256, 0, (cudaStream_t)stream, src, a, b, c, da, db, dc);
    return cuda_launched();
}

__global__ void k_silu_mul_pairs(const float *gu, float *act, uint32_t f)
{
    uint32_t t = blockIdx.y;
    const float *g = gu + (size_t)t * 2 * f, *u = g + f;
    for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < f; i += gridDim.x * blockDim.x)
        act[(size_t)t * f + i] = DEVIO_MUL(devio_siluf(g[i]), u[i]);
}

int cuda_silu_mul_pairs(const float *gu, float *act, uint32_t f, uint32_t n_tok, void *stream)
{
    if (n_tok == 0 || f == 0)
        return 0;
    dim3 grid(cuda_blocks_for(f, 256), n_tok);
    LAUNCH((k_silu_mul_pairs), grid, 256, 0, (cudaStream_t)stream, gu, act, f);
    return cuda_launched();
}
