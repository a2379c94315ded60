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
 * waits for them. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "kernels/emu/emu_internal.h"

#if defined(__SANITIZE_ADDRESS__)
#define EMU_ASAN 1
#include <sanitizer/asan_interface.h>
#endif

using namespace devio_emu;

namespace {

const uint32_t STREAM_MAGIC = 0x53545245u, EVENT_MAGIC = 0x45564e54u, DEAD = 0xdeadbeefu;
const uint32_t GRAPH_MAGIC = 0x47525048u, EXEC_MAGIC = 0x47455845u;
const size_t ALIGN = 256;           /* cudaMalloc's alignment */
const unsigned char CANARY = 0xa5;  /* the bytes between a buffer's end and its guard page */
const size_t SMEM_DEFAULT = 48 * 1024, SMEM_OPTIN = 232448; /* sm_90 */
const size_t QUARANTINE = 256u << 20; /* freed bytes kept inaccessible */

struct alloc {
    char *base;
    size_t size, cap;
    char *map;
    size_t map_len;
};

enum op_kind { OP_FN, OP_LAUNCH, OP_RECORD };

} // namespace

struct CUevent_st;

struct op {
    uint64_t seq = 0;
    op_kind kind;
    std::function<void()> fn;
    std::unique_ptr<launch_rec> L;
    CUevent_st *ev;
};

struct CUgraph_st;

struct CUstream_st {
    uint32_t magic;
    bool blocking;
    std::deque<op> q;
    CUgraph_st *capture = nullptr; /* recording into it, not queueing */
    cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
    std::thread::id capturer;
};

/* A captured graph, and an instantiated one (the same ops, copied). */
struct CUgraph_st {
    uint32_t magic;
    std::vector<op> ops;
    bool invalid; /* something refused during the capture */
};
struct CUgraphExec_st {
    uint32_t magic;
    std::vector<op> ops;
};

struct CUevent_st {
    uint32_t magic;
    CUstream_st *s = nullptr;
    uint64_t seq; /* of its latest record */
    bool recorded;
};

