/* kernels/emu/emu_runtime.cc - the CUDA runtime API of cuda_runtime_api.h
 * on the CPU: one emulated device with an H200's limits.
 *
 * Memory: every cudaMalloc is its own mapping, 256-byte aligned as on the
 * GPU, its end as close to an inaccessible guard page as the alignment
 * allows, the bytes between filled with a canary that is checked after every
 * kernel (and poisoned for AddressSanitizer in a sanitizer build); a freed
 * buffer stays mapped inaccessible for a while, so device code that touches
 * it faults and is reported. Pinned host memory (cudaMallocHost,
 * cudaHostRegister) is remembered as such.
 *
 * Streams: work is queued and runs, in order, only when the host waits for
 * it (an event or stream synchronisation, cudaDeviceSynchronize, a
 * synchronous copy): the latest a GPU could run it, so a host that reads a
 * result before it waited sees what a GPU might have shown. An asynchronous
 * copy to pinned host memory fills its destination with 0xff bytes at once
 * and writes the data when it runs; from pinned host memory it reads the
 * source when it runs (a host that rewrites it too early shows); pageable
 * memory is copied as the toolkit does (staged at once, or synchronously).
 * The legacy default stream waits for blocking streams and they for it.
 *
 * Graphs: a stream being captured records its work in a graph instead of
 * queueing it; an instantiated graph queues copies of that work (the same
 * kernels with the same arguments, the same host functions) each time it is
 * launched. What the toolkit refuses during a capture is refused here too.
 *
 * Errors: a refused call sets the calling thread's last error; a fault of
 * device code (emu_block.cc) or an injected synchronisation fault is the
 * context's sticky error, which every later call answers, as on hardware.
 * Its report (kernel, block, thread, address) follows the error's string.
 * The whole runtime runs under one lock; kernels run inside the call that
 * waits for them.
 *
 * The runtime's files: this one (its state, faults on request, the device
 * and its properties, the devio_emu_* test hooks of cuda_runtime_api.h), emu_memory.cc,
 * emu_stream.cc, emu_graph.cc and emu_error.cc; what they share is
 * emu_state.h. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/emu/emu_state.h"

using namespace devio_emu;
using namespace devio_emu::rt;

namespace devio_emu {
namespace rt {

std::recursive_mutex mu;
cudaError_t sticky = cudaSuccess;
thread_local cudaError_t last = cudaSuccess;
cudaError_t report_code = cudaSuccess;
char report_msg[800];

size_t mem_total, mem_used;
unsigned long n_malloc, n_launch, n_sync;

} // namespace rt
} // namespace devio_emu

namespace {

bool inited;

int fault_class;
unsigned long fault_n;
bool fault_persist;

int parse_fault(const char *spec)
{
    fault_class = F_NONE;
    n_malloc = n_launch = n_sync = 0;
    if (!spec || !*spec)
        return 0;
    char cls[16];
    unsigned long n;
    int used = 0;
    if (sscanf(spec, "%15[a-z]:%lu%n", cls, &n, &used) != 2 || n == 0)
        return -1;
    const char *rest = spec + used;
    bool persist = strcmp(rest, ",sticky") == 0;
    if (*rest && !persist)
        return -1;
    int c = !strcmp(cls, "malloc") ? F_MALLOC
            : !strcmp(cls, "launch") ? F_LAUNCH
            : !strcmp(cls, "sync")   ? F_SYNC
                                     : F_NONE;
    if (c == F_NONE)
        return -1;
    fault_class = c;
    fault_n = n;
    fault_persist = persist;
    return 0;
}

bool device_visible()
{
    const char *v = getenv("CUDA_VISIBLE_DEVICES");
    return !v || (*v && strcmp(v, "-1") != 0 && strncmp(v, "none", 4) != 0 &&
                  strcmp(v, "NoDevFiles") != 0);
}

} // namespace

namespace devio_emu {
namespace rt {

void init()
{
    if (inited)
        return;
    inited = true;
    const char *mb = getenv("DEVIO_EMU_MEMORY_MB");
    mem_total = (size_t)(mb && atol(mb) > 0 ? atol(mb) : 4096) << 20;
    const char *f = getenv("DEVIO_EMU_FAULT");
    if (parse_fault(f) != 0)
        fprintf(stderr, "devio-emu: DEVIO_EMU_FAULT=%s is not CLASS:N[,sticky]; ignored\n", f);
}

/* Whether the count-th call of class c fails. */
bool fires(int c, unsigned long count)
{
    return fault_class == c && (count == fault_n || (fault_persist && count > fault_n));
}

cudaError_t ret(cudaError_t e)
{
    if (e != cudaSuccess)
        last = e;
    return e;
}

/* A refused call: its reason on stderr and after the error's string. */
cudaError_t refuse(cudaError_t code, const char *fmt, ...)
{
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    record_fault(code, msg);
    return ret(code);
}

} // namespace rt
} // namespace devio_emu

extern "C" {

cudaError_t cudaGetDeviceCount(int *count)
{
    std::lock_guard<std::recursive_mutex> lock(mu);
    init();
    *count = device_visible() ? 1 : 0;
    return *count ? cudaSuccess : ret(cudaErrorNoDevice);
}

cudaError_t cudaSetDevice(int device)
{
    ENTER();
    return device == 0 && device_visible() ? cudaSuccess : ret(cudaErrorInvalidDevice);
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int device)
{
    ENTER();
    if (device != 0 || !device_visible())
        return ret(cudaErrorInvalidDevice);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "devio SIMT emulator (emulated, H200 limits)");
    p->totalGlobalMem = mem_total;
    p->sharedMemPerBlock = SMEM_DEFAULT;
    p->sharedMemPerBlockOptin = SMEM_OPTIN;
    p->regsPerBlock = 65536;
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = 1024;
    p->maxThreadsDim[1] = 1024;
    p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 0x7fffffff;
    p->maxGridSize[1] = 65535;
    p->maxGridSize[2] = 65535;
    p->major = 9;
    p->minor = 0;
    p->multiProcessorCount = 132;
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes)
{
    ENTER();
    *total_bytes = mem_total;
    *free_bytes = mem_total - mem_used;
    return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int *v)
{
    *v = 13000;
    return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int *v)
{
    *v = 13000;
    return cudaSuccess;
}

int devio_emu_fault(const char *spec)
{
    std::lock_guard<std::recursive_mutex> lock(mu);
    init();
    return parse_fault(spec);
}

void devio_emu_counts(unsigned long *mallocs, unsigned long *launches, unsigned long *syncs)
{
    std::lock_guard<std::recursive_mutex> lock(mu);
    *mallocs = n_malloc;
    *launches = n_launch;
    *syncs = n_sync;
}

void devio_emu_reset(void)
{
    std::lock_guard<std::recursive_mutex> lock(mu);
    legacy.q.clear();
    for (CUstream_st *s : streams())
        s->q.clear();
    sticky = cudaSuccess;
    last = cudaSuccess;
    report_code = cudaSuccess;
    report_msg[0] = 0;
}

} // extern "C"
