"""The cpu backend's instruction-set paths: the reference's step (ref/isa.bzl's sources) with
cpu_gemm.c and cpu_pack.c in place of ref/ref_gemm.c, cpu_attention.c in place of
ref/ref_attention.c, and its KV cache in binary16
(REF_KV_F16, ref/ref_kv.h), built once per path with every symbol renamed NAME_cpu_PATH.
ref/ref_gemm.c is built beside it under the names ref_strict_* (cpu_strict.h), for the
weights the fast kernels do not take. Both are compiled with -ffp-contract=fast: the paths with
FMA fuse each product into its add (fast numerics; the reference stays uncontracted), and every
source alike, so that fused and unfused code paths keep giving a token the same bits.
"""

load("//ref:isa.bzl", "REF_ISA_COPTS", "REF_ISA_SRCS", "REF_ISA_SYMBOLS")

# The projections' functions cpu_gemm.c defines in place of ref/ref_gemm.c's.
GEMM_API = [
    "ref_gemm_xpack_floats",
    "ref_matmul_run",
    "ref_panels_free",
    "ref_panels_pack",
]

# After .bazelrc's -ffp-contract=off, which it overrides for this backend's sources only.
CONTRACT = ["-ffp-contract=fast"]

# path -> compiler flags. Elsewhere than x86-64 one path, this CPU's.
# cpu/cpu_backend.c lists the same paths under the same names.
CPU_ISA_X86 = {
    "baseline": ["-march=x86-64"],
    "avx2": ["-march=x86-64-v3"],
}
CPU_ISA_OTHER = {
    "native": ["-march=native"],
}

# The reference's headers and private sources every copy compiles with.
REF_HDRS = [
    "//ref:ref_backend.h",
    "//ref:ref_gemm.h",
    "//ref:ref_kernels.h",
    "//ref:ref_kv.h",
    "//ref:ref_mixer.h",
    "//ref:ref_state.h",
    "//ref:ref_vec.h",
]

def _strict(s):
    return s.replace("ref_", "ref_strict_", 1)

def cpu_renames(path):
    """Every reference symbol NAME_cpu_PATH, and the strict projections' names too."""
    return (["-D%s=%s_cpu_%s" % (s, s, path) for s in REF_ISA_SYMBOLS] +
            ["-D%s=%s_cpu_%s" % (_strict(s), _strict(s), path) for s in GEMM_API])

def strict_renames(path):
    """ref/ref_gemm.c's projections under their strict names, the rest as cpu_renames."""
    return ["-D%s=%s_cpu_%s" % (s, _strict(s) if s in GEMM_API else s, path)
            for s in REF_ISA_SYMBOLS]

def cpu_isa_library(path, march, **kwargs):
    """The path's copy of the cpu backend and of the reference's projections it falls back on."""
    native.cc_library(
        name = "strict_gemm_" + path,
        srcs = ["//ref:ref_gemm.c"] + REF_HDRS,
        copts = march + REF_ISA_COPTS + strict_renames(path) + CONTRACT,
        deps = [
            "//device/core",
            "//device/numerics",
            "//ref:pool",
        ],
        **kwargs
    )
    native.cc_library(
        name = "cpu_" + path,
        srcs = ["//ref:" + s for s in REF_ISA_SRCS if s not in ("ref_attention.c", "ref_gemm.c")] + [
            "cpu_attention.c",
            "cpu_gemm.c",
            "cpu_pack.c",
            "cpu_layout.h",
            "cpu_strict.h",
        ] + REF_HDRS,
        # K and V kept as binary16 (ref/ref_kv.h).
        copts = march + REF_ISA_COPTS + cpu_renames(path) + CONTRACT + ["-DREF_KV_F16"],
        deps = [
            ":strict_gemm_" + path,
            "//device/core",
            "//device/numerics",
            "//ref:pool",
        ],
        **kwargs
    )
