"""test_state_routes.py - a sequence's state moved between devio-server processes over HTTP:
GET /v1/sequences/{id}/state streams it out, POST /v1/sequences (application/octet-stream) takes it
in, and the two sequences step on alike, bit for bit. Every refusal leaves both servers as they
were: another model, an altered byte, --max-state-bytes, a busy sequence, a client or a server that
goes away half way, a teardown under an open export. Every wait is bounded; about 15 s in all.
"""
import hashlib
import http.client
import socket
import subprocess
import threading
import time

import pytest

from client import devio_client
from conftest import make_model
from history import wait_until

OCTET = "application/octet-stream"
PROMPT = [(7 * i + 3) % 250 + 1 for i in range(40)]


def header(a, name):
    for k, v in a.headers.items():
        if k.lower() == name.lower():
            return v
    return None


def export(c, seq, snapshots=None):
    """The state of seq as c's server streams it, checked against its Content-Length."""
    q = "" if snapshots is None else "?snapshots=%s" % ("true" if snapshots else "false")
    a = c.call("GET", "/v1/sequences/%d/state%s" % (seq, q))
    assert a.ctype == OCTET, a
    assert int(header(a, "Content-Length")) == len(a.raw) > 160, a
    return a.raw


def import_(c, data, expect=201, code=None, headers=None):
    a = c.request("POST", "/v1/sequences", raw=bytes(data), content_type=OCTET, headers=headers)
    assert a.status == expect, a
    if code is not None:
        assert a.code == code, a
    return a


def step_logits(c, seq, tokens):
    """One greedy step of seq; the token it samples and the sha256 of its logits (released)."""
    r = c.step({"rows": [{"seq": seq, "tokens": tokens, "logits": "last",
                          "sample": {"temperature": 0}}]})
    row = r["rows"][0]
    digest = hashlib.sha256(c.logits_raw(row["logits"])).hexdigest()
    c.effect({"kind": "release", "logits": row["logits"]})
    return row["tokens"], row["len"], digest


def prefill(c, n, chunk=200):
    s = c.create()
    done = 0
    while done < n:
        k = min(chunk, n - done)
        c.step({"rows": [{"seq": s, "tokens": [(done + i) % 250 + 1 for i in range(k)]}]})
        done += k
    return s


def kv(c):
    f = c.facts()
    return f["kv"], f["ssm"], f["logits_live"]


def test_moved_sequence_steps_alike(servers, tiny_model):
    """Prefill on A, export, import on B: the same greedy tokens and logits on both, step after
    step, and the two export the same bytes after."""
    a, b = servers.start(tiny_model), servers.start(tiny_model)
    ca, cb = a.client(), b.client()
    s = ca.create()
    ca.step({"rows": [{"seq": s, "tokens": PROMPT}]})
    state = export(ca, s)
    assert export(ca, s) == state and export(ca, s, snapshots=True) == state  # no snapshots here
    t = import_(cb, state).json["seq"]
    assert cb.seq(t)["len"] == ca.seq(s)["len"] == len(PROMPT)
    assert cb.seq(t)["blocks"] == ca.seq(s)["blocks"]
    tok = [11]
    for _ in range(4):
        ga, la, da = step_logits(ca, s, tok)
        gb, lb, db = step_logits(cb, t, tok)
        assert (ga, la, da) == (gb, lb, db)
        tok = ga
    assert export(ca, s) == export(cb, t)
    # The exporting sequence goes on alone once freed; the import is its own.
    ca.effect({"kind": "free", "seq": s})
    assert step_logits(cb, t, [3])[1] == len(PROMPT) + 5


def test_hybrid_state_with_snapshots(servers, bins, tmp_path):
    """A Bamba sequence with an SSM snapshot moves with it (snapshots=true): truncated back to the
    snapshot on both sides, the two step on alike."""
    model = tmp_path / "bamba"
    subprocess.run([str(bins.mkmodel), "--arch", "bamba", "--preset", "tiny", "--out", str(model)],
                   check=True, capture_output=True, timeout=120)
    a, b = servers.start(model), servers.start(model)
    ca, cb = a.client(), b.client()
    s = ca.create()
    ca.step({"rows": [{"seq": s, "tokens": PROMPT[:20], "snapshot": "end"}]})
    ca.step({"rows": [{"seq": s, "tokens": PROMPT[20:]}]})
    plain, full = export(ca, s, snapshots=False), export(ca, s, snapshots=True)
    assert len(full) > len(plain)
    t = import_(cb, full).json["seq"]
    assert cb.seq(t)["snapshots"] == ca.seq(s)["snapshots"] == [20]
    for c, q in ((ca, s), (cb, t)):
        c.effect({"kind": "truncate", "seq": q, "len": 20})
    assert step_logits(ca, s, [9]) == step_logits(cb, t, [9])
    # Without its snapshots the import has none to truncate to.
    u = import_(cb, plain).json["seq"]
    assert cb.seq(u)["snapshots"] == []


