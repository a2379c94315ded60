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

# The host glue of the backend, compiled for the real plugin and the emulated one.
GLUE = [
    "cuda_adapters.c",
    "cuda_backend.c",
    "cuda_device.c",
    "cuda_gemm.h",
    "cuda_mixer.c",
    "cuda_project.c",
    "cuda_sampling.c",
    "cuda_state.h",
    "cuda_state_io.c",
    "cuda_step.c",
    "cuda_step.h",
]

# The emulator and the kernels it runs are C++17 (the kernels' own dialect);
# the kernels' #pragma unroll is nvcc's.
EMU_CXX = [
    "-std=c++17",
    "-Wno-unknown-pragmas",
]

def cuda_emu_targets():
    """The emulated CUDA target (kernels/emu/): the same kernels and glue,
    compiled by the host compiler against the SIMT emulator, as the plugin
    libdevio-backend-cuda-emu.so (--backend cuda-emu). Built everywhere."""
    native.cc_library(
        name = "emu_runtime",
        srcs = [
            "emu/emu_block.cc",
            "emu/emu_error.cc",
            "emu/emu_fiber.cc",
            "emu/emu_fiber.h",
            "emu/emu_graph.cc",
            "emu/emu_internal.h",
            "emu/emu_memory.cc",
            "emu/emu_runtime.cc",
            "emu/emu_state.h",
            "emu/emu_stream.cc",
        ],
        hdrs = [
            "emu/cuda_runtime.h",
            "emu/cuda_runtime_api.h",
            "emu/emu_device.h",
        ],
        # <cuda_runtime.h> and <cuda_runtime_api.h> are the emulator's for
        # everything that depends on it.
        includes = ["emu"],
        copts = EMU_CXX,
        deps = ["//device/numerics"],
    )
    native.cc_library(
        name = "cuda_kernels_emu",
        srcs = [
            "cuda_gemm.h",
            "emu/emu_fast.cc",
            "emu/emu_gemm.cc",
            "emu/emu_kernels.cc",
            "emu/emu_sample.cc",
            "emu/emu_ssm.cc",
        ],
        hdrs = [
            "cuda_fast.h",
            "cuda_kernels.h",
            "cuda_sample.h",
            "cuda_ssm.h",
        ],
        textual_hdrs = [
            "cuda_fast.cu",
            "cuda_kernels.cu",
            "cuda_sample.cu",
            "cuda_ssm.cu",
            "cuda_warp.cuh",
        ],
        copts = EMU_CXX,
        deps = [":emu_runtime"],
    )
    native.cc_library(
        name = "cuda_backend_emu",
        srcs = GLUE,
        hdrs = ["cuda_backend.h"],
        alwayslink = True,
        deps = [
            ":cuda_kernels_emu",
            ":cuda_plan",
            ":emu_runtime",
            "//device/core",
        ],
    )
    devio_plugin(
        name = "libdevio-backend-cuda-emu.so",
        deps = [":cuda_backend_emu"],
    )

# The negative control's mutants (kernels/emu/mutate.py): each a cuda-emu plugin
# built from kernels with one deliberate defect, at
# kernels/mutants/NAME/libdevio-backend-cuda-emu.so. "combine" breaks a fast
# numerics kernel: strict numerics never run it, the fast tolerance check must
# catch it.
MUTANTS = ["fold", "barrier", "offbyone", "fma", "combine"]

def cuda_emu_mutants():
    for m in MUTANTS:
        d = "mutants/%s/" % m
        native.genrule(
            name = "mutant_%s_src" % m,
            srcs = [
                "cuda_fast.cu",
                "cuda_kernels.cu",
                "cuda_ssm.cu",
                "cuda_warp.cuh",
                "emu/mutate.py",
            ],
            outs = [d + f for f in ("cuda_fast.cu", "cuda_kernels.cu", "cuda_ssm.cu",
                                    "cuda_warp.cuh", "emu_fast.cc", "emu_kernels.cc",
                                    "emu_ssm.cc")],
            cmd = ("python3 $(location emu/mutate.py) {m} $(@D)/{d} $(location cuda_kernels.cu) " +
                   "$(location cuda_ssm.cu) $(location cuda_fast.cu) $(location cuda_warp.cuh) && " +
                   "echo '#include \"cuda_fast.cu\"' > $(@D)/{d}emu_fast.cc && " +
                   "echo '#include \"cuda_kernels.cu\"' > $(@D)/{d}emu_kernels.cc && " +
                   "echo '#include \"cuda_ssm.cu\"' > $(@D)/{d}emu_ssm.cc").format(m = m, d = d),
        )
        native.cc_library(
            name = "cuda_kernels_emu_" + m,
            srcs = [d + "emu_fast.cc", d + "emu_kernels.cc", d + "emu_ssm.cc", "cuda_gemm.h",
                    "emu/emu_gemm.cc", "emu/emu_sample.cc"],
            hdrs = [
                "cuda_fast.h",
                "cuda_kernels.h",
                "cuda_sample.h",
                "cuda_ssm.h",
            ],
            textual_hdrs = [d + "cuda_fast.cu", d + "cuda_kernels.cu", d + "cuda_ssm.cu",
                            d + "cuda_warp.cuh", "cuda_sample.cu", "cuda_warp.cuh"],
            copts = EMU_CXX,
            deps = [":emu_runtime"],
        )
        native.cc_library(
            name = "cuda_backend_emu_" + m,
            srcs = GLUE,
            hdrs = ["cuda_backend.h"],
            alwayslink = True,
            deps = [
                ":cuda_kernels_emu_" + m,
                ":cuda_plan",
                ":emu_runtime",
                "//device/core",
            ],
        )
        devio_plugin(
            name = d + "libdevio-backend-cuda-emu.so",
            deps = [":cuda_backend_emu_" + m],
        )

