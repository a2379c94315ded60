/* cuda_test_util.h - what the CUDA kernel tests share (tests/cuda_fast_kernels_test.c,
 * tests/cuda_ssm_kernels_test.c): a seeded stream of uniform floats, a case skipped where no
 * device answers, and copies into device memory (the caller frees them with cudaFree).
 * Header-only, for cmocka tests that include <cmocka.h> and <cuda_runtime_api.h> first. */
#ifndef DEVIO_CUDA_TEST_UTIL_H
#define DEVIO_CUDA_TEST_UTIL_H

#include <stddef.h>
#include <stdint.h>

/* A deterministic stream of uniform floats in [-1, 1). */
static inline float uniform(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(*s >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
}

/* Built for the GPU, a case needs one; the emulated build always has its device. */
static inline void need_device(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        (void)cudaGetLastError();
        print_message("no CUDA device answers; this case needs one\n");
        skip();
    }
}

/* bytes of host in device memory (zeros when host is NULL). */
static inline void *dev_copy(const void *host, size_t bytes)
{
    void *d = NULL;
    assert_int_equal(cudaMalloc(&d, bytes ? bytes : 4), cudaSuccess);
    if (host)
        assert_int_equal(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice), cudaSuccess);
    else
        assert_int_equal(cudaMemset(d, 0, bytes ? bytes : 4), cudaSuccess);
    return d;
}

#endif