def test_refusals_change_nothing(servers, bins, tiny_model, tmp_path):
    """Another model, an altered byte, a state cut short, --max-state-bytes, a busy or unknown
    sequence: each refused with its code, and the refusing server holds nothing more after."""
    a = servers.start(tiny_model)
    ca = a.client()
    s = ca.create()
    ca.step({"rows": [{"seq": s, "tokens": PROMPT}]})
    state = export(ca, s)
    other = servers.start(make_model(bins, tmp_path / "other", seed=99))
    small = servers.start(tiny_model, ["--max-state-bytes", str(len(state) - 1)])
    co, cs = other.client(), small.client()
    before = [kv(c) for c in (ca, co, cs)]

    r = import_(co, state, 400, "invalid_input")
    assert "another model" in r.json["error"]["message"], r
    flipped = bytearray(state)
    flipped[len(state) // 2] ^= 1
    assert "checksum" in import_(ca, flipped, 400, "invalid_input").json["error"]["message"]
    import_(ca, state[:-1], 400, "invalid_input")
    import_(ca, state + b"\0", 400, "invalid_input")
    import_(ca, b"", 400, "invalid_input")
    r = import_(cs, state, 413, "too_large")
    assert "--max-state-bytes" in r.json["error"]["message"], r
    # Under it by its Content-Length, over it by the size its header declares: read, then refused.
    r = import_(cs, state[:len(state) - 2], 413, "too_large")
    assert "over the limit" in r.json["error"]["message"], r
    assert [kv(c) for c in (ca, co, cs)] == before
    assert [x["seq"] for x in ca.call("GET", "/v1/sequences").json["sequences"]] == [s]

    ca.call("GET", "/v1/sequences/999/state", expect=404, code="unknown_seq")
    ca.call("GET", "/v1/sequences/%d/state?snapshots=yes" % s, expect=400, code="invalid_input")
    t = ca.launch({"rows": [{"seq": s, "tokens": [5]}]})
    busy = ca.call("GET", "/v1/sequences/%d/state" % s, expect=409, code="seq_busy")
    assert busy.details == {"ticket": t}
    ca.await_(t)
    assert len(export(ca, s)) > len(state)
    # Without this content type a POST is the plain create, its body ignored.
    plain = ca.request("POST", "/v1/sequences", raw=state, content_type="text/plain")
    assert plain.status == 201 and ca.seq(plain.json["seq"])["len"] == 0


def test_import_is_keyed_like_create(servers, tiny_model):
    """The same Idempotency-Key and bytes: the first answer again, imported once; other bytes or
    a plain create under the key: 422 key_reused."""
    a = servers.start(tiny_model)
    c = a.client()
    s = c.create()
    c.step({"rows": [{"seq": s, "tokens": PROMPT}]})
    state = export(c, s)
    free0 = c.facts()["kv"]["blocks_free"]
    first = import_(c, state, headers={"Idempotency-Key": "move-1"})
    again = import_(c, state, headers={"Idempotency-Key": "move-1"})
    assert first.json == again.json and header(again, "Idempotent-Replayed") == "true"
    assert header(first, "Idempotent-Replayed") is None
    assert c.facts()["kv"]["blocks_free"] == free0 - c.seq(s)["blocks"]
    import_(c, state[:-1], 422, "key_reused", headers={"Idempotency-Key": "move-1"})
    r = c.request("POST", "/v1/sequences", headers={"Idempotency-Key": "move-1"})
    assert r.status == 422 and r.code == "key_reused", r
    assert c.facts()["kv"]["blocks_free"] == free0 - c.seq(s)["blocks"]


def test_waiting_on_the_device_holds_no_event_loop(stream):
    """One HTTP thread, a step in flight for STEP_MS: an export and an import both wait for it
    (the device reads and writes state between steps), on workers; meanwhile the same thread
    answers other connections at once."""
    step_ms = 800
    sv = stream("--http-threads", "1", step_ms=step_ms)
    c, probe = sv.client(), sv.client()
    busy, moved = c.create(), c.create()
    c.step({"rows": [{"seq": moved, "tokens": PROMPT}]})
    state = export(c, moved)
    for what in ("export", "import"):
        t = c.launch({"rows": [{"seq": busy, "tokens": [1]}]})
        got = {}
        worker = sv.client()
        if what == "export":
            run = lambda: got.update(a=worker.request("GET", "/v1/sequences/%d/state" % moved))
        else:
            run = lambda: got.update(a=worker.request("POST", "/v1/sequences", raw=state,
                                                      content_type=OCTET))
        th = threading.Thread(target=run)
        t0 = time.monotonic()
        th.start()
        time.sleep(0.1)
        p0 = time.monotonic()
        assert probe.call("GET", "/healthz").status == 200
        took = time.monotonic() - p0
        assert th.is_alive(), "the %s did not wait for the step in flight" % what
        assert took < step_ms / 1000 / 2, "%s held the only HTTP thread (%.3f s)" % (what, took)
        th.join(timeout=30)
        assert not th.is_alive()
        assert time.monotonic() - t0 >= step_ms / 1000 / 2
        a = got["a"]
        if what == "export":
            assert a.status == 200 and a.raw == state, a
        else:
            assert a.status == 201, a
            assert c.seq(a.json["seq"])["len"] == len(PROMPT)
        c.await_(t)


def open_export(port, seq):
    """GET seq's state on a socket with a small receive buffer (the kernel's autotuning would
    take megabytes): the answer's response, read as the caller likes; its connection with it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
    sock.settimeout(10)
    sock.connect(("127.0.0.1", port))
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.sock = sock
    conn.request("GET", "/v1/sequences/%d/state" % seq)
    resp = conn.getresponse()
    assert resp.status == 200, resp.read()
    return conn, resp


def pinned(c, seq):
    """Whether seq is pinned by an export under way: a launch on it answers seq_busy with no
    ticket (a ticket would name one); a launch that went through is awaited."""
    a = c.request("POST", "/v1/launch", {"rows": [{"seq": seq, "tokens": [1]}]})
    if a.status == 202:
        c.await_(a.json["ticket"])
        return False
    assert a.status == 409 and a.code == "seq_busy", a
    return True


def slow_half_import(port, data, pieces=8, pause=0.05):
    """A socket that declares all of data and sends its first half, slowly; left open."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(("POST /v1/sequences HTTP/1.1\r\nHost: x\r\nContent-Type: %s\r\n"
                  "Content-Length: %d\r\n\r\n" % (OCTET, len(data))).encode())
    half = len(data) // 2
    step = half // pieces + 1
    for i in range(0, half, step):
        sock.sendall(data[i:min(i + step, half)])
        time.sleep(pause)
    return sock


