/* kernels/emu/emu_stream.cc - the emulated device's queues (emu_runtime.cc
 * tells the whole design): streams whose work runs, in order, only when the
 * host waits for it, the legacy default stream's ordering against blocking
 * streams, events, kernel launches checked against an sm_90 part's limits,
 * host functions, and the synchronisation points counted for injected
 * faults. */
#include <stdio.h>
#include <string.h>

#include <map>

#include "kernels/emu/emu_state.h"

using namespace devio_emu;
using namespace devio_emu::rt;

namespace {

/* Every stream and event made, destroyed ones marked DEAD and kept so that a
 * later use is recognised; never freed, so that what they hold stays
 * reachable at exit (no leak reported by a sanitizer). */
std::vector<CUstream_st *> *streams_;
std::vector<CUevent_st *> *events_;

uint64_t seq_next = 1;

std::map<const void *, int> dyn_smem_max;

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

} // namespace

namespace devio_emu {
namespace rt {

std::vector<CUstream_st *> &streams()
{
    if (!streams_) /* made at first use: a plugin only probed allocates nothing */
        streams_ = new std::vector<CUstream_st *>;
    return *streams_;
}

CUstream_st legacy = {STREAM_MAGIC, true, {}, nullptr, cudaStreamCaptureModeGlobal, {}};

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

} // namespace rt
} // namespace devio_emu

namespace {

std::vector<CUevent_st *> &events()
{
    if (!events_)
        events_ = new std::vector<CUevent_st *>;
    return *events_;
}

} // namespace

namespace devio_emu {

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

} // extern "C"
