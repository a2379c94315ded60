/* fuzz_safetensors.c - libFuzzer target: a .safetensors file through devio_st_open (header, ranges, layout), the finiteness scan of every tensor, and the model loader with the micro model's config.json.
 * Input: the bytes of model.safetensors. */
#include <stddef.h>
#include <stdint.h>
#include <unistd.h>

#include "device/model/model.h"
#include "device/model/safetensors.h"
#include "tests/fuzz/fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int ready;
    if (!ready) {
        fuzz_mkdir("st");
        if (link(fuzz_path("model/config.json"), fuzz_path("st/config.json")) != 0)
            return 0;
        ready = 1;
    }
    const char *p = fuzz_path("st/model.safetensors");
    fuzz_write(p, data, size);
    devio_st_file *f = NULL;
    devio_error err = {0};
    if (devio_st_open(p, "model.safetensors", NULL, &f, &err) == DEVIO_OK) {
        for (size_t i = 0; i < devio_st_count(f); i++) {
            const devio_st_tensor *t = devio_st_at(f, i);
            (void)devio_st_check_finite(f, t, &err);
            if (devio_st_find(f, t->name) != t)
                __builtin_trap(); /* names are unique and sorted */
        }
        devio_st_close(f);
    }
    devio_model *m = NULL;
    if (devio_model_load(fuzz_path("st"), &m, &err) == DEVIO_OK)
        devio_model_free(m);
    return 0;
}
