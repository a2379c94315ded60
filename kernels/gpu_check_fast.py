"""gpu_check_fast.py - the fast-numerics section of the GPU check (kernels/gpu_check.py runs it
through steps()): --numerics fast held to the strict reference by tolerance on tiny, small, 1b and
SmolLM2, the GEMM rate of 1b's prefill projections, the 1b bench in fast numerics judged against
the roofline measured in the same run, and PyTorch side by side on the same weights.

Targets (a miss fails its step, so that it is seen; under --emulate nothing is timed against
one, the emulator's speed being no GPU's):
- decode batch 1 on 1b: its weight stream at >= 80% of the copy bandwidth devio-gpu-bw measured;
- prefill 2048 on 1b: >= 50% of the rate at which devio-gpu-gemm ran the same projections;
- 8 LoRA adapters against none: <= 1.3x the time;
- logits within 1e-2 relative of strict at every position and argmaxes agreeing at >= 99%.
"""
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REL_TOL = 1e-2
AGREE = 0.99
PROMPT = 16
SMOLLM2 = "SmolLM2-135M-Instruct.Q4_1.gguf"


def decode_logits(c, model, tokens, backend, fast, tmp):
    """A PROMPT-token prefill then one step per further token, the logits of each step's last
    position (each handle released once read): float32 [len(tokens) - PROMPT + 1, vocab]."""
    import numpy as np

    script = os.path.join(tmp, "decode.jsonl")
    with open(script, "w") as f:
        f.write('{"op":"create","as":"s"}\n')
        for i, chunk in enumerate([tokens[:PROMPT]] + [[t] for t in tokens[PROMPT:]]):
            f.write(json.dumps({"op": "step", "full": True, "as": "r%d" % i, "plan": {"rows": [
                {"seq": "$s", "tokens": chunk, "logits": "last"}]}}) + "\n")
            f.write(json.dumps({"op": "apply", "effect": {"kind": "release",
                                                          "logits": "$r%d.rows[0].logits" % i}})
                    + "\n")
    cmd = [c.path("ref", "devio-ref"), "--model", model, "--max-seq-len",
           str(len(tokens) + 16), "--backend", backend, "--backend-path", c.path("kernels")]
    p = c.sh(cmd + (["--numerics", "fast"] if fast else []) + [script], 400, check=True)
    rows = []
    for line in p.stdout.splitlines():
        r = json.loads(line)
        if not r.get("ok"):
            raise RuntimeError("devio-ref on %s: %s" % (backend, line[:400]))
        if r["op"] != "step":
            continue
        lg = r["result"]["rows"][0]["logits"]
        rows.append(np.array(lg["values"], dtype=np.float32).reshape(-1))
    return np.stack(rows)


def tolerance(strict, fast):
    """The figures of fast against strict: worst relative error (2-norm per position), argmax
    agreement, and whether they hold."""
    import numpy as np

    d = fast.astype(np.float64) - strict
    rel = np.linalg.norm(d, axis=1) / np.maximum(np.linalg.norm(strict, axis=1), 1e-30)
    agree = float(np.mean(np.argmax(strict, axis=1) == np.argmax(fast, axis=1)))
    return {"positions": int(strict.shape[0]), "max_rel": "%.2e" % float(rel.max()),
            "median_rel": "%.2e" % float(np.median(rel)), "argmax_agree": round(agree, 4),
            "ok": bool(rel.max() <= REL_TOL and agree >= AGREE)}


def smollm2_file():
    """The SmolLM2 GGUF where this machine has one: $DEVIO_SMOLLM2, or .devio/models/."""
    for p in (os.environ.get("DEVIO_SMOLLM2", ""), os.path.join(ROOT, ".devio", "models", SMOLLM2)):
        if p and os.path.isfile(p):
            return p
    return None


