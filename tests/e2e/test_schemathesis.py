"""test_schemathesis.py - schemathesis drives a real devio-server from the spec it serves and finds no answer outside it.
Every run is bounded by examples per operation and a wall-clock limit; the server is killed at teardown.

It runs against the tiny llama model and the tiny hybrid (bamba) model, whose
answers carry SSM slots and snapshots. Checks: status_code_conformance (every
status is documented for its operation), content_type_conformance (every
Content-Type is declared for that status), response_schema_conformance (every
body matches its schema) and not_a_server_error (no 5xx). Every 5xx the spec documents answers a fault of
the machine (an I/O error, memory, a failed device) or a device that is gone;
none happens here, so a 5xx is a defect. The one exception is the torn-down
run below, where 503 torn_down is the documented answer of every device route.

The live run excludes POST /v1/teardown; then the device is torn down and the
torn-down run tries every operation again. Dictionaries of ids that
exist (sequences 1..SEQS, tickets and logits handles of the seeding steps,
the adapter "sql" loaded from "sql-r8", the names the spec's examples use)
are offered to the generator next to random values, so that the 2xx answers
of sequences, launch, effects, logits and the adapter routes are checked, not
only their 404s.

A longer run (docs/schemathesis.md) sets the examples per operation with
E2E_ST_EXAMPLES (and E2E_ST_SEED=N for a seeded random run instead of the
deterministic one); run with -s, the test prints each run's figures.
"""
import json
import os
import subprocess
import sys

import pytest

from test_adapters import mkadapter

TOKEN = "st-token"
SEQS = 32
CHECKS = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance"
EXAMPLES = int(os.environ.get("E2E_ST_EXAMPLES", "20"))
# Deterministic generation unless a seed is given (E2E_ST_SEED=N explores other inputs).
SEED = os.environ.get("E2E_ST_SEED")
GENERATION = ["--seed", SEED] if SEED else ["--generation-deterministic"]
# The hard bound of one schemathesis run; the bounded test takes about 20 s a model here.
RUN_LIMIT_S = max(120, 10 * EXAMPLES)

CONFIG = """
headers = {{ Authorization = "Bearer {token}" }}

[dictionaries]
ids = {{ values = {ids} }}
tokens = {{ values = [0, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 255] }}
names = {{ values = ["sql"] }}
paths = {{ values = ["sql-r8"] }}

[parameters]
"path.id" = {{ dictionary = "ids", probability = 0.6 }}
"path.name" = {{ dictionary = "names", probability = 0.5 }}
"body.rows[*].seq" = {{ dictionary = "ids", probability = 1.0 }}
"body.rows[*].tokens[*]" = {{ dictionary = "tokens", probability = 1.0 }}
"body.rows[*].adapter" = {{ dictionary = "names", probability = 0.6 }}
"body.seq" = {{ dictionary = "ids", probability = 0.7 }}
"body.logits" = {{ dictionary = "ids", probability = 0.7 }}
"body.path" = {{ dictionary = "paths", probability = 0.6 }}

[checks.not_a_server_error]
expected-statuses = {expected}
"""


def schemathesis_cli():
    try:
        import schemathesis  # noqa: F401
    except ImportError:
        pytest.fail("schemathesis is not installed (pip install -r tests/requirements.txt)")
    return [sys.executable, "-m", "schemathesis.cli"]


