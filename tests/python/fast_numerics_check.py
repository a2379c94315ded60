#!/usr/bin/env python3
"""fast_numerics_check.py - the CUDA backend's fast numerics (--numerics fast) held to the strict
reference by tolerance: two devio-server processes on one model, the reference (strict) and a
CUDA backend in fast numerics (cuda-emu by default: the kernels and the GEMM interface run on the
CPU), fed the same tokens, their logits read back as binary32 at every position.

Usage: python3 tests/python/fast_numerics_check.py --bin bazel-bin [--model PATH|fetch | --preset small]
           [--positions 512] [--backend cuda-emu] [--gemv N] [--negative [--mutant NAME]]

A 16-token prompt, then --positions greedy decode positions, teacher-forced with the
reference's greedy token so that both servers see the same sequence. It must hold that:
- at every position ||fast - strict|| / ||strict|| <= 1e-2 (the logits within 1e-2 relative, in
  the 2-norm over the vocabulary); the largest difference over the largest magnitude is printed;
- the two argmaxes agree at >= 99% of the positions;
- every field that is not a logit (lengths, token counts, handles' shapes) is the same.
--negative runs the fast server with the emulator's broken GEMM (DEVIO_EMU_GEMM_BREAK=1, one input
column left out of every sum; with --backend cpu, DEVIO_CPU_GEMM_BREAK=1, the last 128 inputs of
every quantized projection left out) and exits 0 only when the logits' tolerance fails on it: the
control that shows the check can fail. --backend cpu holds the built-in cpu backend to the
reference (--cpu-isa picks its instruction-set path). --negative --mutant NAME runs mutant NAME's cuda-emu plugin instead
(kernels/emu/mutate.py: "combine" adds attention's ranges without bringing them to a common max).
--gemv N runs batches of up to N tokens on the GEMV of kernels/cuda_fast.h (DEVIO_CUDA_GEMV=N)
instead of the GEMM: every decode position here. Prints the figures; exit 0 when they hold,
1 when not.
"""
import argparse
import pathlib
import subprocess
import sys
import tempfile

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "clients" / "python"))
sys.path.insert(0, str(ROOT / "tests" / "bench"))
from devio_client import Client  # noqa: E402
from server_bench import fetch_smollm2, start_server, stop_server  # noqa: E402

PROMPT = 16
REL_TOL = 1e-2
AGREE = 0.99


def logits_of(c, plan_rows):
    """Step one row with logits of its last position; (result without the handle, logits)."""
    r = c.step({"rows": plan_rows})
    row = r["rows"][0]
    raw = np.frombuffer(c.logits_raw(row["logits"]), dtype="<f4").copy()
    c.release_logits(row["logits"])
    shape = dict(row)
    shape.pop("logits")
    return {"len": shape["len"], "tokens": r["tokens"]}, raw


