#!/usr/bin/env python3
"""gguf_forward.py - an independent float64 forward pass of a llama GGUF model.

Weights are dequantized by tools/gguf/gguf_file.py to float32 and widened to
float64; everything after that is float64 numpy: RMSNorm, RoPE, grouped-query
attention with a causal mask, a SiLU-gated MLP, the final norm and the logits
(the token embedding when output.weight is absent).

RoPE rotates adjacent pairs (2i, 2i+1) of each head, the convention of the
rows stored in a llama GGUF (whose q and k rows were reordered from Hugging
Face's rotate-half layout when the file was made), so this forward reads the
stored rows as they are. The first llama.rope.dimension_count values of a head
rotate; angle = position * freq_base^(-2i/dimension_count).

usage:
  gguf_forward.py MODEL.gguf --tokens 1,2,3 [--greedy N] [--logits-out F.npy]
  gguf_forward.py MODEL.gguf --prompt "text" [--no-template] [--greedy N] [--logits-out F.npy]
  gguf_forward.py --self-test [--bin DIR]

--prompt tokenizes with the file's own byte-level BPE vocabulary
(tokenizer.ggml.tokens and tokenizer.ggml.merges, through the tokenizers
package), after rendering tokenizer.chat_template (jinja2) for one user
message with the generation prompt; control tokens are single ids. It prints
the prompt ids, then with --greedy N the greedy ids (stopping after the eos
token unless --no-stop) and their text. --logits-out saves the float64 logits
of every position the model processed (the prompt, then each generated token
fed back), one row per position.

--self-test converts tiny Hugging Face Llama models (written here with numpy,
and by devio-mkmodel when DIR/tools/mkmodel/devio-mkmodel exists) with
tools/gguf/quantize.py from-hf to F32 GGUFs, and requires this forward's
logits to equal, within 1e-9 relative, a float64 forward that follows
Hugging Face's convention on the original rows (rotate-half RoPE); the same
GGUF with its q and k rows put back in Hugging Face's order must differ by
more than 1e-3, and prefill in one step must equal prefill plus one token at a
time through the KV cache. Where the gguf package is importable the
conversion's tensors are also compared with tools/bench/llama_gguf.py's.
"""
import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools", "gguf"))
import gguf_file as gf  # noqa: E402
import quantize as qz  # noqa: E402
from vocab import build_tokenizer, encode_prompt, render_chat  # noqa: E402,F401


# ---- the model --------------------------------------------------------------

def rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def silu(x):
    return x / (1.0 + np.exp(-x))


def softmax_rows(s):
    s = s - s.max(axis=-1, keepdims=True)
    e = np.exp(s)
    return e / e.sum(axis=-1, keepdims=True)


def rope_pairs(x, pos, inv_freq):
    """Rotate adjacent pairs of x [T, heads, hd] at positions pos [T]; the first
    2*len(inv_freq) values of each head rotate, the rest pass through."""
    n = 2 * inv_freq.size
    ang = pos[:, None].astype(np.float64) * inv_freq[None, :]          # [T, n/2]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = x[..., 0:n:2], x[..., 1:n:2]
    out = x.copy()
    out[..., 0:n:2] = a * c - b * s
    out[..., 1:n:2] = a * s + b * c
    return out


def attention(q, k, v, pos_q, pos_k):
    """q [T, H, hd], k/v [S, KV, hd]; query head h reads kv head h // (H/KV);
    a query at position p sees the keys at positions <= p."""
    T, H, hd = q.shape
    S, KV, _ = k.shape
    g = H // KV
    qg = q.reshape(T, KV, g, hd).transpose(1, 2, 0, 3).reshape(KV, g * T, hd)
    sc = qg @ k.transpose(1, 2, 0) / np.sqrt(hd)                        # [KV, g*T, S]
    sc = sc.reshape(KV, g, T, S)
    mask = pos_k[None, :] > pos_q[:, None]                             # [T, S]
    sc = np.where(mask, -np.inf, sc)
    p = softmax_rows(sc)
    o = p @ v.transpose(1, 0, 2)[:, None]                              # [KV, g, T, hd]
    return o.transpose(2, 0, 1, 3).reshape(T, H * hd)


