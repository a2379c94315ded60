"""test_conform.py - devio-conform against a live devio-server prints devio-ref's lines, byte for byte.
Each script runs on a freshly started server (facts depend on everything done before); it must never compare loosely.

    python3 -m pytest -q tests/e2e/test_conform.py --bin bazel-bin

Needs conform/devio-conform under --bin besides the binaries conftest.py needs.
"""
import json
import os
import select
import socket
import subprocess
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
SCRIPTS = HERE / "scripts"
RUN_TIMEOUT_S = 120

SUITES = [
    REPO / "deploy" / "demo.jsonl",
    SCRIPTS / "logits.jsonl",
    SCRIPTS / "effects.jsonl",
    SCRIPTS / "errors.jsonl",
    # A sequence's state exported and imported (GET /v1/sequences/{id}/state, POST /v1/sequences).
    REPO / "tests" / "conformance" / "state.jsonl",
]


@pytest.fixture(scope="session")
def conform(bins):
    p = bins.root / "conform" / "devio-conform"
    if not os.access(p, os.X_OK):
        pytest.fail("no executable %s (bazel build //conform:devio-conform)" % p)
    return p


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEVIO_")}
    env.update(extra)
    return env


def run_ref(bins, model, script, args=()):
    p = subprocess.run([str(bins.ref), "--model", str(model)] + list(args) + [str(script)],
                       capture_output=True, timeout=RUN_TIMEOUT_S, env=clean_env())
    assert p.returncode == 0, p.stderr.decode(errors="replace")
    return p.stdout


def run_conform(conform, sv, script, args=(), env=None, stdin=None):
    cmd = [str(conform), "--server", "http://127.0.0.1:%d" % sv.port] + list(args) + [str(script)]
    return subprocess.run(cmd, capture_output=True, timeout=RUN_TIMEOUT_S, input=stdin,
                          env=env if env is not None else clean_env())


def n_ops(script):
    return sum(1 for line in Path(script).read_text().splitlines()
               if line.strip() and not line.lstrip().startswith("#"))


def assert_same(ref, http):
    """Byte equality, with the first differing line in the message when it fails."""
    if ref != http:
        a, b = ref.decode().splitlines(), http.decode().splitlines()
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                pytest.fail("line %d differs\n  ref:  %s\n  http: %s" % (i + 1, x, y))
        pytest.fail("ref has %d lines, http %d" % (len(a), len(b)))


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


# ---- the same lines in process and over HTTP ---------------------------------------------


@pytest.mark.parametrize("script", SUITES, ids=lambda p: p.name)
def test_suite_matches_devio_ref(servers, tiny_model, bins, conform, script):
    sv = servers.start(tiny_model)
    # Both sides get the same (empty) adapters root, so adapter errors match.
    ref = run_ref(bins, tiny_model, script, ["--adapters", str(sv.workdir / "adapters")])
    p = run_conform(conform, sv, script, ["--verbose"])
    assert p.returncode == 0, p.stderr.decode(errors="replace")
    lines = ref.decode().splitlines()
    assert len(lines) == n_ops(script)
    assert all(json.loads(x)["op"] for x in lines)
    assert_same(ref, p.stdout)
    # Every request went over the one keep-alive connection.
    assert b"over 1 connection(s)" in p.stderr, p.stderr
    assert sv.stop() == 0


def test_suites_reach_what_they_claim(bins, tiny_model):
    """The suites above are only worth comparing if they hit these answers."""
    out = b"".join(run_ref(bins, tiny_model, s) for s in SUITES).decode()
    for want in ('"code":"unknown_seq"', '"code":"seq_busy"', '"code":"depth_exceeded"',
                 '"code":"ticket_consumed"', '"code":"unknown_ticket"',
                 '"code":"unknown_logits"', '"code":"unknown_adapter"', '"code":"unsupported"',
                 '"code":"invalid_input"', '"values":[', '"kind":"fork"', '"kind":"truncate"',
                 '"kind":"free"', '"kind":"release"', '"kind":"sample"', '"kind":"snapshot"',
                 '"op":"facts"', '"adapters":[]', '"ssm_slot":false', '"freed_snapshots":0'):
        assert want in out, want
    assert '"shape":[4,256]' in out or '"shape":[18,256]' in out  # an "all" handle


