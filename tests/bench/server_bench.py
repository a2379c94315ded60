#!/usr/bin/env python3
"""server_bench.py - launch+await round trips through devio-server over HTTP, beside the same steps in-process.
A benchmark, not a test: it prints figures and asserts nothing about speed; it must never leave a server running.

    python3 tests/bench/server_bench.py --bin bazel-bin [--n 2000] [--threads 1] [--clients 4]
                                        [--server-args '--http-threads 4']

Writes the tiny model to a temp dir, starts devio-server on it (loopback, a
temp SQLite file), and times one-token greedy decode steps (POST /v1/launch
then POST /v1/tickets/{id}/await, keep-alive) from one client, then from
--clients concurrent clients (separate processes, one sequence each). Clients
are raw sockets sending prebuilt request bytes, so that their own cost stays
small; the "HTTP floor" row is that same loop with both requests GET /healthz.
Then it runs rtt_inproc (tests/bench/rtt_inproc.c) on the same model and
prints a table.
rtt_inproc comes from --bin (tests/bench/rtt_inproc); when that is missing it is
compiled with gcc from the repository's sources into the temp dir.
"""
import argparse
import json
import multiprocessing as mp
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
PROMPT = 16
WRAP_AT = 500  # truncate back to the prompt before max_seq_len (512 on tiny)


def percentile(sorted_values, p):
    """Nearest rank, as rtt_inproc computes it."""
    n = len(sorted_values)
    k = min(max(int(p / 100.0 * n + 0.999999), 1), n)
    return sorted_values[k - 1]


# ---- the server ---------------------------------------------------------------------------


def fetch_smollm2():
    """(path, None): the SmolLM2 GGUF file, fetched by deploy/fetch-model.sh once into
    .devio/models; (None, why) when it cannot be had."""
    p = subprocess.run(["bash", str(REPO / "deploy" / "fetch-model.sh")], capture_output=True,
                       text=True, timeout=900)
    if p.returncode != 0:
        return None, p.stderr.strip()[-300:]
    return Path(p.stdout.strip().splitlines()[-1]), None


