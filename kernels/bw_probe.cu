/* bw_probe.cu - devio-gpu-bw: the GPU's memory bandwidth, for the GPU check to
 * compare decode with (as devio-bench compares the reference with the host's).
 * Prints one JSON line: {"device":..,"bytes":..,"read_gbs":..,"copy_gbs":..}:
 * read = a kernel summing a buffer much larger than the caches (best of 5),
 * copy = cudaMemcpy device to device, counting bytes read plus written.
 * Asserts nothing; exits 1 with a message when no device answers. */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

__global__ void k_read(const float4 *p, size_t n, float *sink)
{
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float4 v = p[i];
        acc.x += v.x;
        acc.y += v.y;
        acc.z += v.z;
        acc.w += v.w;
    }
    if (acc.x + acc.y + acc.z + acc.w == 12345.f) /* never: keeps the loads */
        *sink = acc.x;
}

static int fail(const char *what, cudaError_t e)
{
    fprintf(stderr, "devio-gpu-bw: %s: %s: %s\n", what, cudaGetErrorName(e), cudaGetErrorString(e));
    return 1;
}

int main(void)
{
    cudaDeviceProp prop;
    cudaError_t e = cudaGetDeviceProperties(&prop, 0);
    if (e != cudaSuccess)
        return fail("no CUDA device", e);
    size_t free_b, total_b;
    cudaMemGetInfo(&free_b, &total_b);
    size_t bytes = (size_t)4 << 30;
    if (bytes > free_b / 4)
        bytes = free_b / 4 & ~(size_t)0xfffff;
    void *a, *b;
    float *sink;
    if ((e = cudaMalloc(&a, bytes)) || (e = cudaMalloc(&b, bytes)) ||
        (e = cudaMalloc((void **)&sink, sizeof(float))))
        return fail("cudaMalloc", e);
    cudaMemset(a, 0, bytes);
    cudaEvent_t t0, t1;
    cudaEventCreate(&t0);
    cudaEventCreate(&t1);
    float best_read = 1e30f, best_copy = 1e30f, ms;
    for (int pass = 0; pass < 6; pass++) {
        cudaEventRecord(t0);
        k_read<<<prop.multiProcessorCount * 8, 512>>>((const float4 *)a, bytes / 16, sink);
        cudaEventRecord(t1);
        cudaEventSynchronize(t1);
        cudaEventElapsedTime(&ms, t0, t1);
        if (pass > 0 && ms < best_read) /* pass 0 warms up */
            best_read = ms;
        cudaEventRecord(t0);
        cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
        cudaEventRecord(t1);
        cudaEventSynchronize(t1);
        cudaEventElapsedTime(&ms, t0, t1);
        if (pass > 0 && ms < best_copy)
            best_copy = ms;
    }
    if ((e = cudaGetLastError()) != cudaSuccess)
        return fail("timing", e);
    printf("{\"device\":\"%s\",\"bytes\":%zu,\"read_gbs\":%.1f,\"copy_gbs\":%.1f}\n", prop.name,
           bytes, bytes / (best_read * 1e6), 2.0 * bytes / (best_copy * 1e6));
    return 0;
}
