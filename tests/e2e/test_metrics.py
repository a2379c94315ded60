"""test_metrics.py - GET /metrics of a real devio-server: every family promtool-clean, the counters and histograms
moving as steps, effects and requests happen, and deploy/'s dashboard and alert rules naming only what is exported.
Runs promtool (Debian's prometheus package, installed by deploy/devio.sh setup); every subprocess is bounded.
"""
import json
import math
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from test_server import metric, parse_metrics, plan, prompt, row

REPO = Path(__file__).resolve().parent.parent.parent
DASHBOARD = REPO / "deploy" / "grafana" / "devio-dashboard.json"
RULES = REPO / "deploy" / "prometheus" / "devio-rules.yaml"
RULES_TEST = REPO / "deploy" / "prometheus" / "devio-rules.test.yaml"
PROMTOOL_TIMEOUT_S = 60

# Series Prometheus makes itself at each scrape, not exported by devio-server.
SCRAPE_SERIES = {"up"}
# The store's families: exported by the store's code (service/store*.c).
STORE_FAMILIES = {"devio_store_errors_total", "devio_store_last_success_timestamp_seconds",
                  "devio_store_commit_seconds"}


def promtool(*args, stdin=None):
    exe = shutil.which("promtool")
    assert exe, "promtool not found: deploy/devio.sh setup installs it (Debian package prometheus)"
    return subprocess.run([exe, *args], input=stdin, capture_output=True, text=True,
                          timeout=PROMTOOL_TIMEOUT_S)


# ---- PromQL: the metric names an expression reads ---------------------------------------------

PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or",
                "unless", "bool", "offset", "inf", "nan"}


