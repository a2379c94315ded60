#!/usr/bin/env python3
"""gpu_check.py - the body of kernels/gpu-check.sh (see there): checks and
figures of the CUDA backend on a machine with an NVIDIA GPU, or with
--emulate of cuda-emu, the same backend on the SIMT emulator (kernels/emu/),
where steps that need hardware are skipped and the bench runs the tiny model
(its figures time the emulator and are labelled so).

Steps run in the order of what they tell per second: a tiny Llama and a tiny
Bamba bit for bit against the reference first, then the CUDA unit tests,
compute-sanitizer, the read bandwidth and the 1b bench, the fast-numerics
section (gpu_check_fast.py: the GEMM rate, the fast bench against its
targets, fast against strict by tolerance, PyTorch side by side), Hugging Face
agreement, every model feature, hybrid model and quantized GGUF weight type
bit for bit, and the conformance suites last. One overall deadline (--deadline) is shared out: a
step gets at most its own limit and never more than what is left. Each step
is recorded as ok, FAIL or skipped with its figures, and the report
(OUT/gpu-check.json, OUT/gpu-check.md) is rewritten after every step and on
SIGTERM, so a run cut short keeps the steps it finished. Every command's full
output is appended to OUT/gpu-check.log; a step that runs out of time keeps
the output it had. Exit status 0 only when no step failed.

Every comparison of logits against the reference locates a mismatch: the
first differing (position, logit), the largest distance in ulps, and the
positions that differ (e.g. only positions >= 32 points at attention's lane
sums).
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import gpu_check_fast

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HF_LIMIT = 1e-4


class Deadline(Exception):
    pass


class Check:
    """The run's state: where binaries and outputs are, the deadline, the
    report (rewritten after every step) and the log every command appends to."""

    def __init__(self, bin_dir, out, deadline_s, backend, emulated=False):
        self.emulated = emulated
        self.bin = bin_dir
        self.out = out
        self.backend = backend
        self.end = time.time() + deadline_s
        self.steps = []
        self.env = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                    "backend": backend, "emulated": emulated}
        self.log = open(os.path.join(out, "gpu-check.log"), "a", buffering=1)
        self.current = None

    def left(self):
        return self.end - time.time()

    def path(self, *p):
        return os.path.join(self.bin, *p)

    def logged(self, text):
        """What of a command's output goes to the log: all of it up to 16 KB
        (logits dumps are megabytes), else its head and tail."""
        return text if len(text) <= 16384 else text[:4096] + "\n[... %d characters ...]\n" % (
            len(text) - 12288) + text[-8192:]

    def sh(self, cmd, limit, check=False, env=None, input=None, cwd=None):
        """Runs cmd for at most min(limit, time left); its output goes to the
        log whole. A timeout raises with the output so far kept."""
        budget = min(limit, self.left() - 2)
        if budget <= 1:
            raise Deadline("no time left for %s" % os.path.basename(cmd[0]))
        self.log.write("\n$ %s   (limit %.0fs)\n" % (" ".join(cmd), budget))
        t0 = time.time()
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=env, cwd=cwd,
                             stdin=subprocess.PIPE if input is not None else None,
                             start_new_session=True)
        try:
            out, err = p.communicate(input=input, timeout=budget)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, err = p.communicate()
            self.log.write(self.logged(out + err) + "\n[killed after %.0fs]\n" % (time.time() - t0))
            raise Deadline("%s ran out of time after %.0fs; its output so far: %s"
                           % (os.path.basename(cmd[0]), time.time() - t0, (out + err)[-800:]))
        self.log.write(self.logged(out + err) + "[exit %d, %.1fs]\n" % (p.returncode, time.time() - t0))
        if check and p.returncode != 0:
            raise RuntimeError("%s exited %d: %s" % (os.path.basename(cmd[0]), p.returncode,
                                                     (err or out)[-800:]))
        return subprocess.CompletedProcess(cmd, p.returncode, out, err)

    def step(self, name, fn):
        t0 = time.time()
        self.current = (name, t0)
        if self.left() < 5:
            status, figures = "skipped", {"why": "the deadline was reached"}
        else:
            try:
                status, figures = fn()
            except Exception as e:  # a crash, a timeout or a missing tool fails the step, not the run
                status, figures = "FAIL", {"error": str(e)[-1200:]}
        self.current = None
        self.add(name, status, time.time() - t0, figures)
        return figures

    def add(self, name, status, seconds, figures):
        self.steps.append(dict(name=name, status=status, seconds=round(seconds, 1), **figures))
        detail = ", ".join("%s %s" % (k, v) for k, v in figures.items() if k != "output")
        print("%-7s %s (%.1fs) %s" % (status, name, seconds, detail), flush=True)
        self.write()

    def failed(self):
        return sum(s["status"] == "FAIL" for s in self.steps)

    def write(self):
        for name, text in (("gpu-check.json", json.dumps({"env": self.env, "steps": self.steps},
                                                         indent=1)),
                           ("gpu-check.md", markdown(self))):
            tmp = os.path.join(self.out, name + ".tmp")
            with open(tmp, "w") as f:
                f.write(text)
            os.replace(tmp, os.path.join(self.out, name))

    def interrupted(self, signum, frame):
        if self.current:
            self.add(self.current[0], "FAIL", time.time() - self.current[1],
                     {"error": "interrupted by signal %d" % signum})
        self.env["interrupted"] = "signal %d after %d steps" % (signum, len(self.steps))
        self.write()
        print("gpu-check: interrupted; %d steps written" % len(self.steps), flush=True)
        os._exit(2)


def markdown(c):
    lines = ["# devio GPU check", "",
             "%s; backend %s; %s" % (c.env.get("gpu", "?"), c.backend, c.env.get("when", "")), "",
             "| step | result | seconds | figures |", "|---|---|---|---|"]
    for s in c.steps:
        figs = ", ".join("%s %s" % (k, v) for k, v in s.items()
                         if k not in ("name", "status", "seconds", "output", "log"))
        lines.append("| %s | %s | %s | %s |" % (s["name"], s["status"], s["seconds"],
                                                 figs.replace("|", "/").replace("\n", " ")))
    for s in c.steps:
        for key in ("output", "log"):
            if s.get(key):
                lines += ["", "%s, %s:" % (s["name"], key), "```", s[key], "```"]
    if c.env.get("interrupted"):
        lines += ["", "Interrupted: %s." % c.env["interrupted"]]
    return "\n".join(lines) + "\n"


# ---- logits, and where two sets of them differ --------------------------------

def make_model(c, tmp, preset, seed=5, flags=(), tag=None):
    d = os.path.join(tmp, tag or preset)
    if not os.path.exists(os.path.join(d, "config.json")):
        c.sh([c.path("tools", "mkmodel", "devio-mkmodel"), "--preset", preset, "--seed", str(seed),
              "--out", d] + list(flags), 240, check=True)
    return d


def prompt(model_dir, n):
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    return [(i * 7919 + 13) % cfg["vocab_size"] for i in range(n)]


def devio_logits(c, model, tokens, backend, tmp):
    """Every position's logits of one prompt as float32 [n, vocab]."""
    import numpy as np

    script = os.path.join(tmp, "logits.jsonl")
    with open(script, "w") as f:
        f.write('{"op":"create","as":"s"}\n')
        f.write(json.dumps({"op": "step", "full": True, "plan": {"rows": [
            {"seq": "$s", "tokens": tokens, "logits": "all"}]}}) + "\n")
    p = c.sh([c.path("ref", "devio-ref"), "--model", model, "--backend", backend,
              "--backend-path", c.path("kernels"), script], 240, check=True)
    lg = json.loads(p.stdout.splitlines()[1])["result"]["rows"][0]["logits"]
    return np.array(lg["values"], dtype=np.float32).reshape(lg["shape"])


