#!/usr/bin/env python3
"""gpu_check_emulate_check.py - the GPU check's own logic, on every commit, with no GPU:
kernels/gpu-check.sh --emulate runs the whole check on cuda-emu (kernels/emu/).

1. A whole run passes: exit status 0, a report (JSON and Markdown) that says it is
   emulated, every step ok or skipped (only those that need hardware are skipped), the
   bench's figures labelled as the emulator's, never as a GPU's.
2. Killed half way (SIGTERM once two steps are written), it keeps what it did: the
   report holds those steps and says it was interrupted.

    python3 tests/python/gpu_check_emulate_check.py [--bin bazel-bin]

Ends with "N passed, M failed". Bounded: the check's own deadline, and 900 s here.
"""
import argparse
import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHECK = os.path.join(ROOT, "kernels", "gpu-check.sh")
HARDWARE = ("compute-sanitizer", "bandwidth", "ncu", "transformers", "GEMM rate", "PyTorch")


def report(out):
    with open(os.path.join(out, "gpu-check.json")) as f:
        return json.load(f)


def whole(bin_dir, out):
    p = subprocess.run(["bash", CHECK, "--emulate", out, bin_dir], capture_output=True,
                       text=True, timeout=900)
    r = report(out)
    problems = []
    if p.returncode != 0:
        problems.append("exit status %d: %s" % (p.returncode, p.stdout[-1500:]))
    if not r["env"].get("emulated") or "emulator" not in r["env"].get("gpu", ""):
        problems.append("the report does not say it is emulated: %r" % r["env"])
    ok = [s for s in r["steps"] if s["status"] == "ok"]
    for s in r["steps"]:
        if s["status"] == "skipped" and not any(h in s["name"] for h in HARDWARE):
            problems.append("skipped without needing hardware: %s" % s["name"])
        if s["status"] == "FAIL":
            problems.append("FAIL %s: %s" % (s["name"], s.get("error") or s.get("log")))
        if "bench" in s["name"] and s["status"] == "ok":
            figs = [k for k in s if k.endswith("_tok_s")]
            if not figs or not all(k.startswith("emulated_") for k in figs):
                problems.append("bench figures not labelled emulated: %r" % figs)
    if len(ok) < 6:
        problems.append("only %d steps ran" % len(ok))
    if "emulator" not in open(os.path.join(out, "gpu-check.md")).read():
        problems.append("the Markdown report does not say emulator")
    return problems, "%d steps, %d ok" % (len(r["steps"]), len(ok))


def killed(bin_dir, out):
    p = subprocess.Popen(["bash", CHECK, "--emulate", out, bin_dir], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
    path, deadline, n = os.path.join(out, "gpu-check.json"), time.time() + 600, 0
    try:
        while time.time() < deadline and p.poll() is None:
            try:
                n = len(report(out)["steps"])
            except (OSError, ValueError):
                n = 0
            if n >= 2:
                break
            time.sleep(0.5)
        if p.poll() is not None:
            return ["the check ended before it could be killed (exit %d)" % p.returncode], ""
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    r = report(out)
    problems = []
    if len(r["steps"]) < n:
        problems.append("the report lost steps: %d after the kill, %d before" % (len(r["steps"]), n))
    if "interrupted" not in r["env"]:
        problems.append("the report does not say it was interrupted: %r" % r["env"])
    if "Interrupted" not in open(os.path.join(out, "gpu-check.md")).read() or not os.path.exists(path):
        problems.append("the Markdown report does not say it was interrupted")
    if p.returncode == 0:
        problems.append("a killed check exited 0")
    return problems, "%d steps kept, %s" % (len(r["steps"]), r["env"].get("interrupted"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="bazel-bin")
    b = os.path.abspath(ap.parse_args().bin)
    passed = failed = 0
    with tempfile.TemporaryDirectory() as tmp, \
            concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        # Side by side: the emulator is one thread, so the two runs take the suite's two cores.
        runs = [(name, pool.submit(fn, b, os.path.join(tmp, name.replace(" ", "-"))))
                for name, fn in (("killed half way", killed), ("a whole run", whole))]
        for name, run in runs:
            problems, what = run.result()
            if problems:
                failed += 1
                print("FAIL %s: %s" % (name, "; ".join(problems)))
            else:
                passed += 1
                print("ok   %s: %s" % (name, what))
    print("%d passed, %d failed" % (passed, failed))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
