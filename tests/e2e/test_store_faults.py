"""test_store_faults.py - devio-server when its SQLite history cannot be written: disk full, read-only file, unwritable at start.
Nothing answered may be missing from the history, a refused launch launches nothing, readiness and metrics tell, ids never repeat.
Every fault is undone in a finally (limits lifted, chattr -i), and every wait is bounded.
"""
import os
import re
import resource
import shutil
import subprocess
import time

import pytest

PAIRS = 300
FULL_BYTES = 4096   # below the sizes of the db and its WAL: every transaction's write fails
RECOVER_S = 10.0    # the store retries a heartbeat about once a second


def metric(text, name):
    m = re.search(r"^%s (\S+)$" % re.escape(name), text, re.M)
    assert m, "no %s in /metrics" % name
    return float(m.group(1))


def wait_ready(c, want, limit_s=RECOVER_S):
    """Poll /readyz until it answers `want` (200 or 503); the last answer."""
    deadline = time.monotonic() + limit_s
    while True:
        a = c.request("GET", "/readyz")
        if a.status == want or time.monotonic() > deadline:
            return a
        time.sleep(0.05)


class Pairs:
    """Launch/await pairs on one sequence; what each answer promised, checked as it comes."""

    def __init__(self, c):
        self.c = c
        self.seq = c.create()
        self.len = 0
        self.ok = set()        # await answered 200: row "ok" in history
        self.launched = set()  # launch answered 202: row in history
        self.kept = []         # await answered 503 store_unavailable: still awaitable
        self.refused = 0       # launch answered 503 store_unavailable
        self.pending = None    # a ticket launched and not yet answered by its await

    def one(self, k):
        c = self.c
        if self.pending is not None:
            self.await_one(self.pending)
            if self.pending is not None:
                return
        before = c.facts()
        a = c.request("POST", "/v1/launch",
                      {"rows": [{"seq": self.seq, "tokens": [k % 200 + 1]}]})
        if a.status == 503:
            assert a.code == "store_unavailable", a
            assert "nothing was launched" in a.json["error"]["message"], a
            self.refused += 1
            after = c.facts()
            assert after["tickets_in_flight"] == before["tickets_in_flight"], (before, after)
            assert after["kv"]["blocks_free"] == before["kv"]["blocks_free"], (before, after)
            assert c.seq(self.seq)["len"] == self.len
            return
        assert a.status == 202, a
        t = a.json["ticket"]
        self.launched.add(t)
        self.len += 1
        self.pending = t
        self.await_one(t)

    def await_one(self, t):
        r = self.c.request("POST", "/v1/tickets/%d/await" % t)
        if r.status == 503:
            assert r.code == "store_unavailable", r
            assert r.details.get("ticket") == t, r
            if t not in self.kept:
                self.kept.append(t)
            return
        assert r.status == 200, r
        assert r.json["ticket"] == t and r.json["rows"][0]["len"] == self.len, r
        self.ok.add(t)
        self.pending = None


def lift(pid):
    resource.prlimit(pid, resource.RLIMIT_FSIZE,
                     (resource.RLIM_INFINITY, resource.RLIM_INFINITY))