def spans(ix):
    """[0,1,2,5,7,8] -> '0-2,5,7-8'."""
    out, start, prev = [], None, None
    for i in list(ix) + [None]:
        if start is not None and (i is None or i != prev + 1):
            out.append(str(start) if start == prev else "%d-%d" % (start, prev))
            start = None
        if i is not None and start is None:
            start = i
        prev = i
    return ",".join(out)


def locate(want, got):
    """'identical', or where got differs from want: first (position, logit),
    the largest ulp distance, the positions that differ."""
    import numpy as np

    if want.shape != got.shape:
        return {"bits": "DIFFER", "shape": "%s vs %s" % (list(want.shape), list(got.shape))}
    a, b = want.view(np.int32).astype(np.int64), got.view(np.int32).astype(np.int64)
    if np.array_equal(a, b):
        return {"bits": "identical"}
    # ulps on the monotonic integer line of IEEE binary32
    a = np.where(a < 0, -(a & 0x7FFFFFFF), a)
    b = np.where(b < 0, -(b & 0x7FFFFFFF), b)
    d = np.abs(a - b)
    rows = np.nonzero(d.max(axis=1))[0]
    pos, logit = np.argwhere(d)[0]
    return {"bits": "DIFFER", "first": "position %d logit %d (%r vs %r)" % (
        pos, logit, float(want[pos, logit]), float(got[pos, logit])),
            "max_ulp": int(d.max()), "logits_differ": int((d > 0).sum()),
            "positions_differ": spans(rows.tolist())[:200],
            "max_rel": "%.2e" % float(np.max(np.abs(want.astype(np.float64) - got) /
                                             (np.abs(want).max() + 1e-30)))}


