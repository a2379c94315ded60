#!/usr/bin/env python3
"""mutate.py - the mutants of the negative control (tests/python/emu_mutants_check.py):
copies of the CUDA kernels with one deliberate defect each, which the emulated
target must catch by a differing byte or a report.

    mutate.py NAME OUT_DIR kernels/cuda_kernels.cu kernels/cuda_ssm.cu kernels/cuda_fast.cu
              kernels/cuda_warp.cuh

writes OUT_DIR/cuda_kernels.cu, cuda_ssm.cu, cuda_fast.cu and cuda_warp.cuh, the
.cu files including the copy of cuda_warp.cuh beside them, with mutation NAME applied
(each must match its text exactly once, so that a mutant never silently
equals the original). Mutations:
  fold       the lane fold's tree in the other order (w = 1, 2, .., 16)
  barrier    k_rope_store's __syncthreads removed (RoPE and the K store race)
  offbyone   rmsnorm's sum of squares runs to i <= d (one element past the
             row: shared memory that no thread wrote)
  fma        the projections' multiply and add fused into one rounding
  combine    fast numerics' attention adds its ranges without bringing them to
             their common max (strict numerics never run it: the fast
             tolerance check, tests/python/fast_numerics_check.py, catches it)
"""
import os
import sys

MUTATIONS = {
    "fold": ("cuda_warp.cuh", "    for (int w = 16; w >= 1; w >>= 1)\n        v = DEVIO_ADD",
             "    for (int w = 1; w <= 16; w <<= 1)\n        v = DEVIO_ADD"),
    "barrier": ("cuda_kernels.cu", "    __syncthreads();\n    const uint32_t *bt",
                "    const uint32_t *bt"),
    "offbyone": ("cuda_kernels.cu",
                 "i < d; i += 32)\n            p = DEVIO_ADD(p, DEVIO_MUL(sm[i]",
                 "i <= d; i += 32)\n            p = DEVIO_ADD(p, DEVIO_MUL(sm[i]"),
    "fma": ("cuda_kernels.cu", "acc[tt] = DEVIO_ADD(acc[tt], DEVIO_MUL(w[u], xv[u]));",
            "acc[tt] = __fmaf_rn(w[u], xv[u], acc[tt]);"),
    "combine": ("cuda_fast.cu", "o = o + rng[2 + c] * devio_expf(rng[0] - M);",
                "o = o + rng[2 + c];"),
}


def main():
    name, out, sources = sys.argv[1], sys.argv[2], sys.argv[3:]
    if name not in MUTATIONS:
        sys.exit("mutate.py: no mutation %r (%s)" % (name, ", ".join(MUTATIONS)))
    target, old, new = MUTATIONS[name]
    os.makedirs(out, exist_ok=True)
    done = False
    for src in sources:
        text = open(src).read().replace('#include "kernels/cuda_warp.cuh"',
                                        '#include "cuda_warp.cuh"')
        if os.path.basename(src) == target:
            if text.count(old) != 1:
                sys.exit("mutate.py: %s: the text of mutation %s is found %d times, not once"
                         % (src, name, text.count(old)))
            text = text.replace(old, new)
            done = True
        with open(os.path.join(out, os.path.basename(src)), "w") as f:
            f.write(text)
    if not done:
        sys.exit("mutate.py: %s is not among the sources" % target)


if __name__ == "__main__":
    main()
