#!/usr/bin/env bash
# Links devio-ref.wasm (wasm32-wasi, SIMD, one thread) from the sources the native devio-ref is built from.
# Must never compile a source of its own: it only drives clang over the files it is given.
#
# usage: ref/wasm/build.sh OUT.wasm FILE...
#   FILE...  the device, api and reference sources and ref/wasm/wasi_heap.c
#            (.c are compiled; .h and other files are inputs listed for Bazel
#            and otherwise ignored), relative to the current directory, which
#            must be the repository root or Bazel's execution root (includes
#            are "device/devio.h").
# jansson for wasm32-wasi comes from deploy/wasi-jansson.sh, built under
# .devio/wasi-jansson by `deploy/devio.sh setup`, or here when it is missing.
set -euo pipefail

die() { printf 'ref/wasm/build.sh: error: %s\n' "$*" >&2; exit 1; }

[ "$#" -ge 2 ] || die "usage: ref/wasm/build.sh OUT.wasm FILE..."
OUT=$1
shift

# The repository itself, not Bazel's execution root: this script is reached
# through the execution root's symlinks, the state directory is not.
SELF=$(readlink -f "${BASH_SOURCE[0]}")
ROOT=$(cd "$(dirname "$SELF")/../.." && pwd)
JANSSON="$ROOT/.devio/wasi-jansson"

if [ ! -f "$JANSSON/lib/libjansson.a" ] || [ ! -f "$JANSSON/include/jansson.h" ]; then
    printf 'ref/wasm/build.sh: jansson for wasm32-wasi not built yet; building it in %s\n' "$JANSSON" >&2
    "$ROOT/deploy/wasi-jansson.sh" "$JANSSON" ||
        die "could not build jansson for wasm32-wasi; run deploy/devio.sh setup (needs the network once) and build again"
fi

CC=""
for c in clang-14 clang; do
    if command -v "$c" >/dev/null 2>&1; then CC=$c; break; fi
done
[ -n "$CC" ] || die "clang not found; run deploy/devio.sh setup"
[ -f /usr/lib/wasm32-wasi/libc.a ] || die "wasi-libc not found; run deploy/devio.sh setup"

srcs=()
for f in "$@"; do
    case "$f" in *.c) srcs+=("$f") ;; esac
done
[ "${#srcs[@]}" -gt 0 ] || die "no .c files given"

# The numerics flags of the native build (no contraction, no fast-math) plus
# wasm SIMD; DEVIO_NO_THREADS runs every step inline on the one thread WASI
# has. The stack is placed first and sized like a native main thread, so that
# an overflow traps instead of running into static data. sbrk and calloc go
# through wasi_heap.c (see there), which must be among the files.
"$CC" --target=wasm32-wasi -std=c11 -O2 -ffp-contract=off -msimd128 \
    -D_POSIX_C_SOURCE=200809L -DDEVIO_NO_THREADS \
    -Wall -Wextra -Werror \
    -I. -I"$JANSSON/include" \
    "${srcs[@]}" "$JANSSON/lib/libjansson.a" \
    -Wl,--wrap=sbrk -Wl,--wrap=calloc -Wl,--strip-all -Wl,--stack-first -Wl,-z,stack-size=8388608 \
    -o "$OUT"