def promql_metrics(expr):
    """The metric names an expression selects: identifiers that are neither functions (followed
    by '('), keywords, label names (inside {...} or a by/without/on list) nor numbers."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)           # strings
    e = re.sub(r"\{[^}]*\}", " ", e)                       # label matchers
    e = re.sub(r"\[[^\]]*\]", " ", e)                      # ranges and subqueries
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    e = re.sub(r"\$\w+", " ", e)                           # Grafana variables
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", e):
        word = m.group(0)
        after = e[m.end():].lstrip()
        if after.startswith("(") or word.lower() in PROMQL_WORDS:
            continue
        if m.start() > 0 and (e[m.start() - 1].isdigit() or e[m.start() - 1] == "."):
            continue  # the exponent or unit of a number: 1e3, 5m
        names.add(word)
    return names


def test_promql_metrics_reads_names_only():
    assert promql_metrics('histogram_quantile(0.99, sum by (job, le) (rate(a_bucket{x="y"}[5m]))) > 2.5') \
        == {"a_bucket"}
    assert promql_metrics("time() - b{job=~\"$job\"} / on(instance) group_left c") == {"b", "c"}
    assert promql_metrics("sum(rate(d[$__rate_interval])) and e offset 5m > 1e3") == {"d", "e"}


def dashboard_exprs():
    d = json.loads(DASHBOARD.read_text())
    out = []

    def walk(panels):
        for p in panels:
            out.extend(t["expr"] for t in p.get("targets", []) if t.get("expr"))
            walk(p.get("panels", []))
    walk(d["panels"])
    for v in d.get("templating", {}).get("list", []):
        q = v.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        m = re.match(r"label_values\((.*),\s*\w+\)$", q or "")
        if m:
            out.append(m.group(1))
    return out


def rules_exprs():
    import yaml
    doc = yaml.safe_load(RULES.read_text())
    return [r["expr"] for g in doc["groups"] for r in g["rules"]]


def exported_names(samples, types):
    """Every name a query may select: the families and their histogram series."""
    names = {k[0] for k in samples} | set(types)
    for fam, kind in types.items():
        if kind == "histogram":
            names |= {fam + "_bucket", fam + "_sum", fam + "_count"}
    return names


# ---- a server with a little of everything behind it ---------------------------------------------


@pytest.fixture(scope="module")
def driven(module_servers, tiny_model):
    """A server after: a prefill row with in-step sampling, a launched-and-awaited decode row, a
    sample effect of 3 positions, a 404. Yields (server, client, metrics before, metrics after)."""
    sv = module_servers.start(tiny_model)
    c = sv.client()
    before = parse_metrics(c.metrics())
    a, b = c.create(), c.create()
    c.step(plan(row(a, prompt(5), sample={"temperature": 0}), row(b, prompt(3, 1))))
    t = c.launch(plan(row(a, [7]), row(b, [9], logits="last")))
    done = c.await_(t)
    h = done["rows"][1]["logits"]
    c.effect({"kind": "release", "logits": h})
    r = c.step(plan(row(b, prompt(3, 2), logits="all")))
    c.effect({"kind": "sample", "logits": r["rows"][0]["logits"], "params": {"temperature": 0}})
    c.effect({"kind": "release", "logits": r["rows"][0]["logits"]})
    c.call("GET", "/v1/sequences/%d" % (b + 10 ** 6), expect=404)
    text = c.metrics()
    yield sv, c, before, parse_metrics(text), text


def test_promtool_check_metrics_clean(driven):
    text = driven[4]
    r = promtool("check", "metrics", stdin=text)
    assert r.returncode == 0 and r.stdout.strip() == "" and r.stderr.strip() == "", (r.stdout, r.stderr)
    # promtool does find what it should: a gauge named like a counter.
    bad = promtool("check", "metrics", stdin="# HELP x_total x\n# TYPE x_total gauge\nx_total 1\n")
    assert bad.returncode != 0 and "_total" in bad.stdout + bad.stderr


def test_counters_and_histograms_move(driven):
    _, _, (m0, _), (m1, types), _ = driven

    def delta(name, **lab):
        return (metric(m1, name, **lab) or 0) - (metric(m0, name, **lab) or 0)

    assert delta("devio_tickets_launched_total") == 3
    assert delta("devio_tickets_settled_total", status="ok") == 3
    assert delta("devio_tickets_settled_total", status="failed") == 0
    # Rows of 5, 3 and 3 tokens are prefill; the two rows of one token are decode.
    assert delta("devio_tokens_processed_total", kind="prefill") == 11
    assert delta("devio_tokens_processed_total", kind="decode") == 2
    assert delta("devio_tokens_sampled_total", source="step") == 1
    assert delta("devio_tokens_sampled_total", source="effect") == 3
    for fam in ("devio_step_seconds", "devio_step_queue_seconds", "devio_step_batch_rows",
                "devio_step_batch_tokens"):
        assert types[fam] == "histogram"
        assert delta(fam + "_count") == 3, fam
        buckets = sorted((float(dict(k[1])["le"]), v) for k, v in m1.items() if k[0] == fam + "_bucket")
        assert buckets[-1][0] == math.inf and buckets[-1][1] == metric(m1, fam + "_count")
        assert all(x[1] <= y[1] for x, y in zip(buckets, buckets[1:])), fam
    assert max(float(dict(k[1])["le"]) for k in m1 if k[0] == "devio_step_seconds_bucket"
               and dict(k[1])["le"] != "+Inf") == 60
    assert delta("devio_step_batch_rows_sum") == 5
    # The ticket store: three launch rows and three settle rows, in one to six group commits,
    # each timed from BEGIN to COMMIT (buckets from 25 us to 1 s).
    fam = "devio_store_commit_seconds"
    assert types[fam] == "histogram"
    assert 1 <= delta(fam + "_count") <= 6
    assert delta(fam + "_sum") > 0
    buckets = sorted((float(dict(k[1])["le"]), v) for k, v in m1.items() if k[0] == fam + "_bucket")
    assert [b[0] for b in buckets][:2] == [0.000025, 0.00005] and buckets[-2][0] == 1.0
    assert buckets[-1] == (math.inf, metric(m1, fam + "_count"))
    assert all(x[1] <= y[1] for x, y in zip(buckets, buckets[1:]))
    assert delta("devio_step_batch_tokens_sum") == 13
    # HTTP: counted by route and code, timed by route.
    assert delta("devio_http_requests_total", route="/v1/sequences/{id}", code="404") == 1
    assert delta("devio_http_requests_total", route="/v1/effects", code="200") == 3
    assert delta("devio_http_request_duration_seconds_count", route="/v1/effects") == 3
    assert delta("devio_http_request_duration_seconds_count", route="/v1/tickets/{id}/await") == 1
    assert metric(m1, "devio_http_request_duration_seconds_sum", route="/v1/step") > 0
    assert 0 < metric(m1, "devio_kv_usage_ratio") <= 1
    used = metric(m1, "devio_kv_blocks_capacity") - metric(m1, "devio_kv_blocks_free")
    assert metric(m1, "devio_kv_usage_ratio") == pytest.approx(used / metric(m1, "devio_kv_blocks_capacity"),
                                                              rel=1e-5)
    assert metric(m1, "devio_ready") == 1 and metric(m1, "devio_up") == 1


def test_operator_gauges_and_errors(driven):
    """Sequences and logits handles live against their limits, device memory as /v1/device
    gives it, and error answers counted by their code: every code exported from 0."""
    _, c, (m0, _), (m1, types), _ = driven
    d = c.device()
    for fam in ("devio_sequences_live", "devio_sequences_capacity", "devio_logits_live",
                "devio_logits_capacity", "devio_device_memory_total_bytes",
                "devio_device_memory_used_bytes"):
        assert types[fam] == "gauge", fam
    assert metric(m1, "devio_sequences_live") == len(c.call("GET", "/v1/sequences").json["sequences"]) == 2
    assert metric(m1, "devio_sequences_capacity") == d["limits"]["max_seqs"]
    assert metric(m1, "devio_logits_live") == 0
    assert metric(m1, "devio_logits_capacity") == d["limits"]["logits_handles"]
    assert metric(m1, "devio_device_memory_total_bytes") == d["device"]["memory_total"]
    assert metric(m1, "devio_device_memory_used_bytes") == d["device"]["memory_used"]
    # The one error of the drive: the 404 of an unknown sequence.
    assert types["devio_http_errors_total"] == "counter"
    codes = {dict(k[1])["code"] for k in m1 if k[0] == "devio_http_errors_total"}
    import yaml
    api = yaml.safe_load((REPO / "api" / "openapi.yaml").read_text())
    assert codes == set(api["components"]["schemas"]["ErrorCode"]["enum"]), codes
    moved = {code: metric(m1, "devio_http_errors_total", code=code)
             - (metric(m0, "devio_http_errors_total", code=code) or 0) for code in codes}
    assert {k: v for k, v in moved.items() if v} == {"unknown_seq": 1}, moved
    # Live gauges follow a sequence made, a handle kept, a refusal; then all is given back.
    s = c.create()
    h = c.step(plan(row(s, prompt(3), logits="last")))["rows"][0]["logits"]
    c.call("POST", "/v1/effects", {"kind": "nosuch"}, expect=400, code="invalid_input")
    m2 = parse_metrics(c.metrics())[0]
    assert metric(m2, "devio_sequences_live") == 3 and metric(m2, "devio_logits_live") == 1
    assert metric(m2, "devio_http_errors_total", code="invalid_input") == \
        metric(m1, "devio_http_errors_total", code="invalid_input") + 1
    # Parked: counted with its host bytes; its logits handle still released as before.
    parked = c.effect({"kind": "park", "seq": s})["parked_bytes"]
    mp = parse_metrics(c.metrics())[0]
    assert metric(mp, "devio_sequences_parked") == 1
    assert metric(mp, "devio_parked_bytes") == parked > 0
    assert c.call("GET", "/v1/facts").json["parked"] == {"seqs": 1, "bytes": parked}
    c.effect({"kind": "release", "logits": h})
    c.call("DELETE", "/v1/sequences/%d" % s)
    m3 = parse_metrics(c.metrics())[0]
    assert metric(m3, "devio_sequences_live") == 2 and metric(m3, "devio_logits_live") == 0
    assert metric(m3, "devio_sequences_parked") == 0 and metric(m3, "devio_parked_bytes") == 0


def test_build_info_and_process(driven):
    sv, c, _, (m1, types), _ = driven
    d = c.device()
    assert metric(m1, "devio_build_info", version=d["version"], backend=d["backend"]) == 1
    assert types["process_cpu_seconds_total"] == "counter"
    assert metric(m1, "process_cpu_seconds_total") >= 0
    assert metric(m1, "process_resident_memory_bytes") > 0
    assert metric(m1, "process_virtual_memory_bytes") >= metric(m1, "process_resident_memory_bytes")
    fds = len(list(Path("/proc/%d/fd" % sv.proc.pid).iterdir()))
    assert abs(metric(m1, "process_open_fds") - fds) <= 8
    limits = Path("/proc/%d/limits" % sv.proc.pid).read_text()
    soft = re.search(r"^Max open files\s+(\d+)", limits, re.M)
    if soft:
        assert metric(m1, "process_max_fds") == int(soft.group(1))
    started = metric(m1, "process_start_time_seconds")
    assert time.time() - 600 < started <= time.time() + 1


def test_rules_check_and_unit_tests():
    r = promtool("check", "rules", str(RULES))
    assert r.returncode == 0 and "SUCCESS" in r.stdout, (r.stdout, r.stderr)
    assert "warning" not in (r.stdout + r.stderr).lower(), (r.stdout, r.stderr)
    t = promtool("test", "rules", str(RULES_TEST))
    assert t.returncode == 0 and "SUCCESS" in t.stdout, (t.stdout, t.stderr)
    # Every alert has a unit test case.
    import yaml
    alerts = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}
    tested = {a["alertname"] for tc in yaml.safe_load(RULES_TEST.read_text())["tests"]
              for a in tc["alert_rule_test"]}
    assert alerts == tested, alerts ^ tested


def test_dashboard_and_rules_name_exported_metrics(driven):
    _, _, _, (m1, types), _ = driven
    exported = exported_names(m1, types)
    used = {}
    for source, exprs in (("dashboard", dashboard_exprs()), ("rules", rules_exprs())):
        assert exprs, source
        for e in exprs:
            names = promql_metrics(e)
            assert names, (source, e)
            for n in names:
                used.setdefault(n, source)
    missing = {n: s for n, s in used.items()
               if n not in exported and n not in SCRAPE_SERIES and n not in STORE_FAMILIES}
    assert not missing, missing
    # The dashboard covers what an operator looks at first.
    for n in ("devio_step_seconds_bucket", "devio_step_queue_seconds_bucket", "devio_tokens_processed_total",
              "devio_kv_usage_ratio", "devio_tickets_in_flight", "devio_http_requests_total",
              "devio_http_request_duration_seconds_bucket", "process_cpu_seconds_total",
              "process_resident_memory_bytes", "devio_store_errors_total",
              "devio_sequences_live", "devio_sequences_capacity", "devio_logits_live",
              "devio_logits_capacity", "devio_adapters_loaded", "devio_adapters_capacity",
              "devio_ssm_slots_used", "devio_ssm_slots_capacity", "devio_device_memory_used_bytes",
              "devio_device_memory_total_bytes", "devio_http_errors_total"):
        assert n in used, n


def test_store_families_exported(driven):
    _, _, _, (m1, types), _ = driven
    exported = exported_names(m1, types)
    if not any(n.startswith("devio_store_") for n in exported):
        pytest.skip("this build exports no devio_store_* family")
    assert STORE_FAMILIES <= exported, STORE_FAMILIES - exported
