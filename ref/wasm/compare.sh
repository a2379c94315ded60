#!/usr/bin/env bash
# Runs conformance scripts on native devio-ref (default threads, 1, 2) and on devio-ref.wasm under Node and Wasmtime.
# Must never pass unless every run's output, error text and exit status are byte-identical to the native run's.
#
# usage: ref/wasm/compare.sh [BIN]    (BIN: Bazel's output tree, default bazel-bin)
#
# Needs BIN/ref/devio-ref, BIN/tools/mkmodel/devio-mkmodel, BIN/ref/wasm/devio-ref.wasm
# and BIN/ref/wasm/heap_test.wasm (bazel build //ref/... makes them), node,
# and python3 with the wasmtime package (tests/requirements.txt). Models and
# scripts are generated in a temporary directory and removed afterwards.
# Prints the first differing line of the first mismatch; the last line is
# "N passed, M failed".
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
BIN=${1:-bazel-bin}
case "$BIN" in /*) ;; *) BIN="$ROOT/$BIN" ;; esac

NATIVE="$BIN/ref/devio-ref"
MKMODEL="$BIN/tools/mkmodel/devio-mkmodel"
WASM="$BIN/ref/wasm/devio-ref.wasm"
HEAP_TEST="$BIN/ref/wasm/heap_test.wasm"
RUN_NODE=(node --no-warnings "$ROOT/ref/wasm/run-node.mjs")
RUN_WASMTIME=(python3 "$ROOT/ref/wasm/run-wasmtime.py")

die() { printf 'compare: error: %s\n' "$*" >&2; echo "0 passed, 1 failed"; exit 1; }
for f in "$NATIVE" "$MKMODEL" "$WASM" "$HEAP_TEST"; do
    [ -f "$f" ] || die "$f not found (bazel build //ref/... first)"
done
command -v node >/dev/null 2>&1 || die "node not found (deploy/devio.sh setup)"
python3 -c 'import wasmtime' 2>/dev/null || die "python3 has no wasmtime package (deploy/devio.sh setup)"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/devio-wasm-compare.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

passed=0
failed=0

# ---- inputs ------------------------------------------------------------------
"$MKMODEL" --preset tiny --out "$WORK/tiny" >/dev/null
"$MKMODEL" --preset small --out "$WORK/small" >/dev/null

cp deploy/demo.jsonl "$WORK/demo.jsonl"

# Logits of every position ("all") and full values, batches of two
# sequences, seeded sampling with top-k, top-p and min-p, effects.
cat >"$WORK/logits.jsonl" <<'EOF'
{"op":"create","as":"a"}
{"op":"create","as":"b"}
{"op":"step","plan":{"rows":[{"seq":"$a","tokens":[1,15,27,99,3,42,7,8],"logits":"all"},{"seq":"$b","tokens":[1,5,9],"logits":"last","sample":{"temperature":0.8,"top_k":40,"top_p":0.9,"seed":7}}]},"as":"p"}
{"op":"step","plan":{"rows":[{"seq":"$a","tokens":[11],"logits":"last","sample":{"temperature":1.0,"min_p":0.05,"seed":3}}]},"full":true,"as":"q"}
{"op":"apply","effect":{"kind":"sample","logits":"$p.rows[0].logits","row":3,"params":{"temperature":0.7,"seed":11}}}
{"op":"apply","effect":{"kind":"fork","seq":"$a"},"as":"f"}
{"op":"step","plan":{"rows":[{"seq":"$f","tokens":[2,3],"logits":"all"},{"seq":"$b","tokens":["$p.rows[1].tokens[0]"],"logits":"last"}]},"full":true}
{"op":"apply","effect":{"kind":"truncate","seq":"$a","len":4}}
{"op":"step","plan":{"rows":[{"seq":"$a","tokens":[5,6,7],"logits":"all","sample":{"temperature":0}}]}}
{"op":"apply","effect":{"kind":"release","logits":"$p.rows[0].logits"}}
{"op":"apply","effect":{"kind":"free","seq":"$f"}}
{"op":"facts"}
EOF

# Greedy decoding fed back step by step, then sampled decoding.
{
    echo '{"op":"create","as":"s"}'
    echo '{"op":"step","plan":{"rows":[{"seq":"$s","tokens":[1,15,27,99,3,42,7,8],"sample":{"temperature":0}}]},"as":"r0"}'
    for i in $(seq 1 24); do
        printf '{"op":"step","plan":{"rows":[{"seq":"$s","tokens":["$r%d.rows[0].tokens[0]"],"sample":{"temperature":0}}]},"as":"r%d"}\n' $((i - 1)) "$i"
    done
    for i in $(seq 25 32); do
        printf '{"op":"step","plan":{"rows":[{"seq":"$s","tokens":["$r%d.rows[0].tokens[0]"],"logits":"last","sample":{"temperature":0.9,"top_p":0.95,"seed":%d}}]},"as":"r%d"}\n' $((i - 1)) "$i" "$i"
    done
    echo '{"op":"facts"}'
} >"$WORK/decode.jsonl"

# A script that stops on an error: the message and the exit status must
# match as well as the lines before it.
cat >"$WORK/error.jsonl" <<'EOF'
{"op":"create","as":"s"}
{"op":"step","plan":{"rows":[{"seq":"$s","tokens":[1,2,3],"logits":"last"}]},"full":true}
{"op":"step","plan":{"rows":[{"seq":"$s","tokens":[]}]}}
{"op":"nosuchop"}
EOF

# ---- comparison ----------------------------------------------------------------
# Prints where two files first differ: line number, column and the text
# around it on both sides (lines of full logits run to megabytes).
show_diff() {
    local a=$1 b=$2 la lb line byte start col from
    read -r byte line < <(cmp "$a" "$b" 2>/dev/null | sed -n 's/.*differ: byte \([0-9]*\), line \([0-9]*\).*/\1 \2/p') || true
    if [ -z "${line:-}" ]; then
        # One is a prefix of the other.
        printf '    %s: %s lines, %s: %s lines\n' "$(basename "$a")" "$(wc -l <"$a")" \
            "$(basename "$b")" "$(wc -l <"$b")"
        return
    fi
    start=$(head -n $((line - 1)) "$a" | wc -c)
    col=$((byte - start))
    from=$((col > 120 ? col - 120 : 1))
    la=$(sed -n "${line}p" "$a" | cut -c"${from}-$((col + 120))")
    lb=$(sed -n "${line}p" "$b" | cut -c"${from}-$((col + 120))")
    printf '    first difference: line %s, column %s\n' "$line" "$col"
    printf '    %-10s %s\n' "native:" "$la" "$(basename "$b" .out):" "$lb"
}

