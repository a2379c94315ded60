/* kernels_bench_main.c - devio-bench-kernels: runs the copy of kernels_bench.c built for the
 * reference path DEVIO_REF_ISA names, else the widest this CPU runs. It never measures anything itself. */
#include <stdio.h>
#include <string.h>

#include "device/status.h"
#include "ref/ref_isa.h"

/* kernels_bench.c's main, built once per path with -Dmain=kernels_bench_PATH. */
#if defined(__x86_64__)
int kernels_bench_baseline(int argc, char **argv);
int kernels_bench_avx2(int argc, char **argv);
int kernels_bench_avx512(int argc, char **argv);
#else
int kernels_bench_native(int argc, char **argv);
#endif

int main(int argc, char **argv)
{
    const char *path;
    const devio_backend_ops *ops;
    devio_error err = {0};
    if (devio_ref_isa_pick(&path, &ops, &err) != DEVIO_OK) {
        fprintf(stderr, "devio-bench-kernels: %s\n", err.message);
        return 2;
    }
    printf("reference path %s\n", path);
#if defined(__x86_64__)
    if (strcmp(path, "avx512") == 0)
        return kernels_bench_avx512(argc, argv);
    if (strcmp(path, "avx2") == 0)
        return kernels_bench_avx2(argc, argv);
    return kernels_bench_baseline(argc, argv);
#else
    return kernels_bench_native(argc, argv);
#endif
}
