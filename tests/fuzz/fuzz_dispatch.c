/* fuzz_dispatch.c - libFuzzer target: the plan, effect, await and id codecs of api/codec.h, and the operation table of conform/inproc.h driving a live reference device.
 * Input: lines "<op letter><JSON body>" (c create, q seq, l launch, w await, s step, a apply, f facts, o lora); each input gets a fresh device. Any crash or sanitizer report is a finding. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "api/codec.h"
#include "conform/inproc.h"
#include "tests/fuzz/fuzz_common.h"

#define MAX_LINES 48

static const char *op_of(char c)
{
    switch (c) {
    case 'c': return "create";
    case 'q': return "seq";
    case 'l': return "launch";
    case 'w': return "await";
    case 's': return "step";
    case 'a': return "apply";
    case 'f': return "facts";
    case 'o': return "lora";
    default: return NULL;
    }
}

/* Every decoder on the body, whatever the op: they must refuse, never crash. */
static void decode_all(const json_t *j)
{
    devio_error err = {0};
    devio_plan_buf pb;
    if (devio_json_plan_decode(j, 8, 64, &pb, &err) == DEVIO_OK)
        devio_plan_buf_free(&pb);
    devio_effect e;
    devio_sample_buf proc;
    (void)devio_json_effect_decode(j, &e, &proc, &err);
    devio_sample_buf_free(&proc);
    devio_sample_params sp;
    if (devio_json_sample_decode(j, &sp, &proc, &err) == DEVIO_OK)
        devio_sample_buf_free(&proc);
    uint64_t id;
    int64_t t;
    (void)devio_json_await_decode(j, &id, &t, &err);
    (void)devio_json_id_decode(j, "seq", &id, &err);
    json_t *ej = devio_json_error(&err);
    json_decref(ej);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    devio_device *d = fuzz_device_open();
    size_t at = 0;
    for (int line = 0; line < MAX_LINES && at < size; line++) {
        const uint8_t *nl = memchr(data + at, '\n', size - at);
        size_t end = nl ? (size_t)(nl - data) : size;
        const char *op = op_of((char)data[at]);
        json_t *body = NULL;
        if (end > at + 1) {
            json_error_t je;
            body = json_loadb((const char *)data + at + 1, end - at - 1,
                              JSON_REJECT_DUPLICATES, &je);
        }
        at = end + 1;
        if (body)
            decode_all(body);
        if (op) {
            /* A timeout is bounded: steps run inside await on this device. */
            json_t *res = NULL;
            devio_error err = {0};
            if (devio_inproc_call(d, op, body, &res, &err) == DEVIO_OK) {
                char *s = json_dumps(res, DEVIO_JSON_FLAGS);
                free(s);
                json_decref(res);
            } else {
                json_t *ej = devio_json_error(&err);
                json_decref(ej);
            }
        }
        json_decref(body);
    }
    devio_teardown(d, NULL);
    return 0;
}
