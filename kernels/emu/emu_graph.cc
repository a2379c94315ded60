/* kernels/emu/emu_graph.cc - stream capture and graphs on the emulated
 * device (emu_runtime.cc tells the whole design): a stream being captured
 * records its work in a graph instead of queueing it; an instantiated graph
 * queues copies of that work (the same kernels with the same arguments, the
 * same host functions) each time it is launched. What the toolkit refuses
 * during a capture is refused here too, and invalidates the capture. */

#include "kernels/emu/emu_state.h"

using namespace devio_emu;
using namespace devio_emu::rt;

namespace {

std::vector<void *> *graphs_; /* graphs and instantiated graphs, kept as streams are */

void keep_graph(void *g)
{
    if (!graphs_)
        graphs_ = new std::vector<void *>;
    graphs_->push_back(g);
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

} // namespace

namespace devio_emu {
namespace rt {

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

} // namespace rt
} // namespace devio_emu

extern "C" {

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

} // extern "C"