def agreement(c, tmp, make_model):
    """--numerics fast against the strict reference, decode positions teacher-forced with one
    fixed token sequence on both sides. On a GPU: 512 positions of tiny, small and SmolLM2 and
    128 of 1b (the reference's own 1b decode bounds it); emulated (the logic, at the emulator's
    pace; the suite runs the long checks), 32 of tiny, 16 of small and 1 of SmolLM2 (its 16-token
    prefill through the widened weights and one decode step through the GEMV, some 3 s of
    emulator each; tests/python/fast_numerics_check.py --model fetch holds 48 to the limits)."""
    cases = [("tiny", make_model(c, tmp, "tiny")), ("small", make_model(c, tmp, "small"))]
    if not c.emulated:
        cases.append(("1b", make_model(c, tmp, "1b")))
    fig, ok = {}, True
    smol = smollm2_file()
    if smol:
        cases.append(("smollm2", smol))
    else:
        fig["smollm2"] = "no file here (set DEVIO_SMOLLM2; 98 MB, past what one call carries)"
    for label, model in cases:
        n = {"tiny": 32, "small": 16, "smollm2": 1}[label] if c.emulated else \
            (128 if label == "1b" else 512)
        vocab = 49152 if label == "smollm2" else \
            json.load(open(os.path.join(model, "config.json")))["vocab_size"]
        tokens = [(i * 7919 + 13) % vocab for i in range(PROMPT + n)]
        r = tolerance(decode_logits(c, model, tokens, "ref", False, tmp),
                      decode_logits(c, model, tokens, c.backend, True, tmp))
        held = r.pop("ok")
        ok = ok and held
        fig[label] = r
    return ("ok" if ok else "FAIL"), fig


def shapes(model_dir):
    """The GEMMs of one layer of a Llama directory under fast numerics, as M:N: q, k and v
    stacked, o, gate and up stacked, down."""
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    d, f = cfg["hidden_size"], cfg["intermediate_size"]
    hd = cfg.get("head_dim") or d // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * hd, cfg.get("num_key_value_heads",
                                                    cfg["num_attention_heads"]) * hd
    return cfg["num_hidden_layers"], ["%d:%d" % (q + 2 * kv, d), "%d:%d" % (d, q),
                                      "%d:%d" % (2 * f, d), "%d:%d" % (d, f)]


def gemm_rate(c, tmp, make_model, tokens):
    if c.emulated:
        return "skipped", {"why": "no GPU: the GEMM rate is cuBLASLt's on hardware"}
    layers, mn = shapes(make_model(c, tmp, "1b"))
    p = c.sh([c.path("kernels", "devio-gpu-gemm"), str(tokens), str(layers)] + mn, 60, check=True)
    fig = json.loads(p.stdout.strip().splitlines()[-1])
    fig["shapes"] = " ".join(mn)
    return "ok", fig


def bench(c, tmp, make_model, bw, gemm, strict):
    """Decode and prefill in fast numerics beside the strict figures of the bench step; the GEMV
    against the GEMM; 8 adapters against none; depth 2 against depth 1."""
    long_prefill = 2048
    preset, extra = ("tiny", ["--batches", "1,8", "--steps", "4", "--prefill", "16",
                              "--overlap", "4"]) if c.emulated else \
        ("1b", ["--batches", "1,8,64", "--steps", "32", "--prefill", str(long_prefill),
                "--overlap", "16"])
    cmd = [c.path("tests", "bench", "devio-bench"), "--model", make_model(c, tmp, preset),
           "--backend", c.backend, "--backend-path", c.path("kernels"), "--numerics", "fast"]
    copy_gbs = (bw or {}).get("copy_gbs")
    if copy_gbs and not c.emulated:
        cmd += ["--device-bw", str(copy_gbs)]
    p = c.sh(cmd + extra, 200, check=True)
    fig = {"output": p.stdout.strip()}
    pre = "emulated_fast_" if c.emulated else "fast_"  # the emulator's timings say so
    for b, tps, pct in re.findall(r"decode batch +(\d+): +([\d.]+) tokens/s.*= (\d+)% of", p.stdout):
        fig["%sdecode_b%s_tok_s" % (pre, b)] = float(tps)
        if not c.emulated and copy_gbs:
            fig["fast_decode_b%s_of_copy_bandwidth_pct" % b] = int(pct)
        want = (strict or {}).get("decode_b%s_tok_s" % b) or \
            (strict or {}).get("emulated_decode_b%s_tok_s" % b)
        if want:
            fig["%sover_strict_b%s" % (pre, b)] = round(float(tps) / want, 3)
    m = re.search(r"depth 1 ([\d.]+) tokens/s, depth 2 ([\d.]+) tokens/s = ([\d.]+)x", p.stdout)
    if m:
        fig["%sdepth2_over_depth1" % pre] = float(m.group(3))
    m = re.search(r"prefill (\d+) tokens: ([\d.]+) tokens/s", p.stdout)
    if m:
        fig["%sprefill_%s_tok_s" % (pre, m.group(1))] = float(m.group(2))
        if not c.emulated and (gemm or {}).get("ms"):
            at_gemm = int(m.group(1)) / (gemm["ms"] / 1e3)
            fig["fast_prefill_of_gemm_rate_pct"] = round(100 * float(m.group(2)) / at_gemm, 1)
    # The GEMV against the GEMM on small batches, each forced (DEVIO_CUDA_GEMV); the run
    # above used what the backend picked by timing both at start.
    small = ["--batches", "1,8", "--steps", "4" if c.emulated else "32", "--prefill", "16"]
    for reach in ("0", "8"):
        q = c.sh(cmd + small, 120, check=True, env=dict(os.environ, DEVIO_CUDA_GEMV=reach))
        for b, tps in re.findall(r"decode batch +(\d+): +([\d.]+) tokens/s", q.stdout):
            fig["%s%s_decode_b%s_tok_s" % (pre, "gemv" if reach == "8" else "gemm", b)] = float(tps)
    for b in ("1", "8"):
        v, g = fig.get("%sgemv_decode_b%s_tok_s" % (pre, b)), fig.get("%sgemm_decode_b%s_tok_s" % (pre, b))
        if v and g:
            fig["%sgemv_over_gemm_b%s" % (pre, b)] = round(v / g, 3)
    # 8 LoRA adapters (rank 16, every projection) against none, rows spread over them.
    q = c.sh(cmd + ["--batches", "8" if c.emulated else "8,64", "--steps",
                    "4" if c.emulated else "32", "--prefill", "16", "--adapters", "8"], 150,
             check=True)
    for b, tps, cost in re.findall(
            r"decode batch +(\d+), 8 adapters: +([\d.]+) tokens/s = ([\d.]+)x", q.stdout):
        fig["%sadapters8_decode_b%s_tok_s" % (pre, b)] = float(tps)
        fig["%sadapters8_time_over_none_b%s" % (pre, b)] = float(cost)
    ok = "(fast numerics)" in p.stdout and any("decode_b" in k for k in fig)
    if not c.emulated:
        missed = [k for k, v in (("decode b1 >= 80% of copy bandwidth",
                                  fig.get("fast_decode_b1_of_copy_bandwidth_pct", 0) >= 80),
                                 ("prefill >= 50% of the GEMM rate",
                                  fig.get("fast_prefill_of_gemm_rate_pct", 0) >= 50),
                                 ("8 adapters <= 1.3x none",
                                  0 < fig.get("fast_adapters8_time_over_none_b8", 9) <= 1.3))
                  if not v]
        if missed:
            fig["targets_missed"] = "; ".join(missed)
        ok = ok and not missed
    return ("ok" if ok else "FAIL"), fig


