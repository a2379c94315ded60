"""test_weights_underfoot.py - weights files changed under a running devio-server: in-place overwrite and truncation of the model and of an adapter, and a symlink swap raced against adapter loads.
Each server gets its own model copy and adapters root; every loop is bounded by count and time, and no server is left running.
"""
import ctypes
import hashlib
import os
import threading
import time

from conftest import make_model
from test_adapters import mkadapter, root_of, step_logits

VOCAB = 256  # the tiny preset
RACE_LOADS = 2000
RACE_SECONDS = 20.0


_libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD = -100
RENAME_EXCHANGE = 2


def exchange(a, b):
    """Swap two names atomically (renameat2 RENAME_EXCHANGE): both always exist."""
    if _libc.renameat2(AT_FDCWD, str(a).encode(), AT_FDCWD, str(b).encode(), RENAME_EXCHANGE):
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def prompt(n, salt=0):
    return [(k * 5 + salt * 17 + 3) % VOCAB for k in range(n)]


def logits(c, adapter=None):
    """The raw f32 logits of every position of one fresh sequence, which is freed after."""
    s = c.create()
    row = {"seq": s, "tokens": prompt(7), "logits": "all"}
    if adapter:
        row["adapter"] = adapter
    (out,) = step_logits(c, [row])
    c.call("DELETE", "/v1/sequences/%d" % s)
    assert len(out) == 7 * VOCAB * 4
    return out


def overwrite_in_place(path):
    """Every byte inverted, written over the same inode: same size, other bytes."""
    data = path.read_bytes()
    fd = os.open(str(path), os.O_WRONLY)
    try:
        assert os.pwrite(fd, bytes(b ^ 0xFF for b in data), 0) == len(data)
    finally:
        os.close(fd)
    assert path.stat().st_size == len(data)


def test_model_file_overwritten_and_truncated(bins, servers, tmp_path):
    model = make_model(bins, tmp_path / "model")
    srv = servers.start(model)
    c = srv.client()
    before = logits(c)
    weights = model / "model.safetensors"
    overwrite_in_place(weights)
    assert logits(c) == before, "an in-place overwrite of the model file changed the logits"
    os.truncate(str(weights), 0)
    assert logits(c) == before, "a truncated model file changed the logits"
    assert srv.alive(), srv.log()
    os.unlink(str(weights))
    assert logits(c) == before
    c.call("GET", "/readyz")
    assert srv.alive(), srv.log()


def test_adapter_file_overwritten_and_truncated(bins, tiny_model, servers):
    srv = servers.start(tiny_model)
    c = srv.client()
    d = mkadapter(bins, tiny_model, root_of(srv) / "a1", seed=5)
    w = d / "adapter_model.safetensors"
    sha = hashlib.sha256(w.read_bytes()).hexdigest()
    rec = c.call("PUT", "/v1/adapters/a", {"path": "a1"}).json
    assert rec["sha256"] == sha and rec["size"] == w.stat().st_size
    base = logits(c)
    before = logits(c, "a")
    assert before != base, "the adapter did not change the logits"

    overwrite_in_place(w)
    assert logits(c, "a") == before, "an in-place overwrite of the adapter changed the logits"
    assert c.call("GET", "/v1/adapters/a").json["sha256"] == sha
    os.truncate(str(w), 0)
    assert logits(c, "a") == before, "a truncated adapter file changed the logits"
    got = c.call("GET", "/v1/adapters/a").json
    assert got["sha256"] == sha and got["state"] == "loaded", got
    assert srv.alive(), srv.log()
    # Loading the truncated file again is refused and keeps the loaded weights and record.
    e = c.call("PUT", "/v1/adapters/a", {"path": "a1"}, expect=400, code="invalid_input")
    assert "adapter_model.safetensors" in e.json["error"]["message"], e
    assert c.call("GET", "/v1/adapters/a").json["sha256"] == sha
    assert logits(c, "a") == before


def test_symlink_swap_race(bins, tiny_model, servers, tmp_path):
    """A directory inside the root swapped, without pause, against a link to an adapter
    outside it while PUT loads it (2000 loads or 20 s): no load may ever succeed with the
    outside adapter's weights."""
    srv = servers.start(tiny_model)
    c = srv.client()
    root = root_of(srv)
    inside = mkadapter(bins, tiny_model, root / "swap", seed=11)
    outside = mkadapter(bins, tiny_model, tmp_path / "outside" / "evil", seed=12)
    sha_in = hashlib.sha256((inside / "adapter_model.safetensors").read_bytes()).hexdigest()
    sha_out = hashlib.sha256((outside / "adapter_model.safetensors").read_bytes()).hexdigest()
    assert sha_in != sha_out
    swap, other = root / "swap", root / "swap.link"
    os.symlink(str(outside), str(other))

    stop = threading.Event()
    swaps = [0]
    errors = []

    def swapper():
        try:
            while not stop.is_set():
                exchange(swap, other)  # "swap" is now the link
                time.sleep(0.0002)
                exchange(swap, other)  # and the directory again
                time.sleep(0.0002)
                swaps[0] += 2
        except OSError as e:  # pragma: no cover - reported below
            errors.append(e)

    t = threading.Thread(target=swapper, daemon=True)
    deadline = time.monotonic() + RACE_SECONDS
    loaded = refused = 0
    t.start()
    try:
        while time.monotonic() < deadline and t.is_alive() and loaded + refused < RACE_LOADS:
            r = c.request("PUT", "/v1/adapters/race", {"path": "swap"})
            if r.status == 200:
                assert r.json["sha256"] == sha_in, "loaded the adapter outside the root: %r" % r.json
                loaded += 1
                c.call("DELETE", "/v1/adapters/race")
            else:
                assert r.status == 400, r
                assert r.code == "invalid_input", r
                refused += 1
    finally:
        stop.set()
        t.join(timeout=30)
    assert not t.is_alive() and not errors, errors
    assert srv.alive(), srv.log()
    assert swaps[0] > 0 and loaded + refused > 0, (swaps[0], loaded, refused)
    print("race: %d swaps, %d loads, %d refused" % (swaps[0], loaded, refused))
    # Whatever the last record says, it is never the outside adapter.
    for rec in c.call("GET", "/v1/adapters").json:
        assert rec["sha256"] != sha_out, rec