# run NAME CMD... : standard input from $STDIN, stdout to NAME.out, stderr
# to NAME.err, exit status to NAME.rc.
STDIN=/dev/null
run() {
    local name=$1 rc=0
    shift
    "$@" >"$WORK/$name.out" 2>"$WORK/$name.err" <"$STDIN" || rc=$?
    echo "$rc" >"$WORK/$name.rc"
}

# compare_case MODEL SCRIPT [STDIN]: one script on one model under every
# runtime, each against native.
compare_case() {
    local model=$1 script=$2 tag r ok=1
    STDIN=${3:-/dev/null}
    tag="$(basename "$model")-$(basename "$script" .jsonl)"
    [ "$script" != - ] || tag="$(basename "$model")-stdin"
    # The five runs are separate processes reading the same inputs: the two runtimes (one
    # thread each, the longest) side by side, then the native ones.
    local pids=()
    run "$tag.node" "${RUN_NODE[@]}" "$WASM" --model "$model" "$script" &
    pids+=($!)
    run "$tag.wasmtime" "${RUN_WASMTIME[@]}" "$WASM" --model "$model" "$script" &
    pids+=($!)
    wait "${pids[@]}"
    run "$tag.native" "$NATIVE" --model "$model" "$script"
    run "$tag.threads1" "$NATIVE" --threads 1 --model "$model" "$script"
    run "$tag.threads2" "$NATIVE" --threads 2 --model "$model" "$script"
    if [ ! -s "$WORK/$tag.native.out" ] && [ ! -s "$WORK/$tag.native.err" ]; then
        printf 'FAIL %s: native printed nothing, so there is nothing to compare\n' "$tag"
        failed=$((failed + 1))
        return
    fi
    for r in threads1 threads2 node wasmtime; do
        if ! cmp -s "$WORK/$tag.native.out" "$WORK/$tag.$r.out"; then
            printf 'FAIL %s: %s output differs from native\n' "$tag" "$r"
            show_diff "$WORK/$tag.native.out" "$WORK/$tag.$r.out"
            ok=0
        elif ! cmp -s "$WORK/$tag.native.err" "$WORK/$tag.$r.err"; then
            printf 'FAIL %s: %s error output differs from native\n' "$tag" "$r"
            printf '    native: %s\n    %s: %s\n' "$(head -c 300 "$WORK/$tag.native.err")" "$r" \
                "$(head -c 300 "$WORK/$tag.$r.err")"
            ok=0
        elif ! cmp -s "$WORK/$tag.native.rc" "$WORK/$tag.$r.rc"; then
            printf 'FAIL %s: %s exit status %s, native %s\n' "$tag" "$r" "$(cat "$WORK/$tag.$r.rc")" \
                "$(cat "$WORK/$tag.native.rc")"
            ok=0
        fi
        [ "$ok" -eq 1 ] || break
    done
    if [ "$ok" -eq 1 ]; then
        printf 'ok   %s: %s lines, %s bytes, exit %s, identical on native (threads default, 1, 2), node, wasmtime\n' \
            "$tag" "$(wc -l <"$WORK/$tag.native.out")" "$(wc -c <"$WORK/$tag.native.out")" \
            "$(cat "$WORK/$tag.native.rc")"
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
    fi
}