def test_limits_match_devio_ref(servers, tiny_model, bins, conform, tmp_path):
    """Capacity errors under the same small device configuration on both sides."""
    flags = ["--kv-blocks", "4", "--max-depth", "1", "--max-rows", "2",
             "--max-batch-tokens", "40", "--logits-handles", "2"]
    lines = [
        {"op": "create", "as": "a"},
        {"op": "create", "as": "b"},
        {"op": "create", "as": "c"},
        {"op": "launch", "plan": {"rows": [{"seq": "$a", "tokens": [1] * 41}]}},
        {"op": "launch", "plan": {"rows": [{"seq": s, "tokens": [1]} for s in ("$a", "$b", "$c")]}},
        {"op": "step", "plan": {"rows": [{"seq": "$a", "tokens": list(range(1, 40))}]}},
        {"op": "step", "plan": {"rows": [{"seq": "$b", "tokens": list(range(1, 40))}]}},
        {"op": "facts"},
        {"op": "launch", "plan": {"rows": [{"seq": "$c", "tokens": [1] * 10}]}, "as": "t1"},
        {"op": "launch", "plan": {"rows": [{"seq": "$a", "tokens": [2]}]}},
        {"op": "await", "ticket": "$t1"},
        {"op": "step", "plan": {"rows": [{"seq": "$a", "tokens": [3], "logits": "last"}]}},
        {"op": "step", "plan": {"rows": [{"seq": "$c", "tokens": [3], "logits": "all"}]}},
        {"op": "step", "plan": {"rows": [{"seq": "$a", "tokens": [4], "logits": "last"}]}},
        {"op": "seq", "seq": "$a"},
        {"op": "facts"},
    ]
    script = tmp_path / "limits.jsonl"
    script.write_text("".join(json.dumps(x) + "\n" for x in lines))
    ref = run_ref(bins, tiny_model, script, flags)
    for code in ("too_large", "out_of_kv_blocks", "depth_exceeded", "out_of_logits"):
        assert ('"code":"%s"' % code).encode() in ref, (code, ref)
    sv = servers.start(tiny_model, flags)
    p = run_conform(conform, sv, script)
    assert p.returncode == 0, p.stderr.decode(errors="replace")
    assert_same(ref, p.stdout)


# ---- --expect ------------------------------------------------------------------------------


def test_expect_passes_and_fails(servers, tiny_model, bins, conform, tmp_path):
    script = SCRIPTS / "logits.jsonl"
    ref = run_ref(bins, tiny_model, script)
    good = tmp_path / "good.txt"
    good.write_bytes(ref)
    lines = ref.decode().splitlines()
    sv = servers.start(tiny_model)

    p = run_conform(conform, sv, script, ["--expect", good])
    assert p.returncode == 0, p.stderr.decode(errors="replace")
    assert p.stdout == ref
    assert b"differs" not in p.stderr

    # One changed field on line 5: reported with its number and both lines.
    bad = tmp_path / "bad.txt"
    changed = lines[4].replace('"shape":[4,256]', '"shape":[4,255]')
    assert changed != lines[4]
    bad.write_text("\n".join(lines[:4] + [changed] + lines[5:]) + "\n")
    sv2 = servers.start(tiny_model)
    p = run_conform(conform, sv2, script, ["--expect", bad])
    err = p.stderr.decode()
    assert p.returncode == 1, err
    assert "result line 5 differs" in err, err
    assert "expected: " + changed in err, err
    assert "got:      " + lines[4] in err, err
    assert p.stdout == ref  # the run still prints every line
    # The same through the environment twin.
    sv2b = servers.start(tiny_model)
    p = run_conform(conform, sv2b, script, env=clean_env(DEVIO_EXPECT=str(bad)))
    assert p.returncode == 1 and b"result line 5 differs" in p.stderr, p.stderr

    # Fewer expected lines than results, and more.
    short = tmp_path / "short.txt"
    short.write_text("\n".join(lines[:-1]) + "\n")
    sv3 = servers.start(tiny_model)
    p = run_conform(conform, sv3, script, ["--expect", short])
    err = p.stderr.decode()
    assert p.returncode == 1, err
    assert "result line %d differs" % len(lines) in err and "(end of file)" in err, err
    longer = tmp_path / "long.txt"
    longer.write_text("\n".join(lines + ['{"op":"facts"}']) + "\n")
    sv4 = servers.start(tiny_model)
    p = run_conform(conform, sv4, script, ["--expect", longer])
    err = p.stderr.decode()
    assert p.returncode == 1, err
    assert "result line %d differs" % (len(lines) + 1) in err and "(end of output)" in err, err