def versus_reference(c, tmp, cases):
    """cases: (label, model_dir, n) or (label, model_dir, n, model): the model (a GGUF
    file) made from model_dir. Bit for bit, each mismatch located."""
    fig, ok = {}, True
    for label, model_dir, n, *model in cases:
        tokens = prompt(model_dir, n)
        model = model[0] if model else model_dir
        r = locate(devio_logits(c, model, tokens, "ref", tmp),
                   devio_logits(c, model, tokens, c.backend, tmp))
        fig[label] = r["bits"] if r["bits"] == "identical" else r
        ok = ok and r["bits"] == "identical"
    return ("ok" if ok else "FAIL"), fig


# Each model feature as devio-mkmodel flags. The window is shorter than the
# prompts below, so that keys leave it; Granite's values are not powers of two
# (but the embedding's), so that a multiply in place of a division or a fused
# residual would show.
FEATURES = (
    ("mistral", ["--arch", "mistral", "--window", "11"]),
    ("granite", ["--arch", "granite", "--embedding-multiplier", "12", "--attention-multiplier",
                 "0.3", "--residual-multiplier", "0.22", "--logits-scaling", "6.5"]),
    ("qwen3", ["--arch", "qwen3"]),
    ("yarn", ["--rope-scaling", "yarn", "--rope-factor", "4"]),
    ("llama3", ["--rope-scaling", "llama3", "--rope-factor", "8", "--rope-original-max", "64"]),
)


def first_bits(c, tmp):
    """The quickest decisive look: tiny Llama and tiny Bamba, 64 positions."""
    return versus_reference(c, tmp, (
        ("llama_tiny", make_model(c, tmp, "tiny"), 64),
        ("bamba_tiny", make_model(c, tmp, "tiny", flags=["--arch", "bamba"], tag="bamba-tiny"), 64),
    ))


def hybrid_bits(c, tmp):
    return versus_reference(c, tmp, [
        ("%s_%s" % (arch, preset),
         make_model(c, tmp, preset, flags=["--arch", arch], tag="%s-%s" % (arch, preset)), n)
        for arch, preset, n in (("mamba2", "tiny", 64), ("bamba", "small", 24),
                                ("mamba2", "small", 24))])


def feature_bits(c, tmp):
    """Each feature on tiny and small (emulated, tiny alone: the suite's conformance runs
    every feature's model on cuda-emu apart)."""
    sizes = (("tiny", 64),) if c.emulated else (("tiny", 64), ("small", 24))
    return versus_reference(c, tmp, [
        ("%s_%s" % (name, preset),
         make_model(c, tmp, preset, flags=flags, tag="feature-%s-%s" % (name, preset)), n)
        for name, flags in FEATURES for preset, n in sizes])