# The heap shim's own check, under both runtimes: the longest runs here (tens of seconds under
# Wasmtime), so they start first, in the background, and are judged at the end.
for r in node wasmtime; do
    if [ "$r" = node ]; then cmd=("${RUN_NODE[@]}"); else cmd=("${RUN_WASMTIME[@]}"); fi
    { rc=0; "${cmd[@]}" "$HEAP_TEST" >"$WORK/heap_test.$r.out" 2>&1 </dev/null || rc=$?
      echo "$rc" >"$WORK/heap_test.$r.rc"; } &
    eval "heap_$r=\$!"
done
heap_tests() {
    local r out
    for r in node wasmtime; do
        eval "wait \$heap_$r" || true
        out=$(cat "$WORK/heap_test.$r.out")
        if [ "$(cat "$WORK/heap_test.$r.rc" 2>/dev/null)" = 0 ]; then
            printf 'ok   heap_test (%s): %s\n' "$r" "$out"
            passed=$((passed + 1))
        else
            printf 'FAIL heap_test (%s): %s\n' "$r" "$out"
            failed=$((failed + 1))
        fi
    done
}

for model in "$WORK/tiny" "$WORK/small"; do
    for script in demo logits decode error; do
        compare_case "$model" "$WORK/$script.jsonl"
    done
done
# Output into a pipe that fills up before its reader starts (1.6 MB of full
# logits): a runtime that loses writes on a full pipe fails here.
piped_case() {
    local r=$1 tag=small-logits rc=0
    shift
    set +e
    "$@" "$WASM" --model "$WORK/small" "$WORK/logits.jsonl" 2>"$WORK/$tag.$r.piped.err" </dev/null |
        { sleep 1; cat >"$WORK/$tag.$r.piped.out"; }
    rc=${PIPESTATUS[0]}
    set -e
    if cmp -s "$WORK/$tag.native.out" "$WORK/$tag.$r.piped.out" && [ "$rc" -eq 0 ]; then
        printf 'ok   %s through a pipe (%s): identical to native\n' "$tag" "$r"
        passed=$((passed + 1))
    else
        printf 'FAIL %s through a pipe (%s): exit %s, %s bytes of %s, %s\n' "$tag" "$r" "$rc" \
            "$(wc -c <"$WORK/$tag.$r.piped.out")" "$(wc -c <"$WORK/$tag.native.out")" \
            "$(head -c 200 "$WORK/$tag.$r.piped.err")"
        failed=$((failed + 1))
    fi
}
piped_case node "${RUN_NODE[@]}"
piped_case wasmtime "${RUN_WASMTIME[@]}"

# The script from standard input and a model directory that is not there.
compare_case "$WORK/tiny" - "$WORK/logits.jsonl"
compare_case "$WORK/missing-model" "$WORK/demo.jsonl"
heap_tests

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
