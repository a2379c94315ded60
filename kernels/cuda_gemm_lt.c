/* cuda_gemm_lt.c - cuda_gemm.h on a GPU: cuBLASLt, loaded with dlopen when fast numerics
 * ask for it (strict numerics and the plugin's own loading never need the library).
 * W row-major [m, n] is, to column-major cuBLASLt, an [n, m] matrix taken transposed; X
 * [n_tok, ldx] an [n, n_tok] one; Y [n_tok, ldy] the [m, n_tok] result. Compute in f32. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include <cublasLt.h>

#include "kernels/cuda_gemm.h"
#include "kernels/cuda_kernels.h"

#define WORKSPACE (32u << 20)

typedef cublasStatus_t (*lt_create)(cublasLtHandle_t *);
typedef cublasStatus_t (*lt_destroy)(cublasLtHandle_t);
typedef cublasStatus_t (*lt_desc_create)(cublasLtMatmulDesc_t *, cublasComputeType_t,
                                         cudaDataType_t);
typedef cublasStatus_t (*lt_desc_set)(cublasLtMatmulDesc_t, cublasLtMatmulDescAttributes_t,
                                      const void *, size_t);
typedef cublasStatus_t (*lt_desc_destroy)(cublasLtMatmulDesc_t);
typedef cublasStatus_t (*lt_layout_create)(cublasLtMatrixLayout_t *, cudaDataType, uint64_t,
                                           uint64_t, int64_t);
typedef cublasStatus_t (*lt_layout_destroy)(cublasLtMatrixLayout_t);
typedef cublasStatus_t (*lt_matmul)(cublasLtHandle_t, cublasLtMatmulDesc_t, const void *,
                                    const void *, cublasLtMatrixLayout_t, const void *,
                                    cublasLtMatrixLayout_t, const void *, const void *,
                                    cublasLtMatrixLayout_t, void *, cublasLtMatrixLayout_t,
                                    const cublasLtMatmulAlgo_t *, void *, size_t, cudaStream_t);

struct cuda_gemm {
    void *lib;
    cublasLtHandle_t h;
    void *workspace; /* device, WORKSPACE bytes */
    lt_create create;
    lt_destroy destroy;
    lt_desc_create desc_create;
    lt_desc_set desc_set;
    lt_desc_destroy desc_destroy;
    lt_layout_create layout_create;
    lt_layout_destroy layout_destroy;
    lt_matmul matmul;
};

static int bind(cuda_gemm *g, char *why, size_t why_len)
{
    struct {
        void **slot;
        const char *name;
    } fns[] = {
        {(void **)&g->create, "cublasLtCreate"},
        {(void **)&g->destroy, "cublasLtDestroy"},
        {(void **)&g->desc_create, "cublasLtMatmulDescCreate"},
        {(void **)&g->desc_set, "cublasLtMatmulDescSetAttribute"},
        {(void **)&g->desc_destroy, "cublasLtMatmulDescDestroy"},
        {(void **)&g->layout_create, "cublasLtMatrixLayoutCreate"},
        {(void **)&g->layout_destroy, "cublasLtMatrixLayoutDestroy"},
        {(void **)&g->matmul, "cublasLtMatmul"},
    };
    for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++)
        if (!(*fns[i].slot = dlsym(g->lib, fns[i].name))) {
            snprintf(why, why_len, "cuBLASLt has no %s", fns[i].name);
            return -1;
        }
    return 0;
}

cuda_gemm *cuda_gemm_open(char *why, size_t why_len)
{
    cuda_gemm *g = calloc(1, sizeof *g);
    if (!g) {
        snprintf(why, why_len, "out of host memory");
        return NULL;
    }
    const char *names[] = {"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"};
    for (size_t i = 0; i < 3 && !g->lib; i++)
        g->lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!g->lib) {
        snprintf(why, why_len, "cannot load cuBLASLt (libcublasLt.so.13): %s", dlerror());
    } else if (bind(g, why, why_len) == 0) {
        cublasStatus_t st = g->create(&g->h);
        if (st != CUBLAS_STATUS_SUCCESS)
            snprintf(why, why_len, "cublasLtCreate failed (status %d)", (int)st);
        else if (cudaMalloc(&g->workspace, WORKSPACE) != cudaSuccess)
            snprintf(why, why_len, "no device memory for cuBLASLt's workspace");
        else
            return g;
    }
    cuda_gemm_close(g);
    return NULL;
}

void cuda_gemm_close(cuda_gemm *g)
{
    if (!g)
        return;
    if (g->workspace)
        cudaFree(g->workspace);
    if (g->h)
        g->destroy(g->h);
    if (g->lib)
        dlclose(g->lib);
    free(g);
}

const char *cuda_gemm_name(const cuda_gemm *g)
{
    (void)g;
    return "cublasLt";
}

static cudaDataType_t type_of(int dtype)
{
    return dtype == CUDA_BF16 ? CUDA_R_16BF : dtype == CUDA_F16 ? CUDA_R_16F : CUDA_R_32F;
}

int cuda_gemm_run(cuda_gemm *g, int dtype, const void *w, uint32_t m, uint32_t n, const void *x,
                  uint32_t ldx, uint32_t n_tok, float alpha, float beta, float *y, uint32_t ldy,
                  void *stream)
{
    if (dtype != CUDA_F32 && dtype != CUDA_F16 && dtype != CUDA_BF16)
        return (int)CUBLAS_STATUS_NOT_SUPPORTED;
    cudaDataType_t in = type_of(dtype);
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t a = NULL, b = NULL, c = NULL;
    cublasOperation_t trans = CUBLAS_OP_T;
    cublasStatus_t st = g->desc_create(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = g->desc_set(op, CUBLASLT_MATMUL_DESC_TRANSA, &trans, sizeof trans);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = g->layout_create(&a, in, n, m, n);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = g->layout_create(&b, in, n, n_tok, ldx);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = g->layout_create(&c, CUDA_R_32F, m, n_tok, ldy);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = g->matmul(g->h, op, &alpha, w, a, x, b, &beta, y, c, y, c, NULL, g->workspace,
                       WORKSPACE, (cudaStream_t)stream);
    if (c)
        g->layout_destroy(c);
    if (b)
        g->layout_destroy(b);
    if (a)
        g->layout_destroy(a);
    if (op)
        g->desc_destroy(op);
    return (int)st;
}
