#!/usr/bin/env bash
# run_asan.sh - the end-to-end tests against binaries built with --config=asan (AddressSanitizer + UBSan).
# Usage: tests/e2e/run_asan.sh [PYTEST ARGS...]
# (default: every file in tests/e2e but test_image.py, which packs the normal build's
# binaries into a container image: gcc's sanitizer runtimes are not in it)
# Each binary writes any sanitizer report to a log file in a scratch folder; the run
# fails when pytest fails or when any report was written, even by a process a test
# did not check the exit status of. Leak reports count (LSan at exit).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
bazel build --config=asan //service:devio-server //tools/mkmodel:devio-mkmodel //ref:devio-ref \
    //conform:devio-conform //tests/bench:devio-bench //kernels:libdevio-backend-cuda-emu.so
BIN=$(bazel info --config=asan bazel-bin 2>/dev/null)
logs=$(mktemp -d "${TMPDIR:-/tmp}/devio-asan-XXXXXX")
trap 'rm -rf "$logs"' EXIT
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:log_path=$logs/asan"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=$logs/ubsan"
args=("$@")
[ "${#args[@]}" -gt 0 ] || args=(tests/e2e --ignore=tests/e2e/test_image.py)
rc=0
python3 -m pytest -q -p no:cacheprovider "${args[@]}" --bin "$BIN" || rc=$?
reports=$(find "$logs" -type f | wc -l)
if [ "$reports" -ne 0 ]; then
    echo "run_asan: $reports sanitizer report(s):"
    for f in "$logs"/*; do echo "== $f"; head -60 "$f"; done
    rc=1
fi
echo "run_asan: pytest exit $rc, $reports sanitizer reports"
exit "$rc"