namespace {

std::recursive_mutex mu;
bool inited;
cudaError_t sticky = cudaSuccess;
thread_local cudaError_t last = cudaSuccess;
cudaError_t report_code = cudaSuccess;
char report_msg[800];

std::map<uintptr_t, alloc> live;
std::deque<alloc> freed;
size_t freed_bytes, mem_total, mem_used;
std::map<const void *, int> dyn_smem_max;
/* Every stream and event made, destroyed ones marked DEAD and kept so that a
 * later use is recognised, and the pinned host ranges; these tables are
 * never freed, so that what they hold stays reachable at exit (no leak
 * reported by a sanitizer), the buffers of a failed device included: after
 * a sticky error cudaFreeHost frees nothing, as on the GPU. */
std::map<uintptr_t, size_t> *pinned_;
std::map<uintptr_t, size_t> &pinned()
{
    if (!pinned_)
        pinned_ = new std::map<uintptr_t, size_t>;
    return *pinned_;
}
std::vector<CUstream_st *> *streams_;
std::vector<CUevent_st *> *events_;
std::vector<void *> *graphs_; /* graphs and instantiated graphs, kept as streams are */
void keep_graph(void *g)
{
    if (!graphs_)
        graphs_ = new std::vector<void *>;
    graphs_->push_back(g);
}
std::vector<CUstream_st *> &streams()
{
    if (!streams_) /* made at first use: a plugin only probed allocates nothing */
        streams_ = new std::vector<CUstream_st *>;
    return *streams_;
}
std::vector<CUevent_st *> &events()
{
    if (!events_)
        events_ = new std::vector<CUevent_st *>;
    return *events_;
}
CUstream_st legacy = {STREAM_MAGIC, true, {}, nullptr, cudaStreamCaptureModeGlobal, {}};
uint64_t seq_next = 1;

enum { F_NONE, F_MALLOC, F_LAUNCH, F_SYNC };
int fault_class;
unsigned long fault_n, n_malloc, n_launch, n_sync;
bool fault_persist;

size_t page()
{
    static size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    return pg;
}

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
cudaError_t refuse(cudaError_t code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
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

/* Entry of every API call: the lock, then the sticky error if any. */
#define ENTER()                                                                                    \
    std::lock_guard<std::recursive_mutex> lock_(mu);                                               \
    init();                                                                                        \
    if (sticky != cudaSuccess)                                                                     \
        return ret(sticky);

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

void exec(op &o)
{
    if (sticky != cudaSuccess)
        return; /* a dead context runs nothing more */
    switch (o.kind) {
    case OP_FN: o.fn(); break;
    case OP_RECORD: break;
    case OP_LAUNCH: {
        cudaError_t e = run_launch(*o.L);
        if (e != cudaSuccess)
            sticky = e;
        else
            check_canaries(*o.L);
        break;
    }
    }
}

/* Runs s's queued work up to sequence number upto, with the legacy default
 * stream's ordering against blocking streams. */
void drain(CUstream_st *s, uint64_t upto)
{
    while (!s->q.empty() && s->q.front().seq <= upto) {
        op o = std::move(s->q.front());
        s->q.pop_front();
        if (s == &legacy) {
            for (CUstream_st *b : streams())
                if (b->magic == STREAM_MAGIC && b->blocking)
                    drain(b, o.seq - 1);
        } else if (s->blocking) {
            drain(&legacy, o.seq - 1);
        }
        exec(o);
    }
}

void drain_all()
{
    drain(&legacy, UINT64_MAX);
    for (CUstream_st *s : streams())
        if (s->magic == STREAM_MAGIC)
            drain(s, UINT64_MAX);
}

uint64_t enqueue(CUstream_st *s, op o)
{
    if (s->capture) {
        s->capture->ops.push_back(std::move(o));
        return 0;
    }
    o.seq = seq_next++;
    uint64_t seq = o.seq;
    s->q.push_back(std::move(o));
    return seq;
}

uint64_t enqueue_fn(CUstream_st *s, std::function<void()> fn)
{
    op o;
    o.kind = OP_FN;
    o.fn = std::move(fn);
    o.ev = nullptr;
    return enqueue(s, std::move(o));
}

cudaError_t get_stream(cudaStream_t h, CUstream_st **out)
{
    if (!h) {
        *out = &legacy;
        return cudaSuccess;
    }
    if (h->magic == DEAD)
        return refuse(cudaErrorInvalidResourceHandle, "use of a destroyed stream %p", (void *)h);
    if (h->magic != STREAM_MAGIC)
        return refuse(cudaErrorInvalidResourceHandle, "%p is not a stream", (void *)h);
    *out = h;
    return cudaSuccess;
}

/* The same work as o, for a graph's instantiation or launch. */
op clone_op(const op &o)
{
    op c;
    c.seq = 0;
    c.kind = o.kind;
    c.fn = o.fn;
    c.ev = nullptr;
    if (o.L)
        c.L.reset(new launch_rec{o.L->name, o.L->func, o.L->grid, o.L->block, o.L->smem,
                                 std::unique_ptr<call>(o.L->args->clone())});
    return c;
}

/* What a capture forbids: `what` on stream s while it captures, or (s NULL)
 * a blocking call while a capture in Global mode, or one of this thread in
 * ThreadLocal mode, is under way. Refused, the capture invalidated. */
cudaError_t capture_guard(CUstream_st *s, const char *what)
{
    std::vector<CUstream_st *> hit;
    if (s && s->capture)
        hit.push_back(s);
    if (!s)
        for (CUstream_st *c : streams())
            if (c->magic == STREAM_MAGIC && c->capture &&
                (c->mode == cudaStreamCaptureModeGlobal ||
                 (c->mode == cudaStreamCaptureModeThreadLocal &&
                  c->capturer == std::this_thread::get_id())))
                hit.push_back(c);
    if (hit.empty())
        return cudaSuccess;
    for (CUstream_st *c : hit)
        c->capture->invalid = true;
    return refuse(cudaErrorStreamCaptureUnsupported, "%s while a stream is being captured", what);
}

cudaError_t get_event(cudaEvent_t h)
{
    if (!h)
        return refuse(cudaErrorInvalidResourceHandle, "a null event");
    if (h->magic == DEAD)
        return refuse(cudaErrorInvalidResourceHandle, "use of a destroyed event %p", (void *)h);
    if (h->magic != EVENT_MAGIC)
        return refuse(cudaErrorInvalidResourceHandle, "%p is not an event", (void *)h);
    return cudaSuccess;
}

/* A synchronisation point: counted for injected faults. */
cudaError_t sync_point(const char *what)
{
    if (fires(F_SYNC, ++n_sync)) {
        char msg[200];
        snprintf(msg, sizeof msg, "injected fault at synchronisation %lu (%s)", n_sync, what);
        record_fault(cudaErrorLaunchFailure, msg);
        sticky = cudaErrorLaunchFailure;
        return ret(sticky);
    }
    return cudaSuccess;
}

cudaError_t after_sync() { return ret(sticky); }

bool device_visible()
{
    const char *v = getenv("CUDA_VISIBLE_DEVICES");
    return !v || (*v && strcmp(v, "-1") != 0 && strncmp(v, "none", 4) != 0 &&
                  strcmp(v, "NoDevFiles") != 0);
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

void record_fault(cudaError_t code, const char *msg)
{
    std::lock_guard<std::recursive_mutex> lock(mu);
    if (code != cudaSuccess && report_code == sticky && sticky != cudaSuccess)
        return; /* the sticky error's report stays the first one */
    report_code = code;
    snprintf(report_msg, sizeof report_msg, "%s", msg);
    fprintf(stderr, "devio-emu: %s\n", msg);
}

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

bool reverse_order()
{
    static int rev = -1;
    if (rev < 0) {
        const char *o = getenv("DEVIO_EMU_ORDER");
        rev = o && strcmp(o, "reverse") == 0;
    }
    return rev == 1;
}

cudaError_t enqueue_launch(const char *name, const void *func, dim3 grid, dim3 block, size_t smem,
                           cudaStream_t stream, call *c)
{
    std::unique_ptr<call> args(c);
    ENTER();
    CUstream_st *s = nullptr;
    cudaError_t e = get_stream(stream, &s);
    if (e != cudaSuccess)
        return e;
    if (fires(F_LAUNCH, ++n_launch))
        return refuse(cudaErrorLaunchOutOfResources, "injected refusal of launch %lu (%s)",
                      n_launch, name);
    unsigned long threads = (unsigned long)block.x * block.y * block.z;
    if (block.x == 0 || block.y == 0 || block.z == 0 || block.x > 1024 || block.y > 1024 ||
        block.z > 64 || threads > 1024)
        return refuse(cudaErrorInvalidConfiguration,
                      "%s: a block of (%u,%u,%u) threads; an sm_90 part takes at most 1024, at "
                      "most (1024,1024,64)",
                      name, block.x, block.y, block.z);
    if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 0x7fffffffu || grid.y > 65535 ||
        grid.z > 65535)
        return refuse(cudaErrorInvalidConfiguration,
                      "%s: a grid of (%u,%u,%u) blocks; an sm_90 part takes at most "
                      "(2147483647,65535,65535)",
                      name, grid.x, grid.y, grid.z);
    auto it = dyn_smem_max.find(func);
    size_t allowed = it != dyn_smem_max.end() ? (size_t)it->second : SMEM_DEFAULT;
    if (allowed < SMEM_DEFAULT)
        allowed = SMEM_DEFAULT;
    if (smem > allowed)
        return refuse(cudaErrorInvalidValue,
                      "%s: %zu bytes of dynamic shared memory; above %zu a kernel needs "
                      "cudaFuncAttributeMaxDynamicSharedMemorySize, and it allows %zu",
                      name, smem, SMEM_DEFAULT, allowed);
    op o;
    o.kind = OP_LAUNCH;
    o.ev = nullptr;
    o.L.reset(new launch_rec{name, func, grid, block, smem, std::move(args)});
    enqueue(s, std::move(o));
    return cudaSuccess;
}

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

cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void *data)
{
    ENTER();
    CUstream_st *s = nullptr;
    cudaError_t e = get_stream(stream, &s);
    if (e != cudaSuccess)
        return e;
    if (!fn)
        return refuse(cudaErrorInvalidValue, "cudaLaunchHostFunc: no function");
    enqueue_fn(s, [fn, data] { fn(data); });
    return cudaSuccess;
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

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags)
{
    *stream = nullptr;
    ENTER();
    CUstream_st *s = new CUstream_st{STREAM_MAGIC, !(flags & cudaStreamNonBlocking), {},
                                     nullptr, cudaStreamCaptureModeGlobal, {}};
    streams().push_back(s);
    *stream = s;
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *stream)
{
    return cudaStreamCreateWithFlags(stream, cudaStreamDefault);
}

cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
    ENTER();
    CUstream_st *s = nullptr;
    cudaError_t e = get_stream(stream, &s);
    if (e != cudaSuccess)
        return e;
    if (s == &legacy)
        return refuse(cudaErrorInvalidResourceHandle, "cudaStreamDestroy of the default stream");
    if ((e = capture_guard(s, "cudaStreamDestroy of it")) != cudaSuccess)
        return e;
    drain(s, UINT64_MAX); /* its work completes, as on the GPU */
    s->magic = DEAD;      /* kept, so that a later use is recognised */
    return ret(sticky);
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    ENTER();
    CUstream_st *s = nullptr;
    cudaError_t e = get_stream(stream, &s);
    if (e == cudaSuccess)
        e = capture_guard(s, "cudaStreamSynchronize of it");
    if (e == cudaSuccess)
        e = capture_guard(nullptr, "cudaStreamSynchronize");
    if (e != cudaSuccess || (e = sync_point("cudaStreamSynchronize")) != cudaSuccess)
        return e;
    drain(s, UINT64_MAX);
    return after_sync();
}

