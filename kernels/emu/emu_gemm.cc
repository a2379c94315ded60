/* kernels/emu/emu_gemm.cc - cuda_gemm.h under the emulator: a host GEMM launched on the
 * stream as a kernel of one thread, so that it runs in stream order after the work that wrote
 * its inputs and a captured graph replays it like any kernel. f16 and bf16 inputs widen exactly; products and sums in f32, in the plain order
 * (fast numerics promise a tolerance, not an order). DEVIO_EMU_GEMM_BREAK=1 leaves the last
 * input column out of every sum: the negative control a tolerance check must catch. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "device/numerics/numerics.h"
#include "kernels/cuda_gemm.h"
#include "kernels/cuda_kernels.h"

struct cuda_gemm {
    bool broken;
};

namespace {

struct job {
    int dtype;
    const void *w, *x;
    uint32_t m, n, ldx, n_tok, ldy, cols;
    float alpha, beta;
    float *y;
};

float elem(int dtype, const void *p, size_t i)
{
    switch (dtype) {
    case CUDA_F16: return devio_f16_to_f32(static_cast<const uint16_t *>(p)[i]);
    case CUDA_BF16: return devio_bf16_to_f32(static_cast<const uint16_t *>(p)[i]);
    default: return static_cast<const float *>(p)[i];
    }
}

void k_gemm(job j)
{
    for (uint32_t t = 0; t < j.n_tok; t++)
        for (uint32_t o = 0; o < j.m; o++) {
            float acc = 0.0f;
            for (uint32_t i = 0; i < j.cols; i++)
                acc += elem(j.dtype, j.w, (size_t)o * j.n + i) *
                       elem(j.dtype, j.x, (size_t)t * j.ldx + i);
            float *y = j.y + (size_t)t * j.ldy + o;
            *y = j.beta == 0.0f ? j.alpha * acc : j.alpha * acc + j.beta * *y;
        }
}

} // namespace

extern "C" {

cuda_gemm *cuda_gemm_open(char *why, size_t why_len)
{
    cuda_gemm *g = static_cast<cuda_gemm *>(calloc(1, sizeof *g));
    if (!g && why_len)
        snprintf(why, why_len, "out of host memory");
    const char *b = getenv("DEVIO_EMU_GEMM_BREAK");
    if (g)
        g->broken = b && strcmp(b, "1") == 0;
    return g;
}

void cuda_gemm_close(cuda_gemm *g) { free(g); }

const char *cuda_gemm_name(const cuda_gemm *g)
{
    return g->broken ? "host (emulated, broken on purpose)" : "host (emulated)";
}

int cuda_gemm_run(cuda_gemm *g, int dtype, const void *w, uint32_t m, uint32_t n, const void *x,
                  uint32_t ldx, uint32_t n_tok, float alpha, float beta, float *y, uint32_t ldy,
                  void *stream)
{
    if (dtype != CUDA_F32 && dtype != CUDA_F16 && dtype != CUDA_BF16)
        return (int)cudaErrorInvalidValue;
    job j{dtype, w, x, m, n, ldx, n_tok, ldy, g->broken && n > 1 ? n - 1 : n, alpha, beta, y};
    return (int)::devio_emu::launch("k_gemm (the host GEMM)", k_gemm, dim3(1), dim3(1), 0,
                                    static_cast<cudaStream_t>(stream), j);
}

} // extern "C"
