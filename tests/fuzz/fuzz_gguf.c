/* fuzz_gguf.c - libFuzzer target: a GGUF file through devio_gguf_parse (header, metadata of
 * every type, the tensor table, the data layout), every lookup and typed read on what passed,
 * then the model loader on it as --model FILE.gguf (metadata as config, value rules, tensor
 * names, shapes, types, the scan, every tensor used or refused) and the shape check a device
 * makes at start. Input: the bytes of a .gguf file. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "device/model/gguf.h"
#include "device/model/model.h"
#include "device/backend/shape.h"
#include "tests/fuzz/fuzz_common.h"

/* What a model that loaded must hold, or the loader let a lie through. */
static void check_model(const devio_model *m)
{
    const devio_model_config *c = &m->cfg;
    const int64_t ids[] = {m->text.bos_id, m->text.eos_id, m->text.pad_id};
    for (size_t i = 0; i < 3; i++)
        if (ids[i] < -1 || ids[i] >= (int64_t)c->vocab_size)
            __builtin_trap(); /* a token id outside the vocabulary */
    const float fs[] = {c->rope_theta, c->rms_norm_eps, c->rope_scaling.factor,
                        c->rope_scaling.attention_factor, c->embedding_multiplier,
                        c->residual_multiplier, c->logits_scaling};
    for (size_t i = 0; i < sizeof fs / sizeof *fs; i++)
        if (!isfinite(fs[i]) || !(fs[i] > 0.0f))
            __builtin_trap(); /* a value the model is computed from, not finite or not > 0 */
    devio_model_shape shape;
    devio_error err = {0};
    (void)devio_model_shape_get(m, &shape, &err);
}

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
        if (devio_gguf_find_tensor(f, t->name) != t || devio_gguf_tensor_index(f, t) != i)
            __builtin_trap(); /* names are unique; the index is the file order */
        if (t->nbytes) /* first and last byte: inside the input, or ASan says so */
            sum += t->data[0] + t->data[t->nbytes - 1];
    }
    /* A file that names no model architecture stops here: the loader would
     * refuse it at its first key, so writing it out would only cost time. */
    bool model = devio_gguf_find_kv(f, "general.architecture") != NULL;
    devio_gguf_close(f);
    if (model) {
        const char *path = fuzz_path("m.gguf");
        fuzz_write(path, data, size);
        devio_model *m = NULL;
        if (devio_model_load(path, &m, &err) == DEVIO_OK) {
            check_model(m);
            devio_model_free(m);
        }
    }
    return (int)(sum & 0);
}