cudaError_t cudaDeviceSynchronize(void)
{
    ENTER();
    cudaError_t e = capture_guard(nullptr, "cudaDeviceSynchronize");
    if (e != cudaSuccess || (e = sync_point("cudaDeviceSynchronize")) != cudaSuccess)
        return e;
    drain_all();
    return after_sync();
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags)
{
    *event = nullptr;
    ENTER();
    if (flags & ~(cudaEventBlockingSync | cudaEventDisableTiming))
        return ret(cudaErrorInvalidValue);
    *event = new CUevent_st{EVENT_MAGIC, nullptr, 0, false};
    events().push_back(*event);
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *event)
{
    return cudaEventCreateWithFlags(event, cudaEventDefault);
}

cudaError_t cudaEventDestroy(cudaEvent_t event)
{
    ENTER();
    cudaError_t e = get_event(event);
    if (e != cudaSuccess)
        return e;
    event->magic = DEAD; /* kept, so that a later use is recognised */
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    ENTER();
    CUstream_st *s = nullptr;
    cudaError_t e = get_event(event);
    if (e == cudaSuccess)
        e = get_stream(stream, &s);
    if (e == cudaSuccess)
        e = capture_guard(s, "cudaEventRecord on it (the emulator keeps events out of graphs)");
    if (e != cudaSuccess)
        return e;
    op o;
    o.kind = OP_RECORD;
    o.ev = event;
    event->seq = enqueue(s, std::move(o));
    event->s = s;
    event->recorded = true;
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
    ENTER();
    cudaError_t e = get_event(event);
    if (e != cudaSuccess || (e = sync_point("cudaEventSynchronize")) != cudaSuccess)
        return e;
    if (event->recorded)
        drain(event->s, event->seq);
    return after_sync();
}

