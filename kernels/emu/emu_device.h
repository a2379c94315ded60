/* kernels/emu/emu_device.h - the device side of CUDA C++ as the SIMT
 * emulator provides it, so that the .cu files of kernels/ compile unchanged with the host
 * compiler (-ffp-contract=off, C++17) and run on the CPU:
 *   - qualifiers (__global__, __device__, ...) and the vector types used;
 *   - threadIdx, blockIdx, blockDim, gridDim of the emulated thread running;
 *   - warp collectives (__shfl*_sync, __ballot_sync, __any/__all_sync,
 *     __syncwarp) and __syncthreads: the emulated thread yields to the
 *     block's scheduler, which completes a collective when every lane of its
 *     mask has reached it and a barrier when every live thread has;
 *   - shared memory as sptr<T>, a pointer whose every access is checked for
 *     bounds and for races between barriers (DEVIO_DYN_SHARED, DEVIO_SHARED);
 *   - atomics, the _rn intrinsics, half and bfloat16 conversions;
 *   - launch(): what LAUNCH (kernels/cuda_warp.cuh) becomes in this build.
 * Everything here runs inside an emulated thread, except launch(), which is
 * host code. Definitions: kernels/emu/emu_stream.cc (launches) and
 * emu_block.cc. */
#ifndef DEVIO_EMU_DEVICE_H
#define DEVIO_EMU_DEVICE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <tuple>
#include <type_traits>
#include <utility>

#include "cuda_runtime_api.h"
#include "device/numerics/numerics.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)

struct uint3 {
    unsigned x, y, z;
};
struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
};
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
struct alignas(16) float4 {
    float x, y, z, w;
};

namespace devio_emu {

/* What device code reads of the emulated thread running now (kernels run
 * one host thread at a time, under the runtime's lock). */
struct ctx {
    uint3 thread_idx;
    uint3 block_idx;
    dim3 block_dim, grid_dim;
};
extern ctx *cur;

enum coll_kind { COLL_SYNC, COLL_SHFL_IDX, COLL_SHFL_XOR, COLL_SHFL_DOWN, COLL_SHFL_UP,
                 COLL_BALLOT, COLL_ANY, COLL_ALL };

/* The calling lane's result of a warp collective over `mask`. */
uint32_t collective(int kind, unsigned mask, uint32_t value, int param, int width);
/* __syncthreads. */
void barrier();
/* Reports a fault of device code (the kernel, block, thread and what went
 * wrong), makes `code` the context's sticky error and abandons the launch. */
[[noreturn]] void device_fault(cudaError_t code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* A vector access must be aligned to its size, as on the GPU. */
inline void check_aligned(const void *p, size_t n, const char *what)
{
    if ((uintptr_t)p % n != 0)
        device_fault(cudaErrorMisalignedAddress, "misaligned address %p for %s", p, what);
}

/* Shared memory: every access goes through shared_access (bounds against the
 * block's shared memory, then the race detector). */
void shared_access(const void *addr, size_t n, bool write);
void *dyn_shared_base();
void *static_shared(size_t bytes, size_t align, const void *site);

template <class T>
struct sref {
    T *p;
    operator T() const
    {
        shared_access(p, sizeof(T), false);
        return *p;
    }
    const sref &operator=(T v) const
    {
        shared_access(p, sizeof(T), true);
        *p = v;
        return *this;
    }
    const sref &operator=(const sref &o) const { return *this = static_cast<T>(o); }
};

template <class T>
struct sptr {
    T *p;
    sref<T> operator[](ptrdiff_t i) const { return sref<T>{p + i}; }
    sref<T> operator*() const { return sref<T>{p}; }
    sptr operator+(ptrdiff_t i) const { return sptr{p + i}; }
    sptr operator-(ptrdiff_t i) const { return sptr{p - i}; }
};

template <class T>
inline sptr<T> dyn_shared()
{
    return sptr<T>{static_cast<T *>(dyn_shared_base())};
}

template <class T>
inline uint32_t bits32(T v)
{
    static_assert(sizeof(T) == 4, "the emulator's collectives move 32-bit values");
    uint32_t u;
    memcpy(&u, &v, 4);
    return u;
}
template <class T>
inline T from32(uint32_t u)
{
    T v;
    memcpy(&v, &u, 4);
    return v;
}

/* ---- launches (host side) ---- */

struct call {
    virtual ~call() {}
    virtual void run() = 0;
    virtual call *clone() const = 0; /* the same kernel and arguments, for a graph's replays */
};
template <class... P>
struct call_of : call {
    void (*k)(P...);
    std::tuple<std::decay_t<P>...> args;
    template <class... A>
    call_of(void (*kernel)(P...), A &&...a) : k(kernel), args(std::forward<A>(a)...)
    {
    }
    void run() override { std::apply(k, args); }
    call *clone() const override { return new call_of(*this); }
};

/* Checks the configuration as an sm_90 part would (a refusal is returned
 * and becomes cudaGetLastError's), then queues the launch on `stream`;
 * takes c. */
cudaError_t enqueue_launch(const char *name, const void *func, dim3 grid, dim3 block, size_t smem,
                           cudaStream_t stream, call *c);

template <class... P, class... A>
inline cudaError_t launch(const char *name, void (*k)(P...), dim3 grid, dim3 block, size_t smem,
                          cudaStream_t stream, A &&...a)
{
    static_assert(sizeof...(P) == sizeof...(A), "a kernel launch takes the kernel's arguments");
    return enqueue_launch(name, reinterpret_cast<const void *>(k), grid, block, smem, stream,
                          new call_of<P...>(k, std::forward<A>(a)...));
}

} // namespace devio_emu

/* The toolkit's C++ overload: a kernel by its own type. */
template <class... P>
inline cudaError_t cudaFuncSetAttribute(void (*k)(P...), enum cudaFuncAttribute attr, int value)
{
    return cudaFuncSetAttribute(reinterpret_cast<const void *>(k), attr, value);
}

#define threadIdx (::devio_emu::cur->thread_idx)
#define blockIdx (::devio_emu::cur->block_idx)
#define blockDim (::devio_emu::cur->block_dim)
#define gridDim (::devio_emu::cur->grid_dim)

/* extern __shared__ T name[] and __shared__ T name[n]. */
#define DEVIO_DYN_SHARED(T, name) ::devio_emu::sptr<T> name = ::devio_emu::dyn_shared<T>()
#define DEVIO_SHARED_VIEW(T, name, base, off)                                                      \
    ::devio_emu::sptr<T> name { reinterpret_cast<T *>(((base) + (off)).p) }
#define DEVIO_SHARED(T, name, n)                                                                   \
    ::devio_emu::sptr<T> name{static_cast<T *>(::devio_emu::static_shared(                         \
        sizeof(T) * (n), alignof(T), [] {                                                          \
            static const char site = 0;                                                            \
            return &site;                                                                          \
        }()))}

/* ---- warp collectives and barriers ---- */

inline void __syncthreads() { devio_emu::barrier(); }
inline void __syncwarp(unsigned mask = 0xffffffffu)
{
    devio_emu::collective(devio_emu::COLL_SYNC, mask, 0, 0, 32);
}
template <class T>
inline T __shfl_sync(unsigned mask, T v, int src, int width = 32)
{
    return devio_emu::from32<T>(
        devio_emu::collective(devio_emu::COLL_SHFL_IDX, mask, devio_emu::bits32(v), src, width));
}
template <class T>
inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32)
{
    return devio_emu::from32<T>(devio_emu::collective(devio_emu::COLL_SHFL_XOR, mask,
                                                      devio_emu::bits32(v), lane_mask, width));
}
template <class T>
inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32)
{
    return devio_emu::from32<T>(devio_emu::collective(devio_emu::COLL_SHFL_DOWN, mask,
                                                      devio_emu::bits32(v), (int)delta, width));
}
template <class T>
inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32)
{
    return devio_emu::from32<T>(devio_emu::collective(devio_emu::COLL_SHFL_UP, mask,
                                                      devio_emu::bits32(v), (int)delta, width));
}
inline unsigned __ballot_sync(unsigned mask, int pred)
{
    return devio_emu::collective(devio_emu::COLL_BALLOT, mask, pred != 0, 0, 32);
}
inline int __any_sync(unsigned mask, int pred)
{
    return (int)devio_emu::collective(devio_emu::COLL_ANY, mask, pred != 0, 0, 32);
}
inline int __all_sync(unsigned mask, int pred)
{
    return (int)devio_emu::collective(devio_emu::COLL_ALL, mask, pred != 0, 0, 32);
}

