/* cuda_emu_checks_test.cc - the SIMT emulator (kernels/emu/) on small kernels of its own:
 * what a GPU would fault on or leave undefined is reported with the kernel, block and thread
 * and becomes the error a real CUDA fault gives (out of bounds past a buffer or in shared
 * memory, a freed buffer, a shared-memory race, a collective part of a warp never reaches,
 * a bad mask, a misaligned vector load, launch configurations an sm_90 part refuses, a
 * destroyed stream or event), while the same kernels written correctly pass; collectives
 * give the GPU's results; streams keep their asynchronous semantics; captured graphs replay
 * their work and a capture refuses what the toolkit's does; faults come on request.
 * Long because each check has its faulty kernel and its correct twin side by side. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

extern "C" {
#include <cmocka.h>
}

#include <cuda_runtime.h>

#include "kernels/cuda_warp.cuh"

/* The sticky error of the last fault, its report checked for `what`, then a fresh context. */
static void expect_fault(cudaError_t got, cudaError_t want, const char *what)
{
    assert_int_equal(got, want);
    const char *msg = cudaGetErrorString(got);
    if (!strstr(msg, what))
        print_error("report: %s\n(wanted \"%s\")\n", msg, what);
    assert_non_null(strstr(msg, what));
    devio_emu_reset();
}

static float *dev_floats(size_t n)
{
    void *p = nullptr;
    assert_int_equal(cudaMalloc(&p, n * sizeof(float)), cudaSuccess);
    return static_cast<float *>(p);
}

/* ---- device memory ---- */

__global__ void k_write(float *p, uint32_t n)
{
    uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i <= n) /* one too many */
        p[i] = 1.0f;
}

static void test_write_past_end(void **state)
{
    (void)state;
    /* 64 floats fill their 256 bytes: the guard page is right after. */
    float *p = dev_floats(64);
    LAUNCH((k_write), 1, 128, 0, nullptr, p, 64u);
    assert_int_equal(cudaGetLastError(), cudaSuccess);
    expect_fault(cudaDeviceSynchronize(), cudaErrorIllegalAddress, "0 bytes past the end");
    /* 60 floats leave 16 bytes before the guard page: the canary shows the write (under
     * AddressSanitizer those bytes are poisoned instead, and its report ends the process,
     * naming the kernel, block and thread: not something this process can observe). */
#if !defined(__SANITIZE_ADDRESS__)
    float *q = dev_floats(60);
    LAUNCH((k_write), 1, 64, 0, nullptr, q, 60u);
    cudaError_t e = cudaDeviceSynchronize();
    assert_non_null(strstr(cudaGetErrorString(e), "k_write"));
    expect_fault(e, cudaErrorIllegalAddress, "past the end of a device buffer of 240 bytes");
    cudaFree(q);
#endif
    cudaFree(p);
}

static void test_in_bounds(void **state)
{
    (void)state;
    float *p = dev_floats(60);
    LAUNCH((k_write), 1, 64, 0, nullptr, p, 59u);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    float h[60];
    assert_int_equal(cudaMemcpy(h, p, sizeof h, cudaMemcpyDeviceToHost), cudaSuccess);
    for (int i = 0; i < 60; i++)
        assert_true(h[i] == 1.0f);
    cudaFree(p);
}

__global__ void k_read_first(const float *p, float *out) { out[threadIdx.x] = p[0]; }

static void test_freed_buffer(void **state)
{
    (void)state;
    float *p = dev_floats(16), *out = dev_floats(32);
    assert_int_equal(cudaFree(p), cudaSuccess);
    LAUNCH((k_read_first), 1, 32, 0, nullptr, p, out);
    cudaError_t e = cudaDeviceSynchronize();
    assert_non_null(strstr(cudaGetErrorString(e), "thread (0,0,0)"));
    expect_fault(e, cudaErrorIllegalAddress, "was freed");
    /* A second cudaFree of it is refused, not a crash. */
    assert_int_equal(cudaFree(p), cudaErrorInvalidValue);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidValue);
    cudaFree(out);
}

