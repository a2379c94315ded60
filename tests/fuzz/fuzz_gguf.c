/* fuzz_gguf.c - libFuzzer target: a GGUF file through devio_gguf_parse (header, metadata of
 * every type, the tensor table, the data layout), then every lookup and typed read on what
 * passed. Input: the bytes of a .gguf file. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "device/gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    devio_gguf_file *f = NULL;
    devio_error err = {0};
    if (devio_gguf_parse(data, size, "fuzz.gguf", &f, &err) != DEVIO_OK)
        return 0;
    for (size_t i = 0; i < devio_gguf_kv_count(f); i++) {
        const devio_gguf_kv *kv = devio_gguf_kv_at(f, i);
        if (devio_gguf_find_kv(f, kv->key) != kv)
            __builtin_trap(); /* keys are unique */
        uint64_t u, len;
        float x;
        bool b;
        (void)devio_gguf_get_u64(f, kv->key, &u);
        (void)devio_gguf_get_f32(f, kv->key, &x);
        (void)devio_gguf_get_bool(f, kv->key, &b);
        const char *s = devio_gguf_get_str(f, kv->key, &len);
        if (s && (s < (const char *)data || len > size || s + len > (const char *)data + size))
            __builtin_trap(); /* a string inside the input */
    }
    uint64_t sum = 0;
    for (size_t i = 0; i < devio_gguf_tensor_count(f); i++) {
        const devio_gguf_tensor *t = devio_gguf_tensor_at(f, i);
        if (devio_gguf_find_tensor(f, t->name) != t)
            __builtin_trap(); /* names are unique */
        if (t->nbytes) /* first and last byte: inside the input, or ASan says so */
            sum += t->data[0] + t->data[t->nbytes - 1];
    }
    devio_gguf_close(f);
    return (int)(sum & 0);
}
