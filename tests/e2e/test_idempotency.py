"""test_idempotency.py - answers that survive: Idempotency-Key on the routes that change state (a
retry gets the first answer and runs nothing twice, across a restart too), a key under way (409), a
key reused for another request (422), failures not recorded, and an await whose answer was lost on
the wire read again on a new connection. Every wait is bounded."""
import json
import socket
import threading
import time

import pytest

PROMPT = [5, 9, 2, 7, 3]


def plan1(seq, tokens, **row):
    r = {"seq": seq, "tokens": tokens}
    r.update(row)
    return {"rows": [r]}


@pytest.fixture(scope="module")
def server(module_servers, tiny_model):
    return module_servers.start(tiny_model)


@pytest.fixture
def c(server):
    return server.client()


def keyed(c, method, path, key, body=None, expect=200):
    return c.call(method, path, body, expect=expect, headers={"Idempotency-Key": key})


def replayed(a):
    return a.headers.get("Idempotent-Replayed") == "true"


def test_sequence_and_effects_run_once(c):
    first = keyed(c, "POST", "/v1/sequences", "seq-a", expect=201)
    again = keyed(c, "POST", "/v1/sequences", "seq-a", expect=201)
    assert again.json == first.json and replayed(again) and not replayed(first)
    s = first.json["seq"]
    # No second sequence was made: the next one takes the very next id.
    assert c.create() == s + 1
    c.step(plan1(s, PROMPT))
    fork = keyed(c, "POST", "/v1/effects", "fork-1", {"kind": "fork", "seq": s})
    fork2 = keyed(c, "POST", "/v1/effects", "fork-1", {"seq": s, "kind": "fork"})  # keys reordered
    assert fork2.json == fork.json and replayed(fork2)
    assert c.create() == fork.json["seq"] + 1
    # A sample drawn again would be drawn anew; a retry gets the first draw.
    h = c.step(plan1(s, [4], logits="last"))["rows"][0]["logits"]
    body = {"kind": "sample", "logits": h, "params": {"temperature": 1.0, "seed": 3}}
    a = keyed(c, "POST", "/v1/effects", "draw-1", body)
    assert keyed(c, "POST", "/v1/effects", "draw-1", body).json == a.json
    # DELETE is keyed too: the retry of a free answers what the free did, not 404.
    d1 = keyed(c, "DELETE", "/v1/sequences/%d" % s, "free-1")
    d2 = keyed(c, "DELETE", "/v1/sequences/%d" % s, "free-1")
    assert d1.json == d2.json and d1.json["freed_logits"] == 1 and replayed(d2)
    c.call("DELETE", "/v1/sequences/%d" % s, expect=404, code="unknown_seq")


def test_launch_runs_once(c):
    s = c.create()
    body = plan1(s, PROMPT, sample={"temperature": 0})
    t = keyed(c, "POST", "/v1/launch", "launch-1", body, expect=202)
    t2 = keyed(c, "POST", "/v1/launch", "launch-1", body, expect=202)
    assert t2.json == t.json and replayed(t2)
    assert c.facts()["tickets_in_flight"] == 1 and c.seq(s)["len"] == len(PROMPT)
    r = c.await_(t.json["ticket"])
    # /v1/step: the retry gets the same step result, and the sequence grew once.
    st = keyed(c, "POST", "/v1/step", "step-1", plan1(s, r["rows"][0]["tokens"]))
    st2 = keyed(c, "POST", "/v1/step", "step-1", plan1(s, r["rows"][0]["tokens"]))
    assert st2.json == st.json and replayed(st2)
    assert c.seq(s)["len"] == len(PROMPT) + 1


def test_key_reused_and_failures_not_recorded(c):
    s = c.create()
    c.step(plan1(s, PROMPT))
    keyed(c, "POST", "/v1/effects", "k", {"kind": "snapshot", "seq": s})
    e = keyed(c, "POST", "/v1/effects", "k", {"kind": "fork", "seq": s}, expect=422)
    assert e.code == "key_reused" and "POST /v1/effects" in e.json["error"]["message"]
    assert keyed(c, "POST", "/v1/sequences", "k", expect=422).code == "key_reused"
    # A failure changed nothing and is not recorded: the same request runs again.
    body = {"kind": "truncate", "seq": s, "len": 7}
    assert keyed(c, "POST", "/v1/effects", "t", body, expect=400).code == "invalid_input"
    c.step(plan1(s, [1, 2, 3]))
    assert keyed(c, "POST", "/v1/effects", "t", body).json["len"] == 7
    # Keys are visible ASCII, 1 to 128 bytes.
    for bad in ("", "a" * 129, "with space"):
        r = c.request("POST", "/v1/sequences", headers={"Idempotency-Key": bad})
        assert r.status == 400 and r.code == "invalid_input", r
    assert keyed(c, "POST", "/v1/sequences", "a" * 128, expect=201).json["seq"] > 0


