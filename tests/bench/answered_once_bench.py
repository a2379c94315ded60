#!/usr/bin/env python3
"""answered_once_bench.py - nothing answered twice, nothing answered wrong, measured under load. A
benchmark, not a test: it prints figures and asserts nothing; it must never leave a server running.

    python3 tests/bench/answered_once_bench.py --bin bazel-bin [--seconds 5] [--rounds 5]

Three parts, each on a fresh devio-server (loopback, a temp SQLite file, the tiny model):
  1. keyed traffic: 4 clients, each with keys of its own, send keyed /v1/step for --seconds while
     2 more await an answered ticket again and again: keyed answers per second, and every answer
     that was not 200 by status and code (a spurious 503 or 409 would show here);
  2. SIGTERM under load: 4 clients loop /v1/step (the stream test device, 50 ms a step) and the
     server gets SIGTERM mid-way, --rounds times: steps answered 200, refused 503 not_ready,
     connections closed without an answer, and tickets in the history whose client got no 200
     (lost steps: run, not answered);
  3. steps closed mid-way: 2 x --rounds /v1/step of 400 ms each (the stream device), each closed
     by FIN or RST 50-230 ms in: how many the server reaped as closed, rows reaped, and logits
     handles left live.
"""
import argparse
import http.client
import random
import signal
import sqlite3
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_server import Server, metric, plan, step_and_close, tiny_model  # noqa: E402


def code_of(status, body):
    err = body.get("error") if isinstance(body, dict) else None
    return "%d %s" % (status, err["code"] if isinstance(err, dict) else "")


def stream_args(bins):
    return ("--backend", "stream", "--backend-path", str(bins / "tests" / "backend"))


def part_keyed(bins, model, work, seconds):
    sv = Server(bins, model, work, "--max-depth", "16")
    try:
        seq = sv.call("POST", "/v1/sequences")[1]["seq"]
        done = sv.call("POST", "/v1/step", plan(seq, [1]))[1]["ticket"]
        t_end = time.monotonic() + seconds
        keyed, replays, other = [0], [0], {}
        lock = threading.Lock()

        def note(st, body):
            with lock:
                k = code_of(st, body)
                other[k] = other.get(k, 0) + 1

        def client(k):
            con = sv.conn()
            s = sv.request("POST", "/v1/sequences", con=con)[1]["seq"]
            i = 0
            while time.monotonic() < t_end:
                i += 1
                if i % 256 == 0:  # a new sequence before this one is full
                    sv.request("DELETE", "/v1/sequences/%d" % s, con=con)
                    s = sv.request("POST", "/v1/sequences", con=con)[1]["seq"]
                st, b, _ = sv.request("POST", "/v1/step", plan(s, [1]),
                                      {"Idempotency-Key": "c%d-%d" % (k, i)}, con=con)
                if st == 200:
                    with lock:
                        keyed[0] += 1
                else:
                    note(st, b)
            con.close()

        def re_awaiter():
            con = sv.conn()
            while time.monotonic() < t_end:
                st, b, r = sv.request("POST", "/v1/tickets/%d/await" % done, con=con)
                if st == 200 and r.getheader("Idempotent-Replayed") == "true":
                    with lock:
                        replays[0] += 1
                else:
                    note(st, b)
            con.close()

        ths = [threading.Thread(target=client, args=(k,)) for k in range(4)]
        ths += [threading.Thread(target=re_awaiter) for _ in range(2)]
        t0 = time.monotonic()
        for t in ths:
            t.start()
        for t in ths:
            t.join()
        took = time.monotonic() - t0
        print("keyed traffic, 4 clients + 2 re-awaiters, %.1f s: %d keyed steps (%.0f/s), %d "
              "replays, answers other than 200: %s" % (took, keyed[0], keyed[0] / took,
                                                       replays[0], other or "none"))
    finally:
        sv.stop()


def part_sigterm(bins, model, work, rounds):
    totals = {"ok": 0, "not_ready": 0, "closed": 0, "other": 0, "lost": 0, "rows": 0}
    for _ in range(rounds):
        sv = Server(bins, model, work, *stream_args(bins), "--max-depth", "8",
                    env={"STREAM_BACKEND_STEP_MS": "50"})
        answered = [0]
        lock = threading.Lock()
        try:
            seqs = [sv.call("POST", "/v1/sequences")[1]["seq"] for _ in range(4)]

            def client(s):
                while True:
                    try:
                        st, b = sv.call("POST", "/v1/step", plan(s, [1]))
                    except (OSError, http.client.HTTPException):
                        with lock:
                            totals["closed"] += 1
                        return
                    with lock:
                        if st == 200:
                            totals["ok"] += 1
                            answered[0] += 1
                        elif code_of(st, b) == "503 not_ready":
                            totals["not_ready"] += 1
                            return
                        else:
                            totals["other"] += 1
                            return

            ths = [threading.Thread(target=client, args=(s,)) for s in seqs]
            for t in ths:
                t.start()
            time.sleep(random.uniform(0.3, 0.6))
            sv.proc.send_signal(signal.SIGTERM)
            for t in ths:
                t.join(timeout=60)
            sv.proc.wait(timeout=60)
        finally:
            sv.stop()
        con = sqlite3.connect(str(sv.db))
        rows = con.execute("SELECT count(*) FROM tickets").fetchone()[0]
        con.close()
        totals["rows"] += rows
        totals["lost"] += rows - answered[0]
    print("SIGTERM under 4 stepping clients, %d rounds: %d steps answered 200, %d refused 503 "
          "not_ready, %d connections closed unanswered, %d other answers; %d tickets in the "
          "history, %d run without a 200 (lost)" % (rounds, totals["ok"], totals["not_ready"],
                                                   totals["closed"], totals["other"],
                                                   totals["rows"], totals["lost"]))


def part_closed(bins, model, work, rounds):
    sv = Server(bins, model, work, *stream_args(bins), "--max-depth", "16",
                env={"STREAM_BACKEND_STEP_MS": "400"})
    try:
        n = 2 * rounds
        seqs = [sv.call("POST", "/v1/sequences")[1]["seq"] for _ in range(n)]
        r = random.Random(1)
        ths = [threading.Thread(target=step_and_close,
                                args=(sv.port, plan(seqs[i], [1, 2], logits="last"),
                                      r.uniform(0.05, 0.23), i % 2 == 1)) for i in range(n)]
        t0 = time.monotonic()
        for t in ths:
            t.start()
            time.sleep(0.4)  # one step in the device at a time: each closes mid-step
        for t in ths:
            t.join()
        key = 'devio_tickets_reaped_total{reason="closed"}'
        reaped = 0.0
        while time.monotonic() - t0 < n * 0.4 + 10:
            reaped = metric(sv.metrics(), key)
            if reaped >= n:
                break
            time.sleep(0.1)
        handles = len(sv.call("GET", "/v1/logits")[1]["handles"])
        con = sqlite3.connect(str(sv.db))
        rows = dict(con.execute("SELECT status, count(*) FROM tickets GROUP BY status"))
        con.close()
        print("steps closed 50-230 ms into a 400 ms step, %d by FIN and %d by RST: %d reaped as "
              "closed (%.0f%%), rows %s, %d logits handles left live"
              % (n - n // 2, n // 2, reaped, 100.0 * reaped / n, rows, handles))
    finally:
        sv.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default="bazel-bin")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    bins = Path(a.bin).resolve()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = tiny_model(bins, work)
        part_keyed(bins, model, work, a.seconds)
        part_sigterm(bins, model, work, a.rounds)
        part_closed(bins, model, work, a.rounds)


if __name__ == "__main__":
    main()
