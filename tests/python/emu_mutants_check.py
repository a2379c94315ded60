#!/usr/bin/env python3
"""emu_mutants_check.py - the negative control of the emulated CUDA target:
proof that cuda-emu can fail.

Each mutant of kernels/emu/mutate.py (the lane fold in the other order, a
__syncthreads removed, an index off by one, one fused multiply-add) is a
cuda-emu plugin under bazel-bin/kernels/mutants/NAME/. Each runs conformance
scripts on a tiny Llama and a tiny Bamba, once with the emulator's threads
in order and once reversed (DEVIO_EMU_ORDER=reverse: a missing barrier shows
in one schedule or the other), and must be caught in at least one: output
that differs from the reference's by a byte, or a devio-emu report. The
unmutated plugin, run the same way, must give the reference's bytes in both
schedules and report nothing (the positive control).

    python3 tests/python/emu_mutants_check.py --bin bazel-bin

Prints one line per plugin and "N passed, M failed"; exit status 1 on a
failure. Bounded: 2 models x 2 scripts x 2 schedules per plugin; a mutant stops at its
first catch.
"""
import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MUTANTS = ("fold", "barrier", "offbyone", "fma")
CASES = (  # model args (tests/conformance/models.txt), scripts
    (["--preset", "tiny", "--seed", "11"], ("chunks.jsonl", "batch.jsonl")),
    (["--preset", "tiny", "--arch", "bamba", "--seed", "21"], ("ssm_chunks.jsonl",)),
)


def run(cmd, env=None):
    return subprocess.run(cmd, capture_output=True, timeout=300, env=env)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    a = ap.parse_args()
    b = os.path.abspath(a.bin)
    ref = os.path.join(b, "ref", "devio-ref")
    plugins = {"none": os.path.join(b, "kernels")}
    plugins.update({m: os.path.join(b, "kernels", "mutants", m) for m in MUTANTS})
    passed = failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        work = []  # (model, script, kv blocks, the reference's output)
        for i, (margs, scripts) in enumerate(CASES):
            model = os.path.join(tmp, "m%d" % i)
            subprocess.run([os.path.join(b, "tools", "mkmodel", "devio-mkmodel")] + margs +
                           ["--out", model], check=True, stdout=subprocess.DEVNULL, timeout=120)
            facts = os.path.join(tmp, "facts.jsonl")
            open(facts, "w").write('{"op":"facts"}\n')
            out = run([ref, "--model", model, facts]).stdout.decode().splitlines()
            kv = str(json.loads(out[0])["result"]["kv"]["blocks_total"])
            for s in scripts:
                path = os.path.join(ROOT, "tests", "conformance", s)
                want = run([ref, "--model", model, path])
                assert want.returncode == 0, want.stderr
                work.append((model, path, kv, want.stdout))
        for name, pdir in plugins.items():
            if not os.path.exists(os.path.join(pdir, "libdevio-backend-cuda-emu.so")):
                failed += 1
                print("FAIL %s: no plugin in %s (bazel build //kernels/...)" % (name, pdir))
                continue
            def one(job):
                order, (model, path, kv, want) = job
                p = run([ref, "--model", model, "--kv-blocks", kv, "--backend", "cuda-emu",
                         "--backend-path", pdir, path], env=dict(os.environ, DEVIO_EMU_ORDER=order))
                err = p.stderr.decode(errors="replace")
                if p.stdout == want and "devio-emu:" not in err and p.returncode == 0:
                    return None
                report = [l for l in err.splitlines() if "devio-emu:" in l]
                return "%s %s: %s" % (os.path.basename(path), order,
                                      report[0][:160] if report else "output differs")

            # Each script in both schedules, one after the other, two runs at once. The
            # unmutated plugin runs them all; a mutant stops at its first catch (in job order),
            # the runs not yet started dropped: one catch is what it must show.
            jobs = [(o, w) for w in work for o in ("forward", "reverse")]
            pool = concurrent.futures.ThreadPoolExecutor(max_workers=2)
            futures = [pool.submit(one, j) for j in jobs]
            caught, ran = [], 0
            for f in futures:
                c = f.result()
                ran += 1
                if c:
                    caught.append(c)
                    if name != "none":
                        break
            pool.shutdown(wait=True, cancel_futures=True)
            ok = not caught if name == "none" else bool(caught)
            if ok:
                passed += 1
                print("ok   %s: %s" % (name, "the reference's bytes, no report in %d runs" % ran
                                       if name == "none" else "caught in run %d of %d (%s)"
                                       % (ran, len(jobs), caught[0])))
            else:
                failed += 1
                print("FAIL %s: %s" % (name, "; ".join(caught[:3]) if caught
                                       else "never caught: the emulator cannot see this mutation"))
    print("%d passed, %d failed" % (passed, failed))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
