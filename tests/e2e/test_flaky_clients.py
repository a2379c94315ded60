"""test_flaky_clients.py - a device that flaky clients cannot wedge: steps whose connection closes
mid-way (FIN or RST), tickets launched and never awaited (leases), a history file locked or pulled
away, signals a process manager sends, and the small input edges. Every loop and wait is bounded.

Each test fails on a server without the rule it checks: an orphaned /v1/step holds its depth slot
and its sequence for ever, an unawaited ticket blocks every launch, a locked file stalls /healthz
for seconds, an unlinked file goes unnoticed, SIGHUP kills the process.
"""
import json
import os
import random
import signal
import socket
import sqlite3
import struct
import threading
import time

import pytest
from history import db_rows, wait_until


def plan1(seq, tokens, **row):
    r = {"seq": seq, "tokens": tokens}
    r.update(row)
    return {"rows": [r]}



def metric(text, name, labels=""):
    key = name + ("{%s}" % labels if labels else "")
    for line in text.splitlines():
        if line.startswith(key + " "):
            return float(line.split()[-1])
    raise AssertionError("no metric %s" % key)


def flaky_step(port, body, close_after_s, reset):
    """POST /v1/step and close the connection close_after_s later, by FIN or by RST."""
    data = json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        s.sendall(b"POST /v1/step HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(data) + data)
        time.sleep(close_after_s)
        if reset:  # SO_LINGER 0: close() sends RST
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    finally:
        s.close()


@pytest.mark.parametrize("reset", [False, True], ids=["fin", "rst"])
def test_steps_closed_mid_way_leave_nothing_in_flight(stream, reset):
    """Clients close /v1/step after 0-30 ms, by FIN or RST, while another client steps: every
    ticket is settled by the server, no sequence stays busy, and the good client never waits
    on a depth slot for ever."""
    sv = stream("--max-depth", "4", "--ticket-lease-ms", "0")
    cl = sv.client()
    seqs = [cl.create() for _ in range(8)]
    good = cl.create()
    stop = threading.Event()
    errors, good_steps = [], [0]

    def good_client():
        c = sv.client()
        try:
            while not stop.is_set():
                r = c.request("POST", "/v1/step", plan1(good, [1]))
                if r.status == 409 and r.code == "depth_exceeded":
                    time.sleep(0.002)
                    continue
                assert r.status == 200, r
                good_steps[0] += 1
        except Exception as e:  # reported below
            errors.append(repr(e))

    def flaky(k):
        r = random.Random(k)
        for i in range(30):
            flaky_step(sv.port, plan1(seqs[(k * 30 + i) % len(seqs)], [1, 2, 3]),
                       r.uniform(0, 0.03), reset)

    th = [threading.Thread(target=good_client)] + [threading.Thread(target=flaky, args=(k,))
                                                   for k in range(4)]
    for t in th:
        t.start()
    for t in th[1:]:
        t.join(timeout=120)
    stop.set()
    th[0].join(timeout=60)
    assert not any(t.is_alive() for t in th)
    assert not errors, errors
    assert good_steps[0] > 0
    # Every ticket settles and is reaped within a few steps of the last close.
    assert wait_until(lambda: cl.facts()["tickets_in_flight"] == 0), cl.facts()
    for s in seqs + [good]:
        assert cl.seq(s)["busy"] is None, cl.seq(s)
    assert wait_until(lambda: db_rows(sv.db, "SELECT count(*) FROM tickets WHERE"
                                             " status='in_flight'") == [(0,)])
    reaped = db_rows(sv.db, "SELECT count(*) FROM tickets WHERE status='reaped'")[0][0]
    m = cl.metrics()
    assert metric(m, "devio_tickets_reaped_total", 'reason="closed"') == reaped
    # The device is whole: a step on every sequence works.
    for s in seqs:
        assert cl.step(plan1(s, [4]))["rows"][0]["seq"] == s
    assert sv.alive()


def test_abandoned_tickets_are_reaped_after_their_lease(stream):
    """Two tickets launched and never awaited hold the device's depth of 2 only for their lease:
    then they are reaped (history 'reaped', handles released, metric), the next launch works,
    and awaiting a reaped ticket answers 410 ticket_reaped."""
    sv = stream("--max-depth", "2", "--ticket-lease-ms", "300")
    cl = sv.client()
    a, b, c = cl.create(), cl.create(), cl.create()
    ta = cl.launch(plan1(a, [1, 2], logits="last"))
    tb = cl.launch(plan1(b, [3], logits="last"))
    r = cl.request("POST", "/v1/launch", plan1(c, [1]))
    assert r.status == 409 and r.code == "depth_exceeded", r
    t0 = time.monotonic()
    assert wait_until(lambda: cl.facts()["tickets_in_flight"] == 0, timeout=10)
    assert time.monotonic() - t0 >= 0.25  # not before the lease
    f = cl.facts()
    assert f["logits_live"] == 0, f
    assert cl.seq(a)["busy"] is None and cl.seq(a)["len"] == 2
    tc = cl.launch(plan1(c, [1]))
    assert cl.await_(tc)["rows"][0]["len"] == 1
    for t in (ta, tb):
        r = cl.request("POST", "/v1/tickets/%d/await" % t)
        assert r.status == 410 and r.code == "ticket_reaped", r
        assert r.details == {"ticket": t}, r
        assert "--ticket-lease-ms" in r.json["error"]["message"]
    rows = dict(db_rows(sv.db, "SELECT id, status FROM tickets"))
    assert rows[ta] == "reaped" and rows[tb] == "reaped" and rows[tc] == "ok", rows
    page = cl.tickets("?status=reaped")
    assert sorted(t["id"] for t in page["tickets"]) == sorted([ta, tb])
    assert all(t["error"]["code"] == "ticket_reaped" for t in page["tickets"])
    m = cl.metrics()
    assert metric(m, "devio_tickets_reaped_total", 'reason="lease"') == 2
    assert metric(m, "devio_tickets_settled_total", 'status="reaped"') == 2


def test_a_ticket_being_awaited_is_not_reaped(stream):
    """A long poll that parks on a ticket takes its answer, however long the step, even past
    the lease."""
    sv = stream("--ticket-lease-ms", "100", step_ms=600)
    cl = sv.client()
    s = cl.create()
    t = cl.launch(plan1(s, [1]))
    assert cl.await_(t)["rows"][0]["len"] == 1


def test_health_answers_while_the_history_is_locked(stream):
    """Another process holds the SQLite file locked while clients launch and step: /healthz,
    /readyz and /metrics each answer within 100 ms all along; once the lock goes, steps work."""
    sv = stream("--http-threads", "2")
    cl = sv.client()
    seqs = [cl.create() for _ in range(6)]
    cl.step(plan1(seqs[0], [1]))
    lock = sqlite3.connect(str(sv.db), timeout=10, isolation_level=None)
    lock.execute("BEGIN EXCLUSIVE")
    answers = []

    def stepper(s):
        c = sv.client(timeout=30)
        for _ in range(3):
            answers.append(c.request("POST", "/v1/step", plan1(s, [2])).status)

    th = [threading.Thread(target=stepper, args=(s,)) for s in seqs]
    for t in th:
        t.start()
    probe = sv.client(timeout=10)
    worst = 0.0
    try:
        t_end = time.monotonic() + 3.0
        while time.monotonic() < t_end:
            for path in ("/healthz", "/readyz", "/metrics"):
                t0 = time.monotonic()
                r = probe.request("GET", path)
                worst = max(worst, time.monotonic() - t0)
                assert r.status in (200, 503), r
            time.sleep(0.05)
    finally:
        lock.execute("ROLLBACK")
        lock.close()
    for t in th:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in th)
    assert worst < 0.1, "a health probe took %.3f s while the history was locked" % worst
    assert set(answers) <= {200, 409, 503}, answers
    # Writable again (the store's heartbeat), then steps work.
    assert wait_until(lambda: probe.request("GET", "/readyz").status == 200, timeout=15)
    assert cl.step(plan1(seqs[1], [3]))["rows"][0]["seq"] == seqs[1]