def torch_side(c, tmp, make_model, fast):
    """PyTorch (transformers, bf16) on 1b beside devio's fast figures of the step before."""
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        return "skipped", {"why": "no PyTorch and transformers here (%s)" % e}
    if c.emulated:
        return "skipped", {"why": "no GPU: PyTorch is timed on hardware only"}
    p = c.sh([sys.executable, os.path.join(ROOT, "tools", "bench", "torch_side.py"), "--model",
              make_model(c, tmp, "1b"), "--prefill", "2048", "--decode", "64"], 240, check=True)
    fig = json.loads(p.stdout.strip().splitlines()[-1])
    fig = {"torch_" + k if not k.startswith(("torch", "transformers")) else k: v
           for k, v in fig.items()}
    mine = {"decode_b1": (fast or {}).get("fast_decode_b1_tok_s"),
            "prefill": (fast or {}).get("fast_prefill_2048_tok_s")}
    theirs = {"decode_b1": fig.get("torch_decode_b1_static_tok_s") or
              fig.get("torch_decode_b1_tok_s"), "prefill": fig.get("torch_prefill_tok_s")}
    for k in mine:
        if mine[k] and theirs[k]:
            fig["devio_over_torch_%s" % k] = round(mine[k] / theirs[k], 3)
    return "ok", fig


def steps(c, tmp, make_model, bw, strict):
    """The fast section's steps, in the check's order; returns the fast bench's figures."""
    gemm = c.step("GEMM rate of 1b's prefill projections, 2048 tokens (devio-gpu-gemm, cuBLASLt)",
                  lambda: gemm_rate(c, tmp, make_model, 2048))
    fast = c.step("decode and prefill on %s in fast numerics (devio-bench --numerics fast)" %
                  ("tiny" if c.emulated else "1b"),
                  lambda: bench(c, tmp, make_model, bw, gemm, strict))
    c.step("fast numerics vs the strict reference by tolerance (tiny, small, 1b, SmolLM2)",
           lambda: agreement(c, tmp, make_model))
    c.step("side by side with PyTorch on 1b (transformers bf16: decode batch 1, prefill 2048)",
           lambda: torch_side(c, tmp, make_model, fast))
    return fast
