"""test_events.py - GET /v1/events: the device's events as server-sent events, in order, with
block prefix hashes a router can compute itself; resumed with Last-Event-ID without loss, told
what it missed when the ring (--event-buffer) dropped events; bounded by --event-subscribers;
and no open stream holds up a stop. Every read has a timeout; a few seconds in all.
"""
import http.client
import json
import struct
import time

from client import devio_client
from history import wait_until

TOKENS = [(5 * i + 11) % 200 + 1 for i in range(10)]


def prefix_hash(prev, tokens):
    """devio_prefix_hash, as the Python client computes it (devio_client.prefix): each token as
    4 little-endian bytes, summed by common/sum64.h's checksum seeded with the previous hash."""
    return devio_client.sum64(b"".join(struct.pack("<I", t & 0xFFFFFFFF) for t in tokens), prev)


class Events:
    """One GET /v1/events stream, read an event at a time with a timeout."""

    def __init__(self, sv, last=None, query="", timeout=5.0):
        self.conn = http.client.HTTPConnection("127.0.0.1", sv.port, timeout=timeout)
        headers = {}
        if sv.token:
            headers["Authorization"] = "Bearer " + sv.token
        if last is not None:
            headers["Last-Event-ID"] = str(last)
        self.conn.request("GET", "/v1/events" + query, headers=headers)
        self.resp = self.conn.getresponse()
        self.last = None

    def status(self):
        return self.resp.status

    def next(self):
        """(id or None, kind, data): the next event; comments (keep-alives) skipped."""
        eid, kind, data = None, None, None
        while True:
            line = self.resp.readline()
            assert line, "the stream ended"
            line = line.decode().rstrip("\n")
            if line == "":
                if kind is not None:
                    if eid is not None:
                        self.last = eid
                    return eid, kind, data
                continue
            if line.startswith(":"):
                continue
            k, _, v = line.partition(": ")
            if k == "id":
                eid = int(v)
            elif k == "event":
                kind = v
            elif k == "data":
                data = json.loads(v)

    def close(self):
        self.conn.close()


def test_events_in_order_with_hashes(servers, tiny_model):
    sv = servers.start(tiny_model, ["--block-size", "4"])
    c = sv.client()
    ev = Events(sv)
    eid, kind, hello = ev.next()
    assert kind == "hello" and eid == hello["last_id"] and "epoch" in hello
    s = c.create()
    c.step({"rows": [{"seq": s, "tokens": TOKENS}]})
    ch = c.effect({"kind": "fork", "seq": s})["seq"]
    c.call("DELETE", "/v1/sequences/%d" % ch)
    got = [ev.next() for _ in range(5)]
    ids = [g[0] for g in got]
    assert ids == list(range(hello["last_id"] + 1, hello["last_id"] + 6)), got
    assert [g[1] for g in got] == ["seq_created", "block_stored", "block_stored",
                                   "seq_created", "seq_freed"], got
    assert got[0][2] == {"seq": s}
    h1 = prefix_hash(0, TOKENS[:4])
    h2 = prefix_hash(h1, TOKENS[4:8])
    b1, b2 = got[1][2], got[2][2]
    assert b1["seq"] == s and b1["prefix_len"] == 4 and b1["prefix_hash"] == "%016x" % h1, b1
    assert b2["seq"] == s and b2["prefix_len"] == 8 and b2["prefix_hash"] == "%016x" % h2, b2
    assert got[3][2] == {"seq": ch, "parent": s}
    assert got[4][2] == {"seq": ch}
    # Gone: more events meanwhile; resumed with Last-Event-ID, none lost.
    last = ev.last
    ev.close()
    c.call("DELETE", "/v1/sequences/%d" % s)
    s2 = c.create()
    ev = Events(sv, last=last)
    assert ev.next()[1] == "hello"
    rest = []
    while not rest or rest[-1][1] != "seq_created":
        rest.append(ev.next())
    assert rest[0][0] == last + 1 and [r[0] for r in rest] == list(range(last + 1,
                                                                         last + 1 + len(rest)))
    kinds = [r[1] for r in rest]
    assert kinds.count("block_removed") == 2 and "seq_freed" in kinds, rest
    removed = {r[2]["prefix_hash"] for r in rest if r[1] == "block_removed"}
    assert removed == {"%016x" % h1, "%016x" % h2}
    assert rest[-1][2] == {"seq": s2}
    ev.close()
    # Another process's epoch: resumed from the oldest kept.
    ev = Events(sv, last=last, query="?epoch=%d" % (hello["epoch"] + 1))
    ev.next()
    assert ev.next()[0] == 1
    ev.close()