def run_schemathesis(srv, workdir, name, filters, examples, expected=("2xx", "3xx", "4xx"), every=True):
    """One schemathesis run (bounded, deterministic unless E2E_ST_SEED) against srv's served spec;
    its JSON report.

    every: each selected operation must have been tested (False for the examples
    phase alone, which skips the operations without an example)."""
    cfg = workdir / ("%s.toml" % name)
    cfg.write_text(CONFIG.format(token=TOKEN, ids=json.dumps(list(range(1, SEQS + 1))),
                                 expected=json.dumps(list(expected))))
    report = workdir / ("%s.json" % name)
    cmd = schemathesis_cli() + [
        "--config-file", str(cfg), "run", "http://127.0.0.1:%d/v1/openapi.yaml" % srv.port,
        "--checks", CHECKS, "--max-examples", str(examples)] + GENERATION + [
        "--workers", "1", "--request-timeout", "30",
        "--no-color", "--report", "json", "--report-json-path", str(report)] + list(filters)
    try:
        p = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=RUN_LIMIT_S,
                           stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        raise AssertionError("schemathesis ran past %d s\n%s" % (RUN_LIMIT_S, (e.stdout or "")[-4000:]))
    out = p.stdout + p.stderr
    assert report.exists(), "schemathesis wrote no report (exit %d)\n%s" % (p.returncode, out[-6000:])
    rep = json.loads(report.read_text())
    assert p.returncode == 0 and not rep["failures"] and not rep["errors"], \
        "schemathesis %s found answers outside api/openapi.yaml\n%s\n%s" % (name, out[-8000:], srv.log())
    ops = rep["operations"]
    assert ops["errored"] == 0 and ops["tested"] > 0, (ops, out[-4000:])
    assert not every or ops["tested"] == ops["selected"], (ops, out[-4000:])
    return rep


@pytest.fixture(scope="module")
def hybrid_model(bins, tmp_path_factory):
    out = tmp_path_factory.mktemp("models") / "bamba"
    subprocess.run([str(bins.mkmodel), "--arch", "bamba", "--preset", "tiny", "--out", str(out)],
                   check=True, capture_output=True, timeout=120)
    return out


def seed_state(bins, model, srv, hybrid):
    """Sequences 1..SEQS, the adapter "sql", a logits handle, a settled and an unawaited ticket;
    on a hybrid model an SSM snapshot of sequence 1 too."""
    c = srv.client()
    mkadapter(bins, model, srv.workdir / "adapters" / "sql-r8", seed=1)
    c.call("PUT", "/v1/adapters/sql", {"path": "sql-r8"})
    seqs = [c.create() for _ in range(SEQS)]
    assert seqs == list(range(1, SEQS + 1)), seqs
    row = {"seq": 1, "tokens": [1, 2, 3], "logits": "all", "adapter": "sql"}
    if hybrid:
        row["snapshot"] = "end"
    c.step({"rows": [row]})
    c.launch({"rows": [{"seq": 2, "tokens": [4, 5], "logits": "last"}]})
    c.close()


def figures(name, rep):
    return {"run": name, "operations": rep["operations"]["tested"],
            "cases": rep["test_cases"]["generated"],
            "failures": len(rep["failures"]), "seconds": round(rep["running_time"], 1)}


@pytest.mark.parametrize("arch", ["llama", "bamba"])
def test_served_spec_conformance(arch, request, servers, bins, tmp_path):
    hybrid = arch == "bamba"
    model = request.getfixturevalue("hybrid_model" if hybrid else "tiny_model")
    srv = servers.start(model, env={"DEVIO_TOKEN": TOKEN}, token=TOKEN)
    seed_state(bins, model, srv, hybrid)
    # The spec's own examples first, before random frees and deletes reach sequence 7.
    # GET /v1/events never ends by itself: test_events.py reads it with timeouts.
    ev = ["--exclude-path", "/v1/events"]
    ex = run_schemathesis(srv, tmp_path, "examples", ev + ["--phases", "examples", "--exclude-path", "/v1/teardown",
                                                      "--exclude-path", "/v1/effects", "--exclude-method", "DELETE"], 1,
                          every=False)
    live = run_schemathesis(srv, tmp_path, "live", ev + ["--exclude-path", "/v1/teardown"], EXAMPLES)
    assert srv.alive(), srv.log()
    c = srv.client()
    assert c.call("GET", "/readyz").status == 200

    # Teardown, then every operation again (teardown too): device routes answer 503 torn_down.
    c.call("POST", "/v1/teardown")
    gone = run_schemathesis(srv, tmp_path, "torn_down", ev, max(3, EXAMPLES // 4),
                            expected=("2xx", "3xx", "4xx", "503"))
    c.call("GET", "/v1/facts", expect=503, code="torn_down")
    assert srv.alive(), srv.log()
    assert srv.stop() == 0

    total = [figures("examples", ex), figures("live", live), figures("torn_down", gone)]
    assert live["test_cases"]["generated"] >= 20 * min(EXAMPLES, 25), total
    print(json.dumps({"model": arch, "examples_per_operation": EXAMPLES, "runs": total}))
