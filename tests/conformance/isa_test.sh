#!/usr/bin/env bash
# isa_test.sh - //tests:conformance_isa_test: every conformance suite on every instruction-set path
# of the reference backend that this CPU runs, through run.py --isa. Runs in Bazel's runfiles tree.
set -euo pipefail
exec python3 tests/conformance/run.py --bin . --isa --only isa-