def test_key_in_use(servers, tiny_model, bins):
    """A retry that comes while the first try still runs is told so, then replayed."""
    srv = servers.start(tiny_model, ["--backend", "stream", "--backend-path",
                                     bins.root / "tests" / "backend"],
                        env={"STREAM_BACKEND_STEP_MS": "400"})
    c = srv.client()
    s = c.create()
    body = plan1(s, PROMPT, sample={"temperature": 0})
    got = {}

    def first():
        got["a"] = srv.client().call("POST", "/v1/step", body,
                                     headers={"Idempotency-Key": "slow"})

    th = threading.Thread(target=first)
    th.start()
    deadline = time.monotonic() + 10
    while c.seq(s)["busy"] is None and time.monotonic() < deadline:
        time.sleep(0.01)
    busy = c.request("POST", "/v1/step", body, headers={"Idempotency-Key": "slow"})
    th.join(30)
    assert not th.is_alive()
    assert busy.status == 409 and busy.code == "key_in_use", busy
    assert busy.headers.get("Retry-After") == "1"
    again = keyed(c, "POST", "/v1/step", "slow", body)
    assert again.json == got["a"].json and replayed(again)
    assert c.seq(s)["len"] == len(PROMPT)


def _retry_until_answered(c, method, path, key, body, deadline_s=20):
    """Retry with the key while it says key_in_use (bounded)."""
    deadline = time.monotonic() + deadline_s
    while True:
        a = c.request(method, path, body, headers={"Idempotency-Key": key})
        if a.status != 409 or a.code != "key_in_use" or time.monotonic() > deadline:
            return a
        time.sleep(0.05)


def _send_and_go(port, route, key, body, wait_busy=None):
    """Send a keyed request and close the connection by RST, at once or once `wait_busy()`."""
    raw = json.dumps(body)
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(("POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  "Idempotency-Key: %s\r\nContent-Length: %d\r\n\r\n%s"
                  % (route, key, len(raw), raw)).encode())
    if wait_busy:
        deadline = time.monotonic() + 10
        while not wait_busy() and time.monotonic() < deadline:
            time.sleep(0.005)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    sock.close()


@pytest.mark.parametrize("when", ["at_once", "mid_step"])
def test_client_gone(servers, tiny_model, bins, when):
    """A keyed /v1/step or /v1/launch whose client goes (right after sending, or while the step
    runs): the retry gets the step's answer once it settles, or the launch's ticket, instead of
    running a second step."""
    srv = servers.start(tiny_model, ["--backend", "stream", "--backend-path",
                                     bins.root / "tests" / "backend"],
                        env={"STREAM_BACKEND_STEP_MS": "300"})
    c = srv.client()
    for route in ("/v1/step", "/v1/launch"):
        key = "gone-%s-%s" % (when, route)
        s = c.create()
        body = plan1(s, PROMPT, sample={"temperature": 0})
        _send_and_go(srv.port, route, key, body,
                     (lambda: c.seq(s)["busy"] is not None) if when == "mid_step" else None)
        a = _retry_until_answered(c, "POST", route, key, body)
        # Gone at once, the request may never have reached a handler: the retry then runs.
        assert a.status in (200, 202) and (replayed(a) or when == "at_once"), a
        ticket = a.json["ticket"]
        if route == "/v1/step":
            assert a.json["rows"][0]["len"] == len(PROMPT)
        else:
            assert a.json == {"ticket": ticket}
        # One step ran: the sequence grew once, in that ticket.
        assert c.seq(s)["len"] == len(PROMPT)
        assert [t["id"] for t in c.all_tickets() if s in t["seqs"]] == [ticket]


def test_keys_survive_a_restart(servers, tiny_model, tmp_path):
    db = tmp_path / "keys.db"
    srv = servers.start(tiny_model, db=db)
    c = srv.client()
    a = keyed(c, "POST", "/v1/sequences", "made-before", expect=201)
    s = a.json["seq"]
    step = keyed(c, "POST", "/v1/step", "step-before", plan1(s, PROMPT))
    assert srv.stop() == 0
    srv2 = servers.start(tiny_model, db=db)
    c2 = srv2.client()
    b = keyed(c2, "POST", "/v1/sequences", "made-before", expect=201)
    assert b.json == a.json and replayed(b)
    st = keyed(c2, "POST", "/v1/step", "step-before", plan1(s, PROMPT))
    assert st.json == step.json and replayed(st)
    # The new process made no sequence for the retry.
    fresh = c2.create()
    assert keyed(c2, "POST", "/v1/sequences", "made-after", expect=201).json["seq"] == fresh + 1


def test_lost_await_answer_is_read_again(server, c):
    """The client sends its await and goes before reading; a new connection gets the same tokens."""
    s = c.create()
    t = c.launch(plan1(s, PROMPT, sample={"temperature": 0.7, "seed": 11}, logits="last"))
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    req = ("POST /v1/tickets/%d/await HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n" % t)
    sock.sendall(req.encode())
    # The await took the ticket (the sequence is no longer busy) and its answer was sent to
    # nobody: the client is gone before reading a byte.
    deadline = time.monotonic() + 10
    while c.seq(s)["busy"] is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    sock.close()
    again = c.call("POST", "/v1/tickets/%d/await" % t)
    assert replayed(again)
    rec = c.call("GET", "/v1/tickets/%d" % t).json
    assert rec["answer"] == again.json
    row = again.json["rows"][0]
    assert len(row["tokens"]) == 1 and row["logits"] > 0
    # The handle the lost answer named is still there, owned by the sequence.
    assert any(h["logits"] == row["logits"] and h["seq"] == s
               for h in c.call("GET", "/v1/logits").json["handles"])
    assert json.loads(json.dumps(row)) == row
