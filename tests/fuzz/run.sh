#!/usr/bin/env bash
# run.sh - builds devio's fuzz targets (build.sh) and runs each for a bounded time from its seed corpus.
# Usage: tests/fuzz/run.sh [SECONDS_EACH [TARGET...]]   (default 30 s, every target; FUZZ_JOBS
# of them at once, default one a core)
# Fails on any crash, sanitizer report, leak, timeout or memory blow-up, leaving the input
# under .devio/fuzz/findings/; prints execs/s and total execs per target. The committed
# corpus is only read: new inputs go to a scratch folder removed afterwards.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
SECS=${1:-30}
shift || true
TARGETS=("$@")
[ "${#TARGETS[@]}" -gt 0 ] || TARGETS=(dispatch config safetensors adapter script gguf state)
OUT=$ROOT/.devio/fuzz
bash tests/fuzz/build.sh "$OUT" >/dev/null
mkdir -p "$OUT/findings"
work=$(mktemp -d "${TMPDIR:-/tmp}/devio-fuzz-run-XXXXXX")
trap 'rm -rf "$work"' EXIT
# Each fuzzer is one process on one core: as many run at once as there are cores (FUZZ_JOBS),
# each still for SECS seconds of its own, their lines printed in TARGETS' order.
fuzz_one() {
    local t=$1 rc=0
    mkdir -p "$work/$t"
    # -timeout: one input may take at most 10 s; -rss_limit_mb bounds memory;
    # -max_len lets whole seed files (the micro model's weights) be mutated.
    timeout $((SECS + 120)) "$OUT/fuzz_$t" -max_total_time="$SECS" -rss_limit_mb=2048 \
        -timeout=10 -max_len=65536 -print_final_stats=1 -dict=tests/fuzz/json.dict \
        -artifact_prefix="$OUT/findings/$t-" "$work/$t" "tests/fuzz/corpus/$t" >"$work/$t.log" 2>&1 ||
        rc=$?
    echo "$rc" >"$work/$t.rc"
}
JOBS=${FUZZ_JOBS:-$(nproc)}
running=0
for t in "${TARGETS[@]}"; do
    if [ "$running" -ge "$JOBS" ]; then
        wait -n
        running=$((running - 1))
    fi
    fuzz_one "$t" &
    running=$((running + 1))
done
wait
failed=0
total_execs=0
for t in "${TARGETS[@]}"; do
    log="$work/$t.log"
    rc=$(cat "$work/$t.rc" 2>/dev/null || echo 1)
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
    if [ "$rc" -ne 0 ]; then
        failed=1
        echo "fuzz_$t: FAILED (exit $rc); input under $OUT/findings/, log tail:"
        tail -40 "$log"
    else
        echo "fuzz_$t: ok: ${execs:-?} execs in ${SECS} s, ${rate:-?} execs/s, coverage ${cov:-?} edges"
    fi
    total_execs=$((total_execs + ${execs:-0}))
done
echo "fuzz: ${#TARGETS[@]} targets, $total_execs execs in all, $([ "$failed" -eq 0 ] && echo 'no crash' || echo 'FAILED')"
exit "$failed"