# Every quantized weight type devio reads, and llama.cpp's usual mix.
QUANT_TYPES = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K", "Q4_K_M")
# Emulated, one type of 32-element blocks and the mix (Q4_K and Q6_K in one model): the step's
# logic. The suite holds every type to the reference on cuda-emu apart
# (tests/python/gguf_quant_models_check.py, strict and fast).
EMULATED_QUANT_TYPES = ("Q8_0", "Q4_K_M")


def quant_bits(c, tmp):
    """A Llama whose rows are whole 256-element blocks, as GGUF files of each quantized
    type (tools/gguf/quantize.py, numpy only), vs the reference."""
    d = make_model(c, tmp, "tiny", flags=["--hidden", "256", "--ffn", "512", "--heads", "4",
                                          "--kv-heads", "2", "--head-dim", "64"],
                   tag="quant-base")
    cases = []
    for t in EMULATED_QUANT_TYPES if c.emulated else QUANT_TYPES:
        g = os.path.join(tmp, "quant-%s.gguf" % t)
        c.sh([sys.executable, os.path.join(ROOT, "tools", "gguf", "quantize.py"), "from-hf", d,
              g, "--type", t], 240, check=True)
        cases.append((t, d, 48, g))
    return versus_reference(c, tmp, cases)


# ---- the other steps -----------------------------------------------------------

def unit_tests(c):
    """cuda_test (the backend against the reference) and cuda_fast_kernels_test (fast
    attention against float64), their cmocka counts added up. Emulated, the second alone:
    the suite runs both on cuda-emu (bazel test), so here only the step's logic is new."""
    fig, ok, logs = {"passed": 0, "failed": 0, "skipped": 0}, True, []
    names = ("cuda_fast_kernels_emu_test",) if c.emulated else ("cuda_test",
                                                                 "cuda_fast_kernels_test")
    for name in names:
        # cwd: the plugin is found as kernels/ beside the test, as in its runfiles.
        p = c.sh([c.path("tests", name)], 200, cwd=c.bin)
        out = p.stdout + p.stderr
        count = lambda what: int((re.findall(r"\[  %s  ?\] (\d+) test" % what, out) or ["0"])[-1])
        for k in fig:
            fig[k] += count(k.upper())
        ok = ok and p.returncode == 0 and count("FAILED") == 0 and count("SKIPPED") == 0 \
            and count("PASSED") > 0
        logs += [l for l in out.splitlines()
                 if re.search(r"FAIL|SKIP|rror|differ|cuda_test:|graphs:", l)]
    fig["log"] = "\n".join(logs)[-2500:]
    return ("ok" if ok else "FAIL"), fig


def sanitizer(c, tmp):
    """compute-sanitizer's memcheck and racecheck over a conformance script on
    a tiny Llama and a tiny Bamba (prefill chunks, decode, forks), in strict and in fast
    numerics."""
    if c.emulated:
        return "skipped", {"why": "compute-sanitizer needs a GPU; the emulator makes its own "
                           "checks in every step"}
    cs = find_tool("compute-sanitizer") or "compute-sanitizer"
    fig, ok = {}, True
    llama = make_model(c, tmp, "tiny")
    bamba = make_model(c, tmp, "tiny", flags=["--arch", "bamba"], tag="bamba-tiny")
    runs = (("llama", llama, "chunks.jsonl", []), ("bamba", bamba, "ssm_chunks.jsonl", []),
            ("llama_fast", llama, "chunks.jsonl", ["--numerics", "fast"]),
            ("bamba_fast", bamba, "ssm_chunks.jsonl", ["--numerics", "fast"]))
    for tool in ("memcheck", "racecheck"):
        for label, model, script, flags in runs:
            p = c.sh([cs, "--tool", tool, "--error-exitcode", "9", c.path("ref", "devio-ref"),
                      "--model", model, "--backend", c.backend, "--backend-path", c.path("kernels")]
                     + flags + [os.path.join(ROOT, "tests", "conformance", script)], 90)
            summary = re.findall(r"(?:ERROR|RACECHECK) SUMMARY: [^\n]*", p.stdout + p.stderr)
            fig["%s_%s" % (tool, label)] = summary[-1] if summary else "exit %d" % p.returncode
            if p.returncode != 0:
                ok = False
                fig["log_%s_%s" % (tool, label)] = (p.stdout + p.stderr)[-1200:]
    return ("ok" if ok else "FAIL"), fig


