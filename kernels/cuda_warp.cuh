/* cuda_warp.cuh - the 32-lane rule of device/numspec.h on a warp, shared by
 * the backend's .cu files: the definition's 32 lanes are a warp's 32
 * threads, and fold() is the definition's tree (for w = 16 .. 1, p[l] =
 * p[l] + p[l + w] for l < w) as xor shuffles. Device code only. */
#ifndef DEVIO_CUDA_WARP_CUH
#define DEVIO_CUDA_WARP_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "device/numerics.h"

#define FULL 0xffffffffu

/* Lane l adds lane l ^ w, which is l + w for l < w; lane 0 ends holding the
 * definition's p[0]. Every lane of the warp must call it. */
__device__ __forceinline__ float fold(float v)
{
#pragma unroll
    for (int w = 16; w >= 1; w >>= 1)
        v = DEVIO_ADD(v, __shfl_xor_sync(FULL, v, w));
    return v;
}

/* fold() and lane 0's result in every lane. */
__device__ __forceinline__ float fold_all(float v)
{
    return __shfl_sync(FULL, fold(v), 0);
}

/* The cudaError_t of the launch just made, as an int. */
static inline int cuda_launched(void)
{
    return (int)cudaGetLastError();
}

static inline uint32_t cuda_blocks_for(uint64_t n, uint32_t per)
{
    return (uint32_t)((n + per - 1) / per);
}

#endif
