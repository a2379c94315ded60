/* cpu_path_test.h - for the cpu backend's kernel tests, each built once per instruction-set path
 * (tests/BUILD.bazel's copts name it: CPU_TEST_PATH, CPU_TEST_OPS, CPU_TEST_LEVEL): whether this
 * CPU runs that path. Static; include once, after cmocka.h. */
#ifndef DEVIO_TESTS_CPU_PATH_TEST_H
#define DEVIO_TESTS_CPU_PATH_TEST_H

#include <stdbool.h>

#include "ref/isa_dispatch.h"

extern const devio_backend_ops CPU_TEST_OPS;

/* Whether this CPU runs the path under test; a skip says so when not. */
static bool runs(void)
{
    devio_isa_path p = {.name = CPU_TEST_PATH, .ops = &CPU_TEST_OPS, .level = CPU_TEST_LEVEL,
                        .needs = "the path's -march"};
    devio_isa_family f = {.what = "cpu", .env = "DEVIO_CPU_TEST_UNSET", .paths = &p, .n_paths = 1};
    char why[160];
    if (devio_isa_runs(&f, CPU_TEST_PATH, why, sizeof why))
        return true;
    print_message("skipped: %s\n", why);
    return false;
}

#endif
