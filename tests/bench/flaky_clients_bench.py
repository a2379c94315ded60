#!/usr/bin/env python3
"""flaky_clients_bench.py - the flaky-client attack on devio-server, measured: steps closed mid-way,
tickets abandoned, a history locked or unlinked. A benchmark, not a test: it prints figures and
asserts nothing; it must never leave a server running.

    python3 tests/bench/flaky_clients_bench.py --bin bazel-bin [--flaky 1000] [--lease-ms 30000]

Writes the tiny model to a temp dir and starts devio-server on it for each part (loopback, a temp
SQLite file, the reference backend):
  1. --flaky steps (/v1/step, 3 prompt tokens) from 4 threads, each connection closed 0-3 ms after
     its request by FIN (depth 2), then by FIN alone and RST alone at depth 8, while one good client
     steps: tickets left in flight 2 s after the last close, refusals the good client got, reaps;
  2. two tickets launched and never awaited at depth 2: how long until a launch succeeds again;
  3. another process holds the SQLite file locked for 6 s while 4 clients step: the slowest
     /healthz, /readyz and /metrics answers;
  4. the file unlinked under the server: steps answered 200 afterwards, and how soon /readyz is 503.
"""
import argparse
import os
import random
import sqlite3
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_server import Server, metric, plan, step_and_close, tiny_model  # noqa: E402


def part_flaky(bins, model, work, n, depth, how):
    sv = Server(bins, model, work, "--max-depth", str(depth))
    try:
        seqs = [sv.call("POST", "/v1/sequences")[1]["seq"] for _ in range(16)]
        good = sv.call("POST", "/v1/sequences")[1]["seq"]
        stop = threading.Event()
        refused = [0, {}]  # depth_exceeded, other answers by status and code

        def good_client():
            mine = good
            while not stop.is_set():
                st, b = sv.call("POST", "/v1/step", plan(mine, [1]))
                if st == 413:  # the sequence is full: a new one
                    sv.call("DELETE", "/v1/sequences/%d" % mine)
                    mine = sv.call("POST", "/v1/sequences")[1]["seq"]
                elif st == 409 and b["error"]["code"] == "depth_exceeded":
                    refused[0] += 1
                elif st != 200:
                    key = "%d %s" % (st, b["error"]["code"] if b else "")
                    refused[1][key] = refused[1].get(key, 0) + 1

        def attacker(k):
            r = random.Random(k)
            for i in range(k, n, 4):
                reset = how == "rst" or (how == "mixed" and r.random() < 0.5)
                step_and_close(sv.port, plan(seqs[i % len(seqs)], [1, 2, 3]), r.uniform(0, 0.003),
                               reset)

        g = threading.Thread(target=good_client)
        g.start()
        t0 = time.monotonic()
        ths = [threading.Thread(target=attacker, args=(k,)) for k in range(4)]
        for t in ths:
            t.start()
        for t in ths:
            t.join()
        took = time.monotonic() - t0
        time.sleep(2.0)
        stop.set()
        g.join()
        facts = sv.call("GET", "/v1/facts")[1]
        busy = sum(1 for s in seqs if sv.call("GET", "/v1/sequences/%d" % s)[1]["busy"])
        reaped = metric(sv.metrics(), 'devio_tickets_reaped_total{reason="closed"}')
        print("flaky steps %-5s depth %d: %d closes in %.1f s; 2 s later %d tickets in flight, %d "
              "busy sequences; %d reaped (closed); good client refused %d depth_exceeded, other %s"
              % (how, depth, n, took, facts["tickets_in_flight"], busy, reaped, refused[0],
                 refused[1]))
    finally:
        sv.stop()


def part_abandoned(bins, model, work, lease_ms):
    sv = Server(bins, model, work, "--max-depth", "2", "--ticket-lease-ms", str(lease_ms))
    try:
        a, b, c = (sv.call("POST", "/v1/sequences")[1]["seq"] for _ in range(3))
        sv.call("POST", "/v1/launch", plan(a, [1]))
        sv.call("POST", "/v1/launch", plan(b, [1]))
        t0 = time.monotonic()
        tries = refused = 0
        while time.monotonic() - t0 < lease_ms / 1000 + 10:
            tries += 1
            st, body = sv.call("POST", "/v1/launch", plan(c, [1]))
            if st == 202:
                break
            refused += 1
            time.sleep(0.1)
        print("abandoned tickets (lease %d ms): a launch succeeded after %.2f s (%d of %d tries "
              "refused)" % (lease_ms, time.monotonic() - t0, refused, tries))
    finally:
        sv.stop()


def part_locked(bins, model, work):
    sv = Server(bins, model, work)
    try:
        seqs = [sv.call("POST", "/v1/sequences")[1]["seq"] for _ in range(4)]
        sv.call("POST", "/v1/step", plan(seqs[0], [1]))
        lock = sqlite3.connect(str(sv.db), timeout=10, isolation_level=None)
        lock.execute("BEGIN EXCLUSIVE")
        stop = threading.Event()

        def stepper(s):
            while not stop.is_set():
                sv.call("POST", "/v1/step", plan(s, [1]))

        ths = [threading.Thread(target=stepper, args=(s,)) for s in seqs]
        for t in ths:
            t.start()
        worst = {"/healthz": 0.0, "/readyz": 0.0, "/metrics": 0.0}
        t_end = time.monotonic() + 6.0
        while time.monotonic() < t_end:
            for path in worst:
                t0 = time.monotonic()
                sv.call("GET", path)
                worst[path] = max(worst[path], time.monotonic() - t0)
            time.sleep(0.02)
        lock.execute("ROLLBACK")
        lock.close()
        stop.set()
        for t in ths:
            t.join()
        print("history locked 6 s under 4 stepping clients: slowest " +
              ", ".join("%s %.1f ms" % (p, w * 1000) for p, w in worst.items()))
    finally:
        sv.stop()


def part_unlinked(bins, model, work):
    sv = Server(bins, model, work)
    try:
        s = sv.call("POST", "/v1/sequences")[1]["seq"]
        sv.call("POST", "/v1/step", plan(s, [1]))
        os.unlink(sv.db)
        t0 = time.monotonic()
        ok = unready_at = 0
        while time.monotonic() - t0 < 3.0:
            st, _ = sv.call("POST", "/v1/step", plan(s, [1]))
            ok += st == 200
            if not unready_at and sv.call("GET", "/readyz")[0] == 503:
                unready_at = time.monotonic() - t0
        print("history unlinked: %d steps answered 200 over the next 3 s; /readyz 503 after "
              "%.3f s" % (ok, unready_at))
    finally:
        sv.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default="bazel-bin")
    ap.add_argument("--flaky", type=int, default=1000)
    ap.add_argument("--lease-ms", type=int, default=30000)
    a = ap.parse_args()
    bins = Path(a.bin).resolve()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = tiny_model(bins, work)
        part_flaky(bins, model, work, a.flaky, 2, "fin")
        part_flaky(bins, model, work, a.flaky, 8, "fin")
        part_flaky(bins, model, work, a.flaky, 8, "rst")
        part_abandoned(bins, model, work, a.lease_ms)
        part_locked(bins, model, work)
        part_unlinked(bins, model, work)


if __name__ == "__main__":
    main()
