#!/usr/bin/env bash
# kernels/gpu-check.sh OUT_DIR [BIN_DIR]: everything devio checks and measures
# on a machine with an NVIDIA GPU, in one command, in under 8 minutes.
#   BIN_DIR  binaries laid out as bazel-bin (default bazel-bin; or DIR/bin of a
#            bundle made by kernels/gpu-bundle.sh DIR when the GPU machine cannot build)
# It runs the CUDA unit tests, every conformance suite on --backend cuda
# (strict numerics, depth 2 and depth 1) against the reference's expected
# outputs (the hybrid ssm_* suites on Bamba and Mamba2 included, none may be
# skipped), logits against Hugging Face transformers + PyTorch (tiny, small
# and the 1b preset) and reference vs CUDA bit for bit on 1b and on the tiny
# and small Bamba and Mamba2 and on models with each new feature (Mistral's
# sliding window, Granite's multipliers, Qwen3's q/k norms, yarn and llama3
# RoPE scaling) and on GGUF files of every quantized weight type (made by
# tools/gguf/quantize.py, numpy only), the GPU's read bandwidth, then decode at batch
# 1/8/64, two groups at depth 1 vs 2, and a prefill on 1b. It writes OUT_DIR/gpu-check.json and OUT_DIR/gpu-check.md
# and ends with the Markdown table; exit status 0 when every check passed.
#
# kernels/gpu-check.sh --emulate OUT_DIR [BIN_DIR] runs the same check on
# cuda-emu, the backend on the SIMT emulator, with no GPU: steps that need
# hardware (compute-sanitizer, bandwidth, ncu) are skipped, the bench runs
# the tiny model and its figures say "emulated", conformance runs a few
# suites, the unit tests only cuda_fast_kernels_emu_test, the features
# only the tiny models, the GGUF weights Q8_0 and Q4_K_M and SmolLM2's fast
# numerics one decode position (the suite runs all of those on cuda-emu
# apart). The suite runs this, so the check's logic, pass criteria and
# report are tested on every commit.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
EMULATE=()
LIMIT=470
if [ "${1:-}" = "--emulate" ]; then
    EMULATE=(--emulate)
    LIMIT=620
    shift
fi
OUT=${1:?usage: kernels/gpu-check.sh [--emulate] OUT_DIR [BIN_DIR]}
case "$OUT" in /*) ;; *) OUT="$PWD/$OUT" ;; esac
BIN=${2:-$ROOT/bazel-bin}
case "$BIN" in /*) ;; *) BIN="$PWD/$BIN" ;; esac
mkdir -p "$OUT"
[ -d "$BIN/../lib" ] && export LD_LIBRARY_PATH="$(cd "$BIN/../lib" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONUNBUFFERED=1
cd "$ROOT"
# The check shares out its deadline itself; the TERM 20 s later makes it write what it has.
exec timeout -k 10 "$LIMIT" python3 kernels/gpu_check.py --bin "$BIN" --out "$OUT" \
    --deadline $((LIMIT - 20)) "${EMULATE[@]}"
