"""test_http_edges.py - the HTTP details clients expect: Allow, HEAD, 415, request ids, access logs, the adapters root, the drain.
Every server is a real devio-server on loopback; every wait is bounded."""
import json
import signal
import socket
import subprocess
import threading
import time

import pytest

VOCAB = 256


def raw(port, data, timeout=10):
    """One request on a fresh connection; the whole answer as bytes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        out = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return out
            out += chunk


@pytest.fixture(scope="module")
def srv(module_servers, tiny_model):
    return module_servers.start(tiny_model, ["--log-format", "json"])


def test_405_names_the_allowed_methods(srv):
    c = srv.client()
    for method, path, allow in (("PATCH", "/v1/facts", "GET, HEAD"),
                                ("GET", "/v1/launch", "POST"),
                                ("PUT", "/v1/sequences/1", "GET, HEAD, DELETE"),
                                ("POST", "/v1/adapters/x", "GET, HEAD, PUT, DELETE")):
        a = c.call(method, path, expect=405, code="method_not_allowed")
        assert a.headers.get("Allow") == allow, (method, path, a.headers)


def test_head_is_get_without_a_body(srv):
    for path in ("/healthz", "/readyz", "/v1/facts", "/metrics"):
        ans = raw(srv.port, b"HEAD %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                  % path.encode())
        head, _, body = ans.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), (path, head)
        assert body == b"", (path, body[:100])
        assert b"X-Request-Id: " in head


def test_415_for_bodies_that_are_not_json(srv):
    c = srv.client()
    s = c.create()
    body = json.dumps({"rows": [{"seq": s, "tokens": [1]}]})
    for ctype in ("text/plain", "application/x-www-form-urlencoded", "application/xml"):
        a = c.call("POST", "/v1/launch", raw=body, content_type=ctype, expect=415,
                   code="unsupported_media_type")
        assert ctype in a.json["error"]["message"]
    assert c.facts()["tickets_in_flight"] == 0  # nothing launched
    for ctype in ("application/json; charset=utf-8", "APPLICATION/JSON", "application/vnd.x+json"):
        t = c.call("POST", "/v1/launch", raw=body, content_type=ctype, expect=202).json["ticket"]
        c.await_(t)
    # No Content-Type at all is taken as JSON (a hand-written request).
    ans = raw(srv.port, b"POST /v1/step HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
              b"Content-Length: %d\r\n\r\n%s" % (len(body), body.encode()))
    assert ans.startswith(b"HTTP/1.1 200"), ans[:200]


def test_request_ids_echoed_generated_and_stored(srv):
    c = srv.client()
    a = c.call("GET", "/v1/facts", headers={"X-Request-Id": "client-42.a:b"})
    assert a.headers["X-Request-Id"] == "client-42.a:b"
    gen = {c.call("GET", "/healthz").headers["X-Request-Id"] for _ in range(3)}
    assert len(gen) == 3 and all(g and len(g) <= 128 for g in gen)
    for bad in ("x" * 129, "has space", 'q"uote'):
        got = c.call("GET", "/healthz", headers={"X-Request-Id": bad}).headers["X-Request-Id"]
        assert got != bad and " " not in got
    s = c.create()
    t = c.call("POST", "/v1/launch", {"rows": [{"seq": s, "tokens": [3]}]}, expect=202,
               headers={"X-Request-Id": "launch-7"}).json["ticket"]
    c.await_(t)
    r = c.call("POST", "/v1/step", {"rows": [{"seq": s, "tokens": [4]}]})
    rid = r.headers["X-Request-Id"]
    rows = {x["id"]: x for x in c.tickets("?limit=10")["tickets"]}
    assert rows[t]["request_id"] == "launch-7"
    assert rows[r.json["ticket"]]["request_id"] == rid
    # Errors carry it too.
    assert c.call("GET", "/v1/sequences/999", expect=404).headers["X-Request-Id"]


def test_json_access_log(srv):
    c = srv.client()
    c.call("GET", "/v1/device", headers={"X-Request-Id": "log-me-1"})
    deadline = time.monotonic() + 5
    while True:
        lines = srv.log_path.read_text(errors="replace").splitlines()
        recs = [json.loads(ln) for ln in lines if ln.strip()]  # every line is one JSON object
        hit = [r for r in recs if r.get("event") == "access" and r.get("request_id") == "log-me-1"]
        if hit or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert len(hit) == 1, lines[-5:]
    h = hit[0]
    assert (h["method"], h["path"], h["status"], h["level"], h["logger"]) == \
        ("GET", "/v1/device", 200, "info", "devio-server")
    assert h["client"] == "127.0.0.1" and h["duration_ms"] >= 0 and h["bytes"] > 0
    assert h["time"].endswith("Z")
    assert any(r.get("event") == "start" and r.get("port") == srv.port for r in recs)


def test_log_level_warn_drops_access_lines(servers, tiny_model):
    sv = servers.start(tiny_model, ["--log-level", "warn"])
    c = sv.client()
    for _ in range(5):
        c.call("GET", "/healthz")
    assert sv.stop() == 0
    assert " access: " not in sv.log_path.read_text(errors="replace")


def test_bad_log_flags_refused(bins, tiny_model, tmp_path):
    for flags in (["--log-format", "xml"], ["--log-level", "loud"]):
        p = subprocess.run([str(bins.server), "--model", str(tiny_model), "--db",
                            str(tmp_path / "x.db")] + flags, capture_output=True, timeout=60)
        assert p.returncode == 2 and b"log-" in p.stderr, p.stderr


def test_adapters_root_checked_at_start(bins, servers, tiny_model, tmp_path):
    # A given root whose parent is missing too (a typo) stops the start, naming it.
    missing = tmp_path / "no-such-dir" / "adapters"
    p = subprocess.run([str(bins.server), "--model", str(tiny_model), "--listen", "127.0.0.1:0",
                        "--db", str(tmp_path / "a.db"), "--adapters", str(missing)],
                       capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
    assert p.returncode == 1
    assert str(missing).encode() in p.stderr and b"No such file" in p.stderr, p.stderr
    # So does a file in its place.
    (tmp_path / "file").write_text("x")
    p = subprocess.run([str(bins.server), "--model", str(tiny_model), "--listen", "127.0.0.1:0",
                        "--db", str(tmp_path / "a.db"), "--adapters", str(tmp_path / "file")],
                       capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
    assert p.returncode == 1 and b"not a directory" in p.stderr, p.stderr
    # A given root missing on a volume that exists (a fresh one) is created, empty.
    fresh = tmp_path / "vol" / "adapters"
    (tmp_path / "vol").mkdir()
    sv = servers.start(tiny_model, ["--adapters", str(fresh)])
    assert fresh.is_dir() and sv.client().call("GET", "/v1/adapters").json == []
    assert sv.stop() == 0
    assert "adapters root '%s' created" % fresh in sv.log_path.read_text()
    # The default root ("adapters" in the working directory) may be missing: a warning,
    # and loads answer unsupported naming the configuration, not the client's path.
    wd = tmp_path / "wd"
    wd.mkdir()
    proc = subprocess.Popen([str(bins.server), "--model", str(tiny_model), "--listen",
                             "127.0.0.1:0", "--db", str(wd / "d.db")], cwd=str(wd),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL)
    try:
        line = proc.stdout.readline().decode()
        assert line.startswith("listening "), line
        port = int(line.split()[1])
        ans = raw(port, b"PUT /v1/adapters/a HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                  b"Content-Type: application/json\r\nContent-Length: 12\r\n\r\n{\"path\":\"a\"}")
        assert ans.startswith(b"HTTP/1.1 400"), ans[:200]
        assert b'"unsupported"' in ans and b"no adapters root" in ans, ans
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert b"loading adapters is off" in err, err


def test_drain_keeps_serving_all_but_launches(servers, tiny_model):
    """SIGTERM: /readyz fails at once and launches get 503 not_ready, but new connections
    are still accepted for awaits, reads and metrics; the process ends once nothing is in
    flight, well before --drain-ms."""
    sv = servers.start(tiny_model, ["--drain-ms", "30000"])
    c = sv.client()
    s = c.create()
    t = c.launch({"rows": [{"seq": s, "tokens": [1, 2, 3]}]})
    sv.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    fresh = sv.client()  # a new connection, opened during the drain
    assert fresh.call("GET", "/readyz", expect=503, code="not_ready")
    assert fresh.call("GET", "/healthz").json == {"status": "ok"}
    assert fresh.facts()["tickets_in_flight"] == 1
    assert "devio_ready 0" in fresh.metrics()
    a = fresh.call("POST", "/v1/launch", {"rows": [{"seq": c.create(), "tokens": [4]}]},
                   expect=503, code="not_ready")
    assert a.headers.get("Connection", "").lower() == "close"
    assert sv.alive(), "the server must wait for the unawaited ticket"
    late = sv.client()
    assert late.await_(t)["rows"][0]["len"] == 3
    t0 = time.monotonic()
    rc = sv.proc.wait(timeout=20)
    assert rc == 0 and time.monotonic() - t0 < 10


def test_unread_log_pipe_never_stalls_the_server(bins, tiny_model, tmp_path, contract):
    """stderr a pipe nobody reads: access lines fill it, then are dropped, and
    every request is still answered (a log never blocks serving)."""
    from client import Client
    proc = subprocess.Popen([str(bins.server), "--model", str(tiny_model), "--listen",
                             "127.0.0.1:0", "--db", str(tmp_path / "d.db"), "--adapters",
                             str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL)
    got, reader = [], None
    try:
        port = int(proc.stdout.readline().split()[1])
        c = Client("127.0.0.1", port, contract, timeout=10)
        t0 = time.monotonic()
        for _ in range(1500):  # about 300 KB of access lines into a 64 KB pipe
            c.call("GET", "/healthz")
        assert time.monotonic() - t0 < 60
        # Someone starts reading: the next line says how many were lost.
        reader = threading.Thread(target=lambda: got.append(proc.stderr.read()), daemon=True)
        reader.start()
        time.sleep(0.5)
        for _ in range(5):
            c.call("GET", "/healthz")
        c.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    if reader:
        reader.join(timeout=30)
    assert proc.returncode == 0
    assert b"lines dropped: the log was not being read" in got[0]


def test_libmicrohttpd_messages_use_devio_log(servers, tiny_model):
    """libmicrohttpd's own messages (here: a client gone mid-headers) are devio log
    lines in the chosen format, not raw text on stderr."""
    sv = servers.start(tiny_model, ["--log-format", "json"])
    with socket.create_connection(("127.0.0.1", sv.port), timeout=5) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHo")
        time.sleep(0.2)
    time.sleep(0.3)
    assert sv.stop() == 0
    recs = [json.loads(ln) for ln in sv.log_path.read_text().splitlines() if ln.strip()]
    assert any(r["event"] == "http" and r["level"] == "warn" for r in recs), recs[-3:]