def run(bins, model, positions, backend, backend_path, env, tmp):
    """The per-position relative error and argmax agreement of `backend` fast vs ref strict."""
    strict, sport = start_server(bins / "service/devio-server", model, tmp / "strict", 1, 2,
                                 ("--max-seq-len", str(PROMPT + positions + 8)))
    try:
        fast, fport = start_server(bins / "service/devio-server", model, tmp / "fast", 1, 2,
                                   ("--max-seq-len", str(PROMPT + positions + 8), "--backend",
                                    backend, "--backend-path", str(backend_path),
                                    "--numerics", "fast"), env)
    except BaseException:
        stop_server(strict)
        raise
    try:
        with Client("http://127.0.0.1:%d" % sport, timeout=600) as cs, \
                Client("http://127.0.0.1:%d" % fport, timeout=600) as cf:
            dev = cf.device()
            assert dev["numerics"] == "fast", dev
            vocab = cs.model()["vocab_size"]
            ss, sf = cs.create_sequence(), cf.create_sequence()
            tokens = [(31 * i + 7) % vocab for i in range(PROMPT)]
            rel, peak, agree, fields_differ = [], [], 0, 0
            for p in range(positions + 1):
                a, ls = logits_of(cs, [{"seq": ss, "tokens": tokens, "logits": "last"}])
                b, lf = logits_of(cf, [{"seq": sf, "tokens": tokens, "logits": "last"}])
                fields_differ += a != b or ls.shape != lf.shape
                diff = lf.astype(np.float64) - ls
                rel.append(float(np.linalg.norm(diff)) / (float(np.linalg.norm(ls)) or 1.0))
                peak.append(float(np.max(np.abs(diff))) / (float(np.max(np.abs(ls))) or 1.0))
                agree += int(np.argmax(ls)) == int(np.argmax(lf))
                tokens = [int(np.argmax(ls))]
            return dev, np.array(rel), np.array(peak), agree / (positions + 1), fields_differ
    finally:
        stop_server(fast)
        stop_server(strict)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default="bazel-bin")
    ap.add_argument("--model", help="a GGUF file or model directory (default: --preset); "
                    "'fetch': SmolLM2 by deploy/fetch-model.sh (exit 77 when it cannot be had)")
    ap.add_argument("--preset", default="small", help="devio-mkmodel preset without --model")
    ap.add_argument("--dtype", default="bf16", help="the preset's weight type")
    ap.add_argument("--arch", default="llama", help="the preset's architecture (devio-mkmodel --arch)")
    ap.add_argument("--positions", type=int, default=512, help="decode positions after the prompt")
    ap.add_argument("--backend", default="cuda-emu", help="the CUDA backend to hold to the reference")
    ap.add_argument("--negative", action="store_true",
                    help="the broken-GEMM control: succeed only when the check fails")
    ap.add_argument("--mutant", help="with --negative: this mutant's plugin, not the broken GEMM")
    ap.add_argument("--cpu-isa", help="with --backend cpu: its instruction-set path "
                                      "(DEVIO_CPU_ISA)")
    ap.add_argument("--gemv", type=int, help="DEVIO_CUDA_GEMV for the fast server")
    a = ap.parse_args()
    if a.mutant and not a.negative:
        ap.error("--mutant goes with --negative")
    if a.model == "fetch":
        path, why = fetch_smollm2()
        if path is None:
            print("fast_numerics_check: skipped, the model cannot be fetched: " + why)
            return 77
        a.model = str(path)
    bins = pathlib.Path(a.bin).resolve()
    backend_path = bins / "kernels" / "mutants" / a.mutant if a.mutant else bins / "kernels"
    broken = "mutant %s" % a.mutant if a.mutant else "broken GEMM"
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        for d in ("strict", "fast"):
            (tmp / d).mkdir()
        model = pathlib.Path(a.model) if a.model else tmp / a.preset
        if not a.model:
            subprocess.run([str(bins / "tools/mkmodel/devio-mkmodel"), "--preset", a.preset,
                            "--arch", a.arch, "--dtype", a.dtype, "--out", str(model)], check=True,
                           capture_output=True, timeout=300)
        brk = "DEVIO_CPU_GEMM_BREAK" if a.backend == "cpu" else "DEVIO_EMU_GEMM_BREAK"
        env = {brk: "1"} if a.negative and not a.mutant else {}
        if a.cpu_isa:
            env["DEVIO_CPU_ISA"] = a.cpu_isa
        if a.gemv is not None:
            env["DEVIO_CUDA_GEMV"] = str(a.gemv)
        dev, rel, peak, agree, differ = run(bins, model, a.positions, a.backend, backend_path,
                                            env, tmp)
    ok = rel.max() <= REL_TOL and agree >= AGREE and differ == 0
    print("fast_numerics_check: %s on %s (%s), %d positions%s%s" % (
        dev["backend"], dev["model"]["architecture"], a.model or "%s %s %s" % (a.preset, a.arch, a.dtype),
        len(rel), ", GEMV up to %d tokens" % a.gemv if a.gemv else "",
        ", %s (negative control)" % broken if a.negative else ""))
    print("  logits: relative error (2-norm) at most %.3g (median %.3g), limit %g; largest "
          "difference over largest magnitude %.3g" % (rel.max(), float(np.median(rel)), REL_TOL,
                                                     peak.max()))
    worst = np.argsort(rel)[::-1][:3]
    print("  worst positions: %s" % ", ".join("%d (%.3g)" % (PROMPT - 1 + int(p), rel[p])
                                              for p in worst))
    print("  argmax agreement %.2f%% (limit %.0f%%); non-logit fields differing: %d" % (
        100 * agree, 100 * AGREE, differ))
    if a.negative:
        # Caught by the logits' tolerance itself: over a few positions one argmax in the
        # sixties already misses 99%, which says nothing about the broken part.
        caught = rel.max() > REL_TOL
        print("  %s" % ("caught: the logits' tolerance fails on the %s" % broken if caught
                        else "NOT CAUGHT: the %s keeps the logits within tolerance" % broken))
        return 0 if caught else 1
    print("  %s" % ("ok" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
