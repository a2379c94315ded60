/* fuzz_script.c - libFuzzer target: the conformance script runner of conform/script.h (docs/conformance.md) over a fresh in-process reference device.
 * Input: a JSON-lines script; its result lines go to /dev/null. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "conform/inproc.h"
#include "conform/script.h"
#include "tests/fuzz/fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static FILE *null;
    if (!null && !(null = fopen("/dev/null", "w")))
        abort();
    if (size == 0)
        return 0;
    FILE *in = fmemopen((void *)data, size, "r");
    if (!in)
        return 0;
    devio_device *d = fuzz_device_open();
    devio_script_target t;
    devio_inproc_target(d, &t);
    char why[256];
    (void)devio_script_run(&t, in, null, why, sizeof why);
    fclose(in);
    devio_teardown(d, NULL);
    return 0;
}