# ---- auth, failures --------------------------------------------------------------------------


def test_token_flag_and_env(servers, tiny_model, bins, conform):
    script = REPO / "deploy" / "demo.jsonl"
    ref = run_ref(bins, tiny_model, script)
    sv = servers.start(tiny_model, env={"DEVIO_TOKEN": "c0nform-tok"}, token="c0nform-tok")
    p = run_conform(conform, sv, script)
    assert p.returncode == 2
    assert p.stdout == b""
    assert b"token" in p.stderr, p.stderr
    p = run_conform(conform, sv, script, ["--token", "wrong"])
    assert p.returncode == 2 and p.stdout == b""
    p = run_conform(conform, sv, script, ["--token", "c0nform-tok"])
    assert p.returncode == 0, p.stderr.decode(errors="replace")
    assert_same(ref, p.stdout)
    sv2 = servers.start(tiny_model, env={"DEVIO_TOKEN": "c0nform-tok"}, token="c0nform-tok")
    p = run_conform(conform, sv2, script, env=clean_env(DEVIO_TOKEN="c0nform-tok"))
    assert p.returncode == 0, p.stderr.decode(errors="replace")
    assert_same(ref, p.stdout)


def test_unreachable_server_exits_2(conform):
    script = REPO / "deploy" / "demo.jsonl"
    url = "http://127.0.0.1:%d" % free_port()
    p = subprocess.run([str(conform), "--server", url, str(script)], capture_output=True,
                       timeout=RUN_TIMEOUT_S, env=clean_env())
    assert p.returncode == 2
    assert p.stdout == b""
    assert b"cannot use server" in p.stderr and url.encode() in p.stderr, p.stderr
    # The URL may also come from the environment.
    p = subprocess.run([str(conform), str(script)], capture_output=True, timeout=RUN_TIMEOUT_S,
                       env=clean_env(DEVIO_SERVER=url))
    assert p.returncode == 2 and b"cannot use server" in p.stderr, p.stderr


def test_server_gone_mid_run(servers, tiny_model, conform):
    """Lines already answered stay; after the failure nothing looks like a result."""
    sv = servers.start(tiny_model)
    proc = subprocess.Popen([str(conform), "--server", "http://127.0.0.1:%d" % sv.port, "-"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=clean_env())
    try:
        proc.stdin.write(b'{"op":"create","as":"a"}\n')
        proc.stdin.flush()
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        assert ready, "no first line from devio-conform"
        first = proc.stdout.readline()
        assert json.loads(first) == {"op": "create", "ok": True, "result": {"seq": "a"}}
        sv.kill()
        out, err = proc.communicate(b'{"op":"seq","seq":"$a"}\n{"op":"facts"}\n',
                                    timeout=RUN_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 2, err
    assert out == b""
    assert b"stopped after 1 result line" in err, err


def test_malformed_script_exits_2(servers, tiny_model, conform, tmp_path):
    sv = servers.start(tiny_model)
    script = tmp_path / "bad.jsonl"
    script.write_text('{"op":"create"}\n{"op":"frobnicate"}\n')
    p = run_conform(conform, sv, script)
    assert p.returncode == 2
    assert p.stdout.decode().splitlines() == ['{"op":"create","ok":true,"result":{"seq":"seq#1"}}']
    assert b"line 2" in p.stderr and b"frobnicate" in p.stderr, p.stderr


def test_usage(conform):
    p = subprocess.run([str(conform)], capture_output=True, timeout=30, env=clean_env())
    assert p.returncode == 2 and b"usage: devio-conform --server URL" in p.stderr
    p = subprocess.run([str(conform), "--help"], capture_output=True, timeout=30, env=clean_env())
    assert p.returncode == 0 and b"--expect FILE" in p.stdout


def test_pin_unpin_match_in_process(servers, tiny_model, conform, bins, tmp_path):
    """pin/unpin go over POST /v1/adapters/{name}/pin|unpin and answer like in process."""
    sv = servers.start(tiny_model)
    script = tmp_path / "pin.jsonl"
    script.write_text('{"op":"lora","cmd":{"kind":"pin","name":"x"}}\n'
                      '{"op":"lora","cmd":{"kind":"unpin","name":"x"}}\n')
    p = run_conform(conform, sv, script)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.decode().splitlines()
    assert lines == ['{"op":"lora","ok":false,"error":{"code":"unknown_adapter"}}'] * 2
    assert p.stdout == run_ref(bins, tiny_model, script)
