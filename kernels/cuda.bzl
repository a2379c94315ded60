"""cuda_backend_targets: //kernels' targets, made only where @cuda found nvcc.

cuda_plan (plain C) always builds, so its tests run on any machine. With the
toolkit: cuda_kernels.pic.o and cuda_ssm.pic.o from nvcc (sm_90 machine code
for Hopper and compute_90 PTX for later GPUs), the host glue as a cc_library
on the static CUDA runtime, and the plugin libdevio-backend-cuda.so. Without
it, nothing else here exists and @cuda's one line says why.
"""

load("@cuda//:defs.bzl", "HAS_NVCC", "NVCC")
load("//device:plugin.bzl", "devio_plugin")

# Strict numerics: no contraction into FMA (the kernels also use the _rn
# intrinsics throughout), IEEE division and square root, no flush to zero.
NVCC_FLAGS = " ".join([
    "-std=c++17",
    "-O3",
    "-fmad=false",
    "-prec-div=true",
    "-prec-sqrt=true",
    "-ftz=false",
    "-gencode arch=compute_90,code=sm_90",
    "-gencode arch=compute_90,code=compute_90",
    "-Xcompiler -fPIC,-ffp-contract=off",
])

def cuda_backend_targets():
    native.cc_library(
        name = "cuda_plan",
        srcs = ["cuda_plan.c"],
        hdrs = [
            "cuda_plan.h",
            "cuda_ssm.h",
        ],
        deps = ["//device"],
    )
    if not HAS_NVCC:
        return
    for unit, hdr in (("cuda_kernels", "cuda_kernels.h"), ("cuda_ssm", "cuda_ssm.h")):
        native.genrule(
            name = unit + "_obj",
            srcs = [
                unit + ".cu",
                hdr,
                "cuda_warp.cuh",
                "//device:numerics.h",
            ],
            outs = [unit + ".pic.o"],
            cmd = "%s %s -I. -c $(location %s.cu) -o $@" % (NVCC, NVCC_FLAGS, unit),
            # nvcc keeps its intermediate files under TMPDIR.
            tags = ["no-sandbox"],
        )
    native.cc_library(
        name = "cuda_backend",
        srcs = [
            "cuda_backend.c",
            "cuda_mixer.c",
            "cuda_state.h",
            "cuda_step.c",
            "cuda_step.h",
            ":cuda_kernels_obj",
            ":cuda_ssm_obj",
        ],
        hdrs = [
            "cuda_backend.h",
            "cuda_kernels.h",
        ],
        alwayslink = True,
        linkopts = ["-lstdc++"],
        deps = [
            ":cuda_plan",
            "//device",
            "@cuda//:cudart",
        ],
    )
    devio_plugin(
        name = "libdevio-backend-cuda.so",
        deps = [":cuda_backend"],
    )
    native.genrule(
        name = "devio-gpu-bw",
        srcs = ["bw_probe.cu"],
        outs = ["devio-gpu-bw"],
        cmd = "%s -std=c++17 -O3 -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90 $(location bw_probe.cu) -o $@" % NVCC,
        executable = True,
        tags = ["no-sandbox"],
    )

def devio_cuda_test(name, deps = [], data = [], **kwargs):
    """A cmocka test of the CUDA backend, made only where nvcc is: it links
    //kernels:cuda_backend and has the plugin in its runfiles (kernels/)."""
    if not HAS_NVCC:
        return
    native.cc_test(
        name = name,
        srcs = [name + ".c"],
        deps = deps + [
            "//kernels:cuda_backend",
            "//device",
            "@system//:cmocka",
        ],
        data = data + ["//kernels:libdevio-backend-cuda.so"],
        # The static CUDA runtime must land in the test binary itself.
        linkstatic = True,
        **kwargs
    )
