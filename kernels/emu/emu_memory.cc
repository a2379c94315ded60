/* kernels/emu/emu_memory.cc - the emulated device's memory (emu_runtime.cc
 * tells the whole design): every cudaMalloc its own mapping between guard
 * pages, the slack behind a buffer's end a canary checked after every
 * kernel, freed buffers kept inaccessible for a while; pinned host memory
 * (cudaMallocHost, cudaHostRegister) remembered; copies and memsets queued
 * on streams, with the toolkit's behaviour for pageable and pinned host
 * memory. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <deque>
#include <map>

#include "kernels/emu/emu_state.h"

using namespace devio_emu;
using namespace devio_emu::rt;

namespace {

struct alloc {
    char *base;
    size_t size, cap;
    char *map;
    size_t map_len;
};

std::map<uintptr_t, alloc> live;
std::deque<alloc> freed;

size_t freed_bytes;

/* The pinned host ranges; never freed, so that what they hold stays
 * reachable at exit (no leak reported by a sanitizer), the buffers of a
 * failed device included: after a sticky error cudaFreeHost frees nothing,
 * as on the GPU. */
std::map<uintptr_t, size_t> *pinned_;
std::map<uintptr_t, size_t> &pinned()
{
    if (!pinned_)
        pinned_ = new std::map<uintptr_t, size_t>;
    return *pinned_;
}

size_t page()
{
    static size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    return pg;
}

const alloc *device_range(const void *p, size_t n)
{
    uintptr_t a = (uintptr_t)p;
    auto it = live.upper_bound(a);
    if (it == live.begin())
        return nullptr;
    --it;
    const alloc &al = it->second;
    if (a >= (uintptr_t)al.base && a + n <= (uintptr_t)al.base + al.size && a + n >= a)
        return &al;
    return nullptr;
}

bool is_pinned(const void *p, size_t n)
{
    uintptr_t a = (uintptr_t)p;
    auto it = pinned().upper_bound(a);
    if (it == pinned().begin())
        return false;
    --it;
    return a >= it->first && a + n <= it->first + it->second;
}

/* Where the direction says device memory, the range must be inside one buffer. */
cudaError_t check_copy(void *dst, const void *src, size_t n, cudaMemcpyKind kind, const char *what)
{
    bool dd = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    bool sd = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if (kind > cudaMemcpyDefault)
        return refuse(cudaErrorInvalidMemcpyDirection, "%s: direction %d", what, (int)kind);
    if (kind == cudaMemcpyDefault) {
        dd = device_range(dst, n) != nullptr;
        sd = device_range(src, n) != nullptr;
    }
    if (n == 0)
        return cudaSuccess;
    if (dd && !device_range(dst, n))
        return refuse(cudaErrorInvalidValue,
                      "%s: the destination %p is not %zu bytes inside one device buffer", what,
                      dst, n);
    if (sd && !device_range(src, n))
        return refuse(cudaErrorInvalidValue,
                      "%s: the source %p is not %zu bytes inside one device buffer", what, src,
                      n);
    return cudaSuccess;
}

} // namespace

namespace devio_emu {
namespace rt {

/* The bytes between each live buffer's end and its guard page, after a
 * kernel: a write past the end shows there. */
void check_canaries(const launch_rec &L)
{
#ifndef EMU_ASAN
    for (const auto &kv : live) {
        const alloc &a = kv.second;
        for (size_t i = a.size; i < a.cap; i++)
            if ((unsigned char)a.base[i] != CANARY) {
                char msg[300];
                snprintf(msg, sizeof msg,
                         "kernel %s wrote past the end of a device buffer of %zu bytes at %p "
                         "(byte %zu after its end, found by the canary after the kernel)",
                         L.name.c_str(), a.size, (void *)a.base, i - a.size);
                record_fault(cudaErrorIllegalAddress, msg);
                sticky = cudaErrorIllegalAddress;
                return;
            }
    }
#else
    (void)L;
#endif
}

} // namespace rt

bool describe_address(const void *addr, char *buf, size_t n)
{
    const char *p = static_cast<const char *>(addr);
    for (const auto &kv : live) {
        const alloc &a = kv.second;
        if (p >= a.map && p < a.map + a.map_len) {
            if (p < a.base)
                snprintf(buf, n, "%p, %zu bytes before a device buffer of %zu bytes", addr,
                         (size_t)(a.base - p), a.size);
            else
                snprintf(buf, n, "%p, %zu bytes past the end of a device buffer of %zu bytes",
                         addr, (size_t)(p - a.base) - a.size, a.size);
            return true;
        }
    }
    for (const alloc &a : freed)
        if (p >= a.map && p < a.map + a.map_len) {
            snprintf(buf, n, "%p, in a device buffer of %zu bytes that was freed", addr, a.size);
            return true;
        }
    return false;
}

} // namespace devio_emu

