/* tensor.c - a tensor's element type and its elements (device/model/model.h): the dtypes' names,
 * sizes and ggml numbers, a tensor's bytes, and its elements widened to binary32 exactly.
 * Functions of values; nothing to own. Used by the loaders (model.c, model_gguf.c,
 * safetensors.c) and by every backend. */
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "device/model/model.h"
#include "device/numerics/numerics.h"
#include "device/numerics/quant.h"

static const struct {
    const char *name;
    uint32_t ggml; /* device/numerics/quant.h's number; 0 for a float type */
} dtypes[] = {
    [DEVIO_F32] = {"F32", 0},   [DEVIO_F16] = {"F16", 0},   [DEVIO_BF16] = {"BF16", 0},
    [DEVIO_Q8_0] = {"Q8_0", DEVIO_QT_Q8_0}, [DEVIO_Q4_0] = {"Q4_0", DEVIO_QT_Q4_0},
    [DEVIO_Q4_1] = {"Q4_1", DEVIO_QT_Q4_1}, [DEVIO_Q5_0] = {"Q5_0", DEVIO_QT_Q5_0},
    [DEVIO_Q5_1] = {"Q5_1", DEVIO_QT_Q5_1}, [DEVIO_Q4_K] = {"Q4_K", DEVIO_QT_Q4_K},
    [DEVIO_Q5_K] = {"Q5_K", DEVIO_QT_Q5_K}, [DEVIO_Q6_K] = {"Q6_K", DEVIO_QT_Q6_K},
};

size_t devio_dtype_size(devio_dtype t)
{
    return t == DEVIO_F32 ? 4 : t == DEVIO_F16 || t == DEVIO_BF16 ? 2 : 0;
}

const char *devio_dtype_str(devio_dtype t)
{
    return (unsigned)t < sizeof dtypes / sizeof *dtypes ? dtypes[t].name : "?";
}

uint32_t devio_dtype_ggml(devio_dtype t)
{
    return (unsigned)t < sizeof dtypes / sizeof *dtypes ? dtypes[t].ggml : 0;
}

bool devio_dtype_quantized(devio_dtype t)
{
    return devio_dtype_ggml(t) != 0;
}

uint64_t devio_dtype_row_bytes(devio_dtype t, uint64_t n)
{
    uint32_t q = devio_dtype_ggml(t);
    if (!q)
        return n * devio_dtype_size(t);
    return n / devio_quant_block(q) * devio_quant_block_bytes(q);
}

uint64_t devio_tensor_bytes(const devio_tensor *t)
{
    if (!t->data)
        return 0;
    return t->ndim > 1 ? t->shape[0] * devio_dtype_row_bytes(t->dtype, t->shape[1])
                       : devio_dtype_row_bytes(t->dtype, t->shape[0]);
}

float devio_tensor_get(const devio_tensor *t, uint64_t i)
{
    const uint8_t *p = t->data;
    uint32_t q = devio_dtype_ggml(t->dtype);
    if (q) {
        /* The element's block, whole: rows are whole blocks. */
        float y[256];
        uint32_t blk = devio_quant_block(q);
        devio_dequant_block(q, p + i / blk * devio_quant_block_bytes(q), y);
        return y[i % blk];
    }
    switch (t->dtype) {
    case DEVIO_F32: {
        float f;
        memcpy(&f, p + i * 4, sizeof f);
        return f;
    }
    case DEVIO_F16: {
        uint16_t h;
        memcpy(&h, p + i * 2, sizeof h);
        return devio_f16_to_f32(h);
    }
    case DEVIO_BF16: {
        uint16_t h;
        memcpy(&h, p + i * 2, sizeof h);
        return devio_bf16_to_f32(h);
    }
    default:
        return 0.0f;
    }
}

bool devio_tensor_widen(const devio_tensor *t, float *dst, size_t n)
{
    if (!t->data)
        return false;
    for (size_t i = 0; i < n; i++)
        dst[i] = devio_tensor_get(t, i);
    return true;
}
