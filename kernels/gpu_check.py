#!/usr/bin/env python3
"""gpu_check.py - the body of kernels/gpu-check.sh (see there): checks and
figures of the CUDA backend on a machine with an NVIDIA GPU.

Each step is bounded in time and recorded as ok, FAIL or skipped with its
figures; the report goes to OUT/gpu-check.json and OUT/gpu-check.md. Exit
status 0 only when no step failed. It asserts what the GPU check promises:
the CUDA unit tests pass with none skipped, every conformance suite is
byte-identical on --backend cuda (the hybrid ssm_* suites on the Bamba and
Mamba2 models of tests/conformance/models.txt included: each must run on
both cuda targets, none skipped), logits agree with Hugging Face
transformers + PyTorch within 1e-4 relative, the 1b model's, the hybrid
models' and the model features' (Mistral's sliding window, Granite's
multipliers, Qwen3's q_norm and k_norm, yarn and llama3 RoPE scaling: numspec
rules 1, 4, 4a, 6, 7, 8) logits are the reference's bit for bit; decode speed
is measured and compared with the GPU's read bandwidth.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HF_LIMIT = 1e-4


class Report:
    def __init__(self):
        self.steps = []

    def add(self, name, status, seconds, **figures):
        self.steps.append(dict(name=name, status=status, seconds=round(seconds, 1), **figures))
        detail = ", ".join("%s %s" % (k, v) for k, v in figures.items())
        print("%-5s %s (%.1fs) %s" % (status, name, seconds, detail), flush=True)

    @property
    def failed(self):
        return sum(s["status"] == "FAIL" for s in self.steps)


def sh(cmd, timeout, cwd=None, check=False):
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise RuntimeError("%s exited %d: %s" % (cmd[0], p.returncode, p.stderr[-800:]))
    return p


def step(report, name, fn):
    t0 = time.time()
    try:
        status, figures = fn()
    except Exception as e:  # a crash, a timeout or a missing tool fails the step, not the run
        status, figures = "FAIL", {"error": str(e)[-600:]}
    report.add(name, status, time.time() - t0, **figures)
    return figures


def unit_tests(bin_dir):
    p = sh([os.path.join(bin_dir, "tests", "cuda_test")], 240, cwd=bin_dir)
    out = p.stdout + p.stderr
    count = lambda what: int((re.findall(r"\[  %s  ?\] (\d+) test" % what, out) or ["0"])[-1])
    passed, failed, skipped = count("PASSED"), count("FAILED"), count("SKIPPED")
    ok = p.returncode == 0 and failed == 0 and skipped == 0 and passed > 0
    fig = {"passed": passed, "failed": failed, "skipped": skipped}
    if not ok:
        fig["log"] = out[-1500:]
    return ("ok" if ok else "FAIL"), fig


def hybrid_suites():
    """The hybrid (ssm_*) suites tests/conformance/suites.txt lists; run.py --gpu
    runs every listed suite, on the models models.txt names, on both cuda targets."""
    names = []
    for line in open(os.path.join(ROOT, "tests", "conformance", "suites.txt")):
        line = line.strip()
        if line and not line.startswith("#") and line.split("|")[0].strip().startswith("ssm_"):
            names.append(line.split("|")[0].strip())
    return names


def conformance(bin_dir):
    p = sh([sys.executable, os.path.join(ROOT, "tests", "conformance", "run.py"), "--bin",
            bin_dir, "--gpu"], 360)
    m = re.search(r"conformance: (\d+) passed, (\d+) failed(?:, (\d+) skipped)?", p.stdout)
    fig = {"passed": int(m.group(1)) if m else 0, "failed": int(m.group(2)) if m else -1,
           "skipped": int(m.group(3) or 0) if m else 0}
    # A hybrid suite skipped on cuda (the backend refused to keep recurrent
    # state) or missing fails the step: each must pass on cuda and cuda-depth1.
    want = hybrid_suites()
    hybrid = re.findall(r"^ok   (ssm_\S+) on (cuda|cuda-depth1)$", p.stdout, re.M)
    fig["hybrid_suites"] = len(want)
    fig["hybrid_passed"] = len(hybrid)
    ok = (p.returncode == 0 and fig["skipped"] == 0 and len(want) > 0
          and sorted(set(hybrid)) == sorted((n, t) for n in want for t in ("cuda", "cuda-depth1")))
    if not ok:
        fig["log"] = "\n".join(l for l in p.stdout.splitlines()
                               if l.startswith(("FAIL", "skip", "conformance:")))[-1500:]
        fig["log"] += p.stderr[-500:]
        if not want:
            fig["log"] += "\ntests/conformance/suites.txt lists no ssm_* suite"
    return ("ok" if ok else "FAIL"), fig


def make_model(bin_dir, tmp, preset, seed=5, arch="llama"):
    d = os.path.join(tmp, preset if arch == "llama" else "%s-%s" % (arch, preset))
    if not os.path.exists(os.path.join(d, "config.json")):
        extra = [] if arch == "llama" else ["--arch", arch]
        sh([os.path.join(bin_dir, "tools", "mkmodel", "devio-mkmodel"), "--preset", preset,
            "--seed", str(seed), "--out", d] + extra, 240, check=True)
    return d


def devio_logits(bin_dir, model, tokens, backend, tmp):
    script = os.path.join(tmp, "logits.jsonl")
    with open(script, "w") as f:
        f.write('{"op":"create","as":"s"}\n')
        f.write(json.dumps({"op": "step", "full": True, "plan": {"rows": [
            {"seq": "$s", "tokens": tokens, "logits": "all"}]}}) + "\n")
    p = sh([os.path.join(bin_dir, "ref", "devio-ref"), "--model", model, "--backend", backend,
            "--backend-path", os.path.join(bin_dir, "kernels"), script], 240, check=True)
    lg = json.loads(p.stdout.splitlines()[1])["result"]["rows"][0]["logits"]
    return lg["values"], lg["shape"]


def hf_agreement(bin_dir, tmp, preset, n_tokens, with_ref):
    import numpy as np
    import torch
    import transformers

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model_dir = make_model(bin_dir, tmp, preset)
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    tokens = [(i * 7919 + 13) % cfg["vocab_size"] for i in range(n_tokens)]
    values, shape = devio_logits(bin_dir, model_dir, tokens, "cuda", tmp)
    got = np.array(values, dtype=np.float64).reshape(shape)
    try:
        m = transformers.LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    except TypeError:
        m = transformers.LlamaForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    m = m.cuda().eval()
    with torch.no_grad():
        want = m(torch.tensor([tokens], device="cuda")).logits[0].double().cpu().numpy()
    del m
    torch.cuda.empty_cache()
    err = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
    fig = {"relative_error": "%.3e" % err, "tokens": n_tokens}
    ok = err < HF_LIMIT
    if with_ref:
        ref_values, _ = devio_logits(bin_dir, model_dir, tokens, "ref", tmp)
        a = np.array(ref_values, dtype=np.float32)
        b = np.array(values, dtype=np.float32)
        same = a.shape == b.shape and bool(np.all(a.view(np.uint32) == b.view(np.uint32)))
        fig["reference_bits"] = "identical" if same else "DIFFER"
        ok = ok and same
    return ("ok" if ok else "FAIL"), fig



def cuda_matches_ref(bin_dir, tmp, model_dir, n):
    """Every position's logits of an n-token prompt, cuda against the
    reference: True when they are the same bits."""
    import numpy as np

    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    tokens = [(i * 7919 + 13) % cfg["vocab_size"] for i in range(n)]
    got, _ = devio_logits(bin_dir, model_dir, tokens, "cuda", tmp)
    want, _ = devio_logits(bin_dir, model_dir, tokens, "ref", tmp)
    a, b = np.array(want, dtype=np.float32), np.array(got, dtype=np.float32)
    return a.shape == b.shape and bool(np.all(a.view(np.uint32) == b.view(np.uint32)))

def hybrid_reference_bits(bin_dir, tmp):
    """Every position's logits of a prompt on the hybrid models (Bamba: mixers
    and attention with RoPE on half a head; Mamba2: mixers only, no MLP), cuda
    against the reference, bit for bit."""
    fig, ok = {}, True
    for arch, preset, n in (("bamba", "tiny", 64), ("mamba2", "tiny", 64), ("bamba", "small", 24),
                            ("mamba2", "small", 24)):
        same = cuda_matches_ref(bin_dir, tmp, make_model(bin_dir, tmp, preset, arch=arch), n)
        fig["%s_%s" % (arch, preset)] = "identical" if same else "DIFFER"
        ok = ok and same
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


def feature_model(bin_dir, tmp, preset, name, flags):
    d = os.path.join(tmp, "%s-feature-%s" % (name, preset))
    if not os.path.exists(os.path.join(d, "config.json")):
        sh([os.path.join(bin_dir, "tools", "mkmodel", "devio-mkmodel"), "--preset", preset,
            "--seed", "5", "--out", d] + flags, 240, check=True)
    return d


def feature_reference_bits(bin_dir, tmp):
    """Every position's logits of a prompt on each model feature's tiny and
    small model, cuda against the reference, bit for bit. (tests/cuda_test
    runs the same features through chunked prefill, decode, batches, forks
    and LoRA.)"""
    fig, ok = {}, True
    for name, flags in FEATURES:
        for preset, n in (("tiny", 64), ("small", 24)):
            model_dir = feature_model(bin_dir, tmp, preset, name, flags)
            same = cuda_matches_ref(bin_dir, tmp, model_dir, n)
            fig["%s_%s" % (name, preset)] = "identical" if same else "DIFFER"
            ok = ok and same
    return ("ok" if ok else "FAIL"), fig


def bandwidth(bin_dir):
    p = sh([os.path.join(bin_dir, "kernels", "devio-gpu-bw")], 120, check=True)
    return "ok", json.loads(p.stdout.strip().splitlines()[-1])


def bench(bin_dir, tmp, read_gbs):
    model_dir = make_model(bin_dir, tmp, "1b")
    cmd = [os.path.join(bin_dir, "tests", "bench", "devio-bench"), "--model", model_dir,
           "--backend", "cuda", "--backend-path", os.path.join(bin_dir, "kernels"),
           "--batches", "1,8,64", "--steps", "32", "--prefill", "512", "--overlap", "16"]
    if read_gbs:
        cmd += ["--device-bw", str(read_gbs)]
    p = sh(cmd, 300, check=True)
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
    # What the issue asks of strict decode: batch 1 at >= 30% of the read
    # bandwidth, and depth 2 measurably faster than depth 1. Reported, and a
    # miss fails the step so that it is seen.
    ok = fig.get("decode_b1_of_bandwidth_pct", 0) >= 30 and fig.get("depth2_over_depth1", 0) > 1.0
    return ("ok" if ok else "FAIL"), fig


def markdown(report, env):
    lines = ["# devio GPU check", "", "%s; %s" % (env.get("gpu", "?"), env.get("when", "")), "",
             "| step | result | seconds | figures |", "|---|---|---|---|"]
    for s in report.steps:
        figs = ", ".join("%s %s" % (k, v) for k, v in s.items()
                         if k not in ("name", "status", "seconds", "output", "log"))
        lines.append("| %s | %s | %s | %s |" % (s["name"], s["status"], s["seconds"], figs))
    for s in report.steps:
        if s.get("output"):
            lines += ["", "```", s["output"], "```"]
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    bin_dir = os.path.abspath(a.bin)
    report = Report()
    env = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    try:
        env["gpu"] = sh(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                         "--format=csv,noheader"], 30).stdout.strip()
    except Exception as e:
        env["gpu"] = "nvidia-smi: %s" % e
    with tempfile.TemporaryDirectory() as tmp:
        step(report, "CUDA unit tests (tests/cuda_test)", lambda: unit_tests(bin_dir))
        step(report, "conformance suites on --backend cuda", lambda: conformance(bin_dir))
        for preset, n, with_ref in (("tiny", 48, False), ("small", 48, False), ("1b", 16, True)):
            step(report, "logits vs transformers, %s" % preset,
                 lambda: hf_agreement(bin_dir, tmp, preset, n, with_ref))
        step(report, "hybrid logits (Bamba, Mamba2) vs the reference, bit for bit",
             lambda: hybrid_reference_bits(bin_dir, tmp))
        step(report, "model features (window, Granite, Qwen3, yarn, llama3) vs the reference, "
             "bit for bit", lambda: feature_reference_bits(bin_dir, tmp))
        bw = step(report, "GPU read bandwidth (devio-gpu-bw)", lambda: bandwidth(bin_dir))
        step(report, "decode and prefill on 1b (devio-bench)",
             lambda: bench(bin_dir, tmp, bw.get("read_gbs")))
    md = markdown(report, env)
    with open(os.path.join(a.out, "gpu-check.json"), "w") as f:
        json.dump({"env": env, "steps": report.steps}, f, indent=1)
    with open(os.path.join(a.out, "gpu-check.md"), "w") as f:
        f.write(md)
    print(md)
    print("gpu-check: %d steps, %d failed" % (len(report.steps), report.failed))
    sys.exit(1 if report.failed else 0)


if __name__ == "__main__":
    main()