/* ---- arithmetic: one rounding each (the build says -ffp-contract=off) ---- */

inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmaf_rn(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
inline float __fsqrt_rn(float a) { return __builtin_sqrtf(a); }

/* ---- 16-bit floats, converted by devio's own rules (device/numerics/numerics.h) ---- */

struct __half {
    uint16_t x;
};
struct __nv_bfloat16 {
    uint16_t x;
};
inline __half __float2half_rn(float f) { return __half{devio_f32_to_f16_rne(f)}; }
inline float __half2float(__half h) { return devio_f16_to_f32(h.x); }
inline __nv_bfloat16 __float2bfloat16_rn(float f)
{
    return __nv_bfloat16{devio_f32_to_bf16_rne(f)};
}
inline float __bfloat162float(__nv_bfloat16 h) { return devio_bf16_to_f32(h.x); }

/* ---- atomics on global memory (blocks may run on several host threads) ---- */

template <class T>
inline T atomicAdd(T *p, T v)
{
    if constexpr (std::is_floating_point<T>::value) {
        T old, want;
        __atomic_load(p, &old, __ATOMIC_RELAXED);
        do
            want = old + v;
        while (!__atomic_compare_exchange(p, &old, &want, false, __ATOMIC_RELAXED,
                                          __ATOMIC_RELAXED));
        return old;
    } else {
        return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
    }
}
template <class T>
inline T atomicMax(T *p, T v)
{
    T old = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (old < v && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_RELAXED,
                                                   __ATOMIC_RELAXED)) {
    }
    return old;
}
template <class T>
inline T atomicMin(T *p, T v)
{
    T old = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (old > v && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_RELAXED,
                                                   __ATOMIC_RELAXED)) {
    }
    return old;
}
template <class T>
inline T atomicExch(T *p, T v)
{
    return __atomic_exchange_n(p, v, __ATOMIC_RELAXED);
}
template <class T>
inline T atomicCAS(T *p, T expected, T desired)
{
    __atomic_compare_exchange_n(p, &expected, desired, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    return expected;
}

#endif
