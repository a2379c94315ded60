#!/usr/bin/env python3
"""depth_bench.py - what depth 2 buys a scheduler over HTTP: two groups of sequences decoded in
turns, each step awaited before the next launch (depth 1) against the other group's step launched
before this one is awaited (depth 2), side by side on one server.
A benchmark, not a test: it prints figures and asserts nothing about speed; it never leaves a
server running.

    python3 tests/bench/depth_bench.py --bin bazel-bin [--model PATH | --preset small]
                                       [--seqs 8] [--steps 48] [--rounds 3]

Starts devio-server (loopback, a temp SQLite file) on --model (a GGUF file or a model
directory) or on a devio-mkmodel preset, gives every sequence a 16-token prompt, then times
--steps greedy one-token decode steps per group in each mode, --rounds times interleaved, and
prints tokens/s of each mode (median) and their ratio. docs/scheduler.md explains the loop.
"""
import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(REPO / "clients" / "python"))
sys.path.insert(0, str(REPO / "tests" / "bench"))
from devio_client import Client  # noqa: E402
from server_bench import start_server, stop_server  # noqa: E402

PROMPT = 16
GREEDY = {"temperature": 0}


def prefill(c, groups, vocab):
    """Every sequence gets a prompt; the token each row samples is its next input."""
    nxt = {}
    for g in groups:
        rows = [{"seq": s, "tokens": [(7 * s + i) % vocab for i in range(PROMPT)],
                 "sample": GREEDY} for s in g]
        for r in c.step({"rows": rows})["rows"]:
            nxt[r["seq"]] = r["tokens"][0]
    return nxt


def plan_of(group, nxt):
    return {"rows": [{"seq": s, "tokens": [nxt[s]], "sample": GREEDY} for s in group]}


def take(result, nxt):
    for r in result["rows"]:
        nxt[r["seq"]] = r["tokens"][0]


def depth1(c, groups, nxt, steps):
    for _ in range(steps):
        for g in groups:
            take(c.await_ticket(c.launch(plan_of(g, nxt))), nxt)


def depth2(c, groups, nxt, steps):
    """Group b's step is queued while group a's runs: the device never waits for the client."""
    a, b = groups
    ta = c.launch(plan_of(a, nxt))
    for i in range(steps):
        tb = c.launch(plan_of(b, nxt))
        take(c.await_ticket(ta), nxt)
        if i + 1 < steps:
            ta = c.launch(plan_of(a, nxt))
        take(c.await_ticket(tb), nxt)


def trim(c, groups):
    for g in groups:
        for s in g:
            c.truncate(s, PROMPT)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default="bazel-bin", help="folder with service/devio-server")
    ap.add_argument("--model", help="a GGUF file or model directory (default: a preset)")
    ap.add_argument("--preset", default="small", help="devio-mkmodel preset without --model")
    ap.add_argument("--seqs", type=int, default=8, help="sequences, split into two groups")
    ap.add_argument("--steps", type=int, default=48, help="decode steps per group and mode")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of both modes")
    ap.add_argument("--threads", type=int, default=2, help="devio-server --threads")
    a = ap.parse_args()
    if a.seqs < 2 or a.steps < 1 or a.rounds < 1:
        ap.error("--seqs must be at least 2, --steps and --rounds at least 1")
    bins = Path(a.bin)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model = Path(a.model) if a.model else tmp / a.preset
        if not a.model:
            subprocess.run([str(bins / "tools/mkmodel/devio-mkmodel"), "--preset", a.preset,
                            "--out", str(model)], check=True, capture_output=True, timeout=300)
        proc, port = start_server(bins / "service/devio-server", model, tmp, a.threads, 2,
                                  ("--max-seq-len", str(PROMPT + a.steps + 8)))
        try:
            with Client("http://127.0.0.1:%d" % port, timeout=120) as c:
                vocab = c.model()["vocab_size"]
                seqs = [c.create_sequence() for _ in range(a.seqs)]
                groups = (seqs[: a.seqs // 2], seqs[a.seqs // 2:])
                nxt = prefill(c, groups, vocab)
                rates = {1: [], 2: []}
                for _ in range(a.rounds):
                    for depth, run in ((1, depth1), (2, depth2)):
                        trim(c, groups)
                        t0 = time.perf_counter()
                        run(c, groups, nxt, a.steps)
                        rates[depth].append(a.steps * a.seqs / (time.perf_counter() - t0))
                name = c.device()["model"]["architecture"]
        finally:
            stop_server(proc)
    d1, d2 = statistics.median(rates[1]), statistics.median(rates[2])
    print("depth_bench: %s, %d sequences in two groups, %d steps per group, %d rounds, "
          "--threads %d" % (name, a.seqs, a.steps, a.rounds, a.threads))
    print("  depth 1 (await, then launch)      %8.1f tokens/s" % d1)
    print("  depth 2 (other group queued)      %8.1f tokens/s" % d2)
    print("  depth 2 / depth 1                 %8.2fx" % (d2 / d1))


if __name__ == "__main__":
    main()