/* The emulator runs work only when waited for: a query runs the event's
 * stream up to it and answers done. */
cudaError_t cudaEventQuery(cudaEvent_t event)
{
    ENTER();
    cudaError_t e = get_event(event);
    if (e != cudaSuccess)
        return e;
    if (event->recorded)
        drain(event->s, event->seq);
    return after_sync();
}

cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value)
{
    ENTER();
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize)
        return refuse(cudaErrorInvalidValue, "cudaFuncSetAttribute: attribute %d", (int)attr);
    if (value < 0 || (size_t)value > SMEM_OPTIN)
        return refuse(cudaErrorInvalidValue,
                      "cudaFuncSetAttribute: %d bytes of dynamic shared memory; an sm_90 part "
                      "allows at most %zu",
                      value, SMEM_OPTIN);
    dyn_smem_max[func] = value;
    return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode)
{
    ENTER();
    CUstream_st *s = nullptr;
    cudaError_t e = get_stream(stream, &s);
    if (e != cudaSuccess)
        return e;
    if (s == &legacy)
        return refuse(cudaErrorStreamCaptureUnsupported, "capture of the legacy default stream");
    if (s->capture)
        return refuse(cudaErrorIllegalState, "cudaStreamBeginCapture: the stream is already "
                                             "being captured");
    if (mode > cudaStreamCaptureModeRelaxed)
        return refuse(cudaErrorInvalidValue, "cudaStreamBeginCapture: mode %d", (int)mode);
    s->capture = new CUgraph_st{GRAPH_MAGIC, {}, false};
    keep_graph(s->capture);
    s->mode = mode;
    s->capturer = std::this_thread::get_id();
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *graph)
{
    *graph = nullptr;
    ENTER();
    CUstream_st *s = nullptr;
    cudaError_t e = get_stream(stream, &s);
    if (e != cudaSuccess)
        return e;
    if (!s->capture)
        return refuse(cudaErrorIllegalState, "cudaStreamEndCapture: the stream is not being "
                                             "captured");
    CUgraph_st *g = s->capture;
    s->capture = nullptr;
    if (s->capturer != std::this_thread::get_id())
        g->invalid = true;
    if (g->invalid) {
        g->magic = DEAD;
        g->ops.clear();
        return refuse(cudaErrorStreamCaptureInvalidated,
                      "cudaStreamEndCapture: the capture was invalidated by a call it forbids "
                      "(or ended by another thread)");
    }
    *graph = g;
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph,
                                 unsigned long long flags)
{
    *exec = nullptr;
    ENTER();
    if (!graph || graph->magic != GRAPH_MAGIC)
        return refuse(cudaErrorInvalidResourceHandle, "%p is not a graph", (void *)graph);
    if (flags)
        return refuse(cudaErrorInvalidValue, "cudaGraphInstantiate: flags %llu", flags);
    CUgraphExec_st *x = new CUgraphExec_st{EXEC_MAGIC, {}};
    keep_graph(x);
    for (const op &o : graph->ops)
        x->ops.push_back(clone_op(o));
    *exec = x;
    return cudaSuccess;
}