def test_server_killed_mid_import_leaves_the_source_alone(servers, small_model):
    """A's state streams to B a piece at a time; half way B is killed (kill -9) and the reader of
    A's export goes away short of its end. A's sequence is unpinned and unchanged: it steps to the
    logits a full import of the same state (on C) gives."""
    a, b, oracle = (servers.start(small_model) for _ in range(3))
    ca, cc = a.client(), oracle.client()
    s = prefill(ca, 1000)
    info, facts = ca.seq(s), kv(ca)
    state = export(ca, s)
    assert len(state) > 12 << 20  # far more than the sockets between hold: mid-stream below
    t = import_(cc, state).json["seq"]
    want = step_logits(cc, t, [42])

    src, resp = open_export(a.port, s)
    assert int(resp.getheader("Content-Length")) == len(state)
    assert resp.read(256 << 10) == state[:256 << 10]
    sink = slow_half_import(b.port, state)
    # Pinned while its bytes stream: a launch on it is refused, nothing launched.
    assert pinned(ca, s)
    b.kill()
    sink.close()
    src.sock.shutdown(socket.SHUT_RDWR)
    src.close()

    def unpinned():
        return ca.request("GET", "/v1/sequences/%d/state" % s).status == 200
    assert wait_until(unpinned, timeout=10), "A's export was never closed"
    assert ca.seq(s) == info and kv(ca) == facts
    assert step_logits(ca, s, [42]) == want


