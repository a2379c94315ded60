#!/usr/bin/env bash
# Times devio-ref natively and devio-ref.wasm under Node and Wasmtime on deploy/demo.jsonl and a 64-step greedy decode.
# Must never report a time for a run whose output differs from the native one.
#
# usage: ref/wasm/bench.sh [BIN] [RUNS]   (BIN default bazel-bin, RUNS default 5)
#
# Each figure is the least of RUNS runs, in milliseconds, on the `small`
# preset model: wall-clock time and CPU time (user + system, all threads; on
# a busy machine the steadier of the two). "per token" is
# (decode64 - decode0) / 64: the cost of one decode step with start-up
# (runtime, compilation, model load) taken out.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
BIN=${1:-bazel-bin}
RUNS=${2:-5}
case "$BIN" in /*) ;; *) BIN="$ROOT/$BIN" ;; esac
WASM="$BIN/ref/wasm/devio-ref.wasm"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/devio-wasm-bench.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
"$BIN/tools/mkmodel/devio-mkmodel" --preset small --out "$WORK/small" >/dev/null

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

# best SCRIPT CMD... : "WALL CPU", each the least of RUNS runs in ms (CPU:
# user + system of the process and its threads), after checking the output.
best() {
    local script=$1
    shift
    "$@" --model "$WORK/small" "$script" >"$WORK/out" 2>/dev/null
    if ! cmp -s "$WORK/out" "$WORK/$(basename "$script").expected"; then
        echo "differs differs"
        return
    fi
    python3 - "$RUNS" "$@" --model "$WORK/small" "$script" <<'PY'
import os, resource, subprocess, sys, time
runs, cmd = int(sys.argv[1]), sys.argv[2:]
wall = cpu = None
for _ in range(runs):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.monotonic()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    w = (time.monotonic() - t) * 1000
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    c = ((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)) * 1000
    wall = w if wall is None else min(wall, w)
    cpu = c if cpu is None else min(cpu, c)
print(f"{wall:.0f} {cpu:.0f}")
PY
}

declare -A W C
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
        read -r W[$r.$sc] C[$r.$sc] < <(best "$WORK/$sc.jsonl" $(cmd_of "$r"))
    done
done

per_token() {
    if [[ "$1" =~ ^[0-9]+$ && "$2" =~ ^[0-9]+$ ]]; then
        awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", (a - b) / 64 }'
    else
        echo "-"
    fi
}
printf '%-10s %16s %16s %16s %16s\n' "" demo decode0 decode64 "per token"
printf '%-10s %16s %16s %16s %16s\n' runtime "wall/cpu" "wall/cpu" "wall/cpu" "wall/cpu"
for r in "${runtimes[@]}"; do
    printf '%-10s %16s %16s %16s %16s\n' "$r" "${W[$r.demo]}/${C[$r.demo]}" \
        "${W[$r.decode0]}/${C[$r.decode0]}" "${W[$r.decode64]}/${C[$r.decode64]}" \
        "$(per_token "${W[$r.decode64]}" "${W[$r.decode0]}")/$(per_token "${C[$r.decode64]}" "${C[$r.decode0]}")"
done
echo "(milliseconds, least of $RUNS runs, small preset; cpu = user + system time;"
echo " per token = (decode64 - decode0) / 64, the cost of one decode step without start-up)"
