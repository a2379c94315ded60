/* ref_kernels.c - widening, the lane reductions, rmsnorm, RoPE and the per-thread scratch
 * of the reference backend, in the operation order ref_kernels.h defines (attention is
 * ref_attention.c). Never fuses a multiply into an add, never calls libm, never allocates per
 * call. The projections are ref_gemm.c; the vector vocabulary both use is
 * ref_vec.h (generic vectors: the same source becomes AVX-512, AVX2, SSE2,
 * NEON or simd128, and the numbers do not depend on which). */
#include "ref/ref_kernels.h"

#include <stdlib.h>
#include <string.h>

#include "device/numerics/numerics.h"
#include "device/numerics/numerics_vec.h"
#include "device/numerics/quant.h"
#include "ref/ref_vec.h"

void ref_widen(devio_dtype dt, const void *src, float *dst, size_t n)
{
    size_t i = 0;
    if (devio_dtype_quantized(dt)) { /* whole blocks: an embedding row */
        devio_dequant_row(devio_dtype_ggml(dt), src, dst, n);
        return;
    }
    if (dt == DEVIO_F32) {
        memcpy(dst, src, n * sizeof(float));
        return;
    }
    const uint16_t *h = src;
    if (dt == DEVIO_BF16) {
        for (; i + VL <= n; i += VL)
            stv(dst + i, widen_bf16(h + i));
        for (; i < n; i++)
            dst[i] = widen1_bf16(h[i]);
    } else {
        for (; i + VL <= n; i += VL)
            stv(dst + i, widen_f16(h + i));
        for (; i < n; i++)
            dst[i] = widen1_f16(h[i]);
    }
}

/* ---- reductions -------------------------------------------------------- */

float ref_lane_dot(const float *a, const float *b, uint32_t n)
{
    vf acc[NV];
    for (int v = 0; v < NV; v++)
        acc[v] = (vf){0};
    uint32_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int v = 0; v < NV; v++)
            acc[v] = acc[v] + ldv(a + i + v * VL) * ldv(b + i + v * VL);
    if (i < n) {
        /* The tail as one more chunk with zero terms in the missing lanes. */
        float ta[32] = {0}, tb[32] = {0};
        memcpy(ta, a + i, (n - i) * sizeof(float));
        memcpy(tb, b + i, (n - i) * sizeof(float));
        for (int v = 0; v < NV; v++)
            acc[v] = acc[v] + ldv(ta + v * VL) * ldv(tb + v * VL);
    }
    return fold_lanes(acc);
}

float ref_lane_sum(const float *x, uint32_t n)
{
    vf acc[NV];
    for (int v = 0; v < NV; v++)
        acc[v] = (vf){0};
    uint32_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int v = 0; v < NV; v++)
            acc[v] = acc[v] + ldv(x + i + v * VL);
    if (i < n) {
        float t[32] = {0};
        memcpy(t, x + i, (n - i) * sizeof(float));
        for (int v = 0; v < NV; v++)
            acc[v] = acc[v] + ldv(t + v * VL);
    }
    return fold_lanes(acc);
}

/* ---- rmsnorm and RoPE -------------------------------------------------- */

void ref_rmsnorm(float *y, const float *x, const float *w, uint32_t d, float eps)
{
    float ss = ref_lane_dot(x, x, d);
    float r = devio_rsqrtf(ss / (float)d + eps);
    for (uint32_t i = 0; i < d; i++)
        y[i] = w[i] * (x[i] * r);
}

void ref_rope(float *x, uint32_t n_heads, uint32_t hd, uint32_t rd, const float *cos_row,
              const float *sin_row)
{
    uint32_t half = rd / 2;
    for (uint32_t h = 0; h < n_heads; h++) {
        float *p = x + (size_t)h * hd;
        for (uint32_t i = 0; i < half; i++) {
            float a = p[i], b = p[i + half];
            float c = cos_row[i], s = sin_row[i];
            p[i] = a * c - b * s;
            p[i + half] = b * c + a * s;
        }
    }
}

/* ---- scratch ----------------------------------------------------------- */

int ref_scratch_init(ref_scratch *s, uint32_t max_seq_len, uint32_t head_dim, uint32_t max_k)
{
    memset(s, 0, sizeof *s);
    s->part = malloc((size_t)REF_GEMM_PART_FLOATS * sizeof(float));
    s->scores = malloc((size_t)(max_seq_len ? max_seq_len : 1) * sizeof(float));
    s->rows = malloc((size_t)(max_seq_len ? max_seq_len : 1) * sizeof(size_t));
    s->acc = malloc((size_t)32 * head_dim * sizeof(float));
    s->qbuf = calloc(ref_pad32(head_dim) + 32, sizeof(float));
    s->kbuf = calloc(32, sizeof(float));
    if (posix_memalign((void **)&s->wide, 64,
                       ref_scratch_wide_floats(max_k, head_dim) * sizeof(float)) != 0)
        s->wide = NULL;
    if (!s->part || !s->scores || !s->rows || !s->acc || !s->qbuf || !s->kbuf || !s->wide) {
        ref_scratch_fini(s);
        return -1;
    }
    return 0;
}

void ref_scratch_fini(ref_scratch *s)
{
    free(s->part);
    free(s->scores);
    free(s->rows);
    free(s->acc);
    free(s->qbuf);
    free(s->kbuf);
    free(s->wide);
    memset(s, 0, sizeof *s);
}