class Model:
    def __init__(self, path):
        self.file = gf.read(path)
        m = self.meta = self.file.metadata
        arch = m.get("general.architecture")
        if arch != "llama":
            raise ValueError(f"{path}: architecture {arch!r}; this forward computes llama")
        if m.get("llama.rope.scaling.type", "none") not in ("none",):
            raise ValueError(f"{path}: RoPE scaling {m['llama.rope.scaling.type']} is not computed")
        self.n_layer = m["llama.block_count"]
        self.d = m["llama.embedding_length"]
        self.heads = m["llama.attention.head_count"]
        self.kv = m.get("llama.attention.head_count_kv", self.heads)
        self.hd = m.get("llama.attention.key_length", self.d // self.heads)
        self.eps = float(m["llama.attention.layer_norm_rms_epsilon"])
        base = float(m.get("llama.rope.freq_base", 10000.0))
        n_rot = m.get("llama.rope.dimension_count", self.hd)
        self.inv_freq = base ** (-np.arange(0, n_rot, 2, dtype=np.float64) / n_rot)
        tensors = self.file.tensor_map()

        def w(name):
            t = tensors[name]
            a = gf.dequantize(t).astype(np.float64)
            return a.reshape(-1) if len(t.dims) == 1 else a

        self.embd = w("token_embd.weight")
        self.output = w("output.weight") if "output.weight" in tensors else self.embd
        self.output_norm = w("output_norm.weight")
        names = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm",
                 "ffn_gate", "ffn_up", "ffn_down")
        self.layers = [{n: w(f"blk.{i}.{n}.weight") for n in names} for i in range(self.n_layer)]
        self.vocab = self.embd.shape[0]

    def new_cache(self):
        return {"pos": 0, "k": [None] * self.n_layer, "v": [None] * self.n_layer}

    def forward(self, tokens, cache=None):
        """Logits [T, vocab] for tokens following what cache holds (a new cache if None)."""
        cache = cache if cache is not None else self.new_cache()
        tokens = np.asarray(tokens, dtype=np.int64)
        if tokens.size == 0 or tokens.min() < 0 or tokens.max() >= self.vocab:
            raise ValueError(f"token ids must be 0..{self.vocab - 1}")
        T, p0 = tokens.size, cache["pos"]
        pos = np.arange(p0, p0 + T)
        x = self.embd[tokens]
        for i, L in enumerate(self.layers):
            h = rms_norm(x, L["attn_norm"], self.eps)
            q = (h @ L["attn_q"].T).reshape(T, self.heads, self.hd)
            k = (h @ L["attn_k"].T).reshape(T, self.kv, self.hd)
            v = (h @ L["attn_v"].T).reshape(T, self.kv, self.hd)
            q = rope_pairs(q, pos, self.inv_freq)
            k = rope_pairs(k, pos, self.inv_freq)
            if cache["k"][i] is not None:
                k = np.concatenate([cache["k"][i], k])
                v = np.concatenate([cache["v"][i], v])
            cache["k"][i], cache["v"][i] = k, v
            x = x + attention(q, k, v, pos, np.arange(k.shape[0])) @ L["attn_output"].T
            h = rms_norm(x, L["ffn_norm"], self.eps)
            x = x + (silu(h @ L["ffn_gate"].T) * (h @ L["ffn_up"].T)) @ L["ffn_down"].T
        cache["pos"] = p0 + T
        return rms_norm(x, self.output_norm, self.eps) @ self.output.T

    def greedy(self, prompt, n, stop=None):
        """(generated ids, logits of every processed position)."""
        cache = self.new_cache()
        rows = [self.forward(prompt, cache)]
        out = []
        for step in range(n):
            nxt = int(np.argmax(rows[-1][-1]))
            out.append(nxt)
            if nxt == stop or step == n - 1:
                break
            rows.append(self.forward([nxt], cache))
        return out, np.concatenate(rows)


