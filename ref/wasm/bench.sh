#!/usr/bin/env bash
# Times devio-ref natively and devio-ref.wasm under Node and Wasmtime on deploy/demo.jsonl and a 64-step greedy decode.
# Must never report a time for a run whose output differs from the native one.
#
# usage: ref/wasm/bench.sh [BIN] [RUNS]   (BIN default bazel-bin, RUNS default 5)
#
# Each figure is the fastest of RUNS wall-clock runs, in milliseconds, on the
# `small` preset model. "per token" is (decode64 - decode0) / 64: the cost of
# one decode step with start-up (runtime, compilation, model load) taken out.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
BIN=${1:-bazel-bin}
RUNS=${2:-5}
case "$BIN" in /*) ;; *) BIN="$ROOT/$BIN" ;; esac
WASM="$BIN/ref/wasm/devio-ref.wasm"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/devio-wasm-bench.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
"$BIN/ref/devio-mkmodel" --preset small --out "$WORK/small" >/dev/null

# decodeN: prefill 8 tokens, then N one-token greedy steps fed back.
decode_script() {
    local n=$1 i
    echo '{"op":"create","as":"s"}'
    echo '{"op":"step","plan":{"rows":[{"seq":"$s","tokens":[1,15,27,99,3,42,7,8],"sample":{"temperature":0}}]},"as":"r0"}'
    for ((i = 1; i <= n; i++)); do
        printf '{"op":"step","plan":{"rows":[{"seq":"$s","tokens":["$r%d.rows[0].tokens[0]"],"sample":{"temperature":0}}]},"as":"r%d"}\n' $((i - 1)) "$i"
    done
    echo '{"op":"facts"}'
}
decode_script 0 >"$WORK/decode0.jsonl"
decode_script 64 >"$WORK/decode64.jsonl"
cp deploy/demo.jsonl "$WORK/demo.jsonl"

# best NAME SCRIPT CMD... : fastest of RUNS, after checking the output.
best() {
    local script=$1 b="" s e ms i
    shift
    "$@" --model "$WORK/small" "$script" >"$WORK/out" 2>/dev/null
    if ! cmp -s "$WORK/out" "$WORK/$(basename "$script").expected"; then
        echo "output differs"
        return
    fi
    for ((i = 0; i < RUNS; i++)); do
        s=$(date +%s%N)
        "$@" --model "$WORK/small" "$script" >/dev/null 2>&1
        e=$(date +%s%N)
        ms=$(((e - s) / 1000000))
        if [ -z "$b" ] || [ "$ms" -lt "$b" ]; then b=$ms; fi
    done
    echo "$b"
}

declare -A T
runtimes=(native native-t1 node wasmtime)
cmd_of() {
    case "$1" in
        native) echo "$BIN/ref/devio-ref" ;;
        native-t1) echo "$BIN/ref/devio-ref --threads 1" ;;
        node) echo "node --no-warnings $ROOT/ref/wasm/run-node.mjs $WASM" ;;
        wasmtime) echo "python3 $ROOT/ref/wasm/run-wasmtime.py $WASM" ;;
    esac
}
for sc in demo decode0 decode64; do
    "$BIN/ref/devio-ref" --model "$WORK/small" "$WORK/$sc.jsonl" >"$WORK/$sc.jsonl.expected"
    for r in "${runtimes[@]}"; do
        # shellcheck disable=SC2046
        T[$r.$sc]=$(best "$WORK/$sc.jsonl" $(cmd_of "$r"))
    done
done

printf '%-10s %10s %10s %10s %12s\n' runtime demo decode0 decode64 "per token"
for r in "${runtimes[@]}"; do
    per="-"
    if [[ "${T[$r.decode64]}" =~ ^[0-9]+$ && "${T[$r.decode0]}" =~ ^[0-9]+$ ]]; then
        per=$(awk -v a="${T[$r.decode64]}" -v b="${T[$r.decode0]}" 'BEGIN { printf "%.2f", (a - b) / 64 }')
    fi
    printf '%-10s %10s %10s %10s %12s\n' "$r" "${T[$r.demo]}" "${T[$r.decode0]}" "${T[$r.decode64]}" "$per"
done
echo "(milliseconds, fastest of $RUNS runs, small preset; per token = (decode64 - decode0) / 64)"
