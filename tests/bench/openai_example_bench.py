#!/usr/bin/env python3
"""openai_example_bench.py - what the OpenAI-compatible example (examples/openai) costs over devio.
A benchmark, not a test: it prints figures, asserts nothing about speed, never leaves a process running.

    python3 tests/bench/openai_example_bench.py --bin bazel-bin [--model FILE.gguf]
                [--concurrency 1,8,32] [--tokens 64] [--rounds 2] [--stream]

Starts devio-server on SmolLM2-135M-Instruct (deploy/fetch-model.sh fetches it; or --model)
on loopback, then for each concurrency C:

  direct   C chat prompts (the model's template and vocabulary) prefilled through
           devio_client in steps of at most --step-tokens tokens, then --tokens - 1 decode
           steps of C rows: the least time devio needs for the same tokens;
  example  the same C chat requests sent at once to examples/openai/serve.py with the
           official openai client, max_tokens --tokens, scheduled by the example.

Both decode greedily with the end-of-turn token banned (logit_bias -100), so every request
makes exactly --tokens tokens. For each it prints generated tokens per second (wall time
from the first request to the last answer), devio's steps and mean rows per step, and the
share of the wall time devio spent computing (devio_step_seconds from GET /metrics): the
rest is HTTP, the scheduler, the text work and the clients. For the example it also prints
the CPU time its server process took, over the wall time: on a machine with few cores that
is taken from devio's compute threads, which then compute each step more slowly. Each pair
runs --rounds times; the fastest run of each is shown.
"""
import argparse
import concurrent.futures
import json
import os
import re
import selectors
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(REPO / "clients" / "python"))
sys.path.insert(0, str(REPO / "examples" / "openai"))
sys.path.insert(0, str(REPO / "tests" / "bench"))
from devio_client import Client  # noqa: E402
from server_bench import stop_server as stop  # noqa: E402

QUESTIONS = ["Tell me a fact about the number %d.", "Write a sentence about a city, number %d.",
             "Describe an animal in a few words (request %d).", "Explain a color to a child (%d)."]
START_S = 120.0


def start(cmd, log_path, env=None):
    """Start a process that prints `listening PORT` first; (process, port)."""
    log = open(log_path, "wb")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL,
                            env=env)
    log.close()
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline, buf = time.monotonic() + START_S, b""
    try:
        while b"\n" not in buf:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("%s did not start:\n%s" % (cmd[0], Path(log_path).read_text(
                    errors="replace")[-2000:]))
            if sel.select(timeout=0.5):
                buf += os.read(proc.stdout.fileno(), 4096)
    except BaseException:
        stop(proc)
        raise
    finally:
        sel.close()
    return proc, int(buf.split(b"\n")[0].split()[1])


def fetch(model):
    if model:
        return Path(model)
    p = subprocess.run(["bash", str(REPO / "deploy" / "fetch-model.sh")], capture_output=True,
                       text=True, timeout=900)
    if p.returncode:
        raise RuntimeError("the model cannot be fetched: " + p.stderr.strip()[-300:])
    return Path(p.stdout.strip().splitlines()[-1])


def step_metrics(port):
    """devio's step counters now: steps, compute seconds, rows."""
    text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=30).read().decode()

    def value(name):
        m = re.search(r"^%s (\S+)$" % re.escape(name), text, re.M)
        return float(m.group(1)) if m else 0.0

    return {"steps": value("devio_step_seconds_count"), "seconds": value("devio_step_seconds_sum"),
            "rows": value("devio_step_batch_rows_sum")}


