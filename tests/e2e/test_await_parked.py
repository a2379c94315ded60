"""test_await_parked.py - awaits that wait without holding an HTTP thread: parked, resumed when the step
settles or the timeout passes, more of them than threads, and drained on SIGTERM. Every wait is bounded.

The device is the stream test backend told to make each step last STEP_MS
(STREAM_BACKEND_STEP_MS), so that a ticket is reliably pending for a known time.
"""
import signal
import threading
import time

import pytest
from history import db_rows

STEP_MS = 600


def plan1(seq, tokens):
    return {"rows": [{"seq": seq, "tokens": tokens}]}


@pytest.fixture
def slow(servers, tiny_model, bins):
    """Start a server on a slow stream device with extra flags."""
    def start(*args):
        return servers.start(tiny_model, ["--backend", "stream", "--backend-path",
                                          bins.root / "tests" / "backend", *args],
                             env={"STREAM_BACKEND_STEP_MS": str(STEP_MS)})
    return start


def in_threads(fns, timeout=60):
    """Run each fn on its own thread; their results (or exceptions) in order."""
    out = [None] * len(fns)

    def run(i, fn):
        try:
            out[i] = fn()
        except Exception as e:  # returned to the test
            out[i] = e

    ths = [threading.Thread(target=run, args=(i, fn)) for i, fn in enumerate(fns)]
    for t in ths:
        t.start()
    for t in ths:
        t.join(timeout=timeout)
    assert not any(t.is_alive() for t in ths), "a request never answered"
    return out


def timed(fn):
    t0 = time.monotonic()
    r = fn()
    return r, time.monotonic() - t0



def test_parked_await_resumed_by_its_step(slow):
    """One HTTP thread: while an await waits for a slow step, the same thread still answers
    other connections; the await answers 200 once the step settles, and only then."""
    sv = slow("--http-threads", "1")
    c, probe = sv.client(), sv.client()
    s = c.create()
    t0 = time.monotonic()
    t = c.launch(plan1(s, [1, 2, 3]))
    got = {}
    th = threading.Thread(target=lambda: got.update(a=c.request("POST", "/v1/tickets/%d/await" % t)))
    th.start()
    time.sleep(0.1)
    _, took = timed(lambda: probe.call("GET", "/healthz"))
    assert took < STEP_MS / 1000 / 2, "the only HTTP thread was held by the await (%.3f s)" % took
    assert probe.facts()["tickets_in_flight"] == 1 and th.is_alive()
    th.join(timeout=30)
    assert not th.is_alive()
    a = got["a"]
    assert a.status == 200 and a.json["ticket"] == t and a.json["rows"][0]["len"] == 3, a
    assert time.monotonic() - t0 >= STEP_MS / 1000
    assert a.json["timing"]["compute_us"] >= STEP_MS * 1000
    assert probe.facts()["tickets_in_flight"] == 0
    assert [x["status"] for x in probe.tickets("?limit=1")["tickets"]] == ["ok"]
    assert sv.stop() == 0


def test_parked_await_times_out(slow):
    """An await whose timeout passes while it is parked answers 202 pending at the
    timeout, not at the step's end; the ticket stays in flight and a later await gets it."""
    sv = slow("--http-threads", "1")
    c = sv.client()
    s = c.create()
    t = c.launch(plan1(s, [4, 5]))
    a, took = timed(lambda: c.request("POST", "/v1/tickets/%d/await?timeout_ms=150" % t))
    assert a.status == 202 and a.json == {"ticket": t, "status": "pending"}, a
    assert 0.15 <= took < STEP_MS / 1000, took
    assert c.seq(s)["busy"] == t
    r = c.await_(t)
    assert r["ticket"] == t and r["rows"][0]["len"] == 2
    assert sv.stop() == 0


def test_awaits_beyond_the_http_threads(slow):
    """Twelve awaits parked at once on two HTTP threads: six on their own tickets, six with a
    short timeout. The timeouts answer on time, health answers meanwhile, every ticket
    settles exactly once."""
    sv = slow("--http-threads", "2", "--max-depth", "6")
    c = sv.client()
    seqs = [c.create() for _ in range(6)]
    tickets = [c.launch(plan1(s, [k + 1])) for k, s in enumerate(seqs)]
    clients = [sv.client() for _ in range(12)]
    probe = sv.client()
    last = tickets[-1]

    def full(k):
        return lambda: timed(lambda: clients[k].request("POST", "/v1/tickets/%d/await" % tickets[k]))

    def short(k):
        return lambda: timed(lambda: clients[6 + k].request(
            "POST", "/v1/tickets/%d/await?timeout_ms=300" % last))

    def health():
        time.sleep(0.1)
        return timed(lambda: probe.call("GET", "/healthz"))

    out = in_threads([full(k) for k in range(6)] + [short(k) for k in range(6)] + [health])
    for r in out:
        assert not isinstance(r, Exception), r
    for k in range(6):
        a, _ = out[k]
        assert a.status == 200 and a.json["ticket"] == tickets[k], a
    for a, took in out[6:12]:
        # The last ticket settles after six slow steps, long after 300 ms.
        assert a.status == 202 and a.json["status"] == "pending", a
        assert 0.3 <= took < 6 * STEP_MS / 1000 - 0.5, took
    assert out[12][1] < 1.0, "health waited %.3f s behind parked awaits" % out[12][1]
    assert c.facts()["tickets_in_flight"] == 0
    assert sv.stop() == 0


def test_sigterm_drains_parked_awaits(slow):
    """SIGTERM with three awaits parked on one HTTP thread: the drain serves each its step's
    answer, then the process exits 0 with no row left in flight."""
    sv = slow("--http-threads", "1", "--max-depth", "3", "--drain-ms", "20000")
    c = sv.client()
    seqs = [c.create() for _ in range(3)]
    tickets = [c.launch(plan1(s, [7, k])) for k, s in enumerate(seqs)]
    clients = [sv.client() for _ in range(3)]

    def waiter(k):
        return lambda: clients[k].request("POST", "/v1/tickets/%d/await" % tickets[k])

    def term():
        time.sleep(0.2)
        sv.proc.send_signal(signal.SIGTERM)
        return sv.proc.wait(timeout=60)

    out = in_threads([waiter(k) for k in range(3)] + [term])
    assert out[3] == 0, out[3]
    for k in range(3):
        assert not isinstance(out[k], Exception), out[k]
        assert out[k].status == 200 and out[k].json["ticket"] == tickets[k], out[k]
    assert db_rows(sv.db, "SELECT count(*) FROM tickets WHERE status='in_flight'") == [(0,)]
    assert sorted(db_rows(sv.db, "SELECT id, status FROM tickets")) == [(t, "ok") for t in tickets]
    sv.kill()


def test_teardown_waits_for_parked_awaits(slow):
    """POST /v1/teardown while an await is parked on the same single HTTP thread: the await
    gets its step's answer, then the teardown answers with nothing aborted."""
    sv = slow("--http-threads", "1")
    c, admin = sv.client(), sv.client()
    s = c.create()
    t = c.launch(plan1(s, [9, 9]))

    def teardown():
        time.sleep(0.1)
        return admin.request("POST", "/v1/teardown")

    a, d = in_threads([lambda: c.request("POST", "/v1/tickets/%d/await" % t), teardown])
    assert a.status == 200 and a.json["ticket"] == t, a
    assert d.status == 200 and d.json == {"torn_down": True, "aborted": 0}, d
    assert [x["status"] for x in admin.tickets("?limit=1")["tickets"]] == ["ok"]
    assert sv.stop() == 0
