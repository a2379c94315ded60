/* kernels/emu/cuda_runtime_api.h - the part of the CUDA runtime API that
 * devio's CUDA backend calls, implemented by the SIMT emulator
 * (kernels/emu/emu_runtime.cc) for the cuda-emu plugin. The host glue
 * (cuda_backend.c, cuda_step.c, cuda_mixer.c) compiles against this header
 * in the emulated build and against the toolkit's in the real one, so the
 * names, types, values and semantics below are the toolkit's; only what the
 * backend uses is here. Plain C. Ownership is the runtime's: memory, streams
 * and events belong to the caller until freed or destroyed.
 *
 * How the emulator executes, what it checks and what it cannot see:
 * docs/backends.md, "The emulated CUDA target". */
#ifndef DEVIO_EMU_CUDA_RUNTIME_API_H
#define DEVIO_EMU_CUDA_RUNTIME_API_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DEVIO_CUDA_EMULATED 1

typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInitializationError = 3,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidMemcpyDirection = 21,
    cudaErrorInsufficientDriver = 35,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorIllegalState = 401,
    cudaErrorNotReady = 600,
    cudaErrorIllegalAddress = 700,
    cudaErrorLaunchOutOfResources = 701,
    cudaErrorMisalignedAddress = 716,
    cudaErrorLaunchFailure = 719,
    cudaErrorStreamCaptureUnsupported = 900,
    cudaErrorStreamCaptureInvalidated = 901,
    cudaErrorUnknown = 999,
} cudaError_t;

typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;
typedef struct CUgraph_st *cudaGraph_t;
typedef struct CUgraphExec_st *cudaGraphExec_t;

enum cudaStreamCaptureMode {
    cudaStreamCaptureModeGlobal = 0,
    cudaStreamCaptureModeThreadLocal = 1,
    cudaStreamCaptureModeRelaxed = 2,
};

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
};

enum cudaFuncAttribute {
    cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
};

#define cudaStreamDefault 0x0u
#define cudaStreamNonBlocking 0x1u
#define cudaEventDefault 0x0u
#define cudaEventBlockingSync 0x1u
#define cudaEventDisableTiming 0x2u
#define cudaHostRegisterDefault 0x0u

/* The fields devio reads; the emulator fills them with an H200's limits. */
struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
    size_t sharedMemPerBlock;      /* 48 KiB: the most without the attribute */
    size_t sharedMemPerBlockOptin; /* the most with cudaFuncSetAttribute */
    int regsPerBlock;
    int warpSize;
    int maxThreadsPerBlock;
    int maxThreadsDim[3];
    int maxGridSize[3];
    int major, minor;
    int multiProcessorCount;
};

cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
cudaError_t cudaDriverGetVersion(int *version);
cudaError_t cudaRuntimeGetVersion(int *version);

cudaError_t cudaMalloc(void **ptr, size_t bytes);
cudaError_t cudaFree(void *ptr);
cudaError_t cudaMallocHost(void **ptr, size_t bytes);
cudaError_t cudaFreeHost(void *ptr);
cudaError_t cudaHostRegister(void *ptr, size_t bytes, unsigned int flags);
cudaError_t cudaHostUnregister(void *ptr);

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                            cudaStream_t stream);
cudaError_t cudaMemset(void *dst, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void *dst, int value, size_t bytes, cudaStream_t stream);
/* fn(data) on the host in stream order, as the work enqueued before it ends. */
typedef void (*cudaHostFn_t)(void *data);
cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void *data);

cudaError_t cudaStreamCreate(cudaStream_t *stream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaDeviceSynchronize(void);

cudaError_t cudaEventCreate(cudaEvent_t *event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventQuery(cudaEvent_t event);

cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value);

/* Stream capture and graphs: between Begin and EndCapture the stream's work
 * is recorded, not run; a graph instantiated from it replays that work, the
 * same launches with the same arguments, each time it is launched. While a
 * stream captures, a synchronisation of it, a copy from or to pageable host
 * memory on it, an event recorded on it and (Global mode) a blocking call of
 * any thread are refused with cudaErrorStreamCaptureUnsupported and the
 * capture is invalidated: EndCapture then answers
 * cudaErrorStreamCaptureInvalidated, as the toolkit does. */
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *graph);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph,
                                 unsigned long long flags);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);

cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
const char *cudaGetErrorName(cudaError_t error);
const char *cudaGetErrorString(cudaError_t error);

/* ---- the emulator's own controls (no CUDA counterpart) --------------------
 * Faults on request, as DEVIO_EMU_FAULT does from the environment: spec is
 * "CLASS:N" or "CLASS:N,sticky" with CLASS malloc (the N-th cudaMalloc or
 * cudaMallocHost answers cudaErrorMemoryAllocation), launch (the N-th kernel
 * launch is refused with cudaErrorLaunchOutOfResources) or sync (the N-th
 * synchronisation reports an asynchronous fault, cudaErrorLaunchFailure,
 * which is sticky as on hardware); ",sticky" keeps failing every later call
 * of the class. NULL or "" disarms. Counters restart at every call. Returns
 * 0, or -1 for a spec it cannot read. */
int devio_emu_fault(const char *spec);
/* Calls of each class since the last devio_emu_fault (or the start). */
void devio_emu_counts(unsigned long *mallocs, unsigned long *launches, unsigned long *syncs);
/* Forgets a sticky error, as a new CUDA context would (tests only). */
void devio_emu_reset(void);

#ifdef __cplusplus
}
#endif

#endif
