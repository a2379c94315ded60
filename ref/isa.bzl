"""The reference backend's instruction-set paths: the sources of REF_ISA_SRCS built once per path.

One binary holds every path; ref/ref_isa.c picks one at run time. Must never
hold a flag that changes a number: -ffp-contract=off (.bazelrc) holds for all.
"""

# The sources whose code depends on the instruction set (generic vectors,
# F16C). pool.c, builtin.c and ref_isa.c are built once, for the baseline.
REF_ISA_SRCS = [
    "ref_attention.c",
    "ref_backend.c",
    "ref_gemm.c",
    "ref_kernels.c",
    "ref_mixer.c",
    "ref_step.c",
]

# Every external symbol REF_ISA_SRCS define (`nm --defined-only -g` on their
# objects). Each path renames them NAME_PATH with -D, so the paths link side by
# side. A new external symbol in those files must be added here: a duplicate
# symbol at link time says which one.
REF_ISA_SYMBOLS = [
    "devio_ref_backend",
    "ref_attention_one",
    "ref_attention_run",
    "ref_lane_dot",
    "ref_lane_sum",
    "ref_matmul_run",
    "ref_mixer_run",
    "ref_gemm_xpack_floats",
    "ref_panels_free",
    "ref_panels_pack",
    "ref_rmsnorm",
    "ref_rope",
    "ref_scratch_fini",
    "ref_scratch_init",
    "ref_step_run",
    "ref_widen",
]

# path -> compiler flags. x86-64: SSE2 (4 floats a vector), x86-64-v3 (AVX2,
# FMA, F16C: 8), x86-64-v4 (AVX-512: 16). Elsewhere one path, this CPU's.
# ref/ref_isa.c lists the same paths under the same names.
REF_ISA_X86 = {
    "baseline": ["-march=x86-64"],
    "avx2": ["-march=x86-64-v3"],
    "avx512": ["-march=x86-64-v4"],
}
REF_ISA_OTHER = {
    "native": ["-march=native"],
}

# Every path: GCC warns that a vector wider than the path's registers would
# be passed differently across a call; the sources pass them only to static
# inline helpers, so the warning (an error under -Werror) says nothing here.
REF_ISA_COPTS = ["-Wno-psabi"]

def ref_isa_renames(path):
    """The -D flags that give the path's copy of every symbol its own name.

    -Ddevio_ref_backend=devio_ref_backend_PATH and so on: every path compiles
    the same sources, so without the renames their copies of each external
    symbol would collide when one binary links them all. ref/ref_isa.c names
    each path's table by its renamed name and defines devio_ref_backend itself.
    """
    return ["-D%s=%s_%s" % (s, s, path) for s in REF_ISA_SYMBOLS]

def ref_isa_library(path, march, **kwargs):
    """The path's copy of the backend: REF_ISA_SRCS with that path's flags and names."""
    native.cc_library(
        name = "ref_" + path,
        srcs = REF_ISA_SRCS + ["ref_kv.h", "ref_state.h", "ref_vec.h"],
        hdrs = [
            "ref_backend.h",
            "ref_gemm.h",
            "ref_kernels.h",
            "ref_mixer.h",
        ],
        copts = march + REF_ISA_COPTS + ref_isa_renames(path),
        deps = [
            ":pool",
            "//device/core",
            "//device/numerics",
        ],
        **kwargs
    )
