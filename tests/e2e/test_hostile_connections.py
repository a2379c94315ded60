"""test_hostile_connections.py - connections that try to hold the server: idle and slowloris ones past the
header deadline, the per-address and total caps (503 too_many_connections), bodies sent without a token,
and framing that two parsers could read two ways. Raw sockets; every wait is bounded by count and time.

Hostile connections come from other loopback addresses (127.0.0.10 and up) than the client that must
stay served (127.0.0.2), as they would from other hosts: the per-address limit counts each address.
"""
import json
import resource
import selectors
import socket
import threading
import time

import pytest

from client import Client
from test_server import metric, parse_metrics

TOKEN = "h0stile-t0ken"
HEADER_MS = 2000          # --header-timeout-ms for the deadline tests
SWEEP_SLACK_S = 1.5       # the server's sweep (50 ms), our 0.5 s byte pace, a busy machine


@pytest.fixture(scope="module", autouse=True)
def many_descriptors():
    """Room for ~700 sockets here; the server raises its own soft limit to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else 65536
    if want < 2048:
        pytest.skip("RLIMIT_NOFILE hard limit %d is too low for 600 connections" % hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def start(servers, tiny_model, *args):
    return servers.start(tiny_model, [str(a) for a in args], env={"DEVIO_TOKEN": TOKEN},
                         token=TOKEN)


def connect(port, src, timeout=5.0):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind((src, 0))
    s.settimeout(timeout)
    s.connect(("127.0.0.1", port))
    return s


def read_all(s, limit_s=5.0, cap=1 << 20):
    """Bytes until the server closes (or resets) or limit_s passes; (bytes, closed)."""
    out = b""
    end = time.monotonic() + limit_s
    while len(out) < cap:
        left = end - time.monotonic()
        if left <= 0:
            return out, False
        s.settimeout(left)
        try:
            b = s.recv(65536)
        except socket.timeout:
            return out, False
        except ConnectionResetError:
            return out, True
        if not b:
            return out, True
        out += b
    return out, False


def first_readable(socks, limit_s):
    """The first socket with bytes (or an end) to read within limit_s, or None."""
    sel = selectors.DefaultSelector()
    for s in socks:
        sel.register(s, selectors.EVENT_READ)
    try:
        ready = sel.select(limit_s)
        return ready[0][0].fileobj if ready else None
    finally:
        sel.close()


def parse_answer(raw):
    """(status, headers dict with lower-case names, body bytes) of the first answer in raw."""
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    hdrs = {}
    for ln in lines[1:]:
        k, _, v = ln.partition(":")
        hdrs[k.strip().lower()] = v.strip()
    n = int(hdrs.get("content-length", len(body)))
    return status, hdrs, body[:n]


def error_code(contract, status, hdrs, body):
    """(code, details) of an error answer, checked against the contract's ErrorCode enum."""
    assert hdrs.get("content-type") == "application/json", hdrs
    j = json.loads(body)
    assert set(j) == {"error"} and set(j["error"]) == {"code", "message", "details"}, j
    assert j["error"]["code"] in contract.doc["components"]["schemas"]["ErrorCode"]["enum"], j
    return j["error"]["code"], j["error"]["details"]


def vm_rss_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        for ln in f:
            if ln.startswith("VmRSS:"):
                return int(ln.split()[1])
    raise AssertionError("no VmRSS for %d" % pid)


# ---- header deadline -------------------------------------------------------------------------


