/* kernels/emu/emu_state.h - what the files of the emulator's CUDA runtime
 * share: emu_runtime.cc (the state, faults on request, the device),
 * emu_memory.cc (buffers, pinned memory, copies), emu_stream.cc (queues,
 * streams, events, launches), emu_graph.cc (captures and graphs) and
 * emu_error.cc (error codes, strings, reports). The handles' structs, the
 * state behind the one lock, and the helpers every API call uses. Private
 * to kernels/emu/. */
#ifndef DEVIO_EMU_STATE_H
#define DEVIO_EMU_STATE_H

#include <stddef.h>
#include <stdint.h>

#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "kernels/emu/emu_internal.h"

#if defined(__SANITIZE_ADDRESS__)
#define EMU_ASAN 1
#include <sanitizer/asan_interface.h>
#endif

namespace devio_emu {
namespace rt {

const uint32_t STREAM_MAGIC = 0x53545245u, EVENT_MAGIC = 0x45564e54u, DEAD = 0xdeadbeefu;
const uint32_t GRAPH_MAGIC = 0x47525048u, EXEC_MAGIC = 0x47455845u;
const size_t ALIGN = 256;           /* cudaMalloc's alignment */
const unsigned char CANARY = 0xa5;  /* the bytes between a buffer's end and its guard page */
const size_t SMEM_DEFAULT = 48 * 1024, SMEM_OPTIN = 232448; /* sm_90 */
const size_t QUARANTINE = 256u << 20; /* freed bytes kept inaccessible */

enum op_kind { OP_FN, OP_LAUNCH, OP_RECORD };

} // namespace rt
} // namespace devio_emu

struct CUevent_st;

struct op {
    uint64_t seq = 0;
    devio_emu::rt::op_kind kind;
    std::function<void()> fn;
    std::unique_ptr<devio_emu::launch_rec> L;
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

namespace devio_emu {
namespace rt {

/* The runtime's lock and errors (emu_runtime.cc, emu_error.cc). */
extern std::recursive_mutex mu;
extern cudaError_t sticky;
extern thread_local cudaError_t last;
extern cudaError_t report_code;
extern char report_msg[800];
extern size_t mem_total, mem_used;

/* Faults on request (DEVIO_EMU_FAULT, devio_emu_fault), and the calls
 * counted for them (emu_runtime.cc). */
enum { F_NONE, F_MALLOC, F_LAUNCH, F_SYNC };
extern unsigned long n_malloc, n_launch, n_sync;

void init();
bool fires(int c, unsigned long count);
cudaError_t ret(cudaError_t e);
cudaError_t refuse(cudaError_t code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Memory (emu_memory.cc). */
void check_canaries(const launch_rec &L);

/* Streams (emu_stream.cc). */
extern CUstream_st legacy;
std::vector<CUstream_st *> &streams();
void drain(CUstream_st *s, uint64_t upto);
void drain_all();
uint64_t enqueue(CUstream_st *s, op o);
uint64_t enqueue_fn(CUstream_st *s, std::function<void()> fn);
cudaError_t get_stream(cudaStream_t h, CUstream_st **out);

/* Captures (emu_graph.cc). */
cudaError_t capture_guard(CUstream_st *s, const char *what);

} // namespace rt
} // namespace devio_emu

/* Entry of every API call: the lock, then the sticky error if any. */
#define ENTER()                                                                                    \
    std::lock_guard<std::recursive_mutex> lock_(mu);                                               \
    init();                                                                                        \
    if (sticky != cudaSuccess)                                                                     \
        return ret(sticky);

#endif
