#!/usr/bin/env python3
"""hf_check.py - devio's reference against an independent Llama forward pass.

Writes models with devio-mkmodel, runs a prompt through devio-ref asking for
every position's logits, and recomputes the same logits with numpy in float64
following Hugging Face's LlamaForCausalLM definition (RMSNorm, rotate_half
RoPE, GQA, SiLU-gated MLP, tied or separate lm_head). Prints the relative
error max|devio - numpy| / max|numpy| per model and fails above 1e-4.

usage: hf_check.py --bin DIR [--presets tiny,small] [--tokens N]
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

LIMIT = 1e-4


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        raw = data[a:b]
        if t["dtype"] == "F32":
            v = np.frombuffer(raw, dtype="<f4").astype(np.float64)
        elif t["dtype"] == "F16":
            v = np.frombuffer(raw, dtype="<f2").astype(np.float64)
        elif t["dtype"] == "BF16":
            u = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            v = u.view(np.float32).astype(np.float64)
        else:
            raise ValueError(f"{name}: dtype {t['dtype']}")
        out[name] = v.reshape(t["shape"])
    return out


def load(model_dir):
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    idx = os.path.join(model_dir, "model.safetensors.index.json")
    w = {}
    if os.path.exists(idx):
        for f in sorted(set(json.load(open(idx))["weight_map"].values())):
            w.update(read_safetensors(os.path.join(model_dir, f)))
    else:
        w = read_safetensors(os.path.join(model_dir, "model.safetensors"))
    return cfg, w


def rmsnorm(x, w, eps):
    return w * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps))


def forward(cfg, w, tokens):
    d = cfg["hidden_size"]
    nh = cfg["num_attention_heads"]
    nkv = cfg.get("num_key_value_heads", nh)
    hd = cfg.get("head_dim") or d // nh
    eps = cfg.get("rms_norm_eps", 1e-6)
    theta = cfg.get("rope_theta", 10000.0)
    T = len(tokens)
    x = w["model.embed_tokens.weight"][tokens]
    inv = 1.0 / (theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
    ang = np.outer(np.arange(T, dtype=np.float64), inv)
    cos = np.concatenate([np.cos(ang), np.cos(ang)], axis=-1)
    sin = np.concatenate([np.sin(ang), np.sin(ang)], axis=-1)

    def rope(v):  # [T, heads, hd]
        half = hd // 2
        rot = np.concatenate([-v[..., half:], v[..., :half]], axis=-1)
        return v * cos[:, None, :] + rot * sin[:, None, :]

    mask = np.triu(np.full((T, T), -np.inf), 1)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rmsnorm(x, w[p + "input_layernorm.weight"], eps)
        q = h @ w[p + "self_attn.q_proj.weight"].T
        k = h @ w[p + "self_attn.k_proj.weight"].T
        v = h @ w[p + "self_attn.v_proj.weight"].T
        for name, t in (("q", None), ("k", None), ("v", None)):
            b = w.get(p + f"self_attn.{name}_proj.bias")
            if b is not None:
                if name == "q":
                    q = q + b
                elif name == "k":
                    k = k + b
                else:
                    v = v + b
        q = rope(q.reshape(T, nh, hd))
        k = rope(k.reshape(T, nkv, hd))
        v = v.reshape(T, nkv, hd)
        rep = nh // nkv
        k = np.repeat(k, rep, axis=1)
        v = np.repeat(v, rep, axis=1)
        s = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd) + mask
        s = np.exp(s - s.max(axis=-1, keepdims=True))
        s = s / s.sum(axis=-1, keepdims=True)
        o = np.einsum("hts,shd->thd", s, v).reshape(T, nh * hd)
        x = x + o @ w[p + "self_attn.o_proj.weight"].T
        h = rmsnorm(x, w[p + "post_attention_layernorm.weight"], eps)
        g = h @ w[p + "mlp.gate_proj.weight"].T
        u = h @ w[p + "mlp.up_proj.weight"].T
        x = x + ((g / (1.0 + np.exp(-g))) * u) @ w[p + "mlp.down_proj.weight"].T
    x = rmsnorm(x, w["model.norm.weight"], eps)
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    return x @ head.T


def merge_adapter(cfg, w, adir):
    """W + s * B A for every adapted projection (PEFT's merge), in float64."""
    acfg = json.load(open(os.path.join(adir, "adapter_config.json")))
    a = read_safetensors(os.path.join(adir, "adapter_model.safetensors"))
    r = acfg["r"]
    alpha = float(acfg.get("lora_alpha", 8))
    scale = alpha / np.sqrt(r) if acfg.get("use_rslora") else alpha / r
    w = dict(w)
    for name in list(a):
        if ".lora_A." not in name:
            continue
        base = name.replace("base_model.model.", "").replace(".lora_A.weight", ".weight")
        b = a[name.replace(".lora_A.", ".lora_B.")]
        w[base] = w[base] + scale * (b @ a[name])
    return w


def run_adapter(bin_dir, preset, extra, n_tokens, tmp):
    """Logits with a LoRA adapter against the base weights merged with it."""
    mdir = os.path.join(tmp, preset + "-lora-base")
    root = os.path.join(tmp, preset + "-adapters")
    if not os.path.exists(mdir):
        subprocess.run([os.path.join(bin_dir, "tools", "mkmodel", "devio-mkmodel"), "--preset", preset,
                        "--seed", "6", "--out", mdir], check=True, stdout=subprocess.DEVNULL)
    name = "ad" + str(abs(hash(" ".join(extra))) % 100000)
    subprocess.run([os.path.join(bin_dir, "tools", "mkmodel", "devio-mkmodel"), "--adapter", "--model", mdir,
                    "--seed", "9", "--out", os.path.join(root, name)] + extra,
                   check=True, stdout=subprocess.DEVNULL)
    cfg, w = load(mdir)
    vocab = cfg["vocab_size"]
    tokens = [(i * 7919 + 13) % vocab for i in range(n_tokens)]
    script = os.path.join(tmp, "lora.jsonl")
    with open(script, "w") as f:
        f.write(json.dumps({"op": "lora", "cmd": {"kind": "load", "name": "x", "path": name}})
                + "\n")
        f.write('{"op":"create","as":"s"}\n')
        f.write(json.dumps({"op": "step", "full": True, "plan": {"rows": [
            {"seq": "$s", "tokens": tokens, "logits": "all", "adapter": "x"}]}}) + "\n")
    out = subprocess.run([os.path.join(bin_dir, "ref", "devio-ref"), "--model", mdir,
                          "--adapters", root, script],
                         check=True, capture_output=True, text=True).stdout.splitlines()
    lg = json.loads(out[2])["result"]["rows"][0]["logits"]
    got = np.array(lg["values"], dtype=np.float64).reshape(lg["shape"])
    want = forward(cfg, merge_adapter(cfg, w, os.path.join(root, name)), tokens)
    base = forward(cfg, w, tokens)
    assert np.max(np.abs(want - base)) > 1e-3 * np.max(np.abs(base)), "adapter changes nothing"
    return np.max(np.abs(got - want)) / np.max(np.abs(want))


def run(bin_dir, preset, extra, n_tokens, tmp):
    mdir = os.path.join(tmp, preset + "-" + "-".join(a.strip("-") for a in extra))
    subprocess.run([os.path.join(bin_dir, "tools", "mkmodel", "devio-mkmodel"), "--preset", preset,
                    "--seed", "5", "--out", mdir] + extra, check=True, stdout=subprocess.DEVNULL)
    cfg, w = load(mdir)
    vocab = cfg["vocab_size"]
    tokens = [(i * 7919 + 13) % vocab for i in range(n_tokens)]
    script = os.path.join(tmp, "check.jsonl")
    with open(script, "w") as f:
        f.write('{"op":"create","as":"s"}\n')
        f.write(json.dumps({"op": "step", "full": True, "plan": {"rows": [
            {"seq": "$s", "tokens": tokens, "logits": "all"}]}}) + "\n")
    out = subprocess.run([os.path.join(bin_dir, "ref", "devio-ref"), "--model", mdir, script],
                         check=True, capture_output=True, text=True).stdout.splitlines()
    res = json.loads(out[1])
    lg = res["result"]["rows"][0]["logits"]
    got = np.array(lg["values"], dtype=np.float64).reshape(lg["shape"])
    want = forward(cfg, w, tokens)
    err = np.max(np.abs(got - want)) / np.max(np.abs(want))
    return err


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True, help="bazel-bin directory")
    ap.add_argument("--presets", default="tiny,small")
    ap.add_argument("--tokens", type=int, default=48)
    a = ap.parse_args()
    variants = [[], ["--dtype", "bf16"], ["--dtype", "f16"], ["--tied", "--bias", "--head-dim", "24"]]
    lora_variants = [
        ["--rank", "8", "--alpha", "16", "--targets", "q_proj,v_proj"],
        ["--rank", "16", "--alpha", "32", "--rslora", "--dtype", "bf16", "--targets",
         "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"],
    ]
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for preset in a.presets.split(","):
            for extra in variants:
                err = run(a.bin, preset, extra, a.tokens, tmp)
                ok = err < LIMIT
                failed += not ok
                print(f"hf_check {preset} {' '.join(extra) or 'f32'}: relative error {err:.3e} "
                      f"({'ok' if ok else 'FAIL'}, limit {LIMIT:g})")
            for extra in lora_variants:
                err = run_adapter(a.bin, preset, extra, a.tokens, tmp)
                ok = err < LIMIT
                failed += not ok
                print(f"hf_check {preset} LoRA {' '.join(extra)}: relative error {err:.3e} "
                      f"({'ok' if ok else 'FAIL'}, limit {LIMIT:g})")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
