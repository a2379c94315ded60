#!/usr/bin/env python3
"""openai_cluster_bench.py - examples/openai over one devio-server against two, with and without
prefill/decode disaggregation. A benchmark, not a test: it prints figures, asserts nothing about
speed, never leaves a process running.

    python3 tests/bench/openai_cluster_bench.py --bin bazel-bin [--model FILE.gguf]
                [--requests 12] [--interval-ms 300] [--prompt-words 240] [--tokens 48]
                [--layouts one,two,prefill-decode]

Layouts, each over the same CPUs (--cpus, every CPU by default):
  one             one devio-server with --threads CPUS; the example with --devio
  two             two devio-servers with --threads CPUS/2 each; the example with --devio twice
                  (placed by load)
  prefill-decode  the same two servers; the example with --prefill A --decode B: each request's
                  state moves from A to B after its first token

For each layout the same --requests streamed chat requests arrive every --interval-ms (the
official openai client, one thread each), each with its own long prompt (no prefix shared) and
--tokens greedy tokens (the end-of-turn token banned, so every request makes them all). It prints
time to first token (the first chunk with text) and the gaps between chunks (inter-token latency)
at the 50th and 90th percentile and their maximum, and tokens/s: every generated token over the
wall time from the first request to the last answer."""
import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(REPO / "tests" / "bench"))
from openai_example_bench import fetch, start, stop  # noqa: E402

SENTENCES = ["The river bends twice before it reaches the old mill.",
             "A lantern hangs by the door of every house on the hill.",
             "Merchants count their coins at dusk and sleep at dawn.",
             "The library keeps maps of roads that no longer exist."]


def prompt(i, words):
    """Request i's messages: a system prompt of about `words` words that differs from the first."""
    text, n = ["Request %d." % i], 0
    while n < words:
        s = SENTENCES[(i + n) % len(SENTENCES)]
        text.append(s)
        n += len(s.split())
    return [{"role": "system", "content": " ".join(text)},
            {"role": "user", "content": "Tell me a story about request %d." % i}]


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def drive(port, name, n, interval, words, tokens, eos):
    """The requests against one example; per request (start, first text, chunk times)."""
    import openai
    client = openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % port, api_key="unused",
                           timeout=600, max_retries=0)
    out = [None] * n

    def one(i):
        t0, times = time.monotonic(), []
        for ch in client.chat.completions.create(
                model=name, messages=prompt(i, words), stream=True, temperature=0,
                max_tokens=tokens, logit_bias={str(eos): -100}):
            if ch.choices and ch.choices[0].delta.content:
                times.append(time.monotonic())
        out[i] = (t0, times)

    threads = []
    for i in range(n):
        t = threading.Thread(target=one, args=(i,))
        t.start()
        threads.append(t)
        time.sleep(interval)
    for t in threads:
        t.join()
    client.close()
    return out


def health(port):
    """The router's counts (GET /health), or {} over one server."""
    with urllib.request.urlopen("http://127.0.0.1:%d/health" % port, timeout=30) as r:
        return json.load(r).get("router", {})