# ---- the file's vocabulary: tools/gguf/vocab.py ----------------------------

# ---- Hugging Face's convention, for the self-test ---------------------------

def rope_half(x, pos, inv_freq):
    """Hugging Face's rotate_half RoPE: value i pairs with value i + hd/2."""
    hd = x.shape[-1]
    ang = pos[:, None].astype(np.float64) * inv_freq[None, :]
    c = np.concatenate([np.cos(ang)] * 2, axis=-1)[:, None, :]
    s = np.concatenate([np.sin(ang)] * 2, axis=-1)[:, None, :]
    rot = np.concatenate([-x[..., hd // 2:], x[..., :hd // 2]], axis=-1)
    return x * c + rot * s


def hf_forward(d, tokens):
    """Float64 logits [T, vocab] of a Hugging Face Llama directory, on its own rows.
    rms_norm_eps is taken as the float32 a GGUF stores it as, so that the two
    forwards differ only in row order and summation order."""
    with open(os.path.join(d, "config.json")) as fh:
        cfg = json.load(fh)
    W = {k: v.astype(np.float64) for k, v in qz.read_hf_weights(d).items()}
    H, KV = cfg["num_attention_heads"], cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
    hd = cfg.get("head_dim") or cfg["hidden_size"] // H
    eps = float(np.float32(cfg["rms_norm_eps"]))
    inv_freq = cfg.get("rope_theta", 10000.0) ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    tokens = np.asarray(tokens)
    T = tokens.size
    pos = np.arange(T)
    x = W["model.embed_tokens.weight"][tokens]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rms_norm(x, W[p + "input_layernorm.weight"], eps)
        q = rope_half((h @ W[p + "self_attn.q_proj.weight"].T).reshape(T, H, hd), pos, inv_freq)
        k = rope_half((h @ W[p + "self_attn.k_proj.weight"].T).reshape(T, KV, hd), pos, inv_freq)
        v = (h @ W[p + "self_attn.v_proj.weight"].T).reshape(T, KV, hd)
        k = np.repeat(k, H // KV, axis=1)
        v = np.repeat(v, H // KV, axis=1)
        s = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd)
        s = np.where(np.triu(np.ones((T, T), bool), 1)[None], -np.inf, s)
        o = np.einsum("hts,shd->thd", softmax_rows(s), v).reshape(T, H * hd)
        x = x + o @ W[p + "self_attn.o_proj.weight"].T
        h = rms_norm(x, W[p + "post_attention_layernorm.weight"], eps)
        x = x + (silu(h @ W[p + "mlp.gate_proj.weight"].T) * (h @ W[p + "mlp.up_proj.weight"].T)) \
            @ W[p + "mlp.down_proj.weight"].T
    head = W.get("lm_head.weight", W["model.embed_tokens.weight"])
    return rms_norm(x, W["model.norm.weight"], eps) @ head.T


def write_hf_dir(d, seed, vocab, hidden, layers, heads, kv, head_dim, ffn, theta, tied,
                 dtype="F32"):
    """A random Llama model directory in Hugging Face's layout."""
    rng = np.random.default_rng(seed)
    os.makedirs(d, exist_ok=True)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab,
           "hidden_size": hidden, "intermediate_size": ffn, "num_hidden_layers": layers,
           "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": head_dim,
           "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": theta,
           "tie_word_embeddings": tied, "hidden_act": "silu", "rope_scaling": None}
    shapes = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (hidden,),
                       p + "self_attn.q_proj.weight": (heads * head_dim, hidden),
                       p + "self_attn.k_proj.weight": (kv * head_dim, hidden),
                       p + "self_attn.v_proj.weight": (kv * head_dim, hidden),
                       p + "self_attn.o_proj.weight": (hidden, heads * head_dim),
                       p + "post_attention_layernorm.weight": (hidden,),
                       p + "mlp.gate_proj.weight": (ffn, hidden),
                       p + "mlp.up_proj.weight": (ffn, hidden),
                       p + "mlp.down_proj.weight": (hidden, ffn)})
    if not tied:
        shapes["lm_head.weight"] = (vocab, hidden)
    header, blobs, off = {}, [], 0
    for name, shape in shapes.items():
        if len(shape) == 1:
            a = 1.0 + 0.1 * rng.standard_normal(shape)
        else:
            a = rng.standard_normal(shape) / np.sqrt(shape[1]) * (2.0 if "q_proj" in name or
                                                                  "k_proj" in name else 1.0)
        a = a.astype(np.float32)
        if dtype == "BF16":
            raw = (a.view(np.uint32) >> 16).astype("<u2").tobytes()
        elif dtype == "F16":
            raw = a.astype("<f2").tobytes()
        else:
            raw = a.astype("<f4").tobytes()
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(os.path.join(d, "model.safetensors"), "wb") as fh:
        fh.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    with open(os.path.join(d, "config.json"), "w") as fh:
        json.dump(cfg, fh, indent=1)


def _rel(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


def _compare_bench_writer(src, ours, work):
    """Tensor bytes of our from-hf F32 file against tools/bench/llama_gguf.py's (gguf package)."""
    try:
        import gguf  # noqa: F401
    except ImportError:
        return "skipped (no gguf package)"
    other = os.path.join(work, "bench.gguf")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "bench", "llama_gguf.py"),
                        src, other], capture_output=True, text=True)
    if r.returncode:
        return f"skipped (llama_gguf.py: {r.stderr.strip()[-200:]})"
    a, b = gf.read(ours).tensor_map(), gf.read(other).tensor_map()
    if set(a) != set(b):
        return f"FAIL: tensor names differ: {sorted(set(a) ^ set(b))[:4]}"
    for name, t in a.items():
        u = b[name]
        if t.dims != u.dims:
            return f"FAIL: {name} dims {t.dims} vs {u.dims}"
        x, y = gf.dequantize(t), gf.dequantize(u)
        if not np.array_equal(x, y):
            return f"FAIL: {name} values differ"
    return "identical values"


