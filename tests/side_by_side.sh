#!/usr/bin/env bash
# side_by_side.sh - runs checks at once, for tests/checks.txt lines whose commands each keep one
# core busy (one emulator or one reference process at a time): on the suite's two cores two such
# checks take about as long as the longer one.
# Usage: bash tests/side_by_side.sh 'COMMAND' 'COMMAND' ...
# Each command runs with bash from the repository root with no standard input, its output kept
# apart and printed whole, in the order given, once all have ended, each under a line naming it.
# Exit status: 1 when any command failed (a status other than 0 and 77), 77 when every one was
# skipped (77), else 0; the last line says how many of each.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
[ "$#" -gt 0 ] || { echo "usage: bash tests/side_by_side.sh 'COMMAND' ..." >&2; exit 2; }
work=$(mktemp -d "${TMPDIR:-/tmp}/devio-side-by-side-XXXXXX")
trap 'rm -rf "$work"' EXIT
pids=()
for i in $(seq 1 "$#"); do
    bash -c "${!i}" </dev/null >"$work/$i.out" 2>&1 &
    pids+=($!)
done
ok=0 skipped=0 failed=0
for i in $(seq 1 "$#"); do
    rc=0
    wait "${pids[$((i - 1))]}" || rc=$?
    echo "side_by_side: $ ${!i}   (exit $rc)"
    cat "$work/$i.out"
    case "$rc" in
        0) ok=$((ok + 1)) ;;
        77) skipped=$((skipped + 1)) ;;
        *) failed=$((failed + 1)) ;;
    esac
done
echo "side_by_side: $ok ok, $skipped skipped, $failed failed"
[ "$failed" -eq 0 ] || exit 1
[ "$ok" -gt 0 ] || exit 77
exit 0