def test_disk_full_history(servers, tiny_model, tmp_path):
    """The history's files may not grow (RLIMIT_FSIZE on the server, SIGXFSZ ignored by it):
    launches are refused with nothing launched, awaits keep their result, /readyz and /metrics
    tell, and once the limit is lifted the server is ready again by itself with nothing lost."""
    db = tmp_path / "full.db"
    sv = servers.start(tiny_model, ["--max-depth", "4"], db=db, workdir=tmp_path / "a")
    c = sv.client(timeout=30)
    p = Pairs(c)
    pid = sv.proc.pid
    m0 = c.metrics()
    assert metric(m0, "devio_store_errors_total") == 0
    assert metric(m0, "devio_store_writable") == 1
    ok_before = metric(m0, "devio_store_last_success_timestamp_seconds")
    assert ok_before > time.time() - 3600
    try:
        for k in range(PAIRS // 3):
            p.one(k)
        assert p.refused == 0 and not p.kept and len(p.ok) == PAIRS // 3
        # One ticket launched before the disk fills: its await cannot be recorded.
        held = c.launch({"rows": [{"seq": c.create(), "tokens": [5, 6]}]})
        resource.prlimit(pid, resource.RLIMIT_FSIZE, (FULL_BYTES, resource.RLIM_INFINITY))
        r = c.request("POST", "/v1/tickets/%d/await" % held)
        assert r.status == 503 and r.code == "store_unavailable", r
        assert r.details["ticket"] == held
        for k in range(PAIRS // 3, PAIRS):
            p.one(k)
        assert p.refused > 0, "no launch was refused while the disk was full"
        ready = c.request("GET", "/readyz")
        assert ready.status == 503 and ready.code == "not_ready", ready
        assert "history" in ready.json["error"]["message"], ready
        m1 = c.metrics()
        errors_full = metric(m1, "devio_store_errors_total")
        assert errors_full >= 1
        assert metric(m1, "devio_store_writable") == 0
        assert metric(m1, "devio_store_last_success_timestamp_seconds") >= ok_before
        # Still full a second later: the heartbeat fails too, and readiness stays off.
        time.sleep(1.5)
        assert c.request("GET", "/readyz").status == 503
        assert metric(c.metrics(), "devio_store_errors_total") > errors_full
        assert c.facts()["tickets_in_flight"] == 1 + (1 if p.pending is not None else 0)
    finally:
        lift(pid)
    a = wait_ready(c, 200)
    assert a.status == 200, (a, sv.log())
    m2 = c.metrics()
    assert metric(m2, "devio_store_writable") == 1
    assert metric(m2, "devio_store_last_success_timestamp_seconds") > ok_before
    assert metric(m2, "devio_store_errors_total") >= errors_full
    # What was kept is awaited now, with its result.
    out = c.await_(held)
    assert out["ticket"] == held and out["rows"][0]["len"] == 2
    if p.pending is not None:
        p.await_one(p.pending)
    assert p.pending is None
    for k in range(10):
        p.one(PAIRS + k)
    assert p.pending is None
    # The stderr log is rate-limited: far fewer lines than failed writes.
    log = sv.log_path.read_text(errors="replace")
    lines = [ln for ln in log.splitlines() if " store: ticket store " in ln and "fail" in ln]
    assert 1 <= len(lines) <= 5, lines
    hist = {x["id"]: x for x in c.all_tickets()}
    missing = (p.launched | {held}) - hist.keys()
    assert not missing, "answered 202 but absent from history: %s" % sorted(missing)[:10]
    for t in p.ok | {held}:
        assert hist[t]["status"] == "ok", hist[t]
    assert not c.all_tickets(status="in_flight")
    seen = set(hist)
    print("disk full: %d awaits ok, %d launches refused, %d results kept and awaited later, "
          "%d store errors" % (len(p.ok), p.refused, len(p.kept) + 1,
                               metric(m2, "devio_store_errors_total")))
    assert sv.stop() == 0

    # Restart on the same file: ids continue past everything handed out before.
    sv2 = servers.start(tiny_model, db=db, workdir=tmp_path / "b")
    c2 = sv2.client()
    t = c2.step({"rows": [{"seq": c2.create(), "tokens": [1]}]})["ticket"]
    assert t not in seen and t > max(seen), (t, max(seen))
    assert sv2.stop() == 0


def chattr(flag, *paths):
    r = subprocess.run(["chattr", flag] + [str(p) for p in paths], capture_output=True, text=True,
                       timeout=30)
    return r.returncode == 0, r.stderr.strip()


def immutable_or_skip(path):
    """chattr +i works here (root, a file system that has the flag), else skip with why."""
    if shutil.which("chattr") is None:
        pytest.skip("no chattr on this machine")
    if os.geteuid() != 0:
        pytest.skip("chattr +i needs root (CAP_LINUX_IMMUTABLE)")
    probe = path / "probe"
    probe.write_text("x")
    ok, why = chattr("+i", probe)
    chattr("-i", probe)
    probe.unlink()
    if not ok:
        pytest.skip("chattr +i is not supported here: %s" % why)


def test_read_only_history(servers, tiny_model, tmp_path):
    """The history's files become immutable under the running server (chattr +i: even its open
    descriptors cannot write): launches refused, /readyz unready, ready again once writable."""
    immutable_or_skip(tmp_path)
    ddir = tmp_path / "hist"
    ddir.mkdir()
    db = ddir / "ro.db"
    sv = servers.start(tiny_model, db=db, workdir=tmp_path / "srv")
    c = sv.client(timeout=30)
    p = Pairs(c)
    for k in range(20):
        p.one(k)
    files = [f for f in (db, ddir / "ro.db-wal") if f.exists()]
    try:
        ok, why = chattr("+i", *files)
        assert ok, why
        for k in range(20, 60):
            p.one(k)
        assert p.refused > 0, "no launch was refused on a read-only history"
        ready = c.request("GET", "/readyz")
        assert ready.status == 503 and ready.code == "not_ready", ready
    finally:
        chattr("-i", *files)
    assert wait_ready(c, 200).status == 200, sv.log()
    for t in list(p.kept):
        p.await_one(t)
    for k in range(60, 70):
        p.one(k)
    assert p.pending is None
    hist = {x["id"]: x for x in c.all_tickets()}
    assert not p.launched - hist.keys()
    assert all(hist[t]["status"] == "ok" for t in p.ok)
    assert sv.stop() == 0


def start_fails(bins, model, db, tmp_path):
    cmd = [str(bins.server), "--model", str(model), "--listen", "127.0.0.1:0", "--db", str(db),
           "--adapters", str(tmp_path)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    return r.returncode, r.stderr


def test_start_on_unwritable_db(bins, tiny_model, tmp_path):
    """Start-up on a database that cannot be written exits non-zero naming the file and why."""
    d = tmp_path / "isdir.db"
    d.mkdir()
    rc, err = start_fails(bins, tiny_model, d, tmp_path)
    assert rc == 1
    assert str(d) in err and "the path is a directory" in err, err

    rc, err = start_fails(bins, tiny_model, tmp_path / "no" / "such" / "x.db", tmp_path)
    assert rc == 1
    assert "x.db" in err and "No such file or directory" in err, err

    immutable_or_skip(tmp_path)
    # A read-only file (immutable even to root).
    ro = tmp_path / "ro"
    ro.mkdir()
    f = ro / "h.db"
    f.write_bytes(b"")
    try:
        ok, why = chattr("+i", f)
        assert ok, why
        rc, err = start_fails(bins, tiny_model, f, tmp_path)
    finally:
        chattr("-i", f)
    assert rc == 1
    assert str(f) in err and "the file is not writable" in err, err
    # A directory where the WAL files cannot be created.
    wd = tmp_path / "rodir"
    wd.mkdir()
    try:
        ok, why = chattr("+i", wd)
        assert ok, why
        rc, err = start_fails(bins, tiny_model, wd / "h.db", tmp_path)
    finally:
        chattr("-i", wd)
    assert rc == 1
    assert str(wd / "h.db") in err and "is not writable" in err, err
