/* gemm_probe.c - devio-gpu-gemm: the matrix rate of the fast numerics' GEMM (cuda_gemm.h, on
 * cuBLASLt) for a model's projection shapes, for the GPU check to hold a prefill against.
 *
 *   devio-gpu-gemm TOKENS LAYERS M:N [M:N ...]
 *
 * times, for TOKENS input rows, one bf16 GEMM [TOKENS, N] x [M, N]^T -> f32 per M:N (a layer's
 * projections), best of 5 after a warm-up, on random data, and prints one JSON line:
 * {"device":..,"tokens":..,"layers":..,"layer_ms":..,"ms":..,"tflops":..}: ms = LAYERS times
 * the layer, the time a prefill of TOKENS spends in its projections if they ran at this rate.
 * Asserts nothing; exits 1 with a message when no device or no cuBLASLt answers. */
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime_api.h>

#include "kernels/cuda_gemm.h"
#include "kernels/cuda_kernels.h"

#define MAX_SHAPES 16

static int fail(const char *what, const char *why)
{
    fprintf(stderr, "devio-gpu-gemm: %s: %s\n", what, why);
    return 1;
}

/* n bf16 values of magnitude in [1, 2) and either sign, from a fixed LCG, copied to device p. */
static int fill_random(void *p, size_t n)
{
    uint16_t *h = malloc(n * sizeof *h);
    if (!h)
        return -1;
    uint32_t s = 12345u;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        h[i] = (uint16_t)(0x3f80u | (s >> 25)) ^ (uint16_t)((s >> 24 & 1u) << 15); /* +-[1, 2) */
    }
    int e = cudaMemcpy(p, h, n * sizeof *h, cudaMemcpyHostToDevice);
    free(h);
    return e;
}

int main(int argc, char **argv)
{
    uint32_t m[MAX_SHAPES], n[MAX_SHAPES], k = 0;
    unsigned long tokens = argc > 1 ? strtoul(argv[1], NULL, 10) : 0;
    unsigned long layers = argc > 2 ? strtoul(argv[2], NULL, 10) : 0;
    for (int i = 3; i < argc && k < MAX_SHAPES; i++, k++)
        if (sscanf(argv[i], "%u:%u", &m[k], &n[k]) != 2 || m[k] == 0 || n[k] == 0)
            return fail("usage", "devio-gpu-gemm TOKENS LAYERS M:N [M:N ...]");
    if (tokens == 0 || layers == 0 || k == 0)
        return fail("usage", "devio-gpu-gemm TOKENS LAYERS M:N [M:N ...]");
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess)
        return fail("no CUDA device", cudaGetErrorString(cudaGetLastError()));
    char why[256] = "";
    cuda_gemm *g = cuda_gemm_open(why, sizeof why);
    if (!g)
        return fail("cuBLASLt", why);
    size_t w_max = 0, x_max = 0, y_max = 0;
    for (uint32_t i = 0; i < k; i++) {
        w_max = (size_t)m[i] * n[i] > w_max ? (size_t)m[i] * n[i] : w_max;
        x_max = (size_t)tokens * n[i] > x_max ? (size_t)tokens * n[i] : x_max;
        y_max = (size_t)tokens * m[i] > y_max ? (size_t)tokens * m[i] : y_max;
    }
    void *w = NULL, *x = NULL;
    float *y = NULL;
    if (cudaMalloc(&w, w_max * 2) || cudaMalloc(&x, x_max * 2) ||
        cudaMalloc((void **)&y, y_max * sizeof *y) || fill_random(w, w_max) ||
        fill_random(x, x_max))
        return fail("device memory", cudaGetErrorString(cudaGetLastError()));
    cudaStream_t stream;
    cudaEvent_t t0, t1;
    cudaStreamCreate(&stream);
    cudaEventCreate(&t0);
    cudaEventCreate(&t1);
    float best = 1e30f;
    double flop = 0;
    for (uint32_t i = 0; i < k; i++)
        flop += 2.0 * (double)tokens * m[i] * n[i];
    for (int pass = 0; pass < 6; pass++) {
        cudaEventRecord(t0, stream);
        for (uint32_t i = 0; i < k; i++) {
            int e = cuda_gemm_run(g, CUDA_BF16, w, m[i], n[i], x, n[i], (uint32_t)tokens, 1.0f,
                                  0.0f, y, m[i], stream);
            if (e)
                return fail("cublasLtMatmul", "the GEMM failed");
        }
        cudaEventRecord(t1, stream);
        float ms;
        if (cudaEventSynchronize(t1) || cudaEventElapsedTime(&ms, t0, t1))
            return fail("timing", cudaGetErrorString(cudaGetLastError()));
        if (pass > 0 && ms < best) /* pass 0 warms up (and picks the algorithms) */
            best = ms;
    }
    printf("{\"device\":\"%s\",\"tokens\":%lu,\"layers\":%lu,\"layer_ms\":%.4f,\"ms\":%.3f,"
           "\"tflops\":%.1f}\n",
           prop.name, tokens, layers, best, best * (double)layers, flop / (best * 1e9));
    cuda_gemm_close(g);
    return 0;
}