def hf_agreement(c, tmp, preset, n_tokens, with_ref):
    import numpy as np
    try:
        import torch
        import transformers
    except ImportError as e:
        return "skipped", {"why": "no PyTorch and transformers here (%s)" % e}
    dev = "cpu" if c.emulated else "cuda"

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model_dir = make_model(c, tmp, preset)
    tokens = prompt(model_dir, n_tokens)
    got = devio_logits(c, model_dir, tokens, c.backend, tmp)
    try:
        m = transformers.LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    except TypeError:
        m = transformers.LlamaForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    m = m.to(dev).eval()
    with torch.no_grad():
        want = m(torch.tensor([tokens], device=dev)).logits[0].double().cpu().numpy()
    del m
    if dev == "cuda":
        torch.cuda.empty_cache()
    err = float(np.max(np.abs(got.astype(np.float64) - want)) / np.max(np.abs(want)))
    fig = {"relative_error": "%.3e" % err, "tokens": n_tokens}
    ok = err < HF_LIMIT
    if with_ref:
        r = locate(devio_logits(c, model_dir, tokens, "ref", tmp), got)
        fig["reference_bits"] = r["bits"] if r["bits"] == "identical" else r
        ok = ok and r["bits"] == "identical"
    return ("ok" if ok else "FAIL"), fig


def bandwidth(c):
    if c.emulated:
        return "skipped", {"why": "no GPU: the emulator has no bandwidth of its own"}
    p = c.sh([c.path("kernels", "devio-gpu-bw")], 60, check=True)
    return "ok", json.loads(p.stdout.strip().splitlines()[-1])


def bench(c, tmp, read_gbs):
    if c.emulated:
        # The bench's figures parsed as on a GPU, on the tiny model: they time the
        # emulator, never a GPU, and no speed is asked of them.
        p = c.sh([c.path("tests", "bench", "devio-bench"), "--model", make_model(c, tmp, "tiny"),
                  "--backend", c.backend, "--backend-path", c.path("kernels"), "--batches", "1,8",
                  "--steps", "4", "--prefill", "16", "--overlap", "4"], 150, check=True)
        fig = {"output": p.stdout.strip()}
        for b, tps in re.findall(r"decode batch +(\d+): +([\d.]+) tokens/s", p.stdout):
            fig["emulated_decode_b%s_tok_s" % b] = float(tps)
        return ("ok" if len(fig) == 3 else "FAIL"), fig
    model_dir = make_model(c, tmp, "1b")
    cmd = [c.path("tests", "bench", "devio-bench"), "--model", model_dir,
           "--backend", c.backend, "--backend-path", c.path("kernels"),
           "--batches", "1,8,64", "--steps", "32", "--prefill", "512", "--overlap", "16"]
    if read_gbs:
        cmd += ["--device-bw", str(read_gbs)]
    p = c.sh(cmd, 150, check=True)
    fig = {"output": p.stdout.strip()}
    for b, tps, pct in re.findall(r"decode batch +(\d+): +([\d.]+) tokens/s.*= (\d+)% of", p.stdout):
        fig["decode_b%s_tok_s" % b] = float(tps)
        fig["decode_b%s_of_bandwidth_pct" % b] = int(pct)
    m = re.search(r"depth 1 ([\d.]+) tokens/s, depth 2 ([\d.]+) tokens/s = ([\d.]+)x", p.stdout)
    if m:
        fig["depth1_tok_s"], fig["depth2_tok_s"] = float(m.group(1)), float(m.group(2))
        fig["depth2_over_depth1"] = float(m.group(3))
    m = re.search(r"prefill (\d+) tokens: ([\d.]+) tokens/s", p.stdout)
    if m:
        fig["prefill_%s_tok_s" % m.group(1)] = float(m.group(2))
    # What strict decode is asked for: batch 1 at >= 30% of the read
    # bandwidth, and depth 2 measurably faster than depth 1. Reported, and a
    # miss fails the step so that it is seen.
    ok = fig.get("decode_b1_of_bandwidth_pct", 0) >= 30 and fig.get("depth2_over_depth1", 0) > 1.0
    return ("ok" if ok else "FAIL"), fig


