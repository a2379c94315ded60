/* cuda_warp.cuh - the 32-lane rule of device/numerics/numspec.h on a warp, shared by
 * the backend's .cu files: the definition's 32 lanes are a warp's 32
 * threads, and fold() is the definition's tree (for w = 16 .. 1, p[l] =
 * p[l] + p[l + w] for l < w) as xor shuffles. Device code only. */
#ifndef DEVIO_CUDA_WARP_CUH
#define DEVIO_CUDA_WARP_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "device/numerics/numerics.h"
#include "kernels/cuda_kernels.h"

#define FULL 0xffffffffu

/* Every launch site reads LAUNCH((kernel), grid, block, smem, stream, args...):
 * the <<<...>>> launch under nvcc, the emulator's queued launch in the
 * cuda-emu build (kernels/emu/), so that both builds run the same sources.
 * The kernel is parenthesised because a template's arguments hold commas. */
#define DEVIO_UNPAREN(...) __VA_ARGS__
#if defined(DEVIO_CUDA_EMULATED)
#define LAUNCH(k, grid, block, smem, stream, ...)                                                  \
    ::devio_emu::launch(#k, DEVIO_UNPAREN k, grid, block, smem, stream, __VA_ARGS__)
#else
#define LAUNCH(k, grid, block, smem, stream, ...)                                                  \
    DEVIO_UNPAREN k<<<grid, block, smem, stream>>>(__VA_ARGS__)
#endif

/* extern __shared__ T name[]: in the emulated build a checked pointer
 * (bounds, races between barriers), so kernels hold it with auto. */
/* DEVIO_SHARED_VIEW(T, name, base, off): the shared memory from base + off
 * (in base's elements) seen as T, checked the same way in the emulated build. */
#if !defined(DEVIO_CUDA_EMULATED)
#define DEVIO_DYN_SHARED(T, name) extern __shared__ T name[]
#define DEVIO_SHARED_VIEW(T, name, base, off) T *name = reinterpret_cast<T *>((base) + (off))
#endif

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

/* 16 bytes at p, which must be 16-byte aligned (the emulator checks it, as
 * the GPU faults on it). */
__device__ __forceinline__ uint4 ld16(const void *p)
{
#if defined(DEVIO_CUDA_EMULATED)
    devio_emu::check_aligned(p, 16, "a 16-byte load");
#endif
    return *static_cast<const uint4 *>(p);
}

/* Fast numerics' KV cache element: binary16, rounded to nearest even, a
 * value past its range kept at +-65504 rather than made infinite. */
__device__ __forceinline__ uint16_t kv16_store(float v)
{
    v = v > 65504.0f ? 65504.0f : v < -65504.0f ? -65504.0f : v;
    return devio_f32_to_f16_rne(v);
}
__device__ __forceinline__ float kv16_load(uint16_t h) { return devio_f16_to_f32(h); }

/* The 16 bytes q of f32, f16 or bf16 elements (4 or 8, in memory order),
 * widened exactly: a lane's V weights of a lane-major chunk, or a row-major
 * weight's 16 bytes. */
template <int DT>
__device__ __forceinline__ void widen16(uint4 q, float *w)
{
    uint32_t word[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int u = 0; u < (DT == CUDA_F32 ? 4 : 8); u++) {
        if (DT == CUDA_F32) {
            w[u] = devio_num_float(word[u]);
        } else {
            uint16_t h = (uint16_t)(word[u / 2] >> (16 * (u % 2)));
            w[u] = DT == CUDA_F16 ? devio_f16_to_f32(h) : devio_bf16_to_f32(h);
        }
    }
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
