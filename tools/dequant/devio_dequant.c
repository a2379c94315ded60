/* devio_dequant.c - devio-dequant: one tensor of a GGUF file as devio reads its values, binary32
 * little-endian, for checking devio's definition of the quantized types (device/numerics/quant.h)
 * against other readers (tests/python/quant_check.py). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/model/gguf.h"
#include "device/numerics/numerics.h"
#include "device/numerics/quant.h"

static int widen(const devio_gguf_tensor *t, float *y, uint64_t n)
{
    if (devio_quant_block(t->type)) {
        for (uint64_t r = 0; r < n / t->ne[0]; r++)
            devio_dequant_row(t->type, t->data + r * (t->nbytes / (n / t->ne[0])),
                              y + r * t->ne[0], t->ne[0]);
        return 0;
    }
    for (uint64_t i = 0; i < n; i++) {
        uint16_t h;
        switch (t->type) {
        case DEVIO_GGML_F32:
            memcpy(&y[i], t->data + 4 * i, 4);
            break;
        case DEVIO_GGML_F16:
            memcpy(&h, t->data + 2 * i, 2);
            y[i] = devio_f16_to_f32(h);
            break;
        case DEVIO_GGML_BF16:
            memcpy(&h, t->data + 2 * i, 2);
            y[i] = devio_bf16_to_f32(h);
            break;
        default:
            return -1;
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 4 || strcmp(argv[1], "--help") == 0) {
        fprintf(argc == 2 ? stdout : stderr,
                "usage: devio-dequant FILE.gguf TENSOR OUT.f32\n"
                "Writes TENSOR's values as devio forms them (docs/numerics.md, quantized\n"
                "weights), binary32 little-endian, row after row.\n");
        return argc == 2 ? 0 : 2;
    }
    devio_gguf_file *f = NULL;
    devio_error err = {0};
    if (devio_gguf_open(argv[1], argv[1], &f, &err) != DEVIO_OK) {
        fprintf(stderr, "devio-dequant: %s\n", err.message);
        return 1;
    }
    const devio_gguf_tensor *t = devio_gguf_find_tensor(f, argv[2]);
    uint64_t n = 1;
    for (uint32_t d = 0; t && d < t->ndim; d++)
        n *= t->ne[d];
    float *y = t ? malloc((size_t)n * sizeof *y) : NULL;
    int rc = 1;
    if (!t)
        fprintf(stderr, "devio-dequant: no tensor '%s'\n", argv[2]);
    else if (!y)
        fprintf(stderr, "devio-dequant: out of memory\n");
    else if (widen(t, y, n) != 0)
        fprintf(stderr, "devio-dequant: '%s' is %s, which devio does not define\n", argv[2],
                devio_gguf_type_name(t->type));
    else {
        FILE *o = fopen(argv[3], "wb");
        rc = o && fwrite(y, sizeof *y, (size_t)n, o) == n && fclose(o) == 0 ? 0 : 1;
        if (rc)
            fprintf(stderr, "devio-dequant: cannot write %s\n", argv[3]);
    }
    free(y);
    devio_gguf_close(f);
    return rc;
}
