"""test_answered_once.py - nothing answered twice, nothing answered wrong: a drain that answers the
steps it launched, keyed requests refused whole when their key cannot be written, ids that a stored
answer names never handed out again, key lookups and replays that a busy store never turns into
503 or 409, steps whose client went reaped, and health that never waits on the store.
Each test fails on a server without the rule it checks. Every loop and wait is bounded.
"""
import http.client
import json
import resource
import signal
import socket
import sqlite3
import struct
import threading
import time

import pytest
from history import db_rows, wait_until

FULL_BYTES = 4096  # below the sizes of the db and its WAL: every transaction's write fails


def plan1(seq, tokens, **row):
    r = {"seq": seq, "tokens": tokens}
    r.update(row)
    return {"rows": [r]}


def metric(text, key):
    for line in text.splitlines():
        if line.startswith(key + " "):
            return float(line.split()[-1])
    raise AssertionError("no metric %s" % key)


def keyed(c, method, path, key, body=None):
    return c.request(method, path, body, headers={"Idempotency-Key": key})


def replayed(a):
    return a.headers.get("Idempotent-Replayed") == "true"


def raw_post(port, path, body, timeout=30):
    """One request on a connection of its own: (status, parsed body)."""
    con = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        con.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        r = con.getresponse()
        return r.status, json.loads(r.read() or b"null")
    finally:
        con.close()


# ---- drain ---------------------------------------------------------------------------------

def test_a_drain_answers_every_step_it_launched(stream):
    """SIGTERM while /v1/step requests run: each step launched before it is answered 200 with
    its result and its row says ok; a step sent after it is refused 503 not_ready and runs
    nothing; the process exits 0 with nothing in flight."""
    sv = stream("--max-depth", "8", step_ms=150)
    cl = sv.client()
    seqs = [cl.create() for _ in range(4)]
    out = {}

    def step(s):
        out[s] = raw_post(sv.port, "/v1/step", plan1(s, [1, 2], sample={"temperature": 0}))

    th = [threading.Thread(target=step, args=(s,)) for s in seqs]
    for t in th:
        t.start()
    assert wait_until(lambda: cl.facts()["tickets_in_flight"] == len(seqs), timeout=10)
    sv.proc.send_signal(signal.SIGTERM)
    time.sleep(0.05)
    late = sv.client().request("POST", "/v1/step", plan1(seqs[0], [3]))
    for t in th:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in th)
    for s in seqs:
        status, body = out[s]
        assert status == 200, (s, status, body)
        assert body["rows"][0]["seq"] == s and len(body["rows"][0]["tokens"]) == 1, body
    assert late.status == 503 and late.code == "not_ready", late
    assert sv.proc.wait(timeout=30) == 0
    rows = db_rows(sv.db, "SELECT status, count(*) FROM tickets GROUP BY status")
    assert rows == [("ok", len(seqs))], rows


# ---- keys whose row cannot be written ---------------------------------------------------------