def test_unlinked_history_is_noticed(stream):
    """The file at --db unlinked under a running server: the next launch is refused
    store_unavailable, /readyz says why within a second, the log says so once."""
    sv = stream()
    cl = sv.client()
    s = cl.create()
    cl.step(plan1(s, [1]))
    os.unlink(sv.db)
    r = cl.request("POST", "/v1/step", plan1(s, [2]))
    assert r.status == 503 and r.code == "store_unavailable", r
    assert r.headers.get("Retry-After") == "1"
    t0 = time.monotonic()
    ready = wait_until(lambda: probe_ready(cl), timeout=1.0)
    assert ready and time.monotonic() - t0 < 1.0
    assert "removed" in ready.json["error"]["message"], ready
    for _ in range(3):
        r = cl.request("POST", "/v1/launch", plan1(s, [2]))
        assert r.status == 503 and r.code == "store_unavailable", r
    assert cl.seq(s)["len"] == 1 and cl.seq(s)["busy"] is None
    log = sv.log_path.read_text(errors="replace")
    assert log.count("was removed under the running server") == 1, log[-3000:]


def probe_ready(cl):
    r = cl.request("GET", "/readyz")
    return r if r.status == 503 else None


def test_replaced_history_is_noticed(stream, tmp_path):
    """The path given to --db now names another file: refused as for an unlinked one."""
    sv = stream()
    cl = sv.client()
    s = cl.create()
    cl.step(plan1(s, [1]))
    other = tmp_path / "other.db"
    sqlite3.connect(str(other)).close()
    os.replace(other, sv.db)
    r = cl.request("POST", "/v1/launch", plan1(s, [2]))
    assert r.status == 503 and r.code == "store_unavailable", r
    assert "replaced" in cl.request("GET", "/readyz").json["error"]["message"]


