"""test_emu_faults.py - the CUDA backend's failure paths, through devio-server, on the
emulated device (--backend cuda-emu), which fails its N-th allocation, kernel launch or
synchronisation on request (DEVIO_EMU_FAULT, docs/backends.md).

For each class and a spread of N (every N up to a few, then sparser, until a run goes
clean), a server runs a fixed workload of steps. A fault must end as the contract says:
at start, the server refuses to start with the CUDA error named; during a step, that
step answers 500 device_error, its reservations are rolled back (the sequence's length
and the KV blocks as before it), the backend is marked failed (/v1/device says why,
/readyz answers 503 not_ready, /healthz 500 device_error so that liveness restarts the
pod, every later step device_error), and the server stays up.
A run that never meets its fault gives the clean run's tokens. Bounded: at most
MAX_RUNS server starts per class.
"""
import pytest

MAX_RUNS = 30
STEPS = 6


def emu_args(bins):
    return ["--backend", "cuda-emu", "--backend-path", str(bins.root / "kernels"),
            "--kv-blocks", "64"]


def plan(seq, tokens):
    return {"rows": [{"seq": seq, "tokens": tokens, "logits": "last",
                      "sample": {"temperature": 0}}]}


def workload(c):
    """STEPS steps of one sequence (a prompt, then greedy decode); stops at the first
    error and checks what must hold after it. Returns the tokens, and whether it failed."""
    seq = c.create()
    tokens, nxt = [], [5, 9, 2]
    for _ in range(STEPS):
        before_len = c.seq(seq)["len"]
        before = c.facts()["kv"]
        a = c.request("POST", "/v1/step", plan(seq, nxt))
        if a.status == 200:
            tok = a.json["rows"][0]["tokens"][0]
            tokens.append(tok)
            nxt = [tok]
            continue
        assert a.status == 500 and a.code == "device_error", a
        assert "CUDA error" in a.json["error"]["message"], a
        # Rolled back: nothing of the failed step stays.
        assert c.seq(seq)["len"] == before_len
        assert c.facts()["kv"] == before
        # The backend is failed for good, and says so; the server stays up.
        dev = c.device()
        assert dev["backend"] == "cuda-emu" and "CUDA error" in dev["device"]["failure"], dev
        c.call("GET", "/readyz", expect=503, code="not_ready")
        # Liveness fails too, so that the pod is restarted.
        c.call("GET", "/healthz", expect=500, code="device_error")
        c.call("POST", "/v1/step", plan(seq, [1]), expect=500, code="device_error")
        assert c.seq(seq)["len"] == before_len
        return tokens, True
    return tokens, False


@pytest.fixture(scope="module")
def clean_tokens(module_servers, bins, tiny_model):
    s = module_servers.start(tiny_model, emu_args(bins))
    c = s.client()
    tokens, failed = workload(c)
    assert not failed and len(tokens) == STEPS
    c.call("GET", "/readyz")
    assert "emulated" in c.device()["device"]["name"]
    s.stop()
    return tokens


def spread():
    n = 1
    while True:
        yield n
        n = n + 1 if n < 16 else n * 2


@pytest.mark.parametrize("spec", ["malloc:%d", "launch:%d", "sync:%d", "launch:%d,sticky"])
def test_faults_on_request(servers, bins, tiny_model, clean_tokens, spec):
    seen = {"start": 0, "step": 0, "clean": 0}
    for runs, n in zip(range(MAX_RUNS), spread()):
        fault = spec % n
        try:
            s = servers.start(tiny_model, emu_args(bins), env={"DEVIO_EMU_FAULT": fault})
        except AssertionError as e:
            # Refused at start: it exited non-zero naming the CUDA error.
            assert "exited" in str(e) and "CUDA error" in str(e), (fault, str(e)[-600:])
            seen["start"] += 1
            continue
        c = s.client()
        tokens, failed = workload(c)
        if failed:
            seen["step"] += 1
            assert tokens == clean_tokens[:len(tokens)], fault
        else:
            assert tokens == clean_tokens, fault
            c.call("GET", "/readyz")
            seen["clean"] += 1
        assert s.alive()
        s.stop()
        if not failed:
            break  # N is past every call of the class the workload makes
    if spec.startswith("malloc"):
        assert seen["start"] > 0  # every device allocation happens at start
    else:
        assert seen["step"] > 0, seen
