#!/usr/bin/env python3
"""emu_scripts_check.py - cuda-emu gives the reference's bytes beyond the conformance
suites: scripts the suites do not run (deploy/demo.jsonl, tests/e2e/scripts/*.jsonl) on
devio-ref --backend cuda-emu against --backend ref, on the small preset (a vocabulary
of 32000 and rows of 288: whole lane-major chunks and tails), and conformance scripts
through devio-server --backend cuda-emu and devio-conform against their expected files.

    python3 tests/python/emu_scripts_check.py --bin bazel-bin

Prints a line per run and "N passed, M failed"; exit status 1 on a failure.
"""
import argparse
import concurrent.futures
import functools
import glob
import json
import os
import signal
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SERVED = ("chunks", "fork", "ssm_snapshot")  # suites run through the server


def table(name):
    rows = {}
    for line in open(os.path.join(ROOT, "tests", "conformance", name)):
        line = line.strip()
        if line and not line.startswith("#"):
            cells = [c.strip() for c in line.split("|")]
            rows[cells[0]] = cells[1:]
    return rows


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, timeout=600, **kw)


def served(b, model, flags, script, tmp, tag):
    """devio-conform's output for script against devio-server --backend cuda-emu (its log and
    database named by tag under tmp)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEVIO_")}
    log = open(os.path.join(tmp, "server-%s.log" % tag), "wb")
    p = subprocess.Popen([os.path.join(b, "service", "devio-server"), "--model", model,
                          "--db", os.path.join(tmp, "s-%s.db" % tag), "--listen", "127.0.0.1:0",
                          "--backend", "cuda-emu", "--backend-path", os.path.join(b, "kernels")]
                         + flags, stdout=subprocess.PIPE, stderr=log, env=env)
    try:
        line = p.stdout.readline().split()
        if not line or line[0] != b"listening":
            return None
        return run([os.path.join(b, "conform", "devio-conform"), "--server",
                    "http://127.0.0.1:%d" % int(line[1]), script]).stdout
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        log.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    b = os.path.abspath(ap.parse_args().bin)
    ref, mk = os.path.join(b, "ref", "devio-ref"), os.path.join(b, "tools", "mkmodel", "devio-mkmodel")
    passed = failed = 0
    jobs = []  # (name, function returning (ok, why)), judged and printed in this order

    with tempfile.TemporaryDirectory() as tmp:
        small = os.path.join(tmp, "small")
        run([mk, "--preset", "small", "--seed", "3", "--out", small], check=True)
        facts = os.path.join(tmp, "facts.jsonl")
        open(facts, "w").write('{"op":"facts"}\n')
        kv = str(json.loads(run([ref, "--model", small, facts]).stdout.decode().splitlines()[0])
                 ["result"]["kv"]["blocks_total"])
        scripts = [os.path.join(ROOT, "deploy", "demo.jsonl")] + sorted(
            glob.glob(os.path.join(ROOT, "tests", "e2e", "scripts", "*.jsonl")))

        def on_small(s):
            want = run([ref, "--model", small, s]).stdout
            got = run([ref, "--model", small, "--kv-blocks", kv, "--backend", "cuda-emu",
                       "--backend-path", os.path.join(b, "kernels"), s])
            return (got.stdout == want and want != b"",
                    got.stderr.decode(errors="replace")[-300:] or "output differs")

        def through_server(name, model, flags, script):
            got = served(b, model, flags, os.path.join(ROOT, "tests", "conformance", script),
                         tmp, name)
            want = open(os.path.join(ROOT, "tests", "conformance", "expected", name + ".out"),
                        "rb").read()
            return got == want, "output differs" if got is not None else "the server did not start"

        for s in scripts:
            jobs.append(("%s on small" % os.path.relpath(s, ROOT), functools.partial(on_small, s)))
        models, suites = table("models.txt"), table("suites.txt")
        for name in SERVED:
            script, model_name, flags = suites[name]
            model = os.path.join(tmp, "m-" + model_name)
            if not os.path.exists(model):
                run([mk] + models[model_name][0].split() + ["--out", model], check=True)
            flags = flags.split()
            if "--kv-blocks" not in flags:  # the reference's pool, not one sized by memory
                out = run([ref, "--model", model] + flags + [facts]).stdout.decode().splitlines()
                flags += ["--kv-blocks", str(json.loads(out[0])["result"]["kv"]["blocks_total"])]
            jobs.append(("%s through devio-server --backend cuda-emu" % name,
                         functools.partial(through_server, name, model, flags, script)))
        # Two at once: each run is one emulator thread, and the suite has two cores.
        with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
            for name, fut in [(name, pool.submit(fn)) for name, fn in jobs]:
                ok, why = fut.result()
                passed, failed = passed + ok, failed + (not ok)
                print("%s %s%s" % ("ok  " if ok else "FAIL", name, "" if ok else ": " + why),
                      flush=True)
    print("%d passed, %d failed" % (passed, failed))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
