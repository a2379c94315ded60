#!/usr/bin/env bash
# build.sh - builds devio's libFuzzer targets with Debian's clang (ASan + UBSan + libFuzzer).
# Usage: tests/fuzz/build.sh [OUT]   (default OUT: .devio/fuzz under the repository root)
# The sources under test are compiled with coverage instrumentation straight from
# the tree (not through Bazel, whose C toolchain is gcc); objects are reused
# while no source, header or flag changed. Prints the targets' paths.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
OUT=${1:-$ROOT/.devio/fuzz}
CC=${FUZZ_CC:-clang}
command -v "$CC" >/dev/null || { echo "build.sh: $CC not found (deploy/devio.sh setup installs clang)" >&2; exit 1; }

TARGETS=(dispatch config safetensors adapter script gguf state)
# The reference backend as its plain (baseline) path: no ref_isa.c, so the
# symbols keep their own names (as in the WASI build).
LIB_SRCS=(common/*.c device/*.c device/*/*.c api/*.c
          ref/ref_attention.c ref/ref_backend.c ref/ref_gemm.c ref/ref_kernels.c ref/ref_mixer.c ref/ref_step.c
          ref/pool.c conform/inproc.c conform/script.c
          tools/mkmodel/mkadapter.c tools/mkmodel/mkfamily.c tools/mkmodel/mkmodel.c
          tools/mkmodel/mkssm.c tools/mkmodel/mkwrite.c
          tests/fuzz/fuzz_common.c)
# Numerics flags as in .bazelrc: never -ffast-math, contraction off.
CFLAGS=(-std=c11 -O1 -g -fno-omit-frame-pointer -ffp-contract=off -D_POSIX_C_SOURCE=200809L
        -I. -Wall -Wextra -Wno-unused-parameter -Wno-psabi
        -fsanitize=address,undefined -fno-sanitize-recover=all)
LIBS=(-ljansson -lm -lpthread -ldl)

mkdir -p "$OUT/obj"
stamp=$( { printf '%s\n' "$CC" "${CFLAGS[*]}"; "$CC" --version | head -1;
           cat "${LIB_SRCS[@]}" tests/fuzz/*.c tests/fuzz/*.h common/*.h device/*.h device/*/*.h api/*.h \
               conform/*.h ref/*.h tools/mkmodel/*.h; } | sha256sum | cut -c1-16)
if [ "$(cat "$OUT/stamp" 2>/dev/null)" != "$stamp" ]; then
    rm -f "$OUT"/obj/*.o
    pids=()
    for src in "${LIB_SRCS[@]}"; do
        "$CC" "${CFLAGS[@]}" -fsanitize=fuzzer-no-link -c "$src" \
            -o "$OUT/obj/$(echo "$src" | tr / _).o" &
        pids+=($!)
        while [ "$(jobs -rp | wc -l)" -ge "$(nproc)" ]; do sleep 0.2; done
    done
    failed=0
    for p in "${pids[@]}"; do wait "$p" || failed=1; done
    [ "$failed" -eq 0 ] || { echo "build.sh: compiling failed" >&2; exit 1; }
    for t in "${TARGETS[@]}"; do
        "$CC" "${CFLAGS[@]}" -Werror -fsanitize=fuzzer "tests/fuzz/fuzz_$t.c" "$OUT"/obj/*.o \
            "${LIBS[@]}" -o "$OUT/fuzz_$t"
    done
    echo "$stamp" >"$OUT/stamp"
fi
for t in "${TARGETS[@]}"; do
    echo "$OUT/fuzz_$t"
done