class Hostile:
    """Idle and slowloris sockets watched from one thread: slowloris ones get one header byte
    every 0.5 s; the time each is closed by the server is recorded."""

    def __init__(self, port, idle_srcs, slow_srcs, per_src):
        self.sel = selectors.DefaultSelector()
        self.opened = {}
        self.closed = {}
        self.slow = set()
        self.answered = []
        for kind, srcs in (("idle", idle_srcs), ("slow", slow_srcs)):
            for src in srcs:
                for _ in range(per_src):
                    s = connect(port, src)
                    s.setblocking(False)
                    if kind == "slow":
                        s.send(b"POST /v1/launch HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                        self.slow.add(s)
                    self.opened[s] = time.monotonic()
                    self.sel.register(s, selectors.EVENT_READ)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _close(self, s, now):
        self.closed[s] = now
        self.sel.unregister(s)

    def _run(self):
        next_byte = time.monotonic() + 0.5
        end = time.monotonic() + 60
        while not self.stop.is_set() and len(self.closed) < len(self.opened) and time.monotonic() < end:
            for key, _ in self.sel.select(timeout=0.05):
                s = key.fileobj
                try:
                    b = s.recv(4096)
                except BlockingIOError:
                    continue
                except OSError:
                    b = b""
                if b:
                    self.answered.append(b)
                else:
                    self._close(s, time.monotonic())
            now = time.monotonic()
            if now >= next_byte:
                next_byte = now + 0.5
                for s in list(self.slow):
                    if s in self.closed:
                        continue
                    try:
                        s.send(b"a")
                    except OSError:
                        self._close(s, now)

    def finish(self, limit_s):
        self.thread.join(timeout=limit_s)
        self.stop.set()
        self.thread.join(timeout=5)
        for s in self.opened:
            s.close()


def test_idle_and_slowloris_connections_leave_a_client_served(servers, tiny_model):
    sv = start(servers, tiny_model, "--header-timeout-ms", HEADER_MS)
    c = Client("127.0.0.1", sv.port, sv.contract, token=TOKEN, timeout=10, source="127.0.0.2")
    sv.clients.append(c)
    seq = c.create()
    # 300 idle and 300 slowloris connections, 60 from each of ten addresses.
    t0 = time.monotonic()
    h = Hostile(sv.port, ["127.0.0.%d" % i for i in range(10, 15)],
                ["127.0.0.%d" % i for i in range(20, 25)], 60)
    assert len(h.opened) == 600
    # While they are open, the client launches and awaits, one step after another, on a new
    # connection every 20 steps (a connection opened before them proves little).
    lat = []
    while time.monotonic() - t0 < HEADER_MS / 1000 + 2.5 and len(lat) < 10000:
        a = time.monotonic()
        t = c.launch({"rows": [{"seq": seq, "tokens": [1]}]})
        c.await_(t)
        lat.append(time.monotonic() - a)
        if len(lat) % 20 == 0:
            c.call("POST", "/v1/effects", {"kind": "truncate", "seq": seq, "len": 0})
            c.close()
    h.finish(HEADER_MS / 1000 + 10)
    lat.sort()
    print("launch+await with 600 hostile connections: %d steps, p50 %.1f ms, max %.1f ms"
          % (len(lat), 1000 * lat[len(lat) // 2], 1000 * lat[-1]))
    assert len(lat) >= 20, lat
    assert lat[-1] < 3.0, "a step took %.2f s" % lat[-1]
    # Every hostile connection was closed by the server at its header deadline, not before.
    assert len(h.closed) == 600, "%d of 600 still open" % (600 - len(h.closed))
    assert not h.answered, h.answered[:3]
    waits = sorted(h.closed[s] - h.opened[s] for s in h.opened)
    assert waits[0] >= HEADER_MS / 1000 - 0.1, waits[:5]
    assert waits[-1] <= HEADER_MS / 1000 + SWEEP_SLACK_S, waits[-5:]
    # Keep-alive: the client's connection, idle past the deadline, is closed too, and the
    # next request (a GET, retried by the client) opens another.
    c.call("GET", "/healthz")
    assert sv.alive()
    assert sv.stop() == 0


def test_headers_deadline_counts_from_the_last_answer(servers, tiny_model):
    """On a kept-alive connection the deadline restarts when an answer is done; a second request
    whose headers trickle is cut like a first one."""
    sv = start(servers, tiny_model, "--header-timeout-ms", 1000)
    s = connect(sv.port, "127.0.0.2")
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    raw = b""
    while b"\r\n\r\n" not in raw or not raw.endswith(b"}"):
        raw += s.recv(4096)
    assert parse_answer(raw)[0] == 200
    t0 = time.monotonic()
    s.sendall(b"GET /healthz HTTP/1.1\r\n")
    for _ in range(10):  # one byte every 0.3 s, never a full header block
        time.sleep(0.3)
        try:
            s.sendall(b"X")
        except OSError:
            break
    raw, closed = read_all(s, 3)
    took = time.monotonic() - t0
    assert closed and raw == b"", raw
    assert 0.9 <= took <= 1.0 + SWEEP_SLACK_S, took
    s.close()
    assert sv.stop() == 0


# ---- connection caps ---------------------------------------------------------------------------


def test_per_address_limit_answers_503(servers, tiny_model, contract):
    sv = start(servers, tiny_model)  # --max-per-address 64 by default
    # The 65th connection the server accepts is refused, whichever it is: a
    # client's connect can return before the server's queue holds it (a full
    # accept queue drops the handshake's last packet and the client resends),
    # so the order of accepts need not be the order of connects.
    conns = [connect(sv.port, "127.0.0.3") for _ in range(65)]
    extra = first_readable(conns, 5)
    assert extra is not None, "no connection of 65 from one address was refused"
    held = [s for s in conns if s is not extra]
    raw, closed = read_all(extra, 5)
    assert closed, raw
    status, hdrs, body = parse_answer(raw)
    assert status == 503 and hdrs.get("connection") == "close", raw
    assert error_code(contract, status, hdrs, body) == ("too_many_connections",
                                                         {"max_per_address": 64})
    extra.close()
    # Another address is served meanwhile, and so is this one once a connection ends.
    c = Client("127.0.0.1", sv.port, sv.contract, token=TOKEN, source="127.0.0.4")
    sv.clients.append(c)
    c.call("GET", "/v1/facts")
    held.pop().close()
    time.sleep(0.3)
    again = Client("127.0.0.1", sv.port, sv.contract, token=TOKEN, source="127.0.0.3")
    sv.clients.append(again)
    again.call("GET", "/v1/facts")
    for s in held:
        s.close()
    assert sv.stop() == 0


def test_total_cap_answers_503(servers, tiny_model, contract):
    sv = start(servers, tiny_model, "--max-connections", 20, "--max-per-address", 0)
    held = [connect(sv.port, "127.0.0.%d" % (30 + i % 4)) for i in range(20)]
    for src in ("127.0.0.5", "127.0.0.6"):
        s = connect(sv.port, src)
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        raw, closed = read_all(s, 5)
        s.close()
        assert closed, raw
        status, hdrs, body = parse_answer(raw)
        assert status == 503 and hdrs.get("retry-after") == "1", raw
        assert error_code(contract, status, hdrs, body) == ("too_many_connections",
                                                             {"max_connections": 20})
    for s in held[:5]:
        s.close()
    time.sleep(0.3)
    c = Client("127.0.0.1", sv.port, sv.contract, token=TOKEN, source="127.0.0.5")
    sv.clients.append(c)
    c.call("GET", "/healthz")
    # The accept thread's refusals are counted with the HTTP layer's errors.
    m = parse_metrics(c.metrics())[0]
    assert metric(m, "devio_http_errors_total", code="too_many_connections") == 2
    for s in held[5:]:
        s.close()
    assert sv.stop() == 0


# ---- bodies without a token --------------------------------------------------------------------


def test_bodies_without_token_are_refused_unread(servers, tiny_model, contract):
    """200 POSTs declaring 1 MiB bodies, half sent, no token: each answered 401 at once, none of
    the bodies kept (the server's RSS grows by less than 30 MB)."""
    sv = start(servers, tiny_model)
    c = sv.client()
    c.call("GET", "/v1/facts")
    rss0 = vm_rss_kb(sv.proc.pid)
    half = b"x" * (512 * 1024)
    socks = []
    for i in range(200):
        s = connect(sv.port, "127.0.0.%d" % (40 + i % 8))
        s.setblocking(False)
        data = (b"POST /v1/launch HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: 1048576\r\n\r\n" + half)
        try:
            s.send(data)
        except OSError:
            pass  # refused and reset already: what matters is the answer and the RSS
        socks.append(s)
    rss_peak = rss0
    codes = []
    for s in socks:
        raw, _ = read_all(s, 5)
        rss_peak = max(rss_peak, vm_rss_kb(sv.proc.pid))
        assert raw, "no answer"
        status, hdrs, body = parse_answer(raw)
        codes.append(status)
        assert status == 401 and error_code(contract, status, hdrs, body)[0] == "unauthorized"
    rss1 = vm_rss_kb(sv.proc.pid)
    for s in socks:
        s.close()
    print("RSS %d kB before, peak %d kB, %d kB after 200 half-sent 1 MiB bodies"
          % (rss0, rss_peak, rss1))
    assert max(rss_peak, rss1) - rss0 < 30 * 1024
    c.call("GET", "/v1/facts")
    assert sv.stop() == 0


# ---- framing -------------------------------------------------------------------------------------

SMUGGLED = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
EFFECT = b'{"kind":"truncate","seq":1,"len":0}'


def framing_cases():
    auth = b"Authorization: Bearer " + TOKEN.encode() + b"\r\n"
    head = b"POST /v1/effects HTTP/1.1\r\nHost: x\r\n" + auth + b"Content-Type: application/json\r\n"
    n = str(len(EFFECT)).encode()
    n2 = str(len(EFFECT) + len(SMUGGLED)).encode()
    return {
        "conflicting Content-Length": head + b"Content-Length: " + n + b"\r\nContent-Length: " + n2
        + b"\r\n\r\n" + EFFECT + SMUGGLED,
        "equal Content-Length": head + b"Content-Length: " + n + b"\r\nContent-Length: " + n
        + b"\r\n\r\n" + EFFECT + SMUGGLED,
        "Content-Length and chunked": head + b"Content-Length: " + n
        + b"\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + SMUGGLED,
        "chunked and Content-Length": head + b"Transfer-Encoding: chunked\r\nContent-Length: " + n
        + b"\r\n\r\n0\r\n\r\n" + SMUGGLED,
        "gzip encoding": head + b"Transfer-Encoding: gzip\r\n\r\n" + EFFECT,
        "two encodings": head + b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"0\r\n\r\n" + SMUGGLED,
        "GET with two lengths": b"GET /v1/facts HTTP/1.1\r\nHost: x\r\n" + auth
        + b"Content-Length: 0\r\nContent-Length: 0\r\n\r\n" + SMUGGLED,
    }


@pytest.fixture(scope="module")
def shared(module_servers, tiny_model):
    return start(module_servers, tiny_model)


@pytest.mark.parametrize("case", sorted(framing_cases()))
def test_ambiguous_framing_is_refused(shared, contract, case):
    sv = shared
    s = connect(sv.port, "127.0.0.2")
    s.sendall(framing_cases()[case])
    raw, closed = read_all(s, 5)
    s.close()
    assert closed, raw
    status, hdrs, body = parse_answer(raw)
    assert status == 400 and hdrs.get("connection") == "close", raw
    assert error_code(contract, status, hdrs, body)[0] == "bad_framing", body
    assert raw.count(b"HTTP/1.1 ") == 1, "a second request was answered: %r" % raw


def test_chunked_body_still_served(shared):
    sv = shared
    c = sv.client()
    seq = c.create()
    s = connect(sv.port, "127.0.0.2")
    body = ('{"kind":"truncate","seq":%d,"len":0}' % seq).encode()
    s.sendall(b"POST /v1/effects HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN.encode()
              + b"\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
              + b"Connection: close\r\n\r\n" + b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n")
    raw, closed = read_all(s, 5)
    s.close()
    assert parse_answer(raw)[0] == 200, raw


def test_declared_length_over_limit_is_answered_at_once(shared, contract):
    """A 2 GB Content-Length is answered 413 before any of the body is sent, within a second."""
    sv = shared
    for method, path in (("POST", "/v1/launch"), ("PUT", "/v1/adapters/x")):
        s = connect(sv.port, "127.0.0.2")
        t0 = time.monotonic()
        s.sendall(method.encode() + b" " + path.encode() + b" HTTP/1.1\r\nHost: x\r\n"
                  + b"Authorization: Bearer " + TOKEN.encode()
                  + b"\r\nContent-Type: application/json\r\nContent-Length: 2000000000\r\n\r\n")
        raw, closed = read_all(s, 3)
        took = time.monotonic() - t0
        s.close()
        assert closed and took < 1.0, (took, raw)
        status, hdrs, body = parse_answer(raw)
        assert status == 413, raw
        assert error_code(contract, status, hdrs, body)[0] == "too_large"
    # The same with Expect: 100-continue: no 100 Continue is sent, only the refusal.
    s = connect(sv.port, "127.0.0.2")
    s.sendall(b"POST /v1/launch HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN.encode()
              + b"\r\nExpect: 100-continue\r\nContent-Length: 2000000000\r\n\r\n")
    raw, closed = read_all(s, 3)
    s.close()
    assert raw.startswith(b"HTTP/1.1 413 "), raw
