"""test_bench_cli.py - devio-bench's machine-readable output and its refusals.
It checks the shape of what side_by_side.py reads, never a speed."""
import json
import subprocess

import pytest


def bench(bins, *args, timeout=120):
    exe = bins.root / "tests" / "bench" / "devio-bench"
    if not exe.exists():
        pytest.skip("no %s (bazel build //tests/bench:devio-bench)" % exe)
    return subprocess.run([str(exe), "--preset", "tiny", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_json_has_every_run(bins):
    p = bench(bins, "--steps", "2", "--batches", "1,3", "--prefill", "8,16", "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["backend"] == "ref" and out["model"] == "tiny"
    assert [d["batch"] for d in out["decode"]] == [1, 3]
    assert [r["tokens"] for r in out["prefill"]] == [8, 16]
    assert all(r["tok_s"] > 0 for r in out["decode"] + out["prefill"])
    assert out["read_bw_gbs"] > 0 and out["weight_bytes"] > 0


@pytest.mark.parametrize("value", ["0", "4033", "1,2,3,4", "x", "8,"])
def test_bad_prefill_refused(bins, value):
    p = bench(bins, "--prefill", value, "--json")
    assert p.returncode == 2
    assert "--prefill" in p.stderr and p.stdout == ""
