# long because these tests share one module-scoped server and one set of helpers for the contract's whole HTTP surface.
"""test_server.py - end-to-end tests of devio-server over real HTTP, every answer checked against the contract.
They drive real processes on loopback ports with SQLite files in temp dirs; they must never wait without a bound.
"""
import hashlib
import json
import math
import os
import re
import signal
import struct
import subprocess
import time
import threading

import pytest
from history import db_rows

VOCAB = 256  # the tiny preset


# ---- shared helpers ------------------------------------------------------------------


def f32(x):
    """x rounded to binary32 (JSON carries the logits as decimal)."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def floats(raw):
    return list(struct.unpack("<%df" % (len(raw) // 4), raw))


def top_of(values, k):
    """[id, value] of the k highest values, ties to the lower id."""
    order = sorted(range(len(values)), key=lambda i: (-values[i], i))
    return [[i, values[i]] for i in order[:k]]


def log_softmax_at(values, i):
    m = max(values)
    return values[i] - m - math.log(sum(math.exp(v - m) for v in values))


def prompt(n, salt=0):
    return [(k * 7 + salt * 31 + 1) % VOCAB for k in range(n)]


def row(seq, tokens, **kw):
    r = {"seq": seq, "tokens": tokens}
    r.update(kw)
    return r


def plan(*rows):
    return {"rows": list(rows)}



METRIC_LINE = re.compile(
    r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*"'
    r'(?:,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*")*)?,?\})? ([^ ]+)( -?[0-9]+)?$'
)


def parse_metrics(text):
    """Prometheus text format 0.0.4 -> ({(name, ((label, value), ...)): float}, {family: type}).
    Asserts every sample belongs to a family declared by # TYPE before it."""
    assert text.endswith("\n"), "exposition must end with a newline"
    types, samples = {}, {}
    for line in text.splitlines():
        if not line.strip():
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            assert kind in ("counter", "gauge", "histogram", "summary", "untyped"), line
            assert name not in types, "family declared twice: " + line
            types[name] = kind
            continue
        if line.startswith("#"):
            assert line.startswith("# HELP "), line
            continue
        m = METRIC_LINE.match(line)
        assert m, "not a sample line: %r" % line
        name, labels, value = m.group(1), m.group(3), m.group(4)
        family = name
        for suffix in ("_bucket", "_sum", "_count"):
            if name.endswith(suffix) and name[: -len(suffix)] in types:
                family = name[: -len(suffix)]
        assert family in types, "sample before its # TYPE: %r" % line
        lab = tuple(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', labels or ""))
        key = (name, lab)
        assert key not in samples, "sample twice: %r" % line
        samples[key] = float(value)
    return samples, types


def metric(samples, name, **labels):
    return samples.get((name, tuple(sorted(labels.items()))), samples.get((name, tuple(labels.items()))))


# ---- the shared server of this module --------------------------------------------------


@pytest.fixture(scope="module")
def srv(module_servers, tiny_model):
    return module_servers.start(tiny_model)


@pytest.fixture
def c(srv):
    cl = srv.client()
    yield cl
    cl.close()


# ---- health, readiness, the contract document -------------------------------------------


def test_health_ready_and_openapi(srv, c):
    assert c.call("GET", "/healthz").json == {"status": "ok"}
    assert c.call("GET", "/readyz").json == {"status": "ready"}
    a = c.call("GET", "/v1/openapi.yaml")
    assert a.ctype.startswith("application/yaml")
    with open(srv.contract.path, "rb") as f:
        assert a.raw == f.read(), "the served contract differs from api/openapi.yaml"


def test_request_schemas_refuse_what_the_server_refuses(srv, c):
    """Every request body schema the server checks field by field says
    additionalProperties: false, and the server does refuse an unknown field there."""
    schemas = srv.contract.doc["components"]["schemas"]
    for name in ("Plan", "Row", "SampleParams", "SampleEffect", "ForkEffect", "TruncateEffect",
                 "SnapshotEffect", "FreeEffect", "ReleaseEffect", "AdapterLoad", "AdapterCommand"):
        assert schemas[name].get("additionalProperties") is False, name
    s = c.create()
    for path, body in (("/v1/launch", {"rows": [{"seq": s, "tokens": [1]}], "x": 1}),
                       ("/v1/launch", {"rows": [{"seq": s, "tokens": [1], "x": 1}]}),
                       ("/v1/launch", {"rows": [{"seq": s, "tokens": [1],
                                                 "sample": {"temperature": 0, "x": 1}}]}),
                       ("/v1/effects", {"kind": "fork", "seq": s, "x": 1})):
        a = c.call("POST", path, body, expect=400, code="invalid_input")
        assert "unknown field 'x'" in a.json["error"]["message"], a


def test_unknown_routes_404(c):
    for path in ("/", "/v2/facts", "/v1", "/v1/nothing", "/v1/sequences/1/extra",
                 "/v1/tickets/1/await/more", "/v1/tickets/1/x",
                 "/healthz/x", "/v1/facts/1", "/v1/a/b/c/d/e/f/g"):
        for method in ("GET", "POST"):
            a = c.call(method, path, expect=404, code="not_found")
            assert a.details == {}


def test_bad_ids_400(c):
    """Something that is no id in an id's place is a bad request on a known route, not 404."""
    for method, path in (("GET", "/v1/sequences/abc"), ("DELETE", "/v1/sequences/-1"),
                         ("GET", "/v1/sequences/12345678901234567890"),
                         ("GET", "/v1/sequences/9223372036854775808"),
                         ("GET", "/v1/sequences/18446744073709551616"),
                         ("POST", "/v1/tickets/1x/await"), ("GET", "/v1/logits/x")):
        a = c.call(method, path, expect=400, code="invalid_input")
        assert "is not an id" in a.json["error"]["message"], a
    c.call("GET", "/v1/sequences/9223372036854775807", expect=404, code="unknown_seq")
    c.call("POST", "/v1/sequences/abc", expect=405, code="method_not_allowed")


def test_numbers_out_of_range(c):
    a = c.call("POST", "/v1/launch", raw='{"rows":[{"seq":99999999999999999999,"tokens":[1]}]}',
               expect=400, code="invalid_input")
    assert "out of range" in a.json["error"]["message"], a
    a = c.call("POST", "/v1/launch", raw='{"rows":[{"seq":1e20,"tokens":[1]}]}',
               expect=400, code="invalid_input")
    assert "'seq'" in a.json["error"]["message"], a


def test_bearer_scheme_any_case(servers, tiny_model):
    srv = servers.start(tiny_model, env={"DEVIO_TOKEN": "tok"}, token="tok")
    c = srv.client(token=False)
    for h in ("Bearer tok", "bearer tok", "BEARER  tok"):
        c.call("GET", "/v1/facts", headers={"Authorization": h})
    for h in ("Bearer", "Bearertok", "Basic tok", "bearer tok2"):
        c.call("GET", "/v1/facts", headers={"Authorization": h}, expect=401, code="unauthorized")


def test_method_not_allowed_405(c):
    cases = [("GET", "/v1/launch"), ("PUT", "/v1/launch"), ("GET", "/v1/step"),
             ("DELETE", "/v1/facts"), ("POST", "/v1/facts"), ("POST", "/v1/device"),
             ("GET", "/v1/effects"), ("DELETE", "/v1/sequences"), ("PATCH", "/v1/sequences"),
             ("POST", "/v1/sequences/1"), ("PUT", "/v1/sequences/1"),
             ("GET", "/v1/tickets/1/await"), ("POST", "/v1/tickets"), ("DELETE", "/v1/tickets"),
             ("PUT", "/v1/logits/1"), ("DELETE", "/v1/logits/1"), ("POST", "/v1/logits"), ("GET", "/v1/teardown"),
             ("POST", "/v1/openapi.yaml"), ("POST", "/v1/adapters"), ("DELETE", "/v1/adapters"),
             ("POST", "/v1/adapters/x"), ("PATCH", "/v1/adapters/x"),
             ("POST", "/healthz"), ("DELETE", "/readyz"), ("POST", "/metrics")]
    for method, path in cases:
        c.call(method, path, expect=405, code="method_not_allowed")
    # Nothing changed: the teardown route answered 405 to GET, not a teardown.
    c.call("GET", "/readyz")


def test_oversize_request_line_and_headers(srv, c):
    """A 100 kB URL or header is refused by the HTTP layer; the server lives on.
    (libmicrohttpd answers these itself, 414/431 with an HTML body: outside the contract.)"""
    import socket

    def raw(data):
        sock = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        try:
            sock.sendall(data)
            out = b""
            while b"\r\n" not in out:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                out += chunk
            return out
        finally:
            sock.close()

    head = raw(b"GET /v1/" + b"a" * 100000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 414 "), head[:100]
    head = raw(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 100000 + b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431 "), head[:100]
    assert srv.alive()
    assert c.call("GET", "/healthz").json == {"status": "ok"}


# ---- sequences ------------------------------------------------------------------------


def test_sequence_create_get_delete(c):
    f0 = c.facts()
    a, b = c.create(), c.create()
    assert b > a > 0
    assert c.seq(a) == {"seq": a, "len": 0, "blocks": 0, "busy": None, "ssm_slot": False,
                        "snapshots_held": 0, "snapshots": [], "parked": False}
    c.step(plan(row(a, prompt(20))))
    info = c.seq(a)
    assert (info["len"], info["blocks"], info["busy"]) == (20, 2, None)
    assert c.facts()["kv"]["blocks_free"] == f0["kv"]["blocks_free"] - 2
    listed = {q["seq"]: q for q in c.call("GET", "/v1/sequences").json["sequences"]}
    assert listed[a] == c.seq(a) and listed[b] == c.seq(b)
    assert c.call("DELETE", "/v1/sequences/%d" % a).json == {"kind": "free", "freed_blocks": 2,
                                                              "freed_snapshots": 0,
                                                              "freed_logits": 0}
    assert c.call("DELETE", "/v1/sequences/%d" % b).json == {"kind": "free", "freed_blocks": 0,
                                                              "freed_snapshots": 0,
                                                              "freed_logits": 0}
    ids = [q["seq"] for q in c.call("GET", "/v1/sequences").json["sequences"]]
    assert a not in ids and b not in ids and ids == sorted(ids)
    for s in (a, b):
        e = c.call("GET", "/v1/sequences/%d" % s, expect=404, code="unknown_seq")
        assert e.details == {"seq": s}
        c.call("DELETE", "/v1/sequences/%d" % s, expect=404, code="unknown_seq")
    assert c.facts()["kv"] == f0["kv"]
    # Ids are never reused.
    assert c.create() > b
    c.call("GET", "/v1/sequences/0", expect=404, code="unknown_seq")
    c.call("GET", "/v1/sequences/9223372036854775807", expect=404, code="unknown_seq")
    # A body on create is ignored.
    assert c.call("POST", "/v1/sequences", {"junk": True}, expect=201).json["seq"] > 0


# ---- launch and await ---------------------------------------------------------------------


def test_launch_await_consume_once(c):
    s = c.create()
    t = c.launch(plan(row(s, prompt(5), logits="last", sample={"temperature": 0})))
    assert c.seq(s)["busy"] == t
    r = c.await_(t)
    assert r["ticket"] == t and r["tokens"] == 5
    (rr,) = r["rows"]
    assert rr["seq"] == s and rr["len"] == 5 and len(rr["tokens"]) == 1
    assert rr["logits"] > 0 and rr["logprobs"][0] <= 0
    assert c.seq(s)["busy"] is None
    # The greedy token is the top logit.
    top = c.logits_top(rr["logits"], top=1)
    assert top["shape"] == [1, VOCAB] and top["top"][0][0] == rr["tokens"][0]
    # Awaited again: the same answer, read from the history and marked so.
    again = c.call("POST", "/v1/tickets/%d/await" % t)
    assert again.json == r and again.headers.get("Idempotent-Replayed") == "true"
    assert c.call("POST", "/v1/tickets/%d/await?timeout_ms=0" % t).json == r
    e = c.call("POST", "/v1/tickets/%d/await" % (t + 1000000), expect=404, code="unknown_ticket")
    assert e.details == {"ticket": t + 1000000}
    c.call("POST", "/v1/tickets/0/await", expect=404, code="unknown_ticket")
    c.effect({"kind": "release", "logits": rr["logits"]})
    # History: the ticket is ok, with its rows, tokens and seqs.
    h = c.tickets("?limit=5")["tickets"]
    rec = [x for x in h if x["id"] == t]
    assert rec and rec[0]["status"] == "ok" and rec[0]["seqs"] == [s]
    assert rec[0]["rows"] == 1 and rec[0]["tokens"] == 5 and rec[0]["error"] is None
    assert rec[0]["settled_ms"] >= rec[0]["launched_ms"]


def test_await_bad_timeout(c):
    s = c.create()
    t = c.launch(plan(row(s, [1])))
    for q in ("abc", "-1", "1.5", "", "99999999999999999999"):
        c.call("POST", "/v1/tickets/%d/await?timeout_ms=%s" % (t, q), expect=400, code="invalid_input")
    # The bad requests left the ticket in flight and awaitable.
    assert c.await_(t, timeout_ms=60000)["ticket"] == t


def test_step_route(c):
    s = c.create()
    r = c.step(plan(row(s, prompt(3), logits="all")))
    assert r["rows"][0]["len"] == 3 and r["tokens"] == 3
    h = c.logits_top(r["rows"][0]["logits"], top=2, row=2)
    assert h["shape"] == [3, VOCAB] and h["row"] == 2
    # The step's ticket is recorded ok with its answer, which an await reads again.
    again = c.call("POST", "/v1/tickets/%d/await" % r["ticket"])
    assert again.json == r and again.headers.get("Idempotent-Replayed") == "true"
    assert any(x["id"] == r["ticket"] and x["status"] == "ok" for x in c.tickets("?limit=10")["tickets"])
    c.effect({"kind": "release", "logits": r["rows"][0]["logits"]})
    # Launch errors come back from step as they do from launch.
    c.call("POST", "/v1/step", plan(row(s, [VOCAB])), expect=400, code="invalid_input")
    c.call("POST", "/v1/step", plan(row(s + 99999, [1])), expect=404, code="unknown_seq")
    c.call("POST", "/v1/step", raw="{", expect=400, code="invalid_input")


def test_pipelined_depth_two_matches_serial(c):
    """Two tickets in flight give the same numbers as one at a time (docs/objects.md)."""
    a, b, x, y = c.create(), c.create(), c.create(), c.create()
    t1 = c.launch(plan(row(a, prompt(9, 1), logits="last")))
    t2 = c.launch(plan(row(b, prompt(4, 2), logits="last")))
    r2, r1 = c.await_(t2), c.await_(t1)
    s1 = c.step(plan(row(x, prompt(9, 1), logits="last")))
    s2 = c.step(plan(row(y, prompt(4, 2), logits="last")))
    for p, q in ((r1, s1), (r2, s2)):
        assert c.logits_raw(p["rows"][0]["logits"]) == c.logits_raw(q["rows"][0]["logits"])
        c.effect({"kind": "release", "logits": p["rows"][0]["logits"]})
        c.effect({"kind": "release", "logits": q["rows"][0]["logits"]})


def test_await_timeout_pending(servers, small_model):
    """A long prefill on the small model awaited with timeout_ms=0 is still pending."""
    sv = servers.start(small_model)
    c = sv.client()
    vocab = 32000  # the small preset
    pending = 0
    for attempt in range(3):
        s = c.create()
        n = 1000
        t = c.launch(plan(row(s, [(k * 7919 + 3) % vocab for k in range(n)], logits="last")))
        a = c.request("POST", "/v1/tickets/%d/await?timeout_ms=0" % t)
        if a.status == 202:
            assert a.json == {"ticket": t, "status": "pending"}, a
            assert a.headers.get("Retry-After") == "1"
            pending += 1
            # The ticket stays in flight, the sequence busy; a short poll is pending too or done.
            assert c.seq(s)["busy"] == t
            assert c.facts()["tickets_in_flight"] == 1
        else:
            assert a.status == 200, a
        deadline = time.monotonic() + 300
        while a.status == 202:
            assert time.monotonic() < deadline, "ticket %d never settled" % t
            a = c.request("POST", "/v1/tickets/%d/await?timeout_ms=250" % t)
            assert a.status in (200, 202), a
        assert a.json["ticket"] == t and a.json["rows"][0]["len"] == n
        assert c.facts()["tickets_in_flight"] == 0
        rec = [x for x in c.tickets("?limit=1")["tickets"] if x["id"] == t]
        assert rec and rec[0]["status"] == "ok"
        c.effect({"kind": "release", "logits": a.json["rows"][0]["logits"]})
        if pending:
            break
    assert pending, "no await with timeout_ms=0 was pending in 3 long prefills"
    assert sv.stop() == 0


# ---- plan errors --------------------------------------------------------------------------


def assert_refused(c, body, status, code, details=None, raw=None):
    """A refused launch answers `status code` and changes nothing."""
    f0 = c.facts()
    h0 = c.tickets("?limit=1")
    a = c.call("POST", "/v1/launch", body, raw=raw, expect=status, code=code)
    if details is not None:
        assert a.details == details, a
    assert c.facts() == f0, "a refused plan changed the facts"
    assert c.tickets("?limit=1") == h0, "a refused plan left a ticket in the history"
    return a


def test_plan_errors(c):
    s, s2 = c.create(), c.create()
    c.step(plan(row(s, [1, 2])))
    before = c.seq(s)
    assert_refused(c, None, 400, "invalid_input", raw="")
    assert_refused(c, None, 400, "invalid_input", raw="{")
    assert_refused(c, None, 400, "invalid_input", raw='{"rows":[{"seq":1,"tokens":[1]}]} x')
    assert_refused(c, None, 400, "invalid_input", raw="\xff\xfe")
    assert_refused(c, None, 400, "invalid_input", raw='{"rows":[],"rows":[]}')
    assert_refused(c, [], 400, "invalid_input")
    assert_refused(c, "rows", 400, "invalid_input")
    assert_refused(c, {}, 400, "invalid_input")
    assert_refused(c, {"rows": []}, 400, "invalid_input")
    assert_refused(c, {"rows": {}}, 400, "invalid_input")
    assert_refused(c, {"rows": [5]}, 400, "invalid_input", {"row": 0})
    assert_refused(c, plan(row(s, [1], color="red")), 400, "invalid_input", {"row": 0})
    assert_refused(c, plan(row(s2, [1]), row(s, [1], extra=1)), 400, "invalid_input", {"row": 1})
    assert_refused(c, {"rows": [row(s, [1])], "priority": 1}, 400, "invalid_input")
    assert_refused(c, plan(row(s, [])), 400, "invalid_input", {"row": 0})
    assert_refused(c, plan(row(s, [VOCAB])), 400, "invalid_input", {"row": 0})
    assert_refused(c, plan(row(s, [-1])), 400, "invalid_input", {"row": 0})
    assert_refused(c, plan(row(s, [1.5])), 400, "invalid_input", {"row": 0})
    assert_refused(c, plan(row(s, ["1"])), 400, "invalid_input", {"row": 0})
    assert_refused(c, plan(row(s2, [1]), row(s2, [2])), 400, "invalid_input", {"row": 1})
    assert_refused(c, plan(row(s, [1], logits="first")), 400, "invalid_input", {"row": 0})
    assert_refused(c, plan(row(s, [1], snapshot="start")), 400, "invalid_input", {"row": 0})
    assert_refused(c, plan(row(s, [1], snapshot=1)), 400, "invalid_input", {"row": 0})
    assert_refused(c, plan(row("x", [1])), 400, "invalid_input", {"row": 0})
    assert_refused(c, plan(row(-1, [1])), 400, "invalid_input", {"row": 0})
    for bad in ({"temperature": -1}, {"top_p": 0}, {"top_p": 1.5}, {"min_p": 2}, {"top_k": -1},
                {"temperature": "hot"}, {"seed": -1}, {"warmth": 1}, [0]):
        assert_refused(c, plan(row(s, [1], sample=bad)), 400, "invalid_input", {"row": 0})
    assert_refused(c, plan(row(s2, [1]), row(s + 10 ** 6, [1])), 404, "unknown_seq", {"row": 1})
    assert_refused(c, plan(row(s, [1], adapter="nope")), 404, "unknown_adapter", {"row": 0})
    assert_refused(c, plan(row(s, [1] * 2049)), 413, "too_large", {"max_batch_tokens": 2048})
    assert_refused(c, plan(*[row(s + i, [1]) for i in range(65)]), 413, "too_large", {"max_rows": 64})
    assert_refused(c, plan(row(s, [1] * 511)), 413, "too_large", {"row": 0})  # 2 + 511 > 512
    assert c.seq(s) == before and c.seq(s2)["len"] == 0
    # The same rows, well formed, are accepted: the refusals were about the errors.
    c.step(plan(row(s2, [1]), row(s, [VOCAB - 1], logits="none", adapter=None, sample=None,
                                  snapshot=None)))
    assert c.seq(s)["len"] == 3 and c.seq(s2)["len"] == 1
    # Both snapshot modes are accepted; an attention-only model holds nothing for them.
    c.step(plan(row(s2, [2], snapshot="end"), row(s, [3, 4], snapshot="each")))
    assert c.seq(s)["len"] == 5 and c.seq(s2)["len"] == 2
    assert c.seq(s)["snapshots"] == [] and c.seq(s)["ssm_slot"] is False
    assert c.facts()["ssm"] == {"slots_total": 0, "slots_used": 0, "snapshots_total": 0,
                                "snapshots_used": 0}


def test_json_nesting_too_deep(srv, c):
    s = c.create()
    deep = '{"rows":[{"seq":%d,"tokens":[1],"x":%s%s}]}' % (s, "[" * 40, "]" * 40)
    a = assert_refused(c, None, 400, "invalid_input", raw=deep)
    assert "nest" in a.json["error"]["message"]
    # Far deeper, and unbalanced: still a clean 400, and the server lives.
    assert_refused(c, None, 400, "invalid_input", raw="[" * 100000)
    c.call("POST", "/v1/effects", raw='{"kind":"free","seq":%d,"x":%s}' % (s, "{\"a\":" * 40 + "1" + "}" * 40),
           expect=400, code="invalid_input")
    assert srv.alive()
    # 32 levels is allowed (a plan that is otherwise refused for its unknown field).
    ok_depth = '{"rows":[{"seq":%d,"tokens":[1],"x":%s%s}]}' % (s, "[" * 29, "]" * 29)
    a = assert_refused(c, None, 400, "invalid_input", raw=ok_depth)
    assert "unknown field" in a.json["error"]["message"], a


def test_seq_busy(c):
    s, other = c.create(), c.create()
    c.step(plan(row(s, prompt(4))))
    h = c.step(plan(row(other, [1], logits="last")))["rows"][0]["logits"]
    t = c.launch(plan(row(s, [5])))
    assert c.seq(s)["busy"] == t
    f0 = c.facts()
    e = assert_refused(c, plan(row(other, [1]), row(s, [6])), 409, "seq_busy")
    assert e.details == {"row": 1, "ticket": t}, e
    for eff in ({"kind": "fork", "seq": s}, {"kind": "truncate", "seq": s, "len": 1},
                {"kind": "snapshot", "seq": s}, {"kind": "free", "seq": s},
                {"kind": "release", "seq": s}):
        e = c.call("POST", "/v1/effects", eff, expect=409, code="seq_busy")
        assert e.details == {"ticket": t}, e
    e = c.call("DELETE", "/v1/sequences/%d" % s, expect=409, code="seq_busy")
    assert e.details == {"ticket": t}
    # step on a busy sequence: refused at launch.
    c.call("POST", "/v1/step", plan(row(s, [7])), expect=409, code="seq_busy")
    # Effects on other objects are not blocked by the busy sequence.
    c.effect({"kind": "sample", "logits": h, "params": {"temperature": 0}})
    c.effect({"kind": "release", "logits": h})
    assert c.facts()["tickets_in_flight"] == f0["tickets_in_flight"]
    r = c.await_(t)
    assert r["rows"][0]["len"] == 5 and c.seq(s)["busy"] is None
    assert c.effect({"kind": "truncate", "seq": s, "len": 1})["len"] == 1
    c.call("DELETE", "/v1/sequences/%d" % s)


def test_depth_exceeded(servers, tiny_model):
    sv = servers.start(tiny_model, ["--max-depth", "1"])
    c = sv.client()
    a, b = c.create(), c.create()
    t = c.launch(plan(row(a, [1, 2])))
    f0 = c.facts()
    assert f0["tickets_in_flight"] == 1
    e = assert_refused(c, plan(row(b, [3])), 409, "depth_exceeded")
    assert e.details == {"max_depth": 1}, e
    c.call("POST", "/v1/step", plan(row(b, [3])), expect=409, code="depth_exceeded")
    assert c.seq(b)["len"] == 0
    c.await_(t)
    c.await_(c.launch(plan(row(b, [3]))))
    assert c.seq(b)["len"] == 1
    assert c.device()["max_depth"] == 1
    assert sv.stop() == 0


def test_out_of_kv_blocks_reserves_nothing(servers, tiny_model):
    sv = servers.start(tiny_model, ["--kv-blocks", "4", "--block-size", "4"])
    c = sv.client()
    f0 = c.facts()
    assert f0["kv"]["blocks_total"] == 4 and f0["kv"]["block_size"] == 4 and f0["kv"]["blocks_free"] == 4
    a, b = c.create(), c.create()
    assert_refused(c, plan(row(a, prompt(17))), 409, "out_of_kv_blocks", {"needed": 5})
    # Row 0 alone would fit: the plan is refused whole, row 0 reserves nothing.
    e = assert_refused(c, plan(row(a, prompt(8)), row(b, prompt(9))), 409, "out_of_kv_blocks")
    assert e.details == {"needed": 5}, e
    assert c.seq(a)["len"] == 0 and c.seq(b)["len"] == 0
    c.step(plan(row(a, prompt(12))))
    f1 = c.facts()
    assert f1["kv"]["blocks_free"] == 1
    assert_refused(c, plan(row(b, prompt(5))), 409, "out_of_kv_blocks", {"needed": 2})
    # Fork shares, a write into the shared partial block would copy it: 1 free block is enough
    # for one append, not for two sequences' copies plus growth.
    ch = c.effect({"kind": "fork", "seq": a})
    assert ch["shared_blocks"] == 3
    assert c.facts()["kv"]["blocks_shared"] == 3
    c.step(plan(row(ch["seq"], [1])))  # uses the last free block
    assert c.facts()["kv"]["blocks_free"] == 0
    assert_refused(c, plan(row(b, [1])), 409, "out_of_kv_blocks", {"needed": 1})
    c.call("DELETE", "/v1/sequences/%d" % ch["seq"])
    c.call("DELETE", "/v1/sequences/%d" % a)
    assert c.facts()["kv"] == f0["kv"]
    assert sv.stop() == 0


def test_limits_server(servers, tiny_model):
    """out_of_seqs, out_of_logits and the max_seq_len 413, on a server with small limits."""
    sv = servers.start(tiny_model, ["--max-seqs", "3", "--logits-handles", "2", "--logits-rows", "4",
                                    "--max-seq-len", "8", "--max-rows", "2", "--max-batch-tokens", "10"])
    c = sv.client()
    a, b, x = c.create(), c.create(), c.create()
    e = c.call("POST", "/v1/sequences", expect=409, code="out_of_seqs")
    assert e.details == {"max_seqs": 3}, e
    c.step(plan(row(a, [1, 2])))
    c.call("POST", "/v1/effects", {"kind": "fork", "seq": a}, expect=409, code="out_of_seqs")
    assert_refused(c, plan(row(a, [1] * 7)), 413, "too_large", {"row": 0})
    assert_refused(c, plan(row(a, [1]), row(b, [1]), row(x, [1])), 413, "too_large", {"max_rows": 2})
    assert_refused(c, plan(row(b, [1] * 6), row(x, [1] * 5)), 413, "too_large", {"max_batch_tokens": 10})
    h1 = c.step(plan(row(b, [1, 2, 3], logits="all")))["rows"][0]["logits"]
    e = assert_refused(c, plan(row(x, [1, 2], logits="all")), 409, "out_of_logits")
    assert e.details == {"needed_rows": 2}, e
    h2 = c.step(plan(row(x, [1], logits="last")))["rows"][0]["logits"]
    assert_refused(c, plan(row(a, [3], logits="last")), 409, "out_of_logits")
    c.effect({"kind": "release", "logits": h1})
    c.effect({"kind": "release", "logits": h2})
    c.step(plan(row(a, [3], logits="all")))
    c.call("DELETE", "/v1/sequences/%d" % x)
    assert c.create() > x
    lim = c.device()["limits"]
    assert (lim["max_seqs"], lim["logits_handles"], lim["logits_rows"], lim["max_seq_len"],
            lim["max_rows"], lim["max_batch_tokens"]) == (3, 2, 4, 8, 2, 10)
    assert sv.stop() == 0


# ---- effects ------------------------------------------------------------------------------


def test_effect_sample(c):
    s = c.create()
    r = c.step(plan(row(s, prompt(4, 3), logits="all")))
    h = r["rows"][0]["logits"]
    vals = floats(c.logits_raw(h))
    rows = [vals[i * VOCAB:(i + 1) * VOCAB] for i in range(4)]
    argmax = [top_of(rv, 1)[0][0] for rv in rows]
    one = c.effect({"kind": "sample", "logits": h, "row": 2, "params": {"temperature": 0}})
    assert one["tokens"] == [argmax[2]]
    assert abs(one["logprobs"][0] - log_softmax_at(rows[2], argmax[2])) < 1e-4
    every = c.effect({"kind": "sample", "logits": h, "params": {"temperature": 0}})
    assert every["tokens"] == argmax and len(every["logprobs"]) == 4
    assert c.effect({"kind": "sample", "logits": h, "row": None, "params": {"temperature": 0}}) == every
    # Seeded sampling is a function of (seed, position): the same call, the same answer.
    p = {"temperature": 1.0, "top_k": 40, "top_p": 0.9, "min_p": 0.01, "seed": 7}
    s1 = c.effect({"kind": "sample", "logits": h, "params": p})
    assert s1 == c.effect({"kind": "sample", "logits": h, "params": p})
    assert all(0 <= t < VOCAB for t in s1["tokens"]) and all(lp <= 0 for lp in s1["logprobs"])
    # top_k 1 is greedy whatever the temperature.
    assert c.effect({"kind": "sample", "logits": h, "params": {"temperature": 5, "top_k": 1}})["tokens"] == argmax
    # No params: temperature 1.
    d = c.effect({"kind": "sample", "logits": h, "row": 0})
    assert len(d["tokens"]) == 1
    # Errors.
    e = c.call("POST", "/v1/effects", {"kind": "sample", "logits": h, "row": 4}, expect=400,
               code="invalid_input")
    e = c.call("POST", "/v1/effects", {"kind": "sample", "logits": h + 9999}, expect=404,
               code="unknown_logits")
    assert e.details == {"logits": h + 9999}
    for bad in ({"temperature": -0.5}, {"top_p": 0}, {"min_p": -1}, {"top_k": "x"}, {"bogus": 1}):
        c.call("POST", "/v1/effects", {"kind": "sample", "logits": h, "params": bad}, expect=400,
               code="invalid_input")
    c.call("POST", "/v1/effects", {"kind": "sample"}, expect=400, code="invalid_input")
    c.call("POST", "/v1/effects", {"kind": "sample", "logits": -1}, expect=400, code="invalid_input")
    c.effect({"kind": "release", "logits": h})
    c.call("POST", "/v1/effects", {"kind": "sample", "logits": h}, expect=404, code="unknown_logits")


def test_effect_fork_truncate_snapshot_free(c):
    f0 = c.facts()
    s = c.create()
    c.step(plan(row(s, prompt(20))))  # 2 blocks of 16
    assert c.facts()["kv"]["blocks_free"] == f0["kv"]["blocks_free"] - 2
    fk = c.effect({"kind": "fork", "seq": s})
    ch = fk["seq"]
    assert fk["shared_blocks"] == 2 and ch > s
    assert c.seq(ch)["len"] == 20 and c.seq(ch)["blocks"] == 2
    f1 = c.facts()
    assert f1["kv"]["blocks_shared"] == f0["kv"]["blocks_shared"] + 2
    assert f1["kv"]["blocks_free"] == f0["kv"]["blocks_free"] - 2
    # The child and the parent diverge from the same prefix with the same numbers.
    rc = c.step(plan(row(ch, [9], logits="last")))["rows"][0]
    rp = c.step(plan(row(s, [9], logits="last")))["rows"][0]
    assert rc["len"] == rp["len"] == 21
    assert c.logits_raw(rc["logits"]) == c.logits_raw(rp["logits"])
    # ...and equal to a sequence that never forked.
    fresh = c.create()
    rf = c.step(plan(row(fresh, prompt(20) + [9], logits="last")))["rows"][0]
    assert c.logits_raw(rf["logits"]) == c.logits_raw(rp["logits"])
    for h in (rc["logits"], rp["logits"], rf["logits"]):
        c.effect({"kind": "release", "logits": h})
    c.call("DELETE", "/v1/sequences/%d" % fresh)
    # Copy-on-write: the partial shared block was copied, the full one stays shared.
    assert c.facts()["kv"]["blocks_shared"] == f0["kv"]["blocks_shared"] + 1
    # Truncate: beyond the length is refused with the current length.
    e = c.call("POST", "/v1/effects", {"kind": "truncate", "seq": s, "len": 22}, expect=400,
               code="invalid_input")
    assert e.details == {"len": 21}
    assert c.effect({"kind": "truncate", "seq": s, "len": 21}) == {"kind": "truncate", "len": 21, "freed_blocks": 0,
                                                                   "freed_snapshots": 0}
    assert c.effect({"kind": "truncate", "seq": s, "len": 10}) == {"kind": "truncate", "len": 10, "freed_blocks": 1,
                                                                   "freed_snapshots": 0}
    assert c.seq(s)["len"] == 10 and c.seq(s)["blocks"] == 1
    # After truncation the sequence computes as if the dropped tokens never were.
    r1 = c.step(plan(row(s, [3, 4], logits="last")))["rows"][0]
    other = c.create()
    r2 = c.step(plan(row(other, prompt(20)[:10] + [3, 4], logits="last")))["rows"][0]
    assert c.logits_raw(r1["logits"]) == c.logits_raw(r2["logits"])
    for h in (r1["logits"], r2["logits"]):
        c.effect({"kind": "release", "logits": h})
    # Snapshot (a pure-attention model needs none, but it is answered with the length).
    assert c.effect({"kind": "snapshot", "seq": s}) == {"kind": "snapshot", "len": 12}
    assert c.seq(s)["snapshots"] == [] and c.facts()["ssm"]["snapshots_used"] == 0
    # Releasing a sequence's snapshots: there are none to drop, the sequence is unchanged.
    assert c.effect({"kind": "release", "seq": s}) == {"kind": "release", "freed_snapshots": 0}
    assert c.seq(s)["len"] == 12
    # Free.
    # s wrote into the full block it shared with the child: it copied it, nothing is shared now.
    assert c.facts()["kv"]["blocks_shared"] == f0["kv"]["blocks_shared"]
    fr = c.effect({"kind": "free", "seq": ch})
    assert fr == {"kind": "free", "freed_blocks": 2, "freed_snapshots": 0, "freed_logits": 0}
    assert c.effect({"kind": "free", "seq": s}) == {"kind": "free", "freed_blocks": 1, "freed_snapshots": 0,
                                                    "freed_logits": 0}
    c.effect({"kind": "free", "seq": other})
    assert c.facts()["kv"] == f0["kv"]
    # Unknown sequences.
    for eff in ({"kind": "fork", "seq": s}, {"kind": "truncate", "seq": s, "len": 0},
                {"kind": "snapshot", "seq": s}, {"kind": "free", "seq": s},
                {"kind": "release", "seq": s}):
        e = c.call("POST", "/v1/effects", eff, expect=404, code="unknown_seq")
        assert e.details == {"seq": s}
    # Malformed effects.
    for bad in ({}, {"kind": "merge", "seq": s}, {"kind": 3}, {"kind": "fork"},
                {"kind": "fork", "seq": "1"}, {"kind": "truncate", "seq": s},
                {"kind": "truncate", "seq": s, "len": -1}, {"kind": "release"},
                {"kind": "release", "logits": 1, "seq": s}, {"kind": "release", "seq": "1"},
                {"kind": "fork", "seq": s, "extra": 1}, [], "fork"):
        c.call("POST", "/v1/effects", bad, expect=400, code="invalid_input")
    c.call("POST", "/v1/effects", raw="{]", expect=400, code="invalid_input")
    c.call("POST", "/v1/effects", raw="", expect=400, code="invalid_input")


def test_effect_release(c):
    s = c.create()
    h = c.step(plan(row(s, [1], logits="last")))["rows"][0]["logits"]
    live = c.facts()["logits_live"]
    assert c.effect({"kind": "release", "logits": h}) == {"kind": "release"}
    assert c.facts()["logits_live"] == live - 1
    e = c.call("POST", "/v1/effects", {"kind": "release", "logits": h}, expect=404, code="unknown_logits")
    assert e.details == {"logits": h}
    c.call("GET", "/v1/logits/%d" % h, expect=404, code="unknown_logits")
    c.call("GET", "/v1/logits/%d" % h, headers={"Accept": "application/octet-stream"}, expect=404,
           code="unknown_logits")


def test_logits_belong_to_their_sequence(c):
    """GET /v1/logits lists the live handles; freeing a sequence releases its handles."""
    s, t = c.create(), c.create()
    h1 = c.step(plan(row(s, [1, 2, 3], logits="all")))["rows"][0]["logits"]
    h2 = c.step(plan(row(t, [4], logits="last")))["rows"][0]["logits"]
    listed = {h["logits"]: h for h in c.call("GET", "/v1/logits").json["handles"]}
    assert listed[h1]["seq"] == s and listed[h1]["rows"] == 3 and listed[h1]["position"] == 0
    assert listed[h2]["seq"] == t and listed[h2]["rows"] == 1 and listed[h2]["state"] == "ready"
    f = c.facts()
    assert f["logits_rows_live"] >= 4, f
    out = c.call("DELETE", "/v1/sequences/%d" % s).json
    assert out["freed_logits"] == 1, out
    after = c.facts()
    assert after["logits_live"] == f["logits_live"] - 1
    assert after["logits_rows_live"] == f["logits_rows_live"] - 3
    listed = {h["logits"] for h in c.call("GET", "/v1/logits").json["handles"]}
    assert h1 not in listed and h2 in listed
    c.call("GET", "/v1/logits/%d" % h1, expect=404, code="unknown_logits")
    assert c.effect({"kind": "free", "seq": t})["freed_logits"] == 1


# ---- logits ---------------------------------------------------------------------------------


def test_logits_json_and_raw(c):
    s = c.create()
    r = c.step(plan(row(s, prompt(3, 5), logits="all")))["rows"][0]
    h = r["logits"]
    raw = c.logits_raw(h)
    assert len(raw) == 3 * VOCAB * 4
    vals = floats(raw)
    for i in range(3):
        rowv = vals[i * VOCAB:(i + 1) * VOCAB]
        j = c.logits_top(h, top=10, row=i)
        assert j["shape"] == [3, VOCAB] and j["row"] == i
        assert [t for t, _ in j["top"]] == [t for t, _ in top_of(rowv, 10)]
        assert [f32(v) for _, v in j["top"]] == [v for _, v in top_of(rowv, 10)], "JSON logits are not the f32 values"
    # Defaults: top 5 of row 0.
    d = c.call("GET", "/v1/logits/%d" % h).json
    assert d["row"] == 0 and len(d["top"]) == 5
    # The whole vocabulary, and nothing.
    full = c.logits_top(h, top=1000, row=1)["top"]
    assert len(full) == VOCAB and [t for t, _ in full] == [t for t, _ in top_of(vals[VOCAB:2 * VOCAB], VOCAB)]
    assert c.logits_top(h, top=0)["top"] == []
    # Raw ignores top and row.
    a = c.call("GET", "/v1/logits/%d?top=1&row=2" % h, headers={"Accept": "application/octet-stream"})
    assert a.raw == raw
    # Errors.
    for q in ("top=1001", "top=-1", "top=x", "row=3", "row=-1", "row=1e3"):
        c.call("GET", "/v1/logits/%d?%s" % (h, q), expect=400, code="invalid_input")
    c.call("GET", "/v1/logits/%d" % (h + 10 ** 6), expect=404, code="unknown_logits")
    c.effect({"kind": "release", "logits": h})


def test_logits_match_devio_ref(c, bins, tiny_model, tmp_path):
    """The server's raw f32 logits are devio-ref's for the same script, bit for bit."""
    toks = prompt(6, 9)
    s = c.create()
    r1 = c.step(plan(row(s, toks, logits="all")))["rows"][0]
    r2 = c.step(plan(row(s, [17, 4], logits="last", sample={"temperature": 0})))["rows"][0]
    script = tmp_path / "s.jsonl"
    lines = [
        {"op": "create", "as": "a"},
        {"op": "launch", "plan": {"rows": [{"seq": "$a", "tokens": toks, "logits": "all"}]}, "as": "t1"},
        {"op": "await", "ticket": "$t1", "as": "r1"},
        {"op": "launch", "plan": {"rows": [{"seq": "$a", "tokens": [17, 4], "logits": "last",
                                            "sample": {"temperature": 0}}]}, "as": "t2"},
        {"op": "await", "ticket": "$t2", "as": "r2"},
    ]
    script.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = subprocess.run([str(bins.ref), "--model", str(tiny_model), str(script)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    res = [json.loads(x) for x in out.stdout.splitlines()]
    assert all(x["ok"] for x in res), res
    ref1 = res[2]["result"]["rows"][0]
    ref2 = res[4]["result"]["rows"][0]
    for mine, ref in ((r1, ref1), (r2, ref2)):
        raw = c.logits_raw(mine["logits"])
        assert ref["logits"]["shape"] == [len(raw) // 4 // VOCAB, VOCAB]
        assert hashlib.sha256(raw).hexdigest() == ref["logits"]["sha256"]
        assert mine["len"] == ref["len"]
    assert r2["tokens"] == ref2["tokens"]
    for mine in (r1, r2):
        c.effect({"kind": "release", "logits": mine["logits"]})


# ---- facts and device -----------------------------------------------------------------------


def test_facts_and_device(c):
    f = c.facts()
    assert f["kv"]["block_size"] == 16 and f["kv"]["blocks_total"] >= f["kv"]["blocks_free"] > 0
    assert f["ssm"] == {"slots_total": 0, "slots_used": 0, "snapshots_total": 0, "snapshots_used": 0}
    assert f["epoch"] == 1 and f["adapters_loaded"] == 0
    d = c.device()
    # No CUDA plugin next to the binary: auto runs the reference.
    assert d["backend"] == "ref" and d["numerics"] == "strict"
    assert "reference" in d["device"]["name"] and d["device"]["memory_used"] > 0
    assert d["device"]["compute_capability"] == "" and d["version"]
    m = d["model"]
    assert (m["architecture"], m["vocab_size"], m["hidden_size"], m["layers"], m["heads"],
            m["kv_heads"], m["head_dim"]) == ("LlamaForCausalLM", VOCAB, 64, 2, 4, 2, 16)
    assert m["dtype"] == "F32" and m["tied_embeddings"] is False
    assert d["max_depth"] == 2 and d["limits"]["block_size"] == f["kv"]["block_size"] == 16
    assert d["limits"]["kv_blocks"] == f["kv"]["blocks_total"]
    assert d["limits"]["ssm_slots"] == d["limits"]["ssm_snapshots"] == 0  # attention only
    assert d["epoch"] == f["epoch"] >= 1
    assert f["ssm"] == {"slots_total": 0, "slots_used": 0, "snapshots_total": 0, "snapshots_used": 0}


def test_backend_choice(servers, tiny_model, bins):
    """--backend picks through the registry: a plugin runs the same numbers, and auto under
    fast numerics without a GPU runs the cpu backend (on a model with no quantized weight its
    only difference is K and V kept as binary16: logits within 1e-3, the same token); what is
    absent, or refuses the numerics asked, stops the start with a message saying so."""
    plugins = bins.root / "tests" / "backend"
    toks = [3, 1, 4, 1, 5]
    got = {}
    for args in ([], ["--backend", "stream", "--backend-path", plugins, "--numerics", "fast"],
                 ["--backend", "ref"], ["--numerics", "fast"]):
        sv = servers.start(tiny_model, args)
        c = sv.client()
        s = c.create()
        r = c.step(plan(row(s, toks, logits="last", sample={"temperature": 0.9, "seed": 4})))
        d = c.device()
        got[d["backend"]] = (c.logits_raw(r["rows"][0]["logits"]), r["rows"][0]["tokens"],
                             d["numerics"])
        assert sv.stop() == 0
    assert set(got) == {"ref", "stream", "cpu"}
    assert got["stream"][2] == "fast" and got["ref"][2] == "strict" and got["cpu"][2] == "fast"
    assert got["stream"][:2] == got["ref"][:2]
    assert got["cpu"][1] == got["ref"][1] and got["cpu"][0] != got["ref"][0]
    ref_l, cpu_l = (struct.unpack("<%df" % (len(got[k][0]) // 4), got[k][0]) for k in ("ref", "cpu"))
    err = math.sqrt(sum((a - b) ** 2 for a, b in zip(ref_l, cpu_l)) / sum(a * a for a in ref_l))
    assert len(ref_l) == len(cpu_l) and err < 1e-3, err
    for args, says in ((["--backend", "cuda"], "libdevio-backend-cuda.so"),
                       (["--backend", "badabi", "--backend-path", plugins], "interface version 1"),
                       (["--backend", "ref", "--numerics", "fast"], "strict numerics only"),
                       (["--backend", "cpu"], "fast numerics only"),
                       (["--numerics", "exact"], "--numerics takes strict|fast, not 'exact'")):
        with pytest.raises(AssertionError, match="exited") as e:
            servers.start(tiny_model, args)
        assert says in str(e.value), str(e.value)


def test_unknown_backend_names_those_that_exist(servers, tiny_model, bins):
    """--backend with a name nothing answers to stops the start with a message listing the
    backends that exist: those built in, and the plugin files on the search path."""
    plugins = bins.root / "tests" / "backend"
    with pytest.raises(AssertionError, match="exited 1") as e:
        servers.start(tiny_model, ["--backend", "nosuch", "--backend-path", plugins])
    says = str(e.value)
    # The directory closes the message, so a long one is what an error's bounded text cuts.
    assert ("no backend 'nosuch'; the backends here: ref, cpu (built in), badabi, noentry, stream, "
            "wrongname (plugins); no libdevio-backend-nosuch.so in ") in says, says
    assert str(plugins)[:40] in says, says
    # Without a plugin directory, the one beside the binary is searched; the built-in ones
    # are named all the same.
    with pytest.raises(AssertionError, match="exited 1") as e:
        servers.start(tiny_model, ["--backend", "nosuch"])
    assert "no backend 'nosuch'; the backends here: ref, cpu (built in)" in str(e.value), \
        str(e.value)


def test_broken_device(servers, tiny_model, bins):
    """A device that breaks for good (a CUDA error, here the stream plugin told to
    break at its first sync): the step fails with device_error, GET /v1/device says
    why, /readyz answers 503 so traffic moves away, /healthz answers 500 device_error
    so the orchestrator restarts the process, later launches are refused, and the
    server still answers and stops cleanly."""
    plugins = bins.root / "tests" / "backend"
    sv = servers.start(tiny_model, ["--backend", "stream", "--backend-path", plugins],
                       env={"STREAM_BACKEND_BREAK_AT_WAIT": "1"})
    c = sv.client()
    assert c.device()["device"]["failure"] == ""
    assert c.call("GET", "/readyz").json == {"status": "ready"}
    assert c.call("GET", "/healthz").json == {"status": "ok"}
    s = c.create()
    c.call("POST", "/v1/step", plan(row(s, [1, 2, 3])), expect=500, code="device_error")
    failure = c.device()["device"]["failure"]
    assert "found at sync" in failure, failure
    r = c.call("GET", "/readyz", expect=503, code="not_ready")
    assert "the device failed" in r.json["error"]["message"], r
    h = c.call("GET", "/healthz", expect=500, code="device_error")
    assert h.json["error"]["message"] == "the device failed for good: " + failure, h
    c.call("POST", "/v1/launch", plan(row(s, [1, 2, 3])), expect=500, code="device_error")
    m = parse_metrics(c.metrics())[0]
    assert metric(m, "devio_ready") == 0 and metric(m, "devio_up") == 1
    # The step, the launch and /healthz answered device_error; /readyz not_ready.
    assert metric(m, "devio_http_errors_total", code="device_error") == 3
    assert metric(m, "devio_http_errors_total", code="not_ready") == 1
    assert c.seq(s)["len"] == 0
    assert c.facts()["tickets_in_flight"] == 0
    assert sv.stop() == 0


def test_env_twins(servers, tiny_model):
    sv = servers.start(tiny_model, env={"DEVIO_MAX_DEPTH": "1", "DEVIO_KV_BLOCKS": "40",
                                        "DEVIO_BLOCK_SIZE": "8"})
    c = sv.client()
    f = c.facts()
    assert f["kv"]["blocks_total"] == 40 and f["kv"]["block_size"] == 8
    a, b = c.create(), c.create()
    t = c.launch(plan(row(a, [1])))
    c.call("POST", "/v1/launch", plan(row(b, [1])), expect=409, code="depth_exceeded")
    c.await_(t)
    d = c.device()
    assert d["max_depth"] == 1 and d["limits"]["kv_blocks"] == 40 and d["limits"]["block_size"] == 8
    assert sv.stop() == 0
    # A flag wins over its twin.
    sv = servers.start(tiny_model, ["--max-depth", "2"], env={"DEVIO_MAX_DEPTH": "1"})
    c = sv.client()
    a, b = c.create(), c.create()
    t1, t2 = c.launch(plan(row(a, [1]))), c.launch(plan(row(b, [1])))
    c.await_(t1), c.await_(t2)
    assert c.device()["max_depth"] == 2
    assert sv.stop() == 0


# ---- ticket history -----------------------------------------------------------------------


def test_one_server_per_history_file(servers, tiny_model, bins, tmp_path):
    """A second devio-server on a history file another one serves is refused at start (exit
    1, naming the file), whatever path reaches the file: absolute, relative or a link. The
    first goes on serving; once it stops, the file is free again."""
    db = tmp_path / "hist" / "history.db"
    db.parent.mkdir()
    first = servers.start(tiny_model, db=db)
    c = first.client()
    s = c.create()
    c.step(plan(row(s, [1, 2, 3])))
    held = "another process holds this file (a devio-server already serves it)"
    with pytest.raises(AssertionError, match="exited 1") as e:
        servers.start(tiny_model, db=db)
    assert "ticket store %s: %s" % (db, held) in str(e.value), str(e.value)
    link = tmp_path / "link.db"
    link.symlink_to(db)
    with pytest.raises(AssertionError, match="exited 1") as e:
        servers.start(tiny_model, db=link)
    assert held in str(e.value), str(e.value)
    # A relative --db, from the file's directory.
    adapters = tmp_path / "adapters"
    adapters.mkdir()
    r = subprocess.run([str(bins.server), "--model", str(tiny_model), "--listen", "127.0.0.1:0",
                        "--db", "history.db", "--adapters", str(adapters)],
                       cwd=db.parent, capture_output=True, text=True, timeout=60,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 1 and r.stdout == "", (r.returncode, r.stdout, r.stderr)
    assert "ticket store history.db: %s" % held in r.stderr, r.stderr
    # The first serves on, its history intact.
    assert c.seq(s)["len"] == 3
    c.step(plan(row(s, [4])))
    assert len(c.all_tickets()) == 2
    assert first.stop() == 0
    again = servers.start(tiny_model, db=db)
    assert len(again.client().all_tickets()) == 2
    assert again.stop() == 0


def test_ticket_history(servers, tiny_model):
    sv = servers.start(tiny_model)
    c = sv.client()
    assert c.tickets() == {"tickets": [], "next": None}
    s = c.create()
    ok = [c.step(plan(row(s, [i + 1])))["ticket"] for i in range(7)]
    other = c.create()
    pending = c.launch(plan(row(other, [1, 2, 3])))
    ids = ok + [pending]
    assert ids == sorted(ids) and len(set(ids)) == 8
    h = c.tickets()
    assert [x["id"] for x in h["tickets"]] == ids[::-1] and h["next"] is None
    rec = h["tickets"][0]
    assert rec["status"] == "in_flight" and rec["settled_ms"] is None and rec["seqs"] == [other]
    assert rec["tokens"] == 3 and rec["queued_us"] is None and rec["error"] is None
    assert all(x["status"] == "ok" and x["queued_us"] is not None for x in h["tickets"][1:])
    assert [x["id"] for x in c.tickets("?status=ok")["tickets"]] == ok[::-1]
    assert [x["id"] for x in c.tickets("?status=in_flight")["tickets"]] == [pending]
    assert c.tickets("?status=failed")["tickets"] == []
    assert c.tickets("?status=aborted")["tickets"] == []
    # Pages of 3 by `next`, newest first, each id once.
    seen, before, pages = [], None, 0
    while True:
        q = "?limit=3" + ("&before=%d" % before if before is not None else "")
        page = c.tickets(q)
        pages += 1
        assert len(page["tickets"]) <= 3
        seen += [x["id"] for x in page["tickets"]]
        before = page["next"]
        if before is None:
            break
        assert before == page["tickets"][-1]["id"]
        assert pages < 10
    assert seen == ids[::-1] and pages == 3
    # A page that ends exactly at the last row says so.
    assert c.tickets("?limit=8")["next"] is None
    assert c.tickets("?limit=7")["next"] == ids[1]
    assert [x["id"] for x in c.tickets("?status=ok&limit=2&before=%d" % ok[3])["tickets"]] == [ok[2], ok[1]]
    # Time window.
    t_launch = rec["launched_ms"]
    assert [x["id"] for x in c.tickets("?since_ms=%d" % t_launch)["tickets"]][:1] == [pending]
    assert c.tickets("?since_ms=%d" % (t_launch + 10 ** 9))["tickets"] == []
    assert c.tickets("?until_ms=1")["tickets"] == []
    assert len(c.tickets("?since_ms=1&until_ms=%d" % (t_launch + 1))["tickets"]) == 8
    # Bounds and bad parameters.
    assert len(c.tickets("?limit=1")["tickets"]) == 1
    assert len(c.tickets("?limit=1000")["tickets"]) == 8
    for q in ("limit=0", "limit=1001", "limit=-1", "limit=x", "limit=99999999999", "before=-1",
              "before=x", "status=running", "status=", "since_ms=x", "until_ms=-5",
              "since_ms=100&until_ms=50"):
        c.call("GET", "/v1/tickets?" + q, expect=400, code="invalid_input")
    c.await_(pending)
    assert c.tickets("?limit=1")["tickets"][0]["status"] == "ok"
    assert sv.stop() == 0


# ---- metrics ------------------------------------------------------------------------------


def test_metrics(c):
    m0, types = parse_metrics(c.metrics())
    for fam, kind in (("devio_tickets_launched_total", "counter"),
                      ("devio_tickets_settled_total", "counter"), ("devio_tokens_processed_total", "counter"),
                      ("devio_step_seconds", "histogram"), ("devio_http_requests_total", "counter"),
                      ("devio_kv_blocks_capacity", "gauge"), ("devio_kv_blocks_free", "gauge"),
                      ("devio_kv_blocks_shared", "gauge"), ("devio_ssm_slots_capacity", "gauge"),
                      ("devio_ssm_slots_used", "gauge"), ("devio_ssm_snapshots_capacity", "gauge"),
                      ("devio_ssm_snapshots_used", "gauge"), ("devio_tickets_in_flight", "gauge"),
                      ("devio_logits_live", "gauge"), ("devio_adapters_loaded", "gauge"),
                      ("devio_epoch", "gauge"), ("devio_up", "gauge")):
        assert types.get(fam) == kind, (fam, types.get(fam))
    s = c.create()
    r = c.step(plan(row(s, prompt(6), logits="last")))
    c.call("GET", "/v1/sequences/%d" % (s + 10 ** 6), expect=404)
    m1, _ = parse_metrics(c.metrics())

    def delta(name, **lab):
        return (metric(m1, name, **lab) or 0) - (metric(m0, name, **lab) or 0)

    assert delta("devio_tickets_launched_total") == 1
    assert delta("devio_tickets_settled_total", status="ok") == 1
    assert delta("devio_tokens_processed_total", kind="prefill") == 6
    assert delta("devio_step_seconds_count") == 1
    assert delta("devio_http_requests_total", route="/v1/step", code="200") == 1
    assert delta("devio_http_requests_total", route="/v1/sequences/{id}", code="404") == 1
    assert delta("devio_logits_live") == 1
    assert metric(m1, "devio_up") == 1
    f = c.facts()
    assert metric(m1, "devio_kv_blocks_free") == f["kv"]["blocks_free"]
    assert metric(m1, "devio_epoch") == f["epoch"]
    # Histogram buckets are cumulative and end in +Inf == count.
    buckets = sorted(((float(dict(k[1])["le"]), v) for k, v in m1.items() if k[0] == "devio_step_seconds_bucket"))
    assert buckets and buckets[-1][0] == math.inf
    assert all(a[1] <= b[1] for a, b in zip(buckets, buckets[1:]))
    assert buckets[-1][1] == metric(m1, "devio_step_seconds_count")
    c.effect({"kind": "release", "logits": r["rows"][0]["logits"]})


# ---- adapters -----------------------------------------------------------------------------


def test_adapters(c, srv):
    assert c.call("GET", "/v1/adapters").json == []
    assert c.facts()["adapters_loaded"] == 0
    e = c.call("GET", "/v1/adapters/sql", expect=404, code="unknown_adapter")
    e = c.call("DELETE", "/v1/adapters/sql", expect=404, code="unknown_adapter")
    # A well-formed load of a directory that is not there is invalid input (a failed row).
    e = c.call("PUT", "/v1/adapters/sql", {"path": "sql-r8", "pin": False}, expect=400, code="invalid_input")
    c.call("PUT", "/v1/adapters/sql", {"path": "sql-r8"}, expect=400, code="invalid_input")
    # Malformed bodies are invalid_input, not unsupported.
    for bad in ({}, {"pin": True}, {"path": 5}, {"path": "x", "pin": "yes"}, [], "x"):
        c.call("PUT", "/v1/adapters/sql", bad, expect=400, code="invalid_input")
    c.call("PUT", "/v1/adapters/sql", raw="{", expect=400, code="invalid_input")
    c.call("PUT", "/v1/adapters/sql", raw="", expect=400, code="invalid_input")
    longname = "a" * 64
    for method in ("GET", "DELETE"):
        c.call(method, "/v1/adapters/" + longname, expect=400, code="invalid_input")
    c.call("PUT", "/v1/adapters/" + longname, {"path": "x"}, expect=400, code="invalid_input")
    assert [a["state"] for a in c.call("GET", "/v1/adapters").json] == ["failed"]
    # Nothing is recorded as loaded.
    assert db_rows(srv.db, "SELECT count(*) FROM adapters WHERE state = 'loaded'") == [(0,)]
    # AdapterLoad.path has minLength 1: an empty path is malformed, not a load attempt.
    c.call("PUT", "/v1/adapters/sql", {"path": ""}, expect=400, code="invalid_input")


# ---- auth ---------------------------------------------------------------------------------


def auth_checks(sv, token, health_open=True):
    good = sv.client(token=token)
    none = sv.client(token=False)
    wrong = sv.client(token=token + "x")
    short = sv.client(token=token[:-1])
    for cl in (none, wrong, short):
        for method, path in (("GET", "/v1/facts"), ("POST", "/v1/sequences"), ("GET", "/v1/tickets"),
                             ("GET", "/v1/openapi.yaml"), ("POST", "/v1/teardown"),
                             ("GET", "/v1/nothing"), ("PATCH", "/v1/facts")):
            cl.call(method, path, expect=401, code="unauthorized")
    for method, path in (("GET", "/healthz"), ("GET", "/readyz"), ("GET", "/metrics")):
        if health_open:
            none.call(method, path)
            wrong.call(method, path)
        else:
            none.call(method, path, expect=401, code="unauthorized")
            wrong.call(method, path, expect=401, code="unauthorized")
        good.call(method, path)
    # The scheme in any case and extra spaces are accepted (RFC 9110); other schemes refused.
    for h in ("bearer " + token, "Bearer  " + token):
        none.call("GET", "/v1/facts", headers={"Authorization": h})
    for h in ("Basic " + token, token, "Bearer", "Bearer" + token):
        none.call("GET", "/v1/facts", headers={"Authorization": h}, expect=401, code="unauthorized")
    s = good.create()
    good.step(plan(row(s, [1])))
    assert good.facts()["tickets_in_flight"] == 0
    # Nothing the refused clients sent reached the device.
    assert good.call("GET", "/v1/sequences/%d" % (s + 1), expect=404).code == "unknown_seq"
    assert good.call("GET", "/readyz").json == {"status": "ready"}


def test_auth_env_token(servers, tiny_model):
    sv = servers.start(tiny_model, env={"DEVIO_TOKEN": "s3cret-t0ken"}, token="s3cret-t0ken")
    auth_checks(sv, "s3cret-t0ken")
    assert sv.stop() == 0


def test_auth_token_file(servers, tiny_model, tmp_path):
    tf = tmp_path / "token"
    tf.write_text("file-token-123\n")
    sv = servers.start(tiny_model, ["--token-file", tf], token="file-token-123")
    auth_checks(sv, "file-token-123")
    assert sv.stop() == 0


def test_auth_health(servers, tiny_model):
    sv = servers.start(tiny_model, ["--auth-health"], env={"DEVIO_TOKEN": "tok"}, token="tok")
    auth_checks(sv, "tok", health_open=False)
    assert sv.stop() == 0


def test_auth_token_file_missing_or_empty(servers, tiny_model, tmp_path):
    empty = tmp_path / "empty"
    empty.write_text("\n")
    for tf in (tmp_path / "missing", empty):
        with pytest.raises(AssertionError, match="exited"):
            servers.start(tiny_model, ["--token-file", tf])


# ---- body limits --------------------------------------------------------------------------


def test_max_body_413(servers, tiny_model):
    sv = servers.start(tiny_model, ["--max-body", "1024"])
    c = sv.client()
    s = c.create()
    big = json.dumps(plan(row(s, [1] * 400)))
    assert len(big) > 1024
    f0 = c.facts()
    c.call("POST", "/v1/launch", raw=big, expect=413, code="too_large")
    c.call("POST", "/v1/step", raw=big, expect=413, code="too_large")
    c.call("POST", "/v1/effects", raw=big, expect=413, code="too_large")
    c.call("PUT", "/v1/adapters/x", raw=big, expect=413, code="too_large")
    c.call("POST", "/v1/sequences", raw=big, expect=413, code="too_large")
    c.call("POST", "/v1/tickets/1/await", raw=big, expect=413, code="too_large")
    c.call("POST", "/v1/teardown", raw=big, expect=413, code="too_large")
    c.call("POST", "/v1/nowhere", raw=big, expect=413, code="too_large")
    c.call("POST", "/v1/facts", raw=big, expect=413, code="too_large")
    assert c.facts() == f0 and c.seq(s)["len"] == 0
    c.call("GET", "/readyz")
    # Exactly the limit is accepted.
    body = json.dumps(plan(row(s, [1, 2])))
    body = body + " " * (1024 - len(body))
    assert len(body) == 1024
    t = c.call("POST", "/v1/launch", raw=body, expect=202).json["ticket"]
    c.await_(t)
    assert c.seq(s)["len"] == 2
    assert sv.stop() == 0


def test_max_body_on_get_routes(servers, tiny_model):
    """The contract says any body over --max-body is 413 too_large; the GET operations must
    document that answer (or the server must ignore GET bodies)."""
    sv = servers.start(tiny_model, ["--max-body", "1024"])
    c = sv.client()
    for path in ("/healthz", "/v1/facts", "/v1/tickets", "/v1/sequences/1"):
        a = c.request("GET", path, raw="x" * 2000)
        assert a.status in (200, 404, 413), a
    assert sv.stop() == 0


# ---- teardown and stop ----------------------------------------------------------------------


def test_teardown(servers, tiny_model):
    sv = servers.start(tiny_model)
    c = sv.client()
    s, b = c.create(), c.create()
    done = c.step(plan(row(s, [1, 2], logits="last")))
    h = done["rows"][0]["logits"]
    t = c.launch(plan(row(b, [3, 4])))
    m0, _ = parse_metrics(c.metrics())
    assert c.call("POST", "/v1/teardown", {"ignored": 1}).json == {"torn_down": True, "aborted": 1}
    for method, path, body in (
            ("POST", "/v1/sequences", None), ("GET", "/v1/sequences/%d" % s, None),
            ("DELETE", "/v1/sequences/%d" % s, None), ("POST", "/v1/launch", plan(row(s, [1]))),
            ("POST", "/v1/step", plan(row(s, [1]))), ("POST", "/v1/tickets/%d/await" % t, None),
            ("POST", "/v1/effects", {"kind": "release", "logits": h}), ("GET", "/v1/logits/%d" % h, None),
            ("GET", "/v1/facts", None), ("GET", "/v1/device", None), ("GET", "/v1/adapters", None),
            ("GET", "/v1/adapters/x", None), ("DELETE", "/v1/adapters/x", None),
            ("PUT", "/v1/adapters/x", {"path": "p"}), ("POST", "/v1/teardown", None)):
        c.call(method, path, body, expect=503, code="torn_down")
    c.call("GET", "/v1/logits/%d" % h, headers={"Accept": "application/octet-stream"}, expect=503,
           code="torn_down")
    c.call("GET", "/readyz", expect=503, code="not_ready")
    c.call("GET", "/healthz")
    c.call("GET", "/v1/openapi.yaml")
    hist = c.tickets()["tickets"]
    assert [(x["id"], x["status"]) for x in hist] == [(t, "aborted"), (done["ticket"], "ok")]
    assert hist[0]["error"]["code"] == "aborted"
    m1, _ = parse_metrics(c.metrics())
    assert metric(m1, "devio_up") == 0
    assert metric(m1, "devio_kv_blocks_free") is None and metric(m1, "devio_epoch") is None
    assert (metric(m1, "devio_tickets_settled_total", status="aborted") or 0) - \
        (metric(m0, "devio_tickets_settled_total", status="aborted") or 0) == 1
    assert sv.stop() == 0
    assert db_rows(sv.db, "SELECT count(*) FROM tickets WHERE status='in_flight'") == [(0,)]


def test_sigterm_exits_zero_and_aborts_in_flight(servers, tiny_model):
    sv = servers.start(tiny_model)
    c = sv.client()
    a, b = c.create(), c.create()
    ok = c.step(plan(row(a, prompt(8))))["ticket"]
    left = c.launch(plan(row(b, prompt(8))))
    assert sv.stop() == 0
    rows = dict(db_rows(sv.db, "SELECT id, status FROM tickets"))
    assert rows == {ok: "ok", left: "aborted"}
    assert db_rows(sv.db, "SELECT count(*) FROM tickets WHERE status='in_flight'") == [(0,)]
    assert db_rows(sv.db, "PRAGMA integrity_check") == [("ok",)]
    # A restart on the same database continues the ids and the epoch.
    sv2 = servers.start(tiny_model, db=sv.db)
    c2 = sv2.client()
    assert c2.facts()["epoch"] == 2
    s = c2.create()
    t = c2.step(plan(row(s, [1])))["ticket"]
    assert t > left
    assert [x["id"] for x in c2.tickets()["tickets"]] == [t, left, ok]
    assert sv2.stop() == 0


def test_sigterm_drains_an_await_in_progress(servers, small_model):
    """SIGTERM while a client waits on a long step: the drain lets the await finish with its
    answer, the process exits 0 within the drain bound, no row stays in_flight."""
    sv = servers.start(small_model, ["--drain-ms", "20000"])
    c = sv.client()
    s = c.create()
    t = c.launch(plan(row(s, [(k * 13 + 5) % 32000 for k in range(1000)], logits="last")))
    got = {}

    def waiter():
        try:
            got["a"] = c.request("POST", "/v1/tickets/%d/await" % t)
        except Exception as e:  # the server may close the connection: that is allowed
            got["e"] = e

    th = threading.Thread(target=waiter)
    th.start()
    time.sleep(0.2)
    sv.proc.send_signal(signal.SIGTERM)
    try:
        rc = sv.proc.wait(timeout=60)
    finally:
        th.join(timeout=60)
    assert rc == 0
    assert not th.is_alive()
    assert "a" in got, got
    assert got["a"].status == 200 and got["a"].json["ticket"] == t, got["a"]
    assert dict(db_rows(sv.db, "SELECT id, status FROM tickets"))[t] == "ok"
    assert db_rows(sv.db, "SELECT count(*) FROM tickets WHERE status='in_flight'") == [(0,)]
    sv.kill()


def test_concurrent_clients(srv):
    """Four clients on their own sequences, in parallel: every answer valid, lengths exact."""
    errors = []
    n_steps = 30

    def work(k):
        cl = srv.client()
        try:
            s = cl.create()
            for i in range(n_steps):
                body = plan(row(s, [(k + i) % VOCAB], sample={"temperature": 0}))
                # Four clients share max_depth 2: depth_exceeded is the expected answer to retry.
                for _ in range(10000):
                    a = cl.request("POST", "/v1/launch", body)
                    if a.status != 409:
                        break
                    assert a.code == "depth_exceeded", a
                    time.sleep(0.001)
                assert a.status == 202, a
                r = cl.await_(a.json["ticket"])
                assert r["rows"][0]["len"] == i + 1
            cl.call("DELETE", "/v1/sequences/%d" % s)
        except Exception as e:  # reported below
            errors.append(repr(e))
        finally:
            cl.close()

    probe = srv.client()
    f0 = probe.facts()
    ths = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in ths:
        t.start()
    for t in ths:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in ths)
    assert not errors, errors
    # Sampling without logits keeps no handle; the freed sequences gave their blocks back.
    assert probe.facts() == f0
    probe.close()
