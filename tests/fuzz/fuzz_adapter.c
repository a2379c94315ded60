/* fuzz_adapter.c - libFuzzer target: a PEFT adapter (adapter_config.json and adapter_model.safetensors) loaded against the micro model, and its hash.
 * Input: 2 bytes little-endian n, then n bytes of adapter_config.json (clamped), then the safetensors file. */
#include <stddef.h>
#include <stdint.h>

#include "device/adapter/adapter.h"
#include "tests/fuzz/fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int ready;
    if (!ready) {
        fuzz_mkdir("adapters/fz");
        ready = 1;
    }
    if (size < 2)
        return 0;
    size_t n = (size_t)data[0] | (size_t)data[1] << 8;
    if (n > size - 2)
        n = size - 2;
    fuzz_write(fuzz_path("adapters/fz/adapter_config.json"), data + 2, n);
    fuzz_write(fuzz_path("adapters/fz/adapter_model.safetensors"), data + 2 + n, size - 2 - n);
    devio_adapter *a = NULL;
    devio_error err = {0};
    if (devio_adapter_load(fuzz_path("adapters"), "fz", "fz", fuzz_model(), 8, &a, &err) ==
        DEVIO_OK)
        devio_adapter_free(a);
    char hex[65];
    uint64_t bytes;
    (void)devio_adapter_file_hash(fuzz_path("adapters"), "fz", hex, &bytes, &err);
    return 0;
}