def bench_graphs(c, tmp, strict):
    """Strict decode with CUDA Graphs off (DEVIO_CUDA_GRAPHS=0) beside the bench step's
    figures, which had them on: the ratio per batch size. Reported, not judged."""
    preset, extra = ("tiny", ["--batches", "1,8", "--steps", "4", "--prefill", "16"]) \
        if c.emulated else ("1b", ["--batches", "1,8,64", "--steps", "32", "--prefill", "16"])
    cmd = [c.path("tests", "bench", "devio-bench"), "--model", make_model(c, tmp, preset),
           "--backend", c.backend, "--backend-path", c.path("kernels")]
    p = c.sh(cmd + extra, 150, check=True, env=dict(os.environ, DEVIO_CUDA_GRAPHS="0"))
    fig = {"output": p.stdout.strip()}
    pre = "emulated_" if c.emulated else ""
    for b, tps in re.findall(r"decode batch +(\d+): +([\d.]+) tokens/s", p.stdout):
        fig["%sno_graphs_decode_b%s_tok_s" % (pre, b)] = float(tps)
        want = (strict or {}).get("%sdecode_b%s_tok_s" % (pre, b))
        if want:
            fig["%sgraphs_over_no_graphs_b%s" % (pre, b)] = round(want / float(tps), 3)
    return ("ok" if any("no_graphs_decode" in k for k in fig) else "FAIL"), fig


def find_tool(name):
    for d in [None, "/usr/local/cuda/bin"]:
        path = shutil.which(name) if d is None else os.path.join(d, name)
        if path and os.path.exists(path):
            return path
    return None


def kernel_profile(c, tmp):
    """ncu's time and DRAM bytes of each kernel over one decode step's worth
    of launches (batch 1 on the 1b model, well past the start), by kernel."""
    import csv
    import io

    ncu = None if c.emulated else find_tool("ncu")
    if not ncu:
        return "skipped", {"why": "ncu needs a GPU" if c.emulated else "no ncu on this machine"}
    model_dir = make_model(c, tmp, "1b")
    p = c.sh([ncu, "--clock-control", "none", "--launch-skip", "700", "--launch-count", "226",
              "--csv", "--page", "raw", "--metrics", "gpu__time_duration.sum,dram__bytes_read.sum",
              c.path("tests", "bench", "devio-bench"), "--model", model_dir, "--backend",
              c.backend, "--backend-path", c.path("kernels"), "--batches", "1", "--steps", "12",
              "--prefill", "1"], 150, check=True)
    rows = list(csv.reader(io.StringIO("\n".join(
        l for l in p.stdout.splitlines() if l.startswith('"')))))
    if len(rows) < 3:
        return "FAIL", {"error": "ncu printed no kernels", "log": p.stdout[-1200:]}
    head = rows[0]
    name_i, t_i = head.index("Kernel Name"), head.index("gpu__time_duration.sum")
    b_i = head.index("dram__bytes_read.sum")
    t_unit, b_unit = rows[1][t_i], rows[1][b_i]
    # ncu's unit row: "nsecond" or "ns" and so on, by version; an unknown
    # unit fails the step rather than print figures off by 1000.
    t_scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3,
               "ms": 1e3}.get(t_unit)
    b_scale = {"byte": 1, "B": 1, "Kbyte": 1e3, "KB": 1e3, "Mbyte": 1e6, "MB": 1e6,
               "Gbyte": 1e9, "GB": 1e9}.get(b_unit)
    if t_scale is None or b_scale is None:
        return "FAIL", {"error": "ncu units %r and %r unknown" % (t_unit, b_unit)}
    agg = {}
    for r in rows[2:]:
        name = re.sub(r"\(.*$", "", r[name_i]).replace("void ", "")
        us, b = float(r[t_i].replace(",", "")) * t_scale, float(r[b_i].replace(",", "")) * b_scale
        a = agg.setdefault(name, [0, 0.0, 0.0])
        a[0] += 1
        a[1] += us
        a[2] += b
    total = sum(a[1] for a in agg.values())
    lines = ["%-44s %5s %10s %6s %9s" % ("kernel", "calls", "us", "share", "GB/s")]
    for name, (n, us, b) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
        lines.append("%-44s %5d %10.1f %5.1f%% %9.1f" % (name[:44], n, us, 100 * us / total,
                                                        b / (us * 1e3) if us else 0))
    return "ok", {"kernel_us_per_step": round(total, 1), "ncu_units": "%s, %s" % (t_unit, b_unit),
                  "output": "\n".join(lines)}