static void test_copy_bounds(void **state)
{
    (void)state;
    float *p = dev_floats(8), h[16] = {0};
    assert_int_equal(cudaMemcpy(p, h, sizeof h, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
    assert_int_equal(cudaMemcpy(h, p, 8 * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    assert_int_equal(cudaMemset(p + 4, 0, 8 * sizeof(float)), cudaErrorInvalidValue);
    (void)cudaGetLastError();
    cudaFree(p);
}

/* ---- shared memory ---- */

/* Thread i writes word i, then reads its neighbour's: a race without the barrier. */
__global__ void k_neighbour(float *out, int barrier)
{
    DEVIO_DYN_SHARED(float, s);
    uint32_t i = threadIdx.x, n = blockDim.x;
    s[i] = (float)i;
    if (barrier)
        __syncthreads();
    out[i] = s[(i + 32) % n];
}

static void test_shared_race(void **state)
{
    (void)state;
    float *out = dev_floats(64);
    LAUNCH((k_neighbour), 1, 64, 64 * sizeof(float), nullptr, out, 1);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    float h[64];
    cudaMemcpy(h, out, sizeof h, cudaMemcpyDeviceToHost);
    for (int i = 0; i < 64; i++)
        assert_true(h[i] == (float)((i + 32) % 64));
    LAUNCH((k_neighbour), 1, 64, 64 * sizeof(float), nullptr, out, 0);
    expect_fault(cudaDeviceSynchronize(), cudaErrorLaunchFailure, "shared memory race");
    cudaFree(out);
}

/* Within a warp a full __syncwarp orders shared memory; without it, a race. */
__global__ void k_warp_neighbour(float *out, int sync)
{
    DEVIO_DYN_SHARED(float, s);
    uint32_t l = threadIdx.x;
    s[l] = (float)l;
    if (sync)
        __syncwarp();
    out[l] = s[l ^ 1];
}

static void test_warp_race(void **state)
{
    (void)state;
    float *out = dev_floats(32);
    LAUNCH((k_warp_neighbour), 1, 32, 32 * sizeof(float), nullptr, out, 1);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    LAUNCH((k_warp_neighbour), 1, 32, 32 * sizeof(float), nullptr, out, 0);
    expect_fault(cudaDeviceSynchronize(), cudaErrorLaunchFailure, "with no barrier between");
    cudaFree(out);
}

__global__ void k_shared_past_end(float *out)
{
    DEVIO_DYN_SHARED(float, s);
    s[threadIdx.x] = 0.0f;
    __syncthreads();
    out[threadIdx.x] = s[threadIdx.x + 1];
}

static void test_shared_bounds(void **state)
{
    (void)state;
    float *out = dev_floats(32);
    LAUNCH((k_shared_past_end), 1, 32, 32 * sizeof(float), nullptr, out);
    cudaError_t e = cudaDeviceSynchronize();
    assert_non_null(strstr(cudaGetErrorString(e), "thread (31,0,0)"));
    expect_fault(e, cudaErrorIllegalAddress, "outside the block's 128 bytes");
    cudaFree(out);
}

/* Shared memory starts as NaN bits: a read of what nobody wrote shows. */
__global__ void k_shared_unwritten(float *out)
{
    DEVIO_DYN_SHARED(float, s);
    out[threadIdx.x] = s[threadIdx.x];
}

static void test_shared_unwritten(void **state)
{
    (void)state;
    float *out = dev_floats(32);
    LAUNCH((k_shared_unwritten), 1, 32, 32 * sizeof(float), nullptr, out);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    float h[32];
    cudaMemcpy(h, out, sizeof h, cudaMemcpyDeviceToHost);
    assert_true(h[5] != h[5]);
    cudaFree(out);
}

/* ---- warp collectives ---- */

__global__ void k_collectives(int32_t *out)
{
    uint32_t l = threadIdx.x;
    int32_t v = (int32_t)l * 3;
    out[l] = __shfl_xor_sync(FULL, v, 5);
    out[32 + l] = __shfl_down_sync(FULL, v, 4);
    out[64 + l] = __shfl_up_sync(FULL, v, 4);
    out[96 + l] = __shfl_sync(FULL, v, 7);
    out[128 + l] = (int32_t)__ballot_sync(FULL, l % 3 == 0);
    out[160 + l] = __shfl_xor_sync(FULL, v, 1, 8); /* in segments of 8 */
    atomicAdd(&out[192], 1);
}

static void test_collective_results(void **state)
{
    (void)state;
    int32_t *out;
    assert_int_equal(cudaMalloc((void **)&out, 193 * sizeof(int32_t)), cudaSuccess);
    cudaMemset(out, 0, 193 * sizeof(int32_t));
    LAUNCH((k_collectives), 1, 32, 0, nullptr, out);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    int32_t h[193];
    cudaMemcpy(h, out, sizeof h, cudaMemcpyDeviceToHost);
    uint32_t ballot = 0;
    for (int l = 0; l < 32; l += 3)
        ballot |= 1u << l;
    for (int l = 0; l < 32; l++) {
        assert_int_equal(h[l], (l ^ 5) * 3);
        assert_int_equal(h[32 + l], (l + 4 < 32 ? l + 4 : l) * 3);
        assert_int_equal(h[64 + l], (l >= 4 ? l - 4 : l) * 3);
        assert_int_equal(h[96 + l], 21);
        assert_int_equal((uint32_t)h[128 + l], ballot);
        assert_int_equal(h[160 + l], (l ^ 1) * 3);
    }
    assert_int_equal(h[192], 32);
    cudaFree(out);
}

/* Half the warp leaves before a fold the whole warp must reach. */
__global__ void k_partial_fold(float *out)
{
    if (threadIdx.x >= 16)
        return;
    out[threadIdx.x] = fold(1.0f);
}

__global__ void k_bad_mask(float *out)
{
    out[threadIdx.x] = __shfl_sync(0x0000ffffu, 1.0f, 0);
}

__global__ void k_full_shuffle(float *out)
{
    out[threadIdx.x] = __shfl_xor_sync(FULL, 1.0f, 1);
}

/* Lanes below 16 wait at __syncthreads, the rest at a shuffle: neither completes. */
__global__ void k_split(float *out)
{
    if (threadIdx.x < 16)
        __syncthreads();
    else
        out[threadIdx.x] = __shfl_xor_sync(FULL, 1.0f, 1);
}

static void test_collective_misuse(void **state)
{
    (void)state;
    float *out = dev_floats(32);
    LAUNCH((k_partial_fold), 1, 32, 0, nullptr, out);
    expect_fault(cudaDeviceSynchronize(), cudaErrorLaunchFailure, "lane 16 has exited");
    LAUNCH((k_bad_mask), 1, 32, 0, nullptr, out);
    expect_fault(cudaDeviceSynchronize(), cudaErrorLaunchFailure, "leaves out the calling lane");
    LAUNCH((k_split), 1, 32, 0, nullptr, out);
    expect_fault(cudaDeviceSynchronize(), cudaErrorLaunchFailure, "waits at __syncthreads");
    cudaFree(out);
    /* A block of 48 threads: its second warp has 16 lanes, and a full mask names 16 it lacks. */
    float *big = dev_floats(48);
    LAUNCH((k_full_shuffle), 1, 48, 0, nullptr, big);
    expect_fault(cudaDeviceSynchronize(), cudaErrorLaunchFailure, "names lanes the block lacks");
    cudaFree(big);
}

__global__ void k_vec_load(const float *p, float *out, uint32_t off)
{
    uint4 q = ld16(p + off);
    out[threadIdx.x] = (float)(q.x & 1u);
}

static void test_misaligned(void **state)
{
    (void)state;
    float *p = dev_floats(64), *out = dev_floats(32);
    cudaMemset(p, 0, 64 * sizeof(float));
    LAUNCH((k_vec_load), 1, 32, 0, nullptr, p, out, 4u);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    LAUNCH((k_vec_load), 1, 32, 0, nullptr, p, out, 1u);
    expect_fault(cudaDeviceSynchronize(), cudaErrorMisalignedAddress, "a 16-byte load");
    cudaFree(p);
    cudaFree(out);
}

/* ---- launch configurations ---- */

__global__ void k_nothing(float *out) { (void)out; }

static void test_launch_limits(void **state)
{
    (void)state;
    float *out = dev_floats(1);
    LAUNCH((k_nothing), 1, 1025, 0, nullptr, out);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidConfiguration);
    LAUNCH((k_nothing), dim3(1, 1, 1), dim3(32, 1, 65), 0, nullptr, out);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidConfiguration);
    LAUNCH((k_nothing), dim3(1, 65536), 32, 0, nullptr, out);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidConfiguration);
    assert_non_null(strstr(cudaGetErrorString(cudaErrorInvalidConfiguration), "grid"));
    /* Dynamic shared memory above 48 KiB needs the attribute, up to 227 KiB. */
    LAUNCH((k_nothing), 1, 32, 64 * 1024, nullptr, out);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidValue);
    assert_int_equal(cudaFuncSetAttribute(k_nothing, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          300 * 1024),
                     cudaErrorInvalidValue);
    (void)cudaGetLastError();
    assert_int_equal(cudaFuncSetAttribute(k_nothing, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          64 * 1024),
                     cudaSuccess);
    LAUNCH((k_nothing), 1, 32, 64 * 1024, nullptr, out);
    assert_int_equal(cudaGetLastError(), cudaSuccess);
    LAUNCH((k_nothing), 1, 32, 96 * 1024, nullptr, out);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidValue);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    cudaFree(out);
}

