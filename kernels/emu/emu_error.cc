/* kernels/emu/emu_error.cc - the emulated runtime's errors (emu_runtime.cc
 * tells the whole design): a refused call sets the calling thread's last
 * error; a fault of device code or an injected synchronisation fault is the
 * context's sticky error, which every later call answers. Its report
 * (kernel, block, thread, address) follows the error's string. */
#include <stdio.h>

#include "kernels/emu/emu_state.h"

using namespace devio_emu;
using namespace devio_emu::rt;

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

} // namespace devio_emu

extern "C" {

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

} // extern "C"