def cuda_backend_targets():
    cuda_emu_targets()
    cuda_emu_mutants()
    native.cc_library(
        name = "cuda_plan",
        srcs = [
            "cuda_fast.h",
            "cuda_kernels.h",
            "cuda_plan.c",
            "cuda_sample.h",
        ],
        hdrs = [
            "cuda_plan.h",
            "cuda_proc.h",
            "cuda_ssm.h",
        ],
        deps = ["//device/core"],
    )
    if not HAS_NVCC:
        return
    for unit, hdr in (("cuda_kernels", "cuda_kernels.h"), ("cuda_ssm", "cuda_ssm.h"),
                      ("cuda_fast", "cuda_fast.h"), ("cuda_sample", "cuda_sample.h")):
        native.genrule(
            name = unit + "_obj",
            srcs = [
                unit + ".cu",
                "cuda_kernels.h",
                "cuda_warp.cuh",
                "//device/numerics:numerics.h",
                "//device/numerics:quant.h",
                "//device/numerics:sample_rule.h",
            ] + ([hdr] if hdr != "cuda_kernels.h" else []),
            outs = [unit + ".pic.o"],
            cmd = "%s %s -I. -c $(location %s.cu) -o $@" % (NVCC, NVCC_FLAGS, unit),
            # nvcc keeps its intermediate files under TMPDIR.
            tags = ["no-sandbox"],
        )
    native.cc_library(
        name = "cuda_backend",
        srcs = GLUE + [
            "cuda_gemm_lt.c",
            ":cuda_fast_obj",
            ":cuda_kernels_obj",
            ":cuda_sample_obj",
            ":cuda_ssm_obj",
        ],
        hdrs = [
            "cuda_backend.h",
            "cuda_fast.h",
            "cuda_kernels.h",
            "cuda_sample.h",
        ],
        alwayslink = True,
        linkopts = ["-lstdc++", "-ldl"],
        deps = [
            ":cuda_plan",
            "//device/core",
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
    native.cc_binary(
        name = "devio-gpu-gemm",
        srcs = [
            "cuda_gemm.h",
            "cuda_gemm_lt.c",
            "cuda_kernels.h",
            "gemm_probe.c",
        ],
        linkopts = ["-lstdc++", "-ldl"],
        deps = ["@cuda//:cudart"],
    )

def devio_cuda_emu_test(name, src, deps = [], **kwargs):
    """The CUDA backend's cmocka test src on the SIMT emulator: it links
    //kernels:cuda_backend_emu, has the cuda-emu plugin in its runfiles
    and sees DEVIO_CUDA_TEST_EMU. Built everywhere."""
    native.cc_test(
        name = name,
        srcs = [src],
        deps = deps + [
            "//kernels:cuda_backend_emu",
            "//device/core",
            "@system//:cmocka",
        ],
        data = ["//kernels:libdevio-backend-cuda-emu.so"],
        local_defines = ["DEVIO_CUDA_TEST_EMU"],
        linkstatic = True,
        **kwargs
    )

def devio_cuda_test(name, deps = [], data = [], srcs_extra = [], **kwargs):
    """A cmocka test of the CUDA backend, made only where nvcc is: it links
    //kernels:cuda_backend and has the plugin in its runfiles (kernels/)."""
    if not HAS_NVCC:
        return
    native.cc_test(
        name = name,
        srcs = [name + ".c"] + srcs_extra,
        deps = deps + [
            "//kernels:cuda_backend",
            "//device/core",
            "@system//:cmocka",
        ],
        data = data + ["//kernels:libdevio-backend-cuda.so"],
        # The static CUDA runtime must land in the test binary itself.
        linkstatic = True,
        **kwargs
    )
