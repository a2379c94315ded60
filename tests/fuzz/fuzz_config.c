/* fuzz_config.c - libFuzzer target: config.json as the model loader reads it (the quoting of Infinity/NaN, jansson, every field rule of model_config.c), beside the micro model's real weights.
 * Input: the bytes of config.json. A config that passes goes on to load the tensors, so shape rules meet real files. */
#include <stddef.h>
#include <stdint.h>
#include <unistd.h>

#include "device/model/model.h"
#include "tests/fuzz/fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int ready;
    if (!ready) {
        fuzz_mkdir("cfg");
        if (link(fuzz_path("model/model.safetensors"), fuzz_path("cfg/model.safetensors")) != 0)
            return 0;
        ready = 1;
    }
    fuzz_write(fuzz_path("cfg/config.json"), data, size);
    devio_model *m = NULL;
    devio_error err = {0};
    if (devio_model_load(fuzz_path("cfg"), &m, &err) == DEVIO_OK)
        devio_model_free(m);
    return 0;
}