def start_server(server_bin, model, workdir, threads, depth, extra=(), env_extra=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEVIO_")}
    env.update(env_extra or {})
    log = open(workdir / "server.log", "wb")
    proc = subprocess.Popen(
        [str(server_bin), "--model", str(model), "--listen", "127.0.0.1:0",
         "--db", str(workdir / "bench.db"), "--adapters", str(workdir),
         "--threads", str(threads), "--max-depth", str(depth), *extra],
        stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL, env=env)
    log.close()
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + 60
    buf = b""
    try:
        while b"\n" not in buf:
            left = deadline - time.monotonic()
            if left <= 0 or proc.poll() is not None:
                raise RuntimeError("devio-server did not start:\n" +
                                   (workdir / "server.log").read_text(errors="replace")[-2000:])
            if sel.select(timeout=min(left, 0.5)):
                chunk = os.read(proc.stdout.fileno(), 4096)
                if not chunk:
                    continue
                buf += chunk
    except BaseException:
        stop_server(proc)
        raise
    finally:
        sel.close()
    return proc, int(buf.split()[1])


def stop_server(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
    if proc.stdout:
        proc.stdout.close()
    return proc.returncode


# ---- one client -----------------------------------------------------------------------------


class Raw:
    """One keep-alive HTTP/1.1 connection over a plain socket, requests prebuilt as bytes: the
    client's own cost per round trip stays a few microseconds (http.client costs ~60 us more)."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def send(self, head, body=b""):
        """Send one request (head: request line and headers, without Content-Length)."""
        self.sock.sendall(head + b"Content-Length: %d\r\n\r\n" % len(body) + body)

    def receive(self):
        """(status, body bytes) of the next answer."""
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end >= 0:
                head = self.buf[:end]
                k = head.lower().find(b"content-length:")
                n = int(head[k + 15:].split(b"\r\n", 1)[0]) if k >= 0 else 0
                if len(self.buf) >= end + 4 + n:
                    body = self.buf[end + 4:end + 4 + n]
                    self.buf = self.buf[end + 4 + n:]
                    return int(head[9:12]), body
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("server closed the connection")
            self.buf += chunk

    def post(self, path, body=None):
        data = json.dumps(body).encode() if body is not None else b""
        self.send(b"POST %s HTTP/1.1\r\nHost: b\r\nContent-Type: application/json\r\n" % path.encode(), data)
        st, raw = self.receive()
        return st, json.loads(raw) if raw else None


LAUNCH = b"POST /v1/launch HTTP/1.1\r\nHost: b\r\nContent-Type: application/json\r\n"
AWAIT = b"POST /v1/tickets/%d/await HTTP/1.1\r\nHost: b\r\n"
HEALTH = b"GET /healthz HTTP/1.1\r\nHost: b\r\n"


def client_run(port, n, warmup, salt, barrier, out, floor=False):
    """Decode n timed steps on a fresh sequence; put (latencies_us, device_us, retries, span, error) on out.
    floor: the same loop of two round trips per step, both GET /healthz (the client's and HTTP's own cost)."""
    try:
        h = Raw(port)
        st, j = h.post("/v1/sequences")
        assert st == 201, (st, j)
        seq = j["seq"]
        st, j = h.post("/v1/step", {"rows": [{"seq": seq, "tokens": [(k * 7 + salt) % 256 for k in range(PROMPT)],
                                              "sample": {"temperature": 0}}]})
        assert st == 200, (st, j)
        tok = j["rows"][0]["tokens"][0]
        length = PROMPT
        lat, compute, retries = [], [], 0
        if barrier is not None:
            barrier.wait(timeout=120)
        start = None
        body_fmt = b'{"rows":[{"seq":%d,"tokens":[%%d],"sample":{"temperature":0}}]}' % seq
        for i in range(-warmup, n):
            if i == 0:
                start = time.perf_counter()  # CLOCK_MONOTONIC: comparable across processes
            if floor:
                t0 = time.perf_counter()
                h.send(HEALTH)
                st, _ = h.receive()
                h.send(HEALTH)
                st2, _ = h.receive()
                t1 = time.perf_counter()
                assert st == st2 == 200, (st, st2)
                if i >= 0:
                    lat.append((t1 - t0) * 1e6)
                continue
            if length >= WRAP_AT:
                st, j = h.post("/v1/effects", {"kind": "truncate", "seq": seq, "len": PROMPT})
                assert st == 200, (st, j)
                length = PROMPT
            body = body_fmt % tok
            t0 = time.perf_counter()
            for _ in range(100000):
                h.send(LAUNCH, body)
                st, raw = h.receive()
                if st == 202:
                    break
                j = json.loads(raw)
                assert st == 409 and j["error"]["code"] == "depth_exceeded", (st, j)
                retries += 1
            h.send(AWAIT % int(raw[10:-1]))  # {"ticket":N}
            st, raw = h.receive()
            t1 = time.perf_counter()
            assert st == 200, (st, raw)
            r = json.loads(raw)
            tok = r["rows"][0]["tokens"][0]
            length += 1
            if i >= 0:
                lat.append((t1 - t0) * 1e6)
                compute.append(r["timing"]["compute_us"] + r["timing"]["queued_us"])
        end = time.perf_counter()
        h.post("/v1/effects", {"kind": "free", "seq": seq})
        out.put((lat, compute, retries, (start, end), None))
    except Exception as e:  # reported by the parent
        out.put(([], [], 0, None, repr(e)))


def store_commits(port):
    """The server's devio_store_commit_seconds histogram: (count, sum_s, [(le, cumulative)])."""
    h = Raw(port)
    h.send(b"GET /metrics HTTP/1.1\r\nHost: b\r\n")
    st, body = h.receive()
    h.sock.close()
    assert st == 200, st
    count, total, buckets = 0, 0.0, []
    for line in body.decode().splitlines():
        if line.startswith("devio_store_commit_seconds_bucket"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            buckets.append((float("inf") if le == "+Inf" else float(le), int(line.rsplit(" ", 1)[1])))
        elif line.startswith("devio_store_commit_seconds_count"):
            count = int(line.rsplit(" ", 1)[1])
        elif line.startswith("devio_store_commit_seconds_sum"):
            total = float(line.rsplit(" ", 1)[1])
    return count, total, buckets


def commit_summary(before, after):
    """Transactions, mean us and the bucket (lo, hi] us holding the median between two scrapes."""
    n = after[0] - before[0]
    if n <= 0:
        return None
    mean = (after[1] - before[1]) / n * 1e6
    lo = 0.0
    for (le, cum), (_, cum0) in zip(after[2], before[2]):
        if cum - cum0 >= (n + 1) // 2:
            return n, mean, lo * 1e6, le * 1e6
        lo = le
    return n, mean, lo * 1e6, float("inf")


def run_http(port, n, warmup, clients, floor=False):
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    barrier = ctx.Barrier(clients) if clients > 1 else None
    procs = [ctx.Process(target=client_run, args=(port, n, warmup, k, barrier, out, floor))
             for k in range(clients)]
    t0 = time.perf_counter()
    for p in procs:
        p.start()
    results = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        if p.is_alive():
            p.kill()
    errors = [r[4] for r in results if r[4]]
    if errors:
        raise RuntimeError("client failed: %s" % errors[0])
    lat = sorted(x for r in results for x in r[0])
    compute = sorted(x for r in results for x in r[1]) or [0]
    # Concurrent clients: every timed step over the span from the first start to the last end.
    wall = time.perf_counter() - t0
    span = max(r[3][1] for r in results) - min(r[3][0] for r in results)
    return {
        "steps_per_s": len(lat) / span,
        "p50_us": percentile(lat, 50),
        "p99_us": percentile(lat, 99),
        "device_p50_us": percentile(compute, 50),
        "retries": sum(r[2] for r in results),
        "wall_s": wall,
    }


# ---- in-process -------------------------------------------------------------------------------


def find_rtt(bin_dir, tmp):
    built = bin_dir / "tests" / "bench" / "rtt_inproc"
    if os.access(built, os.X_OK):
        return built, "bazel"
    out = tmp / "rtt_inproc"
    srcs = ([str(REPO / "tests/bench/rtt_inproc.c")] +
            sorted(str(p) for d in ("common", "device") for p in (REPO / d).glob("*.c")) +
            [str(REPO / f) for f in ("ref/builtin.c", "ref/pool.c", "ref/ref_backend.c",
                                     "ref/ref_attention.c", "ref/ref_kernels.c",
                                     "tools/mkmodel/mkmodel.c", "tools/mkmodel/mkadapter.c",
                                     "tools/mkmodel/mkwrite.c")])
    cmd = ["gcc", "-std=c11", "-O2", "-ffp-contract=off", "-march=native", "-D_POSIX_C_SOURCE=200809L",
           "-I" + str(REPO)] + srcs + ["-ljansson", "-lpthread", "-ldl", "-o", str(out)]
    subprocess.run(cmd, check=True, timeout=300)
    return out, "gcc"


def run_inproc(rtt, model, n, warmup, threads):
    r = subprocess.run([str(rtt), "--model", str(model), "--n", str(n), "--warmup", str(warmup),
                        "--threads", str(threads)], capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError("rtt_inproc failed: " + r.stderr)
    return json.loads(r.stdout.strip().splitlines()[-1])


# ---- main -------------------------------------------------------------------------------------


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default="bazel-bin", help="folder with service/devio-server, tools/mkmodel/devio-mkmodel")
    ap.add_argument("--n", type=int, default=2000, help="timed steps per client [2000]")
    ap.add_argument("--warmup", type=int, default=100, help="untimed steps per client first [100]")
    ap.add_argument("--clients", type=int, default=4, help="concurrent clients in the second run [4]")
    ap.add_argument("--threads", type=int, default=1,
                    help="device compute threads, same for the server and in-process [1]")
    ap.add_argument("--server-args", default="",
                    help="more devio-server flags, one string, e.g. '--http-threads 4'")
    ap.add_argument("--json", action="store_true", help="also print the figures as one JSON line")
    a = ap.parse_args(argv)
    if a.n < 1 or a.clients < 1 or a.warmup < 0 or a.threads < 0:
        ap.error("--n, --clients must be >= 1; --warmup, --threads >= 0")
    bin_dir = Path(a.bin)
    if not bin_dir.is_absolute() and not bin_dir.exists():
        bin_dir = REPO / bin_dir
    server_bin = bin_dir / "service" / "devio-server"
    mkmodel = bin_dir / "tools" / "mkmodel" / "devio-mkmodel"
    for p in (server_bin, mkmodel):
        if not os.access(p, os.X_OK):
            print("server_bench: no executable %s (bazel build //... first)" % p, file=sys.stderr)
            return 2

    tmp = Path(tempfile.mkdtemp(prefix="devio-server-bench-"))
    proc = None
    try:
        model = tmp / "tiny"
        subprocess.run([str(mkmodel), "--preset", "tiny", "--out", str(model)], check=True,
                       capture_output=True, timeout=120)
        rtt, how = find_rtt(bin_dir.resolve(), tmp)
        proc, port = start_server(server_bin, model, tmp, a.threads, max(2, a.clients + 1),
                                  a.server_args.split())
        floor = run_http(port, a.n, a.warmup, 1, floor=True)
        c0 = store_commits(port)
        one = run_http(port, a.n, a.warmup, 1)
        commits = commit_summary(c0, store_commits(port))
        many = run_http(port, a.n, a.warmup, a.clients)
        rc = stop_server(proc)
        proc = None
        inproc = run_inproc(rtt, model, a.n, a.warmup, a.threads)
    finally:
        if proc is not None:
            stop_server(proc)
        shutil.rmtree(tmp, ignore_errors=True)

    print("devio-server round trips: tiny model, one-token greedy decode, launch + await over "
          "keep-alive HTTP; %d timed steps per client, %d device thread(s), %d CPUs; rtt_inproc from %s"
          % (a.n, a.threads, os.cpu_count(), how))
    print("%-16s %12s %10s %10s %14s %12s" % ("mode", "steps/s", "p50 us", "p99 us", "device p50 us",
                                               "in-proc/this"))
    rows = [("HTTP 1 client", one), ("HTTP %d clients" % a.clients, many), ("in-process", inproc),
            ("HTTP floor", floor)]
    for name, r in rows:
        ratio = "-" if r is floor else "%.2fx" % (inproc["steps_per_s"] / r["steps_per_s"])
        dev = "%.0f" % r["device_p50_us"] if r.get("device_p50_us") else "-"
        print("%-16s %12.1f %10.0f %10.0f %14s %12s" % (name, r["steps_per_s"], r["p50_us"], r["p99_us"],
                                                        dev, ratio))
    print("HTTP floor: the same client loop with both round trips GET /healthz (no device, no SQLite):\n"
          "what the client and HTTP cost a step by themselves.")
    if commits:
        print("ticket store in the 1-client run: %d transactions (a launch row and a settle row per step, "
              "group-committed), mean %.0f us, median in (%.0f, %.0f] us: devio_store_commit_seconds"
              % commits)
    if many["retries"]:
        print("(%d launches answered depth_exceeded and were retried)" % many["retries"])
    print("server exit status on SIGTERM: %s" % rc)
    if a.json:
        print(json.dumps({"http_1": one, "http_%d" % a.clients: many, "inproc": inproc, "http_floor": floor}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
