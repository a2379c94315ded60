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
    //conform:devio-conform //tests/bench:devio-bench //kernels:libdevio-backend-cuda-emu.so \
    //tests/backend:libdevio-backend-stream.so
BIN=$(bazel info --config=asan bazel-bin 2>/dev/null)
logs=$(mktemp -d "${TMPDIR:-/tmp}/devio-asan-XXXXXX")
trap 'rm -rf "$logs"' EXIT
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:log_path=$logs/asan"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=$logs/ubsan"
args=("$@")
# test_openai_cluster.py drives four SmolLM2 servers through the Python example for 460 s
# under the sanitizers; the C paths it reaches (state export and import, events, fork and
# truncate) are the ones test_state_routes.py, test_events.py and test_openai_example.py run
# here. Run it alone with: bash tests/e2e/run_asan.sh tests/e2e/test_openai_cluster.py
[ "${#args[@]}" -gt 0 ] || args=(tests/e2e --ignore=tests/e2e/test_image.py
                                 --ignore=tests/e2e/test_openai_cluster.py)
rc=0
python3 -m pytest -q -p no:cacheprovider -rf "${args[@]}" --bin "$BIN" 2>&1 | tee "$logs/pytest.out" ||
    rc=$?
prc=$rc
reports=$(find "$logs" -type f \( -name 'asan.*' -o -name 'ubsan.*' \) | wc -l)
if [ "$reports" -ne 0 ]; then
    # The first few in full, then the rest by their first line and frame.
    echo "run_asan: $reports sanitizer report(s):"
    n=0
    for f in $(find "$logs" -type f \( -name 'asan.*' -o -name 'ubsan.*' \) | sort); do
        n=$((n + 1))
        if [ "$n" -le 3 ]; then
            echo "== $f"; head -60 "$f"
        else
            echo "== $f: $(grep -m1 -E 'ERROR|runtime error' "$f") $(grep -m1 -E '#[1-9] .* in [a-z_]' "$f")"
        fi
    done
    rc=1
fi
# Last, where the tail of the output shows them: the tests that failed.
grep -E '^FAILED ' "$logs/pytest.out" || true
echo "run_asan: pytest exit $prc, $reports sanitizer reports"
exit "$rc"