extern "C" {

cudaError_t cudaMalloc(void **ptr, size_t bytes)
{
    *ptr = nullptr;
    ENTER();
    if (fires(F_MALLOC, ++n_malloc))
        return ret(cudaErrorMemoryAllocation);
    alloc a;
    a.size = bytes;
    a.cap = (bytes ? bytes + ALIGN - 1 : ALIGN) / ALIGN * ALIGN;
    size_t pg = page(), data = (a.cap + pg - 1) / pg * pg;
    if (a.cap > mem_total - mem_used)
        return ret(cudaErrorMemoryAllocation);
    a.map_len = data + 2 * pg;
    a.map = static_cast<char *>(mmap(nullptr, a.map_len, PROT_READ | PROT_WRITE,
                                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
    if (a.map == MAP_FAILED)
        return ret(cudaErrorMemoryAllocation);
    mprotect(a.map, pg, PROT_NONE);
    mprotect(a.map + pg + data, pg, PROT_NONE);
    a.base = a.map + pg + data - a.cap;
    memset(a.base + a.size, CANARY, a.cap - a.size);
#ifdef EMU_ASAN
    ASAN_POISON_MEMORY_REGION(a.base + a.size, a.cap - a.size);
#endif
    live[(uintptr_t)a.base] = a;
    mem_used += a.cap;
    *ptr = a.base;
    return cudaSuccess;
}

cudaError_t cudaFree(void *ptr)
{
    ENTER();
    if (!ptr)
        return cudaSuccess;
    drain_all(); /* cudaFree waits for the device, as the toolkit's does */
    if (sticky != cudaSuccess)
        return ret(sticky);
    auto it = live.find((uintptr_t)ptr);
    if (it == live.end()) {
        for (const alloc &a : freed)
            if (a.base == ptr)
                return refuse(cudaErrorInvalidValue, "cudaFree of %p, which was freed already",
                              ptr);
        return refuse(cudaErrorInvalidValue, "cudaFree of %p, which cudaMalloc did not give",
                      ptr);
    }
    alloc a = it->second;
    live.erase(it);
    mem_used -= a.cap;
#ifdef EMU_ASAN
    ASAN_UNPOISON_MEMORY_REGION(a.base + a.size, a.cap - a.size);
#endif
    mprotect(a.map, a.map_len, PROT_NONE);
    freed.push_back(a);
    freed_bytes += a.map_len;
    while (freed_bytes > QUARANTINE && freed.size() > 1) {
        munmap(freed.front().map, freed.front().map_len);
        freed_bytes -= freed.front().map_len;
        freed.pop_front();
    }
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void **ptr, size_t bytes)
{
    *ptr = nullptr;
    ENTER();
    if (fires(F_MALLOC, ++n_malloc))
        return ret(cudaErrorMemoryAllocation);
    void *p = nullptr;
    if (posix_memalign(&p, 4096, bytes ? bytes : 1) != 0)
        return ret(cudaErrorMemoryAllocation);
    pinned()[(uintptr_t)p] = bytes;
    *ptr = p;
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void *ptr)
{
    ENTER();
    if (!ptr)
        return cudaSuccess;
    drain_all();
    auto it = pinned().find((uintptr_t)ptr);
    if (it == pinned().end())
        return refuse(cudaErrorInvalidValue,
                      "cudaFreeHost of %p, which cudaMallocHost did not give", ptr);
    pinned().erase(it);
    free(ptr);
    return ret(sticky);
}

cudaError_t cudaHostRegister(void *ptr, size_t bytes, unsigned int flags)
{
    ENTER();
    if (!ptr || bytes == 0 || flags != cudaHostRegisterDefault)
        return ret(cudaErrorInvalidValue);
    if (is_pinned(ptr, 1) || is_pinned((char *)ptr + bytes - 1, 1))
        return refuse(cudaErrorInvalidValue, "cudaHostRegister of %p: already registered", ptr);
    pinned()[(uintptr_t)ptr] = bytes;
    return cudaSuccess;
}

cudaError_t cudaHostUnregister(void *ptr)
{
    ENTER();
    drain_all();
    if (pinned().erase((uintptr_t)ptr) == 0)
        return refuse(cudaErrorInvalidValue, "cudaHostUnregister of %p, which is not registered",
                      ptr);
    return ret(sticky);
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
                            cudaStream_t stream)
{
    ENTER();
    CUstream_st *s = nullptr;
    cudaError_t e = get_stream(stream, &s);
    if (e == cudaSuccess)
        e = check_copy(dst, src, n, kind, "cudaMemcpyAsync");
    if (e != cudaSuccess || n == 0)
        return e;
    bool to_host = !device_range(dst, n), from_host = !device_range(src, n);
    if (((from_host && !is_pinned(src, n)) || (to_host && !is_pinned(dst, n))) &&
        (e = capture_guard(s, "cudaMemcpyAsync with pageable host memory")) != cudaSuccess)
        return e;
    if (from_host && !is_pinned(src, n)) {
        /* Pageable source: staged now, so the host may reuse it on return. */
        auto staged = std::make_shared<std::vector<char>>((const char *)src, (const char *)src + n);
        enqueue_fn(s, [dst, staged] { memcpy(dst, staged->data(), staged->size()); });
        return cudaSuccess;
    }
    if (to_host && !is_pinned(dst, n)) {
        /* Pageable destination: synchronous, as the toolkit makes it. */
        uint64_t seq = enqueue_fn(s, [dst, src, n] { memcpy(dst, src, n); });
        drain(s, seq);
        return ret(sticky);
    }
    if (to_host)
        memset(dst, 0xff, n); /* not there yet: a read before the wait shows it */
    enqueue_fn(s, [dst, src, n] { memmove(dst, src, n); });
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind)
{
    ENTER();
    cudaError_t e = check_copy(dst, src, n, kind, "cudaMemcpy");
    if (e == cudaSuccess)
        e = capture_guard(nullptr, "cudaMemcpy");
    if (e != cudaSuccess || n == 0)
        return e;
    uint64_t seq = enqueue_fn(&legacy, [dst, src, n] { memmove(dst, src, n); });
    drain(&legacy, seq);
    return ret(sticky);
}

cudaError_t cudaMemsetAsync(void *dst, int value, size_t n, cudaStream_t stream)
{
    ENTER();
    CUstream_st *s = nullptr;
    cudaError_t e = get_stream(stream, &s);
    if (e != cudaSuccess)
        return e;
    if (n && !device_range(dst, n))
        return refuse(cudaErrorInvalidValue,
                      "cudaMemset: %p is not %zu bytes inside one device buffer", dst, n);
    enqueue_fn(s, [dst, value, n] { memset(dst, value, n); });
    return cudaSuccess;
}

cudaError_t cudaMemset(void *dst, int value, size_t n)
{
    ENTER();
    cudaError_t e = capture_guard(nullptr, "cudaMemset");
    if (e == cudaSuccess)
        e = cudaMemsetAsync(dst, value, n, nullptr);
    if (e != cudaSuccess)
        return e;
    drain(&legacy, UINT64_MAX);
    return ret(sticky);
}

} // extern "C"