/* Counted as one launch for injected faults. */
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream)
{
    ENTER();
    CUstream_st *s = nullptr;
    cudaError_t e = get_stream(stream, &s);
    if (e != cudaSuccess)
        return e;
    if (!exec || exec->magic != EXEC_MAGIC)
        return refuse(cudaErrorInvalidResourceHandle, "%p is not an instantiated graph",
                      (void *)exec);
    if (s->capture)
        return refuse(cudaErrorStreamCaptureUnsupported,
                      "cudaGraphLaunch into a stream being captured (the emulator does not "
                      "nest graphs)");
    if (fires(F_LAUNCH, ++n_launch))
        return refuse(cudaErrorLaunchOutOfResources, "injected refusal of launch %lu (a graph)",
                      n_launch);
    for (const op &o : exec->ops)
        enqueue(s, clone_op(o));
    return cudaSuccess;
}

/* Work already launched from it still runs: it was queued as copies. */
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec)
{
    ENTER();
    if (!exec || exec->magic != EXEC_MAGIC)
        return refuse(cudaErrorInvalidResourceHandle, "%p is not an instantiated graph",
                      (void *)exec);
    exec->magic = DEAD;
    exec->ops.clear();
    return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph)
{
    ENTER();
    if (!graph || graph->magic != GRAPH_MAGIC)
        return refuse(cudaErrorInvalidResourceHandle, "%p is not a graph", (void *)graph);
    graph->magic = DEAD;
    graph->ops.clear();
    return cudaSuccess;
}

cudaError_t cudaGetLastError(void)
{
    std::lock_guard<std::recursive_mutex> lock(mu);
    cudaError_t e = last;
    last = sticky;
    return e;
}

cudaError_t cudaPeekAtLastError(void) { return last; }

const char *cudaGetErrorName(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInitializationError: return "cudaErrorInitializationError";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorInsufficientDriver: return "cudaErrorInsufficientDriver";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorLaunchOutOfResources: return "cudaErrorLaunchOutOfResources";
    case cudaErrorMisalignedAddress: return "cudaErrorMisalignedAddress";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorIllegalState: return "cudaErrorIllegalState";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorUnknown: return "cudaErrorUnknown";
    }
    return "cudaErrorUnknown";
}

static const char *base_string(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInitializationError: return "initialization error";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorInsufficientDriver:
        return "CUDA driver version is insufficient for CUDA runtime version";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
    case cudaErrorMisalignedAddress: return "misaligned address";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorIllegalState: return "the operation is not permitted in this state";
    case cudaErrorStreamCaptureUnsupported:
        return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated:
        return "operation failed due to a previous error during capture";
    case cudaErrorUnknown: return "unknown error";
    }
    return "unrecognized error code";
}

/* The error's string, then the emulator's report of it when it made one. */
const char *cudaGetErrorString(cudaError_t e)
{
    static thread_local char buf[1000]; /* per thread: the string outlives the call */
    std::lock_guard<std::recursive_mutex> lock(mu);
    if (e == cudaSuccess || e != report_code || !report_msg[0])
        return base_string(e);
    snprintf(buf, sizeof buf, "%s (devio-emu: %s)", base_string(e), report_msg);
    return buf;
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