# The suites --emulate runs: one of each kind the step judges (a plain one, a
# hybrid one, two that do not apply at depth 1).
EMULATED_SUITES = ("chunks", "ssm_chunks", "ssm_depth", "errors")


def hybrid_suites():
    names = []
    for line in open(os.path.join(ROOT, "tests", "conformance", "suites.txt")):
        line = line.strip()
        if line and not line.startswith("#") and line.split("|")[0].strip().startswith("ssm_"):
            names.append(line.split("|")[0].strip())
    return names


def conformance(c):
    """Every suite on both cuda targets (depth 2 and 1). A suite that does not
    apply at depth 1 (two tickets in flight, its own --max-depth) is counted
    apart; any other skip, or a hybrid suite missing, fails the step."""
    cmd = [sys.executable, os.path.join(ROOT, "tests", "conformance", "run.py"), "--bin",
           c.bin, "--gpu", "--gpu-backend", c.backend, "--jobs", "2" if c.emulated else "4"]
    if c.emulated:  # the suite runs them all on cuda-emu apart; here, the check's logic
        cmd += ["--suite", ",".join(EMULATED_SUITES)]
    p = c.sh(cmd, 400)
    m = re.search(r"conformance: (\d+) passed, (\d+) failed, (\d+) skipped, (\d+) not applicable",
                  p.stdout)
    fig = {"passed": int(m.group(1)) if m else 0, "failed": int(m.group(2)) if m else -1,
           "skipped": int(m.group(3)) if m else 0, "not_applicable": int(m.group(4)) if m else 0}
    want, b = hybrid_suites(), re.escape(c.backend)
    if c.emulated:
        want = [n for n in want if n in EMULATED_SUITES]
    targets = (c.backend, c.backend + "-depth1")
    ran = set(re.findall(r"^(?:ok  |FAIL) (ssm_\S+) on (%s-depth1|%s)(?=[:\s]|$)" % (b, b),
                         p.stdout, re.M))
    ran |= set(re.findall(r"^n/a  (ssm_\S+) on (%s-depth1)(?=[:\s]|$)" % b, p.stdout, re.M))
    hybrid_ok = re.findall(r"^ok   (ssm_\S+) on (%s|%s-depth1)$" % (b, b), p.stdout, re.M)
    fig["hybrid_suites"], fig["hybrid_passed"] = len(want), len(hybrid_ok)
    missing = sorted({(n, t) for n in want for t in targets} - ran)
    ok = p.returncode == 0 and fig["skipped"] == 0 and fig["failed"] == 0 and want and not missing
    if not ok:
        fig["log"] = "\n".join(l for l in p.stdout.splitlines()
                               if l.startswith(("FAIL", "skip", "conformance:")))[-2500:]
        fig["log"] += p.stderr[-500:]
        if missing:
            fig["log"] += "\nnot run: %s" % " ".join("%s@%s" % m for m in missing[:20])
    return ("ok" if ok else "FAIL"), fig


