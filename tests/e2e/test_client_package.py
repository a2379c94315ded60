"""test_client_package.py - clients/python's typed calls against a real devio-server, one per route.
Each call's answer must be the one the raw route gives; an error answer must raise DevioError with its code."""
import struct

import pytest

from client import devio_client
from test_adapters import mkadapter

TOKEN = "client-secret"


@pytest.fixture
def srv(servers, tiny_model):
    return servers.start(tiny_model, token=TOKEN, env={"DEVIO_TOKEN": TOKEN})


def test_every_route(bins, tiny_model, srv):
    with devio_client.Client("http://127.0.0.1:%d" % srv.port, token=TOKEN, timeout=30) as c:
        assert c.healthz() and c.readyz()
        assert c.device()["model"]["vocab_size"] == 256
        assert "paths:" in c.openapi()
        facts0 = c.facts()

        seq = c.create_sequence()
        res = c.step({"rows": [{"seq": seq, "tokens": [1, 2, 3], "logits": "last",
                                "sample": {"temperature": 0}}]})
        row = res["rows"][0]
        assert row["len"] == 3 and len(row["tokens"]) == 1 and res["tokens"] == 3
        handle = row["logits"]
        top = c.logits_top(handle, top=3)
        raw = c.logits_raw(handle)
        vals = struct.unpack("<%df" % (len(raw) // 4), raw)
        assert top["shape"] == [1, 256] and len(vals) == 256
        assert top["top"][0][0] == max(range(256), key=lambda i: (vals[i], -i)) == row["tokens"][0]
        assert c.sample(handle, {"temperature": 0})["tokens"] == row["tokens"]
        assert c.release_logits(handle) == {"kind": "release"}

        t = c.launch({"rows": [{"seq": seq, "tokens": [4]}]})
        assert c.await_ticket(t, timeout_ms=10000)["rows"][0]["len"] == 4
        assert c.sequence(seq)["len"] == 4
        moved = c.import_state(c.export_state(seq))
        assert c.sequence(moved)["len"] == 4 and c.free(moved)["kind"] == "free"
        child = c.fork(seq)
        assert c.truncate(child, 2)["len"] == 2
        assert c.snapshot(seq)["kind"] == "snapshot"
        assert c.release_snapshots(seq)["kind"] == "release"
        assert c.free(child)["kind"] == "free"
        assert c.delete_sequence(seq)["kind"] == "free"
        hist = c.tickets(limit=10, status="ok")
        assert [r["id"] for r in hist["tickets"]] == [t, res["ticket"]] and hist["next"] is None

        mkadapter(bins, tiny_model, srv.workdir / "adapters" / "a1", seed=1)
        rec = c.load_adapter("a1", "a1")
        assert rec["state"] == "loaded" and c.adapter("a1")["sha256"] == rec["sha256"]
        assert c.pin_adapter("a1")["pinned"] and not c.unpin_adapter("a1")["pinned"]
        assert [a["name"] for a in c.adapters()] == ["a1"]
        assert c.unload_adapter("a1")["state"] == "unloaded"

        assert "devio_" in c.metrics()
        assert c.facts()["kv"] == facts0["kv"]
        assert c.teardown()["torn_down"] is True


def test_errors_raise_with_code(srv):
    c = devio_client.Client("http://127.0.0.1:%d" % srv.port, token=TOKEN, timeout=30)
    with pytest.raises(devio_client.DevioError) as e:
        c.sequence(999)
    assert (e.value.status, e.value.code, e.value.details) == (404, "unknown_seq", {"seq": 999})
    seq = c.create_sequence()
    with pytest.raises(devio_client.DevioError) as e:
        c.launch({"rows": [{"seq": seq, "tokens": [1 << 20]}]})
    assert e.value.status == 400 and e.value.code == "invalid_input"
    bad = devio_client.Client("http://127.0.0.1:%d" % srv.port, token="wrong", timeout=30)
    with pytest.raises(devio_client.DevioError) as e:
        bad.facts()
    assert e.value.code == "unauthorized"
    assert bad.healthz()  # health needs no token
    c.close()
    bad.close()
    with pytest.raises(ValueError):
        devio_client.Client("ftp://x")


class _LosesFirstAnswer(devio_client.Client):
    """The first answer of each keyed request reaches the server's side of the wire and no
    further: the request ran, the client sees a lost connection."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.lost = set()

    def request(self, method, path, body=None, headers=None, **kw):
        r = super().request(method, path, body, headers=headers, **kw)
        key = (headers or {}).get("Idempotency-Key")
        if key and key not in self.lost:
            self.lost.add(key)
            raise devio_client.ConnectionLost("%s %s: the answer was lost" % (method, path))
        return r


def test_retries_are_safe(srv):
    """Every keyed call whose answer is lost is retried with its key and gets the first answer:
    one sequence made, one step run, one fork."""
    url = "http://127.0.0.1:%d" % srv.port
    with _LosesFirstAnswer(url, token=TOKEN, timeout=30, retry_delay=0.01) as c, \
            devio_client.Client(url, token=TOKEN, timeout=30) as plain:
        seq = c.create_sequence()
        assert plain.create_sequence() == seq + 1
        r = c.step({"rows": [{"seq": seq, "tokens": [1, 2, 3], "sample": {"temperature": 0}}]})
        assert plain.sequence(seq)["len"] == 3 and r["rows"][0]["len"] == 3
        t = c.launch({"rows": [{"seq": seq, "tokens": r["rows"][0]["tokens"]}]})
        assert plain.facts()["tickets_in_flight"] == 1
        assert c.await_ticket(t)["rows"][0]["len"] == 4
        child = c.fork(seq)
        assert plain.create_sequence() == child + 1
        assert c.free(child)["freed_blocks"] >= 0
        with pytest.raises(devio_client.DevioError) as e:
            plain.sequence(child)
        assert e.value.code == "unknown_seq"
        # A key given by the caller is the key sent: the same key twice is one request.
        k = "caller-key"
        assert plain.create_sequence(key=k) == plain.create_sequence(key=k)
        # Without retries a lost answer is the caller's to handle.
        c.retries = 0
        with pytest.raises(devio_client.ConnectionLost):
            c.create_sequence()