def self_test(bin_dir):
    work = tempfile.mkdtemp(prefix="gguf_forward.")
    failures = 0
    try:
        cases = [
            ("numpy gqa hd16", dict(seed=1, vocab=300, hidden=64, layers=2, heads=4, kv=2,
                                   head_dim=16, ffn=96, theta=10000.0, tied=False)),
            ("numpy head_dim!=hidden/heads tied kv1", dict(seed=2, vocab=280, hidden=48, layers=2,
                                                         heads=4, kv=1, head_dim=16, ffn=80,
                                                         theta=500000.0, tied=True)),
            ("numpy mha bf16", dict(seed=3, vocab=260, hidden=32, layers=3, heads=2, kv=2,
                                   head_dim=16, ffn=64, theta=10000.0, tied=False, dtype="BF16")),
        ]
        dirs = []
        for name, kw in cases:
            d = os.path.join(work, name.replace(" ", "_").replace("!", "n").replace("=", "e"))
            write_hf_dir(d, **kw)
            dirs.append((name, d))
        mk = os.path.join(bin_dir, "tools", "mkmodel", "devio-mkmodel") if bin_dir else None
        if mk and os.access(mk, os.X_OK):
            for name, args in (("mkmodel tiny", ["--preset", "tiny", "--vocab", "300"]),
                               ("mkmodel tiny tied bf16", ["--preset", "tiny", "--tied", "--vocab", "270",
                                                           "--dtype", "bf16", "--seed", "7"])):
                d = os.path.join(work, name.replace(" ", "_"))
                subprocess.run([mk, *args, "--out", d], check=True, capture_output=True)
                dirs.append((name, d))
        else:
            print("devio-mkmodel not found: numpy-written models only")
        for name, d in dirs:
            g = os.path.join(d, "model.gguf")
            qz.from_hf(d, g, "F32", log=open(os.devnull, "w"))
            m = Model(g)
            rng = np.random.default_rng(5)
            toks = rng.integers(0, m.vocab, 40)
            ref = hf_forward(d, toks)
            got = m.forward(toks)
            e = _rel(got, ref)
            # the prefill then one token at a time through the cache
            cache = m.new_cache()
            inc = np.concatenate([m.forward(toks[:25], cache)] +
                                 [m.forward(toks[i:i + 1], cache) for i in range(25, 40)])
            e_inc = _rel(inc, got)
            # q and k rows back in Hugging Face's order: the pair rotation must then be wrong
            for L in m.layers:
                for key, heads in (("attn_q", m.heads), ("attn_k", m.kv)):
                    w = L[key]
                    L[key] = w.reshape(heads, m.hd // 2, 2, -1).swapaxes(1, 2).reshape(w.shape)
            e_wrong = _rel(m.forward(toks), ref)
            bench = _compare_bench_writer(d, g, work)
            ok = e <= 1e-9 and e_inc <= 1e-12 and e_wrong > 1e-3 and not bench.startswith("FAIL")
            failures += not ok
            print(f"{'ok  ' if ok else 'FAIL'} {name}: gguf forward vs HF forward {e:.2e} "
                  f"(<= 1e-9); cached decode {e_inc:.2e}; HF row order read as pairs {e_wrong:.2e} "
                  f"(> 1e-3); vs llama_gguf.py: {bench}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{len(dirs) - failures} passed, {failures} failed")
    return 1 if failures else 0


# ---- command line -----------------------------------------------------------

def main(argv):
    p = argparse.ArgumentParser(description="Float64 forward of a llama GGUF.")
    p.add_argument("model", nargs="?")
    p.add_argument("--tokens", help="comma-separated token ids")
    p.add_argument("--prompt", help="a user message, through the chat template")
    p.add_argument("--no-template", action="store_true", help="tokenize --prompt as it is")
    p.add_argument("--greedy", type=int, default=0, metavar="N", help="generate N tokens")
    p.add_argument("--no-stop", action="store_true", help="do not stop at the eos token")
    p.add_argument("--logits-out", metavar="F.npy")
    p.add_argument("--self-test", action="store_true")
    p.add_argument("--bin", default=os.path.join(ROOT, "bazel-bin"),
                   help="where tools/mkmodel/devio-mkmodel is looked for (self-test)")
    a = p.parse_args(argv)
    if a.self_test:
        return self_test(a.bin)
    if not a.model or (a.tokens is None) == (a.prompt is None):
        p.error("give MODEL.gguf and one of --tokens or --prompt")
    t0 = time.time()
    m = Model(a.model)
    t_load = time.time() - t0
    tk = None
    if a.prompt is not None:
        tk, text, ids = encode_prompt(m.meta, a.prompt, not a.no_template)
        print("prompt text: " + json.dumps(text))
    else:
        ids = [int(x) for x in a.tokens.split(",") if x.strip()]
    print("prompt ids: " + ",".join(map(str, ids)))
    t0 = time.time()
    if a.greedy > 0:
        stop = None if a.no_stop else m.meta.get("tokenizer.ggml.eos_token_id")
        out, logits = m.greedy(ids, a.greedy, stop)
        print("greedy ids: " + ",".join(map(str, out)))
        if tk is None and m.meta.get("tokenizer.ggml.model") == "gpt2":
            tk = build_tokenizer(m.meta)
        if tk is not None:
            print("greedy text: " + json.dumps(tk.decode(out, skip_special_tokens=False)))
    else:
        logits = m.forward(ids)
        print("next id: " + str(int(np.argmax(logits[-1]))))
    t_run = time.time() - t0
    if a.logits_out:
        np.save(a.logits_out, logits)
    sys.stdout.flush()
    print(f"positions {logits.shape[0]}, load {t_load:.1f}s, forward {t_run:.1f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except (ValueError, OSError, KeyError) as e:
        print(f"gguf_forward.py: {e}", file=sys.stderr)
        sys.exit(1)