def conformance_fast(c):
    """Every suite in fast numerics (cuBLASLt on a GPU), judged by tolerance against the
    reference (tests/conformance/tolerance.py): logits within 1e-2, every other field exact."""
    cmd = [sys.executable, os.path.join(ROOT, "tests", "conformance", "run.py"), "--bin",
           c.bin, "--gpu", "--gpu-backend", c.backend, "--fast", "--jobs",
           "2" if c.emulated else "4"]
    if c.emulated:
        cmd += ["--suite", ",".join(EMULATED_SUITES)]
    p = c.sh(cmd, 300)
    m = re.search(r"conformance: (\d+) passed, (\d+) failed, (\d+) skipped", p.stdout)
    t = re.search(r"fast numerics: (.*)", p.stdout)
    fig = {"passed": int(m.group(1)) if m else 0, "failed": int(m.group(2)) if m else -1,
           "skipped": int(m.group(3)) if m else 0, "tally": t.group(1) if t else ""}
    ok = p.returncode == 0 and fig["failed"] == 0 and fig["skipped"] == 0 and fig["passed"] > 0
    if not ok:
        fig["log"] = "\n".join(l for l in p.stdout.splitlines()
                               if l.startswith(("FAIL", "skip", "conformance:")))[-2500:]
        fig["log"] += p.stderr[-500:]
    return ("ok" if ok else "FAIL"), fig


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--deadline", type=float, default=450,
                    help="seconds for the whole check, shared out between the steps")
    ap.add_argument("--emulate", action="store_true",
                    help="check cuda-emu, the CUDA backend on the SIMT emulator, in place of a "
                         "GPU: steps that need hardware are skipped, timings are the emulator's")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    c = Check(os.path.abspath(a.bin), os.path.abspath(a.out), a.deadline,
              "cuda-emu" if a.emulate else "cuda", a.emulate)
    signal.signal(signal.SIGTERM, c.interrupted)
    signal.signal(signal.SIGINT, c.interrupted)
    try:
        c.env["gpu"] = ("no GPU: the SIMT emulator (cuda-emu); every timing is the emulator's"
                        if c.emulated else
                        c.sh(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                              "--format=csv,noheader"], 30).stdout.strip())
    except Exception as e:
        c.env["gpu"] = "nvidia-smi: %s" % e
    c.write()
    with tempfile.TemporaryDirectory() as tmp:
        c.step("tiny Llama and Bamba vs the reference, bit for bit", lambda: first_bits(c, tmp))
        c.step("CUDA unit tests (cuda_test, cuda_fast_kernels_test)", lambda: unit_tests(c))
        c.step("compute-sanitizer memcheck and racecheck, tiny", lambda: sanitizer(c, tmp))
        bw = c.step("GPU read bandwidth (devio-gpu-bw)", lambda: bandwidth(c))
        strict = c.step("decode and prefill on %s (devio-bench)" % ("tiny" if c.emulated else "1b"),
                        lambda: bench(c, tmp, bw.get("read_gbs")))
        gpu_check_fast.steps(c, tmp, make_model, bw, strict)
        c.step("decode without CUDA Graphs (DEVIO_CUDA_GRAPHS=0), against the bench step",
               lambda: bench_graphs(c, tmp, strict))
        c.step("kernel times of a decode step on 1b (ncu)", lambda: kernel_profile(c, tmp))
        hf = (("tiny", 48, True), ("small", 16, False)) if c.emulated else (
            ("tiny", 48, False), ("small", 48, False), ("1b", 16, True))
        for preset, n, with_ref in hf:
            c.step("logits vs transformers, %s" % preset,
                   lambda: hf_agreement(c, tmp, preset, n, with_ref))
        c.step("hybrid logits (Bamba, Mamba2) vs the reference, bit for bit",
               lambda: hybrid_bits(c, tmp))
        c.step("model features (window, Granite, Qwen3, yarn, llama3) vs the reference, "
               "bit for bit", lambda: feature_bits(c, tmp))
        c.step("quantized GGUF weights (Q8_0 ... Q6_K, Q4_K_M) vs the reference, bit for bit",
               lambda: quant_bits(c, tmp))
        c.step("conformance suites on --backend %s, depth 2 and 1" % c.backend,
               lambda: conformance(c))
        c.step("conformance suites on --backend %s in fast numerics, by tolerance" % c.backend,
               lambda: conformance_fast(c))
    print(markdown(c))
    print("gpu-check: %d steps, %d failed" % (len(c.steps), c.failed()))
    sys.exit(1 if c.failed() else 0)


if __name__ == "__main__":
    main()
