"""test_adapters.py - LoRA adapter commands over HTTP with the SQLite rows checked after each one, and the reload at restart.
Adapters are written by devio-mkmodel into each server's own adapters root; no test waits without a bound or leaves a server running.
"""
import hashlib
import json
import os
import re
import sqlite3
import subprocess
import time

import pytest

VOCAB = 256  # the tiny preset
RECORD_KEYS = {"name", "path", "rank", "alpha", "scale", "targets", "sha256", "size", "state",
               "pinned", "rows_served", "loaded_ms", "last_used_ms", "reason"}


# ---- helpers ---------------------------------------------------------------------------


def mkadapter(bins, model, out, rank=8, alpha=16, targets="q_proj,v_proj", seed=None):
    cmd = [str(bins.mkmodel), "--adapter", "--model", str(model), "--rank", str(rank),
           "--alpha", str(alpha), "--targets", targets, "--out", str(out)]
    if seed is not None:
        cmd += ["--seed", str(seed)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    return out


def weights_of(d):
    data = (d / "adapter_model.safetensors").read_bytes()
    return hashlib.sha256(data).hexdigest(), len(data)


def db_adapters(db):
    """Every row of the adapters table, by name, as dicts."""
    con = sqlite3.connect(str(db), timeout=10)
    con.row_factory = sqlite3.Row
    try:
        return {r["name"]: dict(r) for r in con.execute("SELECT * FROM adapters ORDER BY name")}
    finally:
        con.close()


def root_of(srv):
    return srv.workdir / "adapters"


def put(c, name, path, pin=None, expect=200, code=None):
    body = {"path": path}
    if pin is not None:
        body["pin"] = pin
    return c.call("PUT", "/v1/adapters/" + name, body, expect=expect, code=code).json


def get(c, name, expect=200, code=None):
    return c.call("GET", "/v1/adapters/" + name, expect=expect, code=code).json


def listing(c):
    out = c.call("GET", "/v1/adapters").json
    # The loaded ones first (in the device's order), then the others by name.
    loaded = [a["state"] == "loaded" for a in out]
    assert loaded == sorted(loaded, reverse=True), out
    rest = [a["name"] for a in out if a["state"] != "loaded"]
    assert rest == sorted(rest), out
    assert len({a["name"] for a in out}) == len(out), out
    return {a["name"]: a for a in out}


def step_logits(c, rows):
    """One step; the raw f32 bytes of every row's logits (rows ask for "all")."""
    r = c.step({"rows": rows})
    out = []
    for x in r["rows"]:
        out.append(c.logits_raw(x["logits"]))
        c.effect({"kind": "release", "logits": x["logits"]})
    return out


def prompt(n, salt=0):
    return [(k * 7 + salt * 31 + 1) % VOCAB for k in range(n)]


def check_row(row, rec):
    """The SQLite row holds what the record says."""
    assert row["name"] == rec["name"] and row["path"] == rec["path"], (row, rec)
    assert row["state"] == rec["state"] and bool(row["pinned"]) == rec["pinned"], (row, rec)
    assert row["rank"] == rec["rank"] and row["size"] == rec["size"], (row, rec)
    assert row["alpha"] == rec["alpha"] and row["scale"] == rec["scale"], (row, rec)
    assert row["sha256"] == rec["sha256"], (row, rec)
    assert row["targets"] == ",".join(rec["targets"]), (row, rec)
    assert row["loaded_ms"] == rec["loaded_ms"] and row["reason"] == rec["reason"], (row, rec)


def metric_value(text, name, **labels):
    lab = ",".join('%s="%s"' % kv for kv in labels.items())
    pat = re.escape(name) + (r"\{" + re.escape(lab) + r"\}" if lab else "") + r" (\S+)$"
    for line in text.splitlines():
        m = re.match(pat, line)
        if m:
            return float(m.group(1))
    return None


@pytest.fixture
def adapter_srv(servers, tiny_model):
    """A fresh server per test: the adapter table and the store start empty."""
    def start(*args, **kw):
        return servers.start(tiny_model, args=args, **kw)
    return start


# ---- commands, one by one -----------------------------------------------------------------


def test_load_list_get_pin_unpin_unload(bins, tiny_model, adapter_srv):
    srv = adapter_srv()
    c = srv.client()
    a1 = mkadapter(bins, tiny_model, root_of(srv) / "a1", seed=1)
    sha, size = weights_of(a1)
    t0 = int(time.time() * 1000)

    rec = put(c, "a", "a1")
    assert set(rec) == RECORD_KEYS, rec
    assert rec["state"] == "loaded" and rec["path"] == "a1" and rec["rank"] == 8
    assert rec["alpha"] == 16.0 and rec["scale"] == 2.0 and rec["targets"] == ["q_proj", "v_proj"]
    assert rec["sha256"] == sha and rec["size"] == size and rec["pinned"] is False
    assert rec["rows_served"] == 0 and rec["reason"] is None
    assert t0 - 5000 <= rec["loaded_ms"] <= int(time.time() * 1000) + 5000
    rows = db_adapters(srv.db)
    assert list(rows) == ["a"]
    check_row(rows["a"], rec)
    assert rows["a"]["last_used_ms"] >= rows["a"]["loaded_ms"]
    assert c.facts()["adapters_loaded"] == 1

    assert listing(c) == {"a": rec}
    assert get(c, "a") == rec

    pinned = c.call("POST", "/v1/adapters/a/pin").json
    assert pinned["pinned"] is True and pinned["state"] == "loaded"
    assert pinned["loaded_ms"] == rec["loaded_ms"]
    check_row(db_adapters(srv.db)["a"], pinned)
    unpinned = c.call("POST", "/v1/adapters/a/unpin").json
    assert unpinned["pinned"] is False
    check_row(db_adapters(srv.db)["a"], unpinned)

    # The same weights again: nothing reloads, the load time stays; a pin request still pins.
    again = put(c, "a", "a1")
    assert again["loaded_ms"] == rec["loaded_ms"] and again["sha256"] == sha
    assert "evicted" not in again
    check_row(db_adapters(srv.db)["a"], again)
    again = put(c, "a", "a1", pin=True)
    assert again["pinned"] is True and again["loaded_ms"] == rec["loaded_ms"]
    check_row(db_adapters(srv.db)["a"], again)
    assert c.facts()["adapters_loaded"] == 1

    # Rows served come from the device's table.
    s = c.create()
    c.step({"rows": [{"seq": s, "tokens": prompt(3), "adapter": "a"}]})
    c.step({"rows": [{"seq": s, "tokens": [5], "adapter": "a"}]})
    assert get(c, "a")["rows_served"] == 2
    m = c.metrics()
    assert metric_value(m, "devio_adapter_rows_served_total", adapter="a") == 2
    assert metric_value(m, "devio_adapters_loaded") == 1
    assert metric_value(m, "devio_adapters_capacity") == 4

    gone = c.call("DELETE", "/v1/adapters/a").json
    assert gone["state"] == "unloaded" and gone["pinned"] is False and gone["rows_served"] == 2
    rows = db_adapters(srv.db)
    check_row(rows["a"], gone)
    after = get(c, "a")
    assert after["state"] == "unloaded" and after["rows_served"] == 0 and after["sha256"] == sha
    assert listing(c) == {"a": after}
    assert c.facts()["adapters_loaded"] == 0
    m = c.metrics()
    assert metric_value(m, "devio_adapter_rows_served_total", adapter="a") is None
    assert metric_value(m, "devio_adapters_loaded") == 0

    # Commands on an adapter that is not loaded change nothing.
    c.call("DELETE", "/v1/adapters/a", expect=404, code="unknown_adapter")
    c.call("POST", "/v1/adapters/a/pin", expect=404, code="unknown_adapter")
    c.call("POST", "/v1/adapters/a/unpin", expect=404, code="unknown_adapter")
    c.call("GET", "/v1/adapters/zz", expect=404, code="unknown_adapter")
    c.call("DELETE", "/v1/adapters/zz", expect=404, code="unknown_adapter")
    assert db_adapters(srv.db) == rows
    # A row may not name an unloaded adapter.
    e = c.call("POST", "/v1/launch", {"rows": [{"seq": s, "tokens": [1], "adapter": "a"}]},
               expect=404, code="unknown_adapter")
    assert e.details == {"row": 0}

    # Loaded again from the unloaded record: a new load time.
    back = put(c, "a", "a1")
    assert back["state"] == "loaded" and back["loaded_ms"] >= rec["loaded_ms"]
    check_row(db_adapters(srv.db)["a"], back)


def test_malformed_bodies_write_nothing(bins, tiny_model, adapter_srv):
    srv = adapter_srv()
    c = srv.client()
    mkadapter(bins, tiny_model, root_of(srv) / "a1")
    for bad in ({}, {"pin": True}, {"path": 5}, {"path": ""}, {"path": "a1", "pin": "yes"},
                {"path": "a1", "extra": 1}, [], "x"):
        c.call("PUT", "/v1/adapters/a", bad, expect=400, code="invalid_input")
    c.call("PUT", "/v1/adapters/a", raw="{", expect=400, code="invalid_input")
    c.call("PUT", "/v1/adapters/" + "n" * 64, {"path": "a1"}, expect=400, code="invalid_input")
    c.call("PUT", "/v1/adapters/a", {"path": "p" * 300}, expect=400, code="invalid_input")
    assert db_adapters(srv.db) == {}
    assert c.call("GET", "/v1/adapters").json == []


def test_same_name_other_weights(bins, tiny_model, adapter_srv):
    srv = adapter_srv()
    c = srv.client()
    mkadapter(bins, tiny_model, root_of(srv) / "a1", seed=1)
    mkadapter(bins, tiny_model, root_of(srv) / "a2", seed=2)
    rec = put(c, "a", "a1")
    before = db_adapters(srv.db)
    put(c, "a", "a2", expect=400, code="invalid_input")
    # A failure never overwrites a loaded adapter's row, whatever the cause.
    put(c, "a", "missing", expect=400, code="invalid_input")
    put(c, "a", "../a1", expect=400, code="invalid_input")
    assert db_adapters(srv.db) == before
    assert get(c, "a") == rec
    assert c.facts()["adapters_loaded"] == 1


def test_paths_outside_the_root(bins, tiny_model, adapter_srv, tmp_path):
    srv = adapter_srv()
    c = srv.client()
    root = root_of(srv)
    outside = mkadapter(bins, tiny_model, tmp_path / "outside" / "x", seed=3)
    (root / "sub").mkdir()
    os.symlink(str(outside), str(root / "link"))
    # A directory inside the root whose weights file is a link out of it.
    inner = mkadapter(bins, tiny_model, root / "inner", seed=4)
    (inner / "adapter_model.safetensors").unlink()
    os.symlink(str(outside / "adapter_model.safetensors"), str(inner / "adapter_model.safetensors"))
    for path in ("../outside/x", str(outside), "link", "sub/../../outside/x", "inner",
                 "/etc"):
        e = c.call("PUT", "/v1/adapters/esc", {"path": path}, expect=400, code="invalid_input")
        assert "outside the adapters root" in e.json["error"]["message"], e
    assert db_adapters(srv.db) == {}
    c.call("GET", "/v1/adapters/esc", expect=404, code="unknown_adapter")
    assert c.facts()["adapters_loaded"] == 0


@pytest.mark.parametrize("case", ["missing", "corrupt_config", "rank", "target", "shape"])
def test_bad_adapters(bins, tiny_model, adapter_srv, tmp_path, case):
    srv = adapter_srv("--max-lora-rank", "8")
    c = srv.client()
    root = root_of(srv)
    if case == "missing":
        path, status, code = "nothing-here", 400, "invalid_input"
    elif case == "corrupt_config":
        d = mkadapter(bins, tiny_model, root / "bad")
        (d / "adapter_config.json").write_text('{"r": 8, "lora_alpha": ')
        path, status, code = "bad", 400, "invalid_input"
    elif case == "rank":
        mkadapter(bins, tiny_model, root / "bad", rank=16, alpha=16)
        path, status, code = "bad", 400, "invalid_input"
    elif case == "target":
        d = mkadapter(bins, tiny_model, root / "bad")
        cfg = json.loads((d / "adapter_config.json").read_text())
        cfg["target_modules"] = ["q_proj", "w_proj"]
        (d / "adapter_config.json").write_text(json.dumps(cfg))
        path, status, code = "bad", 400, "unsupported"
    else:
        other = subprocess.run([str(bins.mkmodel), "--preset", "tiny", "--hidden", "32",
                                "--head-dim", "8", "--out", str(tmp_path / "other")],
                               check=True, capture_output=True, timeout=120)
        assert other.returncode == 0
        mkadapter(bins, tmp_path / "other", root / "bad")
        path, status, code = "bad", 400, "invalid_input"
    e = c.call("PUT", "/v1/adapters/bad", {"path": path}, expect=status, code=code)
    rows = db_adapters(srv.db)
    assert list(rows) == ["bad"]
    row = rows["bad"]
    assert row["state"] == "failed" and row["path"] == path and row["pinned"] == 0
    assert row["reason"] == "%s: %s" % (code, e.json["error"]["message"])
    assert row["sha256"] is None and row["rank"] == 0
    rec = get(c, "bad")
    assert rec["state"] == "failed" and rec["reason"] == row["reason"] and rec["rows_served"] == 0
    assert listing(c) == {"bad": rec}
    assert c.facts()["adapters_loaded"] == 0
    s = c.create()
    c.call("POST", "/v1/launch", {"rows": [{"seq": s, "tokens": [1], "adapter": "bad"}]},
           expect=404, code="unknown_adapter")
    # A good load of the name replaces the failed record.
    mkadapter(bins, tiny_model, root / "good")
    rec = put(c, "bad", "good")
    assert rec["state"] == "loaded" and rec["reason"] is None
    check_row(db_adapters(srv.db)["bad"], rec)


# ---- capacity and eviction ------------------------------------------------------------------


def test_capacity_evicts_lru_unpinned(bins, tiny_model, adapter_srv):
    srv = adapter_srv("--max-loras", "2")
    c = srv.client()
    for k, n in enumerate("abcd"):
        mkadapter(bins, tiny_model, root_of(srv) / n, seed=10 + k)
    put(c, "a", "a")
    put(c, "b", "b")
    s = c.create()
    c.step({"rows": [{"seq": s, "tokens": [1, 2], "adapter": "a"}]})  # b is now the LRU
    rec = put(c, "c", "c")
    assert rec["evicted"] == "b" and rec["state"] == "loaded"
    rows = db_adapters(srv.db)
    assert rows["b"]["state"] == "unloaded" and rows["b"]["reason"] == "evicted"
    assert rows["a"]["state"] == "loaded" and rows["c"]["state"] == "loaded"
    assert {n: a["state"] for n, a in listing(c).items()} == {
        "a": "loaded", "b": "unloaded", "c": "loaded"}
    assert get(c, "b")["reason"] == "evicted"
    assert c.facts()["adapters_loaded"] == 2

    # Both loaded adapters pinned: nothing can go.
    c.call("POST", "/v1/adapters/a/pin")
    c.call("POST", "/v1/adapters/c/pin")
    before = db_adapters(srv.db)
    e = c.call("PUT", "/v1/adapters/d", {"path": "d"}, expect=409, code="adapter_capacity")
    assert e.details == {"max_loras": 2}
    rows = db_adapters(srv.db)
    assert rows["d"]["state"] == "failed" and rows["d"]["reason"].startswith("adapter_capacity: ")
    del rows["d"]
    assert rows == before
    assert {n for n, a in listing(c).items() if a["state"] == "loaded"} == {"a", "c"}
    # Unpinning one makes room again.
    c.call("POST", "/v1/adapters/c/unpin")
    rec = put(c, "d", "d")
    assert rec["evicted"] == "c" and rec["state"] == "loaded"
    rows = db_adapters(srv.db)
    assert rows["c"]["state"] == "unloaded" and rows["c"]["reason"] == "evicted"
    assert rows["d"]["state"] == "loaded" and rows["d"]["reason"] is None
    assert rows["a"]["state"] == "loaded" and rows["a"]["pinned"] == 1


def test_adapter_of_unawaited_ticket_is_not_evicted(bins, tiny_model, adapter_srv):
    srv = adapter_srv("--max-loras", "2")
    c = srv.client()
    for k, n in enumerate("ABCD"):
        mkadapter(bins, tiny_model, root_of(srv) / n, seed=20 + k)
    put(c, "A", "A")
    put(c, "B", "B")
    sa, sb = c.create(), c.create()
    ticket = c.launch({"rows": [{"seq": sa, "tokens": prompt(4), "adapter": "A",
                                 "logits": "last"}]})
    # B is used after A, so A is the least recently used, but its ticket is not awaited.
    c.step({"rows": [{"seq": sb, "tokens": prompt(2, 1), "adapter": "B"}]})
    for n in ("C", "D"):
        a = c.request("PUT", "/v1/adapters/" + n, {"path": n})
        assert a.status in (200, 409), a
        if a.status == 200:
            assert a.json["evicted"] != "A", a
        else:
            assert a.code == "adapter_capacity", a
        assert get(c, "A")["state"] == "loaded"
        assert db_adapters(srv.db)["A"]["state"] == "loaded"
    # With the other slot pinned, nothing can go while A's ticket is out.
    loaded = [n for n, a in listing(c).items() if a["state"] == "loaded" and n != "A"]
    assert len(loaded) == 1
    c.call("POST", "/v1/adapters/%s/pin" % loaded[0])
    mkadapter(bins, tiny_model, root_of(srv) / "E", seed=30)
    c.call("PUT", "/v1/adapters/E", {"path": "E"}, expect=409, code="adapter_capacity")
    assert db_adapters(srv.db)["A"]["state"] == "loaded"
    r = c.await_(ticket)
    assert r["rows"][0]["len"] == 4 and "logits" in r["rows"][0]
    # Awaited: A may go now.
    rec = put(c, "E", "E")
    assert rec["evicted"] == "A"
    assert db_adapters(srv.db)["A"]["state"] == "unloaded"


# ---- numbers ---------------------------------------------------------------------------------


def test_adapter_changes_logits_and_is_batch_invariant(bins, tiny_model, adapter_srv):
    srv = adapter_srv()
    c = srv.client()
    mkadapter(bins, tiny_model, root_of(srv) / "A", seed=41)
    mkadapter(bins, tiny_model, root_of(srv) / "B", seed=42,
              targets="q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj")
    put(c, "A", "A")
    put(c, "B", "B")
    toks = prompt(9, 3)
    base, with_a = step_logits(c, [
        {"seq": c.create(), "tokens": toks, "logits": "all"},
        {"seq": c.create(), "tokens": toks, "logits": "all", "adapter": "A"},
    ])
    assert len(base) == len(with_a) == 9 * VOCAB * 4
    assert base != with_a, "the adapter did not change the logits"

    alone = step_logits(c, [{"seq": c.create(), "tokens": toks, "logits": "all",
                             "adapter": "A"}])[0]
    assert alone == with_a
    # The same row batched with rows of B and rows without an adapter, at other lengths.
    rows = []
    for k in range(6):
        kw = {"adapter": "B"} if k % 2 else {}
        rows.append(dict({"seq": c.create(), "tokens": prompt(3 + k, k), "logits": "all"}, **kw))
    rows.insert(3, {"seq": c.create(), "tokens": toks, "logits": "all", "adapter": "A"})
    out = step_logits(c, rows)
    assert out[3] == alone, "adapter A's row changed with its batch"
    # B's rows differ from the same rows without an adapter.
    plain = step_logits(c, [{"seq": c.create(), "tokens": prompt(4, 1), "logits": "all"}])[0]
    assert out[1] != plain
    assert get(c, "A")["rows_served"] == 3 and get(c, "B")["rows_served"] == 3


def test_store_write_failure_is_reported(bins, tiny_model, adapter_srv):
    """A row write that fails after the device changed answers 500 io_error saying so."""
    srv = adapter_srv()
    c = srv.client()
    mkadapter(bins, tiny_model, root_of(srv) / "a1")
    con = sqlite3.connect(str(srv.db), timeout=10, isolation_level=None)
    try:
        con.execute("BEGIN IMMEDIATE")  # holds the write lock past the store's busy timeout
        e = c.call("PUT", "/v1/adapters/a", {"path": "a1"}, expect=500, code="io_error")
        assert "is loaded on the device" in e.json["error"]["message"], e
        con.execute("ROLLBACK")
    finally:
        con.close()
    assert "a" not in db_adapters(srv.db)
    # The device wins in reads; the next command on the name writes the row.
    rec = get(c, "a")
    assert rec["state"] == "loaded" and rec["loaded_ms"] == 0
    rec = c.call("POST", "/v1/adapters/a/pin").json
    check_row(db_adapters(srv.db)["a"], rec)
    assert "record could not be written" in srv.log()


# ---- restart -------------------------------------------------------------------------------


def test_restart_reloads_recorded_adapters(bins, tiny_model, servers, tmp_path):
    wd = tmp_path / "restart"
    srv = servers.start(tiny_model, workdir=wd)
    c = srv.client()
    root = root_of(srv)
    for k, n in enumerate(("a", "b", "c", "d")):
        mkadapter(bins, tiny_model, root / n, seed=50 + k)
    put(c, "a", "a")
    put(c, "b", "b")
    put(c, "c", "c", pin=True)
    put(c, "d", "d")
    toks = prompt(6, 2)
    before = step_logits(c, [{"seq": c.create(), "tokens": toks, "logits": "all", "adapter": n}
                             for n in ("a", "c")])
    srv.kill()

    mkadapter(bins, tiny_model, root / "b", seed=99)  # other weights under the same path
    for f in (root / "d").iterdir():
        f.unlink()
    (root / "d").rmdir()

    srv2 = servers.start(tiny_model, workdir=wd, db=srv.db)
    c2 = srv2.client()
    recs = listing(c2)
    assert recs["a"]["state"] == "loaded" and recs["a"]["pinned"] is False
    assert recs["c"]["state"] == "loaded" and recs["c"]["pinned"] is True
    assert recs["b"]["state"] == "stale" and recs["b"]["reason"] == "weights changed since load"
    # Its directory is gone: what the record names is not there (the command's fault).
    assert recs["d"]["state"] == "failed" and recs["d"]["reason"].startswith("invalid_input: ")
    rows = db_adapters(srv2.db)
    for n in "abcd":
        check_row(rows[n], dict(recs[n]))
    assert c2.facts()["adapters_loaded"] == 2
    after = step_logits(c2, [{"seq": c2.create(), "tokens": toks, "logits": "all", "adapter": n}
                             for n in ("a", "c")])
    assert after == before, "reloaded adapters compute other numbers"
    for n in ("b", "d"):
        c2.call("POST", "/v1/launch", {"rows": [{"seq": c2.create(), "tokens": [1], "adapter": n}]},
                expect=404, code="unknown_adapter")
    log = srv2.log()
    for n, word in (("a", "loaded again"), ("b", "stale"), ("c", "loaded again, pinned"),
                    ("d", "not loaded again")):
        assert ("adapter '%s' (%s): %s" % (n, n, word)) in log, log
    # A stale record loads again once asked to, with the new weights.
    rec = put(c2, "b", "b")
    assert rec["state"] == "loaded" and rec["sha256"] == weights_of(root / "b")[0]
    check_row(db_adapters(srv2.db)["b"], rec)
    assert srv2.stop() == 0