def test_signals_a_manager_sends(stream):
    """SIGHUP, SIGUSR1 and SIGUSR2 to a busy server leave it serving (each logged);
    SIGQUIT drains and stops it like SIGTERM."""
    sv = stream()
    cl = sv.client()
    s = cl.create()
    stop = threading.Event()
    done, errors = [0], []

    def busy():
        c = sv.client()
        try:
            while not stop.is_set():
                c.step(plan1(s, [1]))
                done[0] += 1
        except Exception as e:  # reported below
            errors.append(repr(e))

    th = threading.Thread(target=busy)
    th.start()
    time.sleep(0.1)
    for sig in (signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        sv.proc.send_signal(sig)
        time.sleep(0.1)
        assert sv.alive()
    before = done[0]
    time.sleep(0.2)
    stop.set()
    th.join(timeout=60)
    assert not errors, errors
    assert done[0] > before
    log = sv.log_path.read_text(errors="replace")
    for name in ("SIGHUP", "SIGUSR1", "SIGUSR2"):
        assert "(%s) ignored" % name in log, log
    sv.proc.send_signal(signal.SIGQUIT)
    assert sv.proc.wait(timeout=30) == 0
    assert db_rows(sv.db, "SELECT count(*) FROM tickets WHERE status='in_flight'") == [(0,)]


def test_input_edges(servers, tiny_model):
    """Numbers checked in 64-bit before narrowing, tiny temperatures greedy, messages that match
    the schema, seq_busy naming its ticket, repeated query arguments refused."""
    sv = servers.start(tiny_model)
    cl = sv.client()

    def sample_step(sample):
        s = cl.create()
        return cl.request("POST", "/v1/step", plan1(s, [5, 6, 7], sample=sample))

    r = sample_step({"temperature": 1e308})
    assert r.status == 400 and r.code == "invalid_input", r
    msg = r.json["error"]["message"]
    assert "'temperature'" in msg and "3.40282347e+38" in msg and "1e+308" in msg, msg
    greedy = sample_step({"temperature": 0}).json["rows"][0]["tokens"]
    for sample in ({"temperature": 1e-40}, {"temperature": 1e-6, "seed": 3},
                   {"temperature": 1.0, "top_p": 1e-300, "seed": 5}):
        r = sample_step(sample)
        assert r.status == 200, r
        assert r.json["rows"][0]["tokens"] == greedy, (sample, r)
    r = sample_step({"min_p": 1.5})
    assert r.status == 400 and "'min_p'" in r.json["error"]["message"]
    r = sample_step({"seed": -1})
    assert r.status == 400 and "9223372036854775807]" in r.json["error"]["message"], r
    assert "18446744073709551615" not in r.json["error"]["message"]
    s = cl.create()
    r = cl.request("POST", "/v1/step", raw='{"rows":[{"seq":%d,"tokens":[1],'
                   '"sample":{"temperature":1e309}}]}' % s)
    assert r.status == 400 and "1.7976931348623157e308" in r.json["error"]["message"], r
    # seq_busy names the ticket that holds the sequence.
    t = cl.launch(plan1(s, [1]))
    r = cl.request("POST", "/v1/launch", plan1(s, [2]))
    assert r.status == 409 and r.code == "seq_busy", r
    assert r.details == {"row": 0, "ticket": t}, r
    res = cl.await_(t)
    h = cl.step(plan1(s, [2], logits="last"))["rows"][0]["logits"]
    r = cl.request("GET", "/v1/logits/%d?top=5&top=6" % h)
    assert r.status == 400 and "'top'" in r.json["error"]["message"], r
    assert cl.request("GET", "/v1/logits/%d?top=5" % h).status == 200
    assert res["rows"][0]["len"] == 1


def test_a_lost_await_answer_is_read_again(stream):
    """The client sends its await and goes before reading the answer: a new connection's await
    answers the same tokens, byte for byte, from the history; GET /v1/tickets/{id} shows it."""
    sv = stream(step_ms=200)
    cl = sv.client()
    s = cl.create()
    t = cl.launch(plan1(s, [5, 6, 7], sample={"temperature": 0, "logprobs": 2}))
    # The await parks until the step settles; the client waits past that, never reads, closes.
    raw = socket.create_connection(("127.0.0.1", sv.port), timeout=5)
    raw.sendall(b"POST /v1/tickets/%d/await HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n" % t)
    time.sleep(0.6)
    raw.close()
    assert wait_until(lambda: cl.facts()["tickets_in_flight"] == 0)
    a = cl.request("POST", "/v1/tickets/%d/await" % t)
    assert a.status == 200, a
    assert a.json["ticket"] == t and a.json["rows"][0]["tokens"][0] >= 0
    b = cl.request("POST", "/v1/tickets/%d/await" % t)
    assert b.status == 200 and b.raw == a.raw
    rec = cl.call("GET", "/v1/tickets/%d" % t).json
    assert rec["status"] == "ok" and rec["answer"] == a.json
    # The sequence moved on once: the answer was taken, not the step run twice.
    assert cl.seq(s)["len"] == 3 and cl.seq(s)["busy"] is None
    r = cl.request("GET", "/v1/tickets/%d" % (t + 1000))
    assert r.status == 404 and r.code == "unknown_ticket", r


def test_answers_survive_a_restart(servers, tiny_model, tmp_path):
    """An answer settled by one process is read again by the next on the same file; a ticket the
    first left in flight answers that it was aborted."""
    db = tmp_path / "keep.db"
    sv = servers.start(tiny_model, db=db)
    cl = sv.client()
    s = cl.create()
    t = cl.launch(plan1(s, [1, 2], sample={"temperature": 0}))
    first = cl.request("POST", "/v1/tickets/%d/await" % t)
    left = cl.launch(plan1(cl.create(), [3]))
    sv.kill()
    sv2 = servers.start(tiny_model, db=db)
    c2 = sv2.client()
    again = c2.request("POST", "/v1/tickets/%d/await" % t)
    assert again.status == 200 and again.raw == first.raw
    r = c2.request("POST", "/v1/tickets/%d/await" % left)
    assert r.status == 404 and r.code == "unknown_ticket" and "aborted" in r.json["error"]["message"]