def cpu_seconds(pid):
    """User and system CPU time of a process so far (/proc/PID/stat)."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def figures(port, before, wall, tokens):
    after = step_metrics(port)
    steps = after["steps"] - before["steps"]
    busy = after["seconds"] - before["seconds"]
    return {"tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall, "steps": int(steps),
            "rows_per_step": (after["rows"] - before["rows"]) / max(steps, 1),
            "step_ms": 1000 * busy / max(steps, 1), "device_busy": busy / wall}


def prefill_plans(seqs, prompts, budget, sample):
    """The prompts in steps of at most `budget` tokens, chunked where they do not fit."""
    plans, rows, left = [], [], budget
    for seq, ids in zip(seqs, prompts):
        at = 0
        while at < len(ids):
            if left == 0:
                plans.append({"rows": rows})
                rows, left = [], budget
            n = min(left, len(ids) - at)
            row = {"seq": seq, "tokens": ids[at:at + n]}
            if at + n == len(ids):
                row["sample"] = sample
            rows.append(row)
            at, left = at + n, left - n
    return plans + [{"rows": rows}] if rows else plans


def run_direct(port, prompts, tokens, budget, eos):
    sample = {"temperature": 0, "logit_bias": {str(eos): -100}}
    with Client("http://127.0.0.1:%d" % port, timeout=300) as c:
        seqs = [c.create_sequence() for _ in prompts]
        before = step_metrics(port)
        t0 = time.perf_counter()
        last = {}
        for plan in prefill_plans(seqs, prompts, budget, sample):
            for row in c.step(plan)["rows"]:
                if "tokens" in row:
                    last[row["seq"]] = row["tokens"]
        for _ in range(tokens - 1):
            r = c.step({"rows": [{"seq": s, "tokens": last[s], "sample": sample} for s in seqs]})
            last = {row["seq"]: row["tokens"] for row in r["rows"]}
        wall = time.perf_counter() - t0
        out = figures(port, before, wall, tokens * len(seqs))
        for s in seqs:
            c.free(s)
    return out


def run_example(client, name, devio_port, server_pid, messages, tokens, eos, stream):
    def one(msgs):
        kw = dict(model=name, messages=msgs, max_tokens=tokens, temperature=0,
                  logit_bias={str(eos): -100})
        if not stream:
            return client.chat.completions.create(**kw).usage.completion_tokens
        n = 0
        for chunk in client.chat.completions.create(stream=True, stream_options={"include_usage": True},
                                                    **kw):
            if chunk.usage:
                n = chunk.usage.completion_tokens
        return n

    before, cpu0 = step_metrics(devio_port), cpu_seconds(server_pid)
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(len(messages)) as pool:
        made = sum(pool.map(one, messages))
    out = figures(devio_port, before, time.perf_counter() - t0, made)
    out["server_cpu"] = (cpu_seconds(server_pid) - cpu0) / out["wall_s"]
    return out


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default="bazel-bin", help="folder with service/devio-server")
    ap.add_argument("--model", help="the GGUF file [SmolLM2, fetched by deploy/fetch-model.sh]")
    ap.add_argument("--concurrency", default="1,8,32",
                    help="concurrent requests, comma-separated [1,8,32]")
    ap.add_argument("--tokens", type=int, default=64, help="tokens each request generates [64]")
    ap.add_argument("--step-tokens", type=int, default=512, help="the example's --step-tokens [512]")
    ap.add_argument("--threads", type=int, default=0, help="devio-server --threads [0: every CPU]")
    ap.add_argument("--stream", action="store_true", help="stream the example's answers")
    ap.add_argument("--rounds", type=int, default=2,
                    help="runs of each; the fastest is shown (a shared machine is noisy) [2]")
    ap.add_argument("--json", action="store_true", help="also print the figures as one JSON line")
    a = ap.parse_args(argv)
    levels = [int(x) for x in a.concurrency.split(",") if x.strip()]
    if a.tokens < 2 or not levels or min(levels) < 1 or a.rounds < 1:
        ap.error("--tokens must be >= 2, --rounds >= 1 and --concurrency positive integers")
    import openai
    from text import Vocabulary

    bin_dir = Path(a.bin) if Path(a.bin).is_absolute() or Path(a.bin).exists() else REPO / a.bin
    model = fetch(a.model)
    tmp = Path(tempfile.mkdtemp(prefix="devio-openai-bench-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEVIO_")}
    procs, results = [], []
    try:
        devio, dport = start([str(bin_dir / "service" / "devio-server"), "--model", str(model),
                              "--listen", "127.0.0.1:0", "--db", str(tmp / "devio.db"),
                              "--adapters", str(tmp), "--threads", str(a.threads),
                              "--max-rows", str(max(64, max(levels)))], tmp / "devio.log", env)
        procs.append(devio)
        example, eport = start([sys.executable, str(REPO / "examples" / "openai" / "serve.py"),
                                "--devio", "http://127.0.0.1:%d" % dport, "--listen", "127.0.0.1:0",
                                "--model", str(model), "--step-tokens", str(a.step_tokens),
                                "--log-level", "warning"], tmp / "example.log", env)
        procs.append(example)
        with Client("http://127.0.0.1:%d" % dport) as c:
            info = c.model()
            threads = c.device()["threads"]
        eos = info["eos_token_id"]
        vocab = Vocabulary(str(model), info["chat_template"], info["bos_token_id"], eos)
        client = openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % eport, api_key="unused",
                               timeout=600, max_retries=0)
        name = client.models.list().data[0].id
        work = {}
        for n in levels:
            msgs = [[{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)] % i}] for i in range(n)]
            work[n] = msgs, [vocab.encode(vocab.render_chat(m)) for m in msgs]
        top = max(levels)   # untimed: the largest shapes once each, so no run pays a first time
        run_direct(dport, work[top][1], 2, a.step_tokens, eos)
        run_example(client, name, dport, example.pid, work[top][0], 2, eos, a.stream)
        for n in levels:
            msgs, prompts = work[n]
            direct, ex = [], []
            for _ in range(a.rounds):
                direct.append(run_direct(dport, prompts, a.tokens, a.step_tokens, eos))
                ex.append(run_example(client, name, dport, example.pid, msgs, a.tokens, eos,
                                      a.stream))
            best = lambda runs: max(runs, key=lambda r: r["tokens_per_s"])  # noqa: E731
            results.append({"concurrency": n, "prompt_tokens": sum(map(len, prompts)),
                            "direct": best(direct), "example": best(ex)})
        client.close()
    finally:
        for p in reversed(procs):
            stop(p)
        shutil.rmtree(tmp, ignore_errors=True)
    print("examples/openai over devio-server: %s, %d devio thread(s), %d CPUs; greedy, %d tokens a "
          "request, %s answers, step budget %d tokens; the fastest of %d rounds"
          % (model.name, threads, os.cpu_count(), a.tokens, "streamed" if a.stream else "whole",
             a.step_tokens, a.rounds))
    head = "%10s %6s %9s %8s %5s"
    print(("%4s %7s | " + head + " | " + head + " %7s | %9s") % (
        "C", "prompt", "direct/s", "steps", "rows/step", "ms/step", "busy",
        "example/s", "steps", "rows/step", "ms/step", "busy", "srv cpu", "ex/direct"))
    row = "%10.1f %6d %9.1f %8.1f %4.0f%%"
    for r in results:
        d, e = r["direct"], r["example"]
        print(("%4d %7d | " + row + " | " + row + " %6.0f%% | %8.0f%%") % (
            (r["concurrency"], r["prompt_tokens"]) +
            tuple(x[k] * (100 if k == "device_busy" else 1) for x in (d, e)
                  for k in ("tokens_per_s", "steps", "rows_per_step", "step_ms", "device_busy")) +
            (100 * e["server_cpu"], 100 * e["tokens_per_s"] / d["tokens_per_s"])))
    print("tokens/s: generated tokens over the wall time from the first request to the last answer; "
          "ms/step: devio's compute time per step;\nbusy: devio's compute time over the wall time "
          "(the rest is HTTP, scheduling, text and the clients); srv cpu: the example server's "
          "CPU time over the wall time.")
    if a.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