def test_keyed_requests_refused_whole_when_their_key_cannot_be_written(servers, tiny_model,
                                                                      tmp_path):
    """The history cannot grow (RLIMIT_FSIZE): a keyed create and a keyed fork answer 503
    store_unavailable and leave no sequence behind; once it can, the same keys run once."""
    sv = servers.start(tiny_model, db=tmp_path / "full.db", workdir=tmp_path / "a")
    c = sv.client(timeout=30)
    parent = c.create()
    c.step(plan1(parent, [1, 2, 3]))
    pid = sv.proc.pid
    try:
        resource.prlimit(pid, resource.RLIMIT_FSIZE, (FULL_BYTES, resource.RLIM_INFINITY))
        # A write fails first, so that the store knows; then both keyed requests come.
        c.request("POST", "/v1/launch", plan1(parent, [4]))
        assert wait_until(lambda: c.request("GET", "/readyz").status == 503, timeout=10)
        before = c.call("GET", "/v1/sequences").json["sequences"]
        a = keyed(c, "POST", "/v1/sequences", "full-create")
        f = keyed(c, "POST", "/v1/effects", "full-fork", {"kind": "fork", "seq": parent})
        for r in (a, f):
            assert r.status == 503 and r.code == "store_unavailable", r
        assert c.call("GET", "/v1/sequences").json["sequences"] == before
    finally:
        resource.prlimit(pid, resource.RLIMIT_FSIZE,
                         (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    assert wait_until(lambda: c.request("GET", "/readyz").status == 200, timeout=15)
    n0 = len(c.call("GET", "/v1/sequences").json["sequences"])
    a1 = keyed(c, "POST", "/v1/sequences", "full-create")
    a2 = keyed(c, "POST", "/v1/sequences", "full-create")
    f1 = keyed(c, "POST", "/v1/effects", "full-fork", {"kind": "fork", "seq": parent})
    f2 = keyed(c, "POST", "/v1/effects", "full-fork", {"kind": "fork", "seq": parent})
    assert a1.status == 201 and a2.json == a1.json and replayed(a2), (a1, a2)
    assert f1.status == 200 and f2.json == f1.json and replayed(f2), (f1, f2)
    assert len(c.call("GET", "/v1/sequences").json["sequences"]) == n0 + 2


# ---- ids that outlive a restart ----------------------------------------------------------------

def test_ids_a_stored_answer_names_are_never_handed_out_again(servers, tiny_model, tmp_path):
    """Sequences, forks and logits handles named by stored answers, then a restart on the same
    file: new ids are all above the old ones, and the old keys replay ids nobody holds."""
    db = tmp_path / "ids.db"
    sv = servers.start(tiny_model, db=db, workdir=tmp_path / "a")
    c = sv.client()
    s = keyed(c, "POST", "/v1/sequences", "ids-create").json["seq"]
    step = keyed(c, "POST", "/v1/step", "ids-step", plan1(s, [1, 2], logits="last"))
    h = step.json["rows"][0]["logits"]
    child = keyed(c, "POST", "/v1/effects", "ids-fork", {"kind": "fork", "seq": s}).json["seq"]
    assert sv.stop() == 0
    sv2 = servers.start(tiny_model, db=db, workdir=tmp_path / "b")
    c2 = sv2.client()
    fresh = c2.create()
    assert fresh > max(s, child), (fresh, s, child)
    h2 = c2.step(plan1(fresh, [1, 2], logits="last"))["rows"][0]["logits"]
    assert h2 > h, (h2, h)
    again = keyed(c2, "POST", "/v1/sequences", "ids-create")
    assert again.json == {"seq": s} and replayed(again), again
    assert keyed(c2, "POST", "/v1/step", "ids-step",
                 plan1(s, [1, 2], logits="last")).raw == step.raw
    live = [q["seq"] for q in c2.call("GET", "/v1/sequences").json["sequences"]]
    assert s not in live and child not in live, live


# ---- lookups a busy store must not refuse ---------------------------------------------------

def test_keyed_traffic_and_replays_on_a_healthy_store(stream):
    """Four clients with keys of their own, while others await answered tickets again: no
    keyed answer is 503, each is its own step's result (never an empty one while the store's
    writer still ends the launch), and every await of an answered ticket replays it."""
    sv = stream("--max-depth", "16", step_ms=0)
    cl = sv.client()
    done = cl.step(plan1(cl.create(), [1]))
    bad, replays = [], [0]
    t_end = time.monotonic() + 2.0

    def keyed_client(k):
        c = sv.client()
        s = c.create()
        i = 0
        while time.monotonic() < t_end:
            i += 1
            if i % 256 == 0:  # a new sequence before this one reaches max_seq_len
                s = c.create()
            r = keyed(c, "POST", "/v1/step", "c%d-%d" % (k, i), plan1(s, [1]))
            if r.status != 200 or r.json["ticket"] == 0 or r.json["rows"][0]["seq"] != s:
                bad.append(r)

    def re_awaiter():
        c = sv.client()
        while time.monotonic() < t_end:
            r = c.request("POST", "/v1/tickets/%d/await" % done["ticket"])
            if r.status != 200 or not replayed(r):
                bad.append(r)
            replays[0] += 1

    th = ([threading.Thread(target=keyed_client, args=(k,)) for k in range(4)] +
          [threading.Thread(target=re_awaiter) for _ in range(2)])
    for t in th:
        t.start()
    for t in th:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in th)
    assert replays[0] > 0
    assert not bad, bad[:5]


def test_concurrent_awaits_of_one_ticket_all_get_its_answer(stream):
    """Forty awaits of one ticket at once, sent while its step runs: each answers 200 with the
    same bytes; one took the ticket, the others replay it."""
    sv = stream(step_ms=300)
    cl = sv.client()
    t = cl.launch(plan1(cl.create(), [1, 2], sample={"temperature": 0}))
    out = []

    def await_it():
        con = http.client.HTTPConnection("127.0.0.1", sv.port, timeout=30)
        try:
            con.request("POST", "/v1/tickets/%d/await" % t)
            r = con.getresponse()
            out.append((r.status, r.read(), r.getheader("Idempotent-Replayed")))
        finally:
            con.close()

    th = [threading.Thread(target=await_it) for _ in range(40)]
    for x in th:
        x.start()
    for x in th:
        x.join(timeout=30)
    assert not any(x.is_alive() for x in th)
    assert sorted(set(st for st, _, _ in out)) == [200], [o for o in out if o[0] != 200][:3]
    assert len(set(body for _, body, _ in out)) == 1
    assert sum(1 for _, _, rep in out if rep != "true") == 1, out


# ---- steps whose client went ----------------------------------------------------------------

@pytest.mark.parametrize("reset", [False, True], ids=["fin", "rst"])
def test_a_step_closed_mid_way_is_reaped(stream, reset):
    """A /v1/step closed (FIN or RST) 100 ms into a 400 ms step: its row says reaped, the
    closed-reaped counter counts it, and its logits handle is released."""
    sv = stream(step_ms=400)
    cl = sv.client()
    s = cl.create()
    m0 = metric(cl.metrics(), 'devio_tickets_reaped_total{reason="closed"}')
    data = json.dumps(plan1(s, [1, 2], logits="last")).encode()
    sock = socket.create_connection(("127.0.0.1", sv.port), timeout=5)
    try:
        sock.sendall(b"POST /v1/step HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(data) + data)
        time.sleep(0.1)
        if reset:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    finally:
        sock.close()
    assert wait_until(lambda: metric(cl.metrics(),
                                     'devio_tickets_reaped_total{reason="closed"}') == m0 + 1)
    assert wait_until(lambda: cl.call("GET", "/v1/logits").json["handles"] == [])
    assert db_rows(sv.db, "SELECT status FROM tickets") == [("reaped",)]
    assert cl.seq(s)["busy"] is None


# ---- health that never waits ------------------------------------------------------------------

def probe_health(port, seconds):
    """/healthz on a new connection each time (so that probes land on every HTTP thread) for
    `seconds`: the slowest answer's time."""
    worst = 0.0
    t_end = time.monotonic() + seconds
    while time.monotonic() < t_end:
        t0 = time.monotonic()
        con = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        con.request("GET", "/healthz")
        assert con.getresponse().status == 200
        con.close()
        worst = max(worst, time.monotonic() - t0)
        time.sleep(0.01)
    return worst


def test_health_never_waits_on_the_store(stream):
    """Another process holds the history locked while a step waits for its row: a DELETE, a
    fork and a truncate of other sequences, and a read of the step's logits handle, are sent
    meanwhile; every /healthz, each on a new connection, answers within 100 ms, and each of
    those requests is answered once the lock goes."""
    sv = stream("--http-threads", "2", step_ms=5)
    cl = sv.client()
    a, b, f, t = (cl.create() for _ in range(4))
    for s in (b, f, t):
        cl.step(plan1(s, [1, 2, 3]))
    lock = sqlite3.connect(str(sv.db), timeout=10, isolation_level=None)
    lock.execute("BEGIN EXCLUSIVE")
    out = {}

    def send(name, method, path, body=None):
        c = sv.client(timeout=30)
        out[name] = c.request(method, path, body)

    th = [threading.Thread(target=send, args=("step", "POST", "/v1/step",
                                              plan1(a, [1, 2], logits="last")))]
    try:
        th[0].start()
        assert wait_until(lambda: cl.facts()["tickets_in_flight"] == 1)
        th += [threading.Thread(target=send, args=args) for args in (
            ("free", "DELETE", "/v1/sequences/%d" % b),
            ("fork", "POST", "/v1/effects", {"kind": "fork", "seq": f}),
            ("truncate", "POST", "/v1/effects", {"kind": "truncate", "seq": t, "len": 1}))]
        for x in th[1:]:
            x.start()
        worst = probe_health(sv.port, 1.0)
    finally:
        lock.execute("ROLLBACK")
        lock.close()
    for x in th:
        x.join(timeout=30)
    assert not any(x.is_alive() for x in th)
    assert worst < 0.1, "a /healthz took %.3f s while the history was locked" % worst
    assert [out[k].status for k in ("step", "free", "fork", "truncate")] == [200] * 4, out


# ---- smaller edges ------------------------------------------------------------------------

def raw_exchange(port, data, timeout=3.0):
    """Send bytes, read until the server closes (or timeout): the bytes answered."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    out = b""
    try:
        s.sendall(data)
        while True:
            d = s.recv(65536)
            if not d:
                break
            out += d
    except socket.timeout:
        pass
    finally:
        s.close()
    return out


@pytest.fixture(scope="module")
def edge_server(module_servers, tiny_model):
    return module_servers.start(tiny_model, ["--max-body", str(64 << 20)])


def test_framing_that_two_readers_could_read_two_ways_is_refused(edge_server):
    """Whitespace before a header's colon and a folded Transfer-Encoding are 400 bad_framing
    in devio's JSON, the connection closed; a Content-Length that is not decimal is refused by
    libmicrohttpd before devio sees it, and nothing after it is answered."""
    c = edge_server.client()
    n0 = len(c.call("GET", "/v1/sequences").json["sequences"])
    for head in (b"Transfer-Encoding : chunked\r\n",
                 b"Content-Length: 5\r\nTransfer-Encoding:\r\n chunked\r\n",
                 b"Transfer-Encoding: chunked\r\n foo\r\nContent-Length: 5\r\n"):
        out = raw_exchange(edge_server.port,
                           b"POST /v1/sequences HTTP/1.1\r\nHost: x\r\n" + head +
                           b"\r\n0\r\n\r\nGET /v1/facts HTTP/1.1\r\nHost: x\r\n\r\n")
        assert out.startswith(b"HTTP/1.1 400 "), out
        assert b'"code":"bad_framing"' in out and b"X-Request-Id" in out, out
        assert out.count(b"HTTP/1.1") == 1, out  # the hidden request is never answered
    for value in (b"+0", b"0x0", b"-1", b"0,0"):
        out = raw_exchange(edge_server.port,
                           b"POST /v1/sequences HTTP/1.1\r\nHost: x\r\nContent-Length: " + value +
                           b"\r\n\r\nGET /v1/facts HTTP/1.1\r\nHost: x\r\n\r\n")
        assert out.startswith(b"HTTP/1.1 400 "), out
        assert b'"tickets_in_flight"' not in out, out
    assert len(c.call("GET", "/v1/sequences").json["sequences"]) == n0


def test_keys_taken_once_and_compared_by_value(edge_server):
    """Two Idempotency-Key headers are 400; a retry whose numbers are spelled another way
    (0.0 for 0) is the same request and replays."""
    c = edge_server.client()
    con = http.client.HTTPConnection("127.0.0.1", edge_server.port, timeout=10)
    con.putrequest("POST", "/v1/sequences")
    con.putheader("Idempotency-Key", "twice-a")
    con.putheader("Idempotency-Key", "twice-b")
    con.endheaders()
    r = con.getresponse()
    body = json.loads(r.read())
    con.close()
    assert r.status == 400 and body["error"]["code"] == "invalid_input", body
    assert "Idempotency-Key" in body["error"]["message"]
    s = c.create()
    h = c.step(plan1(s, [1, 2], logits="last"))["rows"][0]["logits"]
    first = keyed(c, "POST", "/v1/effects", "spelled",
                  {"kind": "sample", "logits": h, "params": {"temperature": 0}})
    again = c.request("POST", "/v1/effects",
                      raw='{"kind":"sample","logits":%d,"params":{"temperature":0.0}}' % h,
                      headers={"Idempotency-Key": "spelled"})
    assert first.status == 200 and again.status == 200 and replayed(again), again
    assert again.raw == first.raw


def test_a_huge_body_is_refused_before_it_is_decoded(edge_server):
    """A 20 MB logit_bias (1.6 million distinct ids) under --max-body 64 MiB: 413 within a
    second, well under 100 MB of extra memory, and /healthz answers meanwhile."""
    c = edge_server.client()
    s = c.create()
    bias = ",".join('"%d":-1' % i for i in range(1_600_000))
    body = '{"rows":[{"seq":%d,"tokens":[1],"sample":{"temperature":0,"logit_bias":{%s}}}]}' % (
        s, bias)
    pid = edge_server.proc.pid

    def hwm_kb():
        for line in open("/proc/%d/status" % pid):
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
        raise AssertionError("no VmHWM")

    before = hwm_kb()
    worst = [0.0]
    done = threading.Event()

    def probe():
        while not done.is_set():
            worst[0] = max(worst[0], probe_health(edge_server.port, 0.05))

    th = threading.Thread(target=probe)
    th.start()
    t0 = time.monotonic()
    r = c.request("POST", "/v1/step", raw=body)
    took = time.monotonic() - t0
    done.set()
    th.join(timeout=30)
    assert r.status == 413 and r.code == "too_large", r
    assert took < 1.0, took
    assert hwm_kb() - before < 100 * 1024, (before, hwm_kb())
    assert worst[0] < 0.1, worst