def test_missed_when_the_ring_dropped_events(servers, tiny_model):
    sv = servers.start(tiny_model, ["--event-buffer", "8"])
    c = sv.client()
    ev = Events(sv)
    _, _, hello = ev.next()
    ev.close()
    last = hello["last_id"]
    for _ in range(12):
        c.create()
    ev = Events(sv, query="?last_event_id=%d" % last)
    assert ev.next()[1] == "hello"
    eid, kind, data = ev.next()
    assert kind == "missed" and eid is None and data == {"missed": 4, "from": last + 1}, data
    assert [ev.next()[0] for _ in range(8)] == list(range(last + 5, last + 13))
    ev.close()
    c.call("GET", "/v1/events?last_event_id=x", expect=400, code="invalid_input")


def test_subscriber_limit_and_stop(servers, tiny_model):
    sv = servers.start(tiny_model, ["--event-subscribers", "2"])
    a, b = Events(sv), Events(sv)
    assert a.next()[1] == "hello" and b.next()[1] == "hello"
    over = Events(sv)
    assert over.status() == 503
    assert json.loads(over.resp.read())["error"]["code"] == "too_many_connections"
    over.close()
    metrics = sv.client().call("GET", "/metrics").raw.decode()
    assert "\ndevio_event_subscribers 2\n" in metrics
    a.close()

    def again():
        e = Events(sv)
        if e.status() == 200:
            return e
        e.resp.read()
        e.close()
        return None
    e = wait_until(again, timeout=5.0, every=0.1)
    assert e, "a stream closed by its client still counts"
    # Open streams do not hold up a stop: they end.
    t0 = time.monotonic()
    assert sv.stop() == 0
    assert time.monotonic() - t0 < 5.0
    b.close()
    e.close()


def test_client_follows_events_and_hashes_prompts(servers, tiny_model):
    """devio_client's events() reads the stream (and resumes it after the last id it saw), and
    its prefix_hashes() gives the hashes the server's block_stored events carry."""
    sv = servers.start(tiny_model, ["--block-size", "4"])
    c = sv.client()
    stream = devio_client.Client("http://127.0.0.1:%d" % sv.port).events(timeout=5.0)
    ident, kind, data = next(stream)
    assert kind == "hello" and ident == data["last_id"]
    with devio_client.Client("http://127.0.0.1:%d" % sv.port) as dc:
        s = dc.create_sequence()
        dc.step({"rows": [{"seq": s, "tokens": TOKENS}]})
        got = [next(stream) for _ in range(3)]
        assert [k for _, k, _ in got] == ["seq_created", "block_stored", "block_stored"]
        want = [devio_client.hex_of(h) for h in devio_client.prefix_hashes(TOKENS, 4)]
        assert [d["prefix_hash"] for _, _, d in got[1:]] == want == \
            [devio_client.hex_of(prefix_hash(0, TOKENS[:4])),
             devio_client.hex_of(prefix_hash(prefix_hash(0, TOKENS[:4]), TOKENS[4:8]))]
        stream.close()
        dc.free(s)
        again = devio_client.Client("http://127.0.0.1:%d" % sv.port).events(
            last_event_id=got[-1][0], epoch=data["epoch"], timeout=5.0)
        kinds = [next(again)[1] for _ in range(4)]
        assert kinds == ["hello", "block_removed", "block_removed", "seq_freed"], kinds
        again.close()
    c.close()
