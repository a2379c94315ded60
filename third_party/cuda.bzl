"""cuda_configure: the repository @cuda, saying whether this machine has the CUDA toolkit.

It looks for nvcc at $CUDA_PATH/bin/nvcc, else /usr/local/cuda/bin/nvcc, and writes
@cuda//:defs.bzl with HAS_NVCC, NVCC (the compiler) and CUDA_ROOT. Without a toolkit
//kernels builds nothing and the rest of devio builds and tests as before; one line
says so when the repository is made.
"""

def _cuda_configure_impl(ctx):
    root = ctx.os.environ.get("CUDA_PATH", "/usr/local/cuda")
    nvcc = ctx.path(root + "/bin/nvcc")
    cudart = ctx.path(root + "/lib64/libcudart_static.a")
    has = nvcc.exists and cudart.exists
    if not has:
        print("devio: no CUDA toolkit at %s (nvcc and libcudart_static.a): the CUDA backend plugin //kernels:libdevio-backend-cuda.so is not built" % root)
    ctx.file("defs.bzl", "HAS_NVCC = %s\nNVCC = %r\nCUDA_ROOT = %r\n" % (has, str(nvcc), root))
    build = 'exports_files(["defs.bzl"])\n'
    if has:
        # The toolkit's headers and the static CUDA runtime, seen through links
        # so that Bazel knows every header a CUDA source includes.
        ctx.symlink(root + "/include", "include")
        ctx.symlink(str(cudart), "lib/libcudart_static.a")
        build += """
cc_library(
    name = "cudart",
    hdrs = glob(["include/**/*.h", "include/**/*.hpp"]),
    includes = ["include"],
    srcs = ["lib/libcudart_static.a"],
    linkopts = ["-ldl", "-lrt", "-lpthread"],
    visibility = ["//visibility:public"],
)
"""
    ctx.file("BUILD.bazel", build)

cuda_configure = repository_rule(
    implementation = _cuda_configure_impl,
    environ = ["CUDA_PATH"],
    local = True,
)
