/* cuda_device.c - what every file of the CUDA backend shares and that calls nothing else of
 * the backend: CUDA errors made devio errors (and the state marked failed), device memory
 * allocated for the state's life, and weights uploaded in the layout the kernels read. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "device/status.h"
#include "kernels/cuda_backend.h"
#include "kernels/cuda_kernels.h"
#include "kernels/cuda_state.h"

devio_status devio_cuda_error(int code, const char *what, devio_error *err)
{
    cudaError_t e = (cudaError_t)code;
    return devio_fail(err, DEVIO_E_DEVICE, "CUDA error in %s: %s: %s", what, cudaGetErrorName(e),
                      cudaGetErrorString(e));
}

devio_status cuda_check(cuda_state *st, int code, const char *what, devio_error *err)
{
    if (code == 0)
        return DEVIO_OK;
    devio_error e = {0};
    devio_cuda_error(code, what, &e);
    if (st) {
        pthread_mutex_lock(&st->fail_mu);
        if (!atomic_load(&st->failed)) {
            snprintf(st->failure, sizeof st->failure, "%.190s", e.message);
            atomic_store(&st->failed, true);
        }
        pthread_mutex_unlock(&st->fail_mu);
    }
    if (err)
        *err = e;
    return DEVIO_E_DEVICE;
}

devio_status cuda_refuse_if_failed(cuda_state *st, devio_error *err)
{
    if (!atomic_load(&st->failed))
        return DEVIO_OK;
    pthread_mutex_lock(&st->fail_mu);
    devio_status s =
        devio_fail(err, DEVIO_E_DEVICE, "the CUDA device failed earlier: %s", st->failure);
    pthread_mutex_unlock(&st->fail_mu);
    return s;
}

devio_status cuda_dalloc(cuda_state *st, void **p, uint64_t bytes, devio_error *err)
{
    *p = NULL;
    if (st->n_allocs == st->cap_allocs) {
        uint32_t cap = st->cap_allocs ? 2 * st->cap_allocs : 64;
        void **a = realloc(st->allocs, cap * sizeof *a);
        if (!a)
            return devio_fail(err, DEVIO_E_NOMEM, "out of host memory for the CUDA backend");
        st->allocs = a;
        st->cap_allocs = cap;
    }
    devio_status s = cuda_check(st, cudaMalloc(p, bytes ? bytes : 4), "cudaMalloc", err);
    if (s == DEVIO_OK)
        s = cuda_check(st, cudaMemset(*p, 0, bytes ? bytes : 4), "cudaMemset", err);
    if (*p)
        st->allocs[st->n_allocs++] = *p;
    st->bytes += bytes;
    return s;
}

/* The rows of a [rows, n] weight in the lane-major layout (cuda_kernels.h)
 * into dst: element i of a row goes to cuda_lane_pos(i). */
static void lane_major_rows(const devio_tensor *t, void *dst)
{
    uint64_t rows = t->shape[0], n = t->shape[1];
    uint32_t *pos = malloc(n * sizeof *pos); /* one row's permutation, reused */
    for (uint64_t i = 0; pos && i < n; i++)
        pos[i] = (uint32_t)cuda_lane_pos(i, (uint32_t)n, (int)t->dtype);
    for (uint64_t r = 0; r < rows; r++) {
        uint64_t o = r * n;
        if (devio_dtype_size(t->dtype) == 4) {
            const uint32_t *src = t->data;
            uint32_t *d = dst;
            for (uint64_t i = 0; i < n; i++)
                d[o + (pos ? pos[i] : cuda_lane_pos(i, (uint32_t)n, (int)t->dtype))] = src[o + i];
        } else {
            const uint16_t *src = t->data;
            uint16_t *d = dst;
            for (uint64_t i = 0; i < n; i++)
                d[o + (pos ? pos[i] : cuda_lane_pos(i, (uint32_t)n, (int)t->dtype))] = src[o + i];
        }
    }
    free(pos);
}

/* A copy is made on the host for the permutation, one tensor at a time. */
devio_status cuda_upload_as(cuda_state *st, const devio_tensor *t, bool as_matrix, bool lane_major,
                            const void **dev, int *dt, devio_error *err)
{
    *dev = NULL;
    *dt = (int)t->dtype;
    if (!t->data)
        return DEVIO_OK;
    uint64_t bytes = devio_tensor_bytes(t);
    void *p;
    devio_status s = cuda_dalloc(st, &p, bytes, err);
    const void *src = t->data;
    char *tmp = NULL;
    if (s == DEVIO_OK && as_matrix && lane_major && t->ndim == 2 &&
        cuda_lane_major((uint32_t)t->shape[1], (int)t->dtype)) {
        if (!(tmp = malloc(bytes ? bytes : 1)))
            s = devio_fail(err, DEVIO_E_NOMEM, "out of host memory laying out a weight");
        else
            lane_major_rows(t, tmp);
        src = tmp;
    }
    if (s == DEVIO_OK)
        s = cuda_check(st, cudaMemcpy(p, src, bytes, cudaMemcpyHostToDevice),
                       "uploading a weight", err);
    free(tmp);
    *dev = p;
    return s;
}

devio_status cuda_upload(cuda_state *st, const devio_tensor *t, const void **dev, int *dt,
                         devio_error *err)
{
    return cuda_upload_as(st, t, true, !st->fast, dev, dt, err);
}

devio_status cuda_upload_strict(cuda_state *st, const devio_tensor *t, const void **dev, int *dt,
                                devio_error *err)
{
    return cuda_upload_as(st, t, true, true, dev, dt, err);
}