static void test_dead_handles(void **state)
{
    (void)state;
    cudaStream_t s;
    cudaEvent_t e;
    assert_int_equal(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    assert_int_equal(cudaEventCreate(&e), cudaSuccess);
    assert_int_equal(cudaStreamDestroy(s), cudaSuccess);
    assert_int_equal(cudaEventDestroy(e), cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(s), cudaErrorInvalidResourceHandle);
    assert_non_null(strstr(cudaGetErrorString(cudaErrorInvalidResourceHandle), "destroyed stream"));
    assert_int_equal(cudaEventRecord(e, nullptr), cudaErrorInvalidResourceHandle);
    assert_non_null(strstr(cudaGetErrorString(cudaErrorInvalidResourceHandle), "destroyed event"));
    (void)cudaGetLastError();
}

/* ---- streams ---- */

__global__ void k_fill(float *p, float v) { p[threadIdx.x] = v; }

static void test_async_semantics(void **state)
{
    (void)state;
    cudaStream_t s;
    assert_int_equal(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    float *d = dev_floats(32), *pinned;
    assert_int_equal(cudaMallocHost((void **)&pinned, 32 * sizeof(float)), cudaSuccess);
    /* A result copied to pinned memory is not there before the wait. */
    LAUNCH((k_fill), 1, 32, 0, s, d, 2.5f);
    assert_int_equal(cudaMemcpyAsync(pinned, d, 32 * sizeof(float), cudaMemcpyDeviceToHost, s),
                     cudaSuccess);
    assert_true(pinned[0] != pinned[0]);
    cudaEvent_t done;
    cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
    cudaEventRecord(done, s);
    assert_int_equal(cudaEventSynchronize(done), cudaSuccess);
    assert_true(pinned[0] == 2.5f && pinned[31] == 2.5f);
    /* From pinned memory the copy reads the source when it runs; from pageable, at once. */
    float pageable[32];
    for (int i = 0; i < 32; i++)
        pinned[i] = pageable[i] = 1.0f;
    float *d2 = dev_floats(32);
    cudaMemcpyAsync(d, pinned, sizeof pageable, cudaMemcpyHostToDevice, s);
    cudaMemcpyAsync(d2, pageable, sizeof pageable, cudaMemcpyHostToDevice, s);
    pinned[0] = pageable[0] = 7.0f;
    assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
    float a, b;
    cudaMemcpy(&a, d, sizeof a, cudaMemcpyDeviceToHost);
    cudaMemcpy(&b, d2, sizeof b, cudaMemcpyDeviceToHost);
    assert_true(a == 7.0f && b == 1.0f);
    cudaEventDestroy(done);
    cudaStreamDestroy(s);
    cudaFreeHost(pinned);
    cudaFree(d);
    cudaFree(d2);
}

/* ---- graphs ---- */

__global__ void k_add_one(float *p) { p[threadIdx.x] = p[threadIdx.x] + 1.0f; }

/* A captured stream runs nothing; each launch of the graph runs its kernels again with the
 * arguments they were captured with; what a capture forbids invalidates it. */
static void test_graphs(void **state)
{
    (void)state;
    cudaStream_t s;
    assert_int_equal(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    float *d = dev_floats(32), host[32];
    assert_int_equal(cudaMemset(d, 0, 32 * sizeof(float)), cudaSuccess);
    assert_int_equal(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    LAUNCH((k_add_one), 1, 32, 0, s, d);
    LAUNCH((k_add_one), 1, 32, 0, s, d);
    assert_int_equal(cudaGetLastError(), cudaSuccess);
    cudaGraph_t g = nullptr;
    cudaGraphExec_t x = nullptr;
    assert_int_equal(cudaStreamEndCapture(s, &g), cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
    assert_int_equal(cudaMemcpy(host, d, sizeof host, cudaMemcpyDeviceToHost), cudaSuccess);
    assert_true(host[0] == 0.0f); /* captured, not run */
    assert_int_equal(cudaGraphInstantiate(&x, g, 0), cudaSuccess);
    assert_int_equal(cudaGraphDestroy(g), cudaSuccess);
    for (int i = 0; i < 3; i++)
        assert_int_equal(cudaGraphLaunch(x, s), cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
    assert_int_equal(cudaMemcpy(host, d, sizeof host, cudaMemcpyDeviceToHost), cudaSuccess);
    assert_true(host[0] == 6.0f && host[31] == 6.0f);
    /* A synchronisation inside a capture is refused and spoils it. */
    assert_int_equal(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
    LAUNCH((k_add_one), 1, 32, 0, s, d);
    assert_int_equal(cudaStreamSynchronize(s), cudaErrorStreamCaptureUnsupported);
    assert_int_equal(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);
    assert_null(g);
    assert_int_equal(cudaStreamEndCapture(s, &g), cudaErrorIllegalState);
    /* So is a copy from pageable memory, and the legacy stream cannot be captured. */
    assert_int_equal(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    assert_int_equal(cudaMemcpyAsync(d, host, sizeof host, cudaMemcpyHostToDevice, s),
                     cudaErrorStreamCaptureUnsupported);
    assert_int_equal(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);
    assert_int_equal(cudaStreamBeginCapture(nullptr, cudaStreamCaptureModeGlobal),
                     cudaErrorStreamCaptureUnsupported);
    (void)cudaGetLastError();
    /* A destroyed graph is refused, and its launch counts for injected faults. */
    assert_int_equal(cudaGraphExecDestroy(x), cudaSuccess);
    assert_int_equal(cudaGraphLaunch(x, s), cudaErrorInvalidResourceHandle);
    (void)cudaGetLastError();
    assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
    assert_int_equal(cudaMemcpy(host, d, sizeof host, cudaMemcpyDeviceToHost), cudaSuccess);
    assert_true(host[0] == 6.0f); /* nothing of the spoiled captures ran */
    cudaStreamDestroy(s);
    cudaFree(d);
}

/* ---- faults on request ---- */

static void test_faults_on_request(void **state)
{
    (void)state;
    void *p = nullptr, *q = nullptr;
    assert_int_equal(devio_emu_fault("malloc:2"), 0);
    assert_int_equal(cudaMalloc(&p, 64), cudaSuccess);
    assert_int_equal(cudaMalloc(&q, 64), cudaErrorMemoryAllocation);
    assert_null(q);
    assert_int_equal(cudaMalloc(&q, 64), cudaSuccess); /* once only */
    cudaFree(q);
    assert_int_equal(devio_emu_fault("launch:1,sticky"), 0);
    LAUNCH((k_fill), 1, 32, 0, nullptr, (float *)p, 1.0f);
    assert_int_equal(cudaGetLastError(), cudaErrorLaunchOutOfResources);
    LAUNCH((k_fill), 1, 32, 0, nullptr, (float *)p, 1.0f);
    assert_int_equal(cudaGetLastError(), cudaErrorLaunchOutOfResources);
    unsigned long m, l, s;
    devio_emu_counts(&m, &l, &s);
    assert_int_equal(l, 2);
    assert_int_equal(devio_emu_fault("sync:2"), 0);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    assert_int_equal(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
    /* Sticky, as an asynchronous fault is on hardware: every later call answers it. */
    assert_int_equal(cudaMalloc(&q, 64), cudaErrorLaunchFailure);
    assert_int_equal(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
    expect_fault(cudaGetLastError(), cudaErrorLaunchFailure, "injected fault at synchronisation 2");
    assert_int_equal(devio_emu_fault("bogus:1"), -1);
    assert_int_equal(devio_emu_fault(nullptr), 0);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    cudaFree(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_write_past_end),   cmocka_unit_test(test_in_bounds),
        cmocka_unit_test(test_freed_buffer),     cmocka_unit_test(test_copy_bounds),
        cmocka_unit_test(test_shared_race),      cmocka_unit_test(test_warp_race),
        cmocka_unit_test(test_shared_bounds),    cmocka_unit_test(test_shared_unwritten),
        cmocka_unit_test(test_collective_results), cmocka_unit_test(test_collective_misuse),
        cmocka_unit_test(test_misaligned),       cmocka_unit_test(test_launch_limits),
        cmocka_unit_test(test_dead_handles),     cmocka_unit_test(test_async_semantics),
        cmocka_unit_test(test_graphs),           cmocka_unit_test(test_faults_on_request),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