def test_teardown_closes_what_is_under_way(servers, small_model):
    """A teardown with an export half sent and an import half received: the export is cut short
    (the connection closed before its Content-Length), the import answered 503 torn_down, and the
    server goes on answering."""
    a = servers.start(small_model)
    c = a.client()
    s = prefill(c, 1000)
    state = export(c, s)
    src, resp = open_export(a.port, s)
    got = resp.read(1 << 20)
    sock = slow_half_import(a.port, state, pieces=4, pause=0.01)
    time.sleep(0.2)
    assert pinned(c, s), "the export ended before the teardown: nothing was under way"
    assert c.call("POST", "/v1/teardown").json["torn_down"] is True
    try:
        while True:
            more = resp.read(1 << 20)
            if not more:
                break
            got += more
    except (http.client.IncompleteRead, ConnectionError) as e:
        got += getattr(e, "partial", b"")
    assert len(got) < len(state)
    src.close()
    half = len(state) // 2
    sock.sendall(state[half:])
    reply = b""
    sock.settimeout(10)
    while not reply.endswith(b"}}"):
        chunk = sock.recv(65536)
        if not chunk:
            break
        reply += chunk
    sock.close()
    assert reply.startswith(b"HTTP/1.1 503"), reply[:300]
    assert b'"code":"torn_down"' in reply, reply[:300]
    c.call("GET", "/v1/sequences/%d/state" % s, expect=503, code="torn_down")
    assert c.call("GET", "/healthz").status == 200
    assert a.alive()


def test_python_client(servers, tiny_model):
    """clients/python: export_state and import_state, and a refusal raised as DevioError."""
    a, b = servers.start(tiny_model), servers.start(tiny_model)
    with devio_client.Client("http://127.0.0.1:%d" % a.port, timeout=30) as ca, \
            devio_client.Client("http://127.0.0.1:%d" % b.port, timeout=30) as cb:
        s = ca.create_sequence()
        ca.step({"rows": [{"seq": s, "tokens": PROMPT}]})
        data = ca.export_state(s)
        assert data == ca.export_state(s, snapshots=True)
        t = cb.import_state(data)
        assert cb.sequence(t)["len"] == len(PROMPT)
        assert cb.import_state(data, key="k") == cb.import_state(data, key="k") != t
        once = cb.import_state(data, keyed=False)   # no key: a new sequence each time
        assert once not in (t, cb.import_state(data, keyed=False))
        assert cb.export_state(once) == data
        for keyed in (True, False):
            with pytest.raises(devio_client.DevioError) as e:
                cb.import_state(data[:100], keyed=keyed)
            assert (e.value.status, e.value.code) == (400, "invalid_input")
        with pytest.raises(devio_client.DevioError) as e:
            ca.export_state(12345)
        assert (e.value.status, e.value.code, e.value.details) == (404, "unknown_seq",
                                                                   {"seq": 12345})


def chunked_import(port, pieces):
    """POST pieces as a chunked body; the answer's status line and body, or None when the
    server closed the connection without one."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    head = ("POST /v1/sequences HTTP/1.1\r\nHost: x\r\nContent-Type: %s\r\n"
            "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n" % OCTET).encode()
    reply = b""
    try:
        sock.sendall(head)
        for p in pieces:
            sock.sendall(b"%x\r\n" % len(p) + p + b"\r\n")
        sock.sendall(b"0\r\n\r\n")
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            reply += chunk
    except (BrokenPipeError, ConnectionResetError):
        pass
    finally:
        sock.close()
    return reply or None


def test_chunked_bodies(servers, tiny_model):
    """A state sent without Content-Length: taken in pieces as any other; one that runs past
    --max-state-bytes has its connection closed, unanswered, and holds nothing."""
    a = servers.start(tiny_model, ["--max-state-bytes", "100000"])
    c = a.client()
    s = c.create()
    c.step({"rows": [{"seq": s, "tokens": PROMPT}]})
    state = export(c, s)
    free0 = kv(c)
    reply = chunked_import(a.port, [state[i:i + 999] for i in range(0, len(state), 999)])
    assert reply.startswith(b"HTTP/1.1 201"), reply
    t = int(reply.split(b'"seq":')[1].split(b"}")[0])
    assert c.seq(t)["len"] == len(PROMPT)
    c.call("DELETE", "/v1/sequences/%d" % t)
    assert kv(c) == free0
    assert chunked_import(a.port, [state] + [bytes(50000)] * 3) is None
    assert kv(c) == free0 and a.alive()