def run_layout(layout, a, bin_dir, model, tmp, env, eos):
    servers, procs = (1 if layout == "one" else 2), []
    threads = max(1, a.cpus // servers)
    try:
        ports = []
        for k in range(servers):
            p, port = start([str(bin_dir / "service" / "devio-server"), "--model", str(model),
                             "--listen", "127.0.0.1:0", "--db", str(tmp / ("%s%d.db" % (layout, k))),
                             "--adapters", str(tmp), "--threads", str(threads)],
                            tmp / ("%s%d.log" % (layout, k)), env)
            procs.append(p)
            ports.append(port)
        urls = ["http://127.0.0.1:%d" % p for p in ports]
        if layout == "prefill-decode":
            args = ["--prefill", urls[0], "--decode", urls[1]]
        else:
            args = [x for u in urls for x in ("--devio", u)]
        ex, eport = start([sys.executable, str(REPO / "examples" / "openai" / "serve.py")] + args +
                          ["--listen", "127.0.0.1:0", "--model", str(model), "--log-level",
                           "warning", "--served-model-name", "m"], tmp / (layout + ".log"), env)
        procs.append(ex)
        drive(eport, "m", 2, 0.0, a.prompt_words, 2, eos)   # untimed: first steps, first moves
        before = health(eport)
        runs = drive(eport, "m", a.requests, a.interval_ms / 1000.0, a.prompt_words, a.tokens, eos)
        after = health(eport)
    finally:
        for p in reversed(procs):
            stop(p)
    start_t = min(r[0] for r in runs)
    end_t = max(r[1][-1] for r in runs)
    ttft = [r[1][0] - r[0] for r in runs]
    gaps = [b - a_ for r in runs for a_, b in zip(r[1], r[1][1:])]
    chunks = sum(len(r[1]) for r in runs)
    moved = {k: after.get(k, 0) - before.get(k, 0) for k in ("moved", "moved_bytes", "move_ms")}
    return {"layout": layout, "servers": servers, "threads": threads,
            "ttft_p50": pct(ttft, 0.5), "ttft_p90": pct(ttft, 0.9), "ttft_mean":
            statistics.mean(ttft), "itl_p50": pct(gaps, 0.5), "itl_p90": pct(gaps, 0.9),
            "itl_max": max(gaps), "tokens_per_s": a.requests * a.tokens / (end_t - start_t),
            "chunks": chunks, **moved}


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default="bazel-bin", help="folder with service/devio-server")
    ap.add_argument("--model", help="the GGUF file [SmolLM2, fetched by deploy/fetch-model.sh]")
    ap.add_argument("--requests", type=int, default=12, help="requests per layout [12]")
    ap.add_argument("--interval-ms", type=float, default=300, help="between arrivals [300]")
    ap.add_argument("--prompt-words", type=int, default=240, help="system prompt words [240]")
    ap.add_argument("--tokens", type=int, default=48, help="tokens each request generates [48]")
    ap.add_argument("--cpus", type=int, default=os.cpu_count(), help="CPUs shared out [all]")
    ap.add_argument("--layouts", default="one,two,prefill-decode",
                    help="which, comma-separated [one,two,prefill-decode]")
    a = ap.parse_args(argv)
    layouts = [x for x in a.layouts.split(",") if x]
    if any(x not in ("one", "two", "prefill-decode") for x in layouts) or a.requests < 1 or \
            a.tokens < 2:
        ap.error("--layouts takes one, two, prefill-decode; --requests >= 1, --tokens >= 2")
    bin_dir = Path(a.bin) if Path(a.bin).is_absolute() or Path(a.bin).exists() else REPO / a.bin
    model = fetch(a.model)
    sys.path.insert(0, str(REPO / "tools" / "gguf"))
    import gguf_file
    eos = gguf_file.read(str(model)).metadata["tokenizer.ggml.eos_token_id"]
    tmp = Path(tempfile.mkdtemp(prefix="devio-cluster-bench-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEVIO_")}
    try:
        results = [run_layout(x, a, bin_dir, model, tmp, env, eos) for x in layouts]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("examples/openai over devio-server: %s; %d streamed requests every %.0f ms, a %d-word "
          "system prompt each, %d greedy tokens; %d CPUs shared out"
          % (model.name, a.requests, a.interval_ms, a.prompt_words, a.tokens, a.cpus))
    print("%-15s %7s %7s | %8s %8s %8s | %7s %7s %7s | %8s" % (
        "layout", "servers", "threads", "ttft p50", "ttft p90", "mean", "itl p50", "itl p90",
        "itl max", "tokens/s"))
    for r in results:
        print("%-15s %7d %7d | %7.0fms %7.0fms %7.0fms | %5.0fms %5.0fms %5.0fms | %8.1f" % (
            r["layout"], r["servers"], r["threads"], 1000 * r["ttft_p50"], 1000 * r["ttft_p90"],
            1000 * r["ttft_mean"], 1000 * r["itl_p50"], 1000 * r["itl_p90"], 1000 * r["itl_max"],
            r["tokens_per_s"]))
    for r in results:
        if r["moved"]:
            print("%s: %d states moved, %.1f MB each, imported in %.0f ms each" % (
                r["layout"], r["moved"], r["moved_bytes"] / r["moved"] / 1e6,
                r["move_ms"] / r["moved"]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
