#!/usr/bin/env python3
"""ssm_check.py - devio's reference against an independent Bamba / Mamba2 forward pass.

Writes hybrid Mamba-2 models with devio-mkmodel (--arch bamba, --arch mamba2),
runs a prompt through devio-ref asking for every position's logits, and
recomputes the same logits with numpy in float64 following Hugging Face's
BambaForCausalLM and Mamba2ForCausalLM: the mixer as a plain token-by-token
recurrence (causal depthwise conv, softplus dt, S = S exp(dt A) + dt B x,
y = C S + D x, gated RMSNorm per group), Bamba's attention with RoPE on the
first half of each head. Prints the relative error max|devio - numpy| /
max|numpy| per model and fails above 1e-4 (or when devio-ref refuses a model).

--self-test needs neither devio-mkmodel nor devio-ref: it checks on numpy
weights that the forward is chunk-invariant (running [0, n) equals running
[0, k) and then [k, n) from the carried state, which must matter), and the
recurrence against the scan's closed (SSD) form, and prints ok.

Variants run side by side in --jobs processes (one BLAS and one devio-ref thread each); the
lines print in order.

usage: ssm_check.py --bin DIR [--archs bamba,mamba2] [--presets tiny,small] [--tokens N]
                    [--jobs N]
       ssm_check.py --self-test
Needs only numpy.
"""
import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile

if __name__ == "__main__":
    # One BLAS thread per process: --jobs runs the variants side by side.
    for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_v, "1")
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_check import load, merge_adapter  # noqa: E402  (safetensors into float64; PEFT's merge)

LIMIT = 1e-4
DEFAULT_TOKENS = {"tiny": 300, "small": 300}
# Positions whose logits are compared: all of tiny's; small's vocabulary makes
# "all" logits large, so its last 48 (the prompt before them runs without logits).
COMPARED = {"tiny": None, "small": 48}


def silu(v):
    return v / (1.0 + np.exp(-v))


def softplus(v):
    # torch's softplus: the identity above 20
    return np.where(v > 20.0, v, np.log1p(np.exp(np.minimum(v, 20.0))))


def rmsnorm(x, w, eps):
    return w * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps))


# ---- the shapes of a config ----

class Dims:
    """The dimensions the forward needs, read from either architecture's config.json."""

    def __init__(self, cfg):
        self.arch = cfg["model_type"]
        self.d = cfg["hidden_size"]
        self.layers = cfg["num_hidden_layers"]
        if self.arch == "bamba":
            self.H, self.P = cfg["mamba_n_heads"], cfg["mamba_d_head"]
            self.N, self.G = cfg["mamba_d_state"], cfg["mamba_n_groups"]
            self.K = cfg["mamba_d_conv"]
            self.I = cfg["mamba_expand"] * self.d
            self.eps = cfg["rms_norm_eps"]
            self.attn = set(cfg.get("attn_layer_indices") or [])
            self.nh = cfg["num_attention_heads"]
            self.nkv = cfg.get("num_key_value_heads", self.nh)
            self.hd = self.d // self.nh
            self.theta = cfg.get("rope_theta", 10000.0)
        elif self.arch == "mamba2":
            self.H, self.P = cfg["num_heads"], cfg["head_dim"]
            self.N, self.G = cfg["state_size"], cfg["n_groups"]
            self.K = cfg["conv_kernel"]
            self.I = cfg["expand"] * self.d
            self.eps = cfg["layer_norm_epsilon"]
            self.attn = set()
        else:
            raise ValueError(f"model_type {self.arch!r} is neither bamba nor mamba2")
        assert self.H * self.P == self.I, "heads * head_dim != expand * hidden"
        self.conv_dim = self.I + 2 * self.G * self.N
        lim = cfg.get("time_step_limit", [0.0, float("inf")])
        self.dt_lo, self.dt_hi = float(lim[0]), float(lim[1])


def new_state(m):
    """Zero state: per layer the conv window and S (mixers) or the K/V cache (attention)."""
    layers = []
    for i in range(m.layers):
        if i in m.attn:
            layers.append({"k": np.zeros((0, m.nkv, m.hd)), "v": np.zeros((0, m.nkv, m.hd))})
        else:
            layers.append({"conv": np.zeros((m.K - 1, m.conv_dim)),
                           "ssm": np.zeros((m.H, m.P, m.N))})
    return {"pos": 0, "layers": layers}


# ---- the Mamba-2 mixer, token by token ----

def causal_conv(m, w, p, xbc, st):
    """Depthwise causal conv over the window of the K-1 previous raw inputs, then SiLU."""
    cw = w[p + "conv1d.weight"][:, 0, :]  # [conv_dim, K]
    cb = w.get(p + "conv1d.bias", np.zeros(m.conv_dim))
    full = np.concatenate([st["conv"], xbc])  # row j = input of token j - (K-1)
    out = np.empty_like(xbc)
    for t in range(xbc.shape[0]):
        out[t] = np.sum(cw.T * full[t:t + m.K], axis=0) + cb
    st["conv"] = full[full.shape[0] - (m.K - 1):]
    return silu(out)


def scan(m, w, p, x, B, C, dt, st):
    """S = S exp(dt A) + dt B x; y = C S + D x, one token at a time."""
    A = -np.exp(w[p + "A_log"])
    D = w[p + "D"]
    group = np.arange(m.H) // (m.H // m.G)
    S = st["ssm"]
    y = np.empty_like(x)
    for t in range(x.shape[0]):
        xt = x[t].reshape(m.H, m.P)
        Bt, Ct = B[t][group], C[t][group]  # [H, N]
        decay = np.exp(dt[t] * A)  # [H]
        S = S * decay[:, None, None] + (dt[t][:, None, None] * xt[:, :, None]) * Bt[:, None, :]
        y[t] = (np.einsum("hpn,hn->hp", S, Ct) + D[:, None] * xt).reshape(m.I)
    st["ssm"] = S
    return y


def gated_norm(m, w, p, y, z, norm_groups):
    g = y * silu(z)
    gs = g.reshape(g.shape[0], norm_groups, m.I // norm_groups)
    gs = gs / np.sqrt(np.mean(gs * gs, axis=-1, keepdims=True) + m.eps)
    return gs.reshape(g.shape) * w[p + "norm.weight"]


def mixer(m, w, p, h, st, norm_groups):
    zxbcdt = h @ w[p + "in_proj.weight"].T
    if p + "in_proj.bias" in w:
        zxbcdt = zxbcdt + w[p + "in_proj.bias"]
    z = zxbcdt[:, :m.I]
    xbc = causal_conv(m, w, p, zxbcdt[:, m.I:m.I + m.conv_dim], st)
    dt = softplus(zxbcdt[:, m.I + m.conv_dim:] + w[p + "dt_bias"])
    dt = np.clip(dt, m.dt_lo, m.dt_hi)
    gn = m.G * m.N
    T = h.shape[0]
    x = xbc[:, :m.I]
    B = xbc[:, m.I:m.I + gn].reshape(T, m.G, m.N)
    C = xbc[:, m.I + gn:].reshape(T, m.G, m.N)
    y = scan(m, w, p, x, B, C, dt, st)
    out = gated_norm(m, w, p, y, z, norm_groups) @ w[p + "out_proj.weight"].T
    if p + "out_proj.bias" in w:
        out = out + w[p + "out_proj.bias"]
    return out


# ---- Bamba's attention: RoPE on the first half of each head, a K/V cache ----

def rope_half(m, v, pos):
    """rotate_half RoPE over the first rotary_dim = head_dim / 2 dims; the rest pass through."""
    rd = m.hd // 2
    inv = 1.0 / (m.theta ** (np.arange(0, rd, 2, dtype=np.float64) / rd))
    ang = np.outer(pos.astype(np.float64), inv)  # [T, rd/2]
    cos = np.concatenate([np.cos(ang), np.cos(ang)], axis=-1)[:, None, :]
    sin = np.concatenate([np.sin(ang), np.sin(ang)], axis=-1)[:, None, :]
    r = v[..., :rd]
    rot = np.concatenate([-r[..., rd // 2:], r[..., :rd // 2]], axis=-1)
    return np.concatenate([r * cos + rot * sin, v[..., rd:]], axis=-1)


def attention(m, w, p, h, st, pos0):
    T = h.shape[0]
    pos = np.arange(pos0, pos0 + T)
    q = rope_half(m, (h @ w[p + "self_attn.q_proj.weight"].T).reshape(T, m.nh, m.hd), pos)
    k = rope_half(m, (h @ w[p + "self_attn.k_proj.weight"].T).reshape(T, m.nkv, m.hd), pos)
    v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(T, m.nkv, m.hd)
    st["k"] = np.concatenate([st["k"], k])
    st["v"] = np.concatenate([st["v"], v])
    rep = m.nh // m.nkv
    ks = np.repeat(st["k"], rep, axis=1)
    vs = np.repeat(st["v"], rep, axis=1)
    s = np.einsum("thd,shd->hts", q, ks) / np.sqrt(m.hd)
    s = s + np.where(np.arange(ks.shape[0])[None, :] > pos[:, None], -np.inf, 0.0)
    s = np.exp(s - s.max(axis=-1, keepdims=True))
    s = s / s.sum(axis=-1, keepdims=True)
    o = np.einsum("hts,shd->thd", s, vs).reshape(T, m.nh * m.hd)
    return o @ w[p + "self_attn.o_proj.weight"].T


# ---- the models ----

def forward(cfg, w, tokens, state=None, norm_groups=None):
    """Logits [len(tokens), vocab] of tokens following `state` (None: a fresh sequence),
    and the state after them. norm_groups: the gated norm's groups (default n_groups;
    1 is the norm over all I channels of Hugging Face's torch-only path)."""
    m = Dims(cfg)
    st = state if state is not None else new_state(m)
    ng = norm_groups or m.G
    bamba = m.arch == "bamba"
    x = w["model.embed_tokens.weight" if bamba else "backbone.embeddings.weight"][tokens]
    for i in range(m.layers):
        ls = st["layers"][i]
        if bamba:
            p = f"model.layers.{i}."
            h = rmsnorm(x, w[p + "input_layernorm.weight"], m.eps)
            if i in m.attn:
                x = x + attention(m, w, p, h, ls, st["pos"])
            else:
                x = x + mixer(m, w, p + "mamba.", h, ls, ng)
            h = rmsnorm(x, w[p + "pre_ff_layernorm.weight"], m.eps)
            g = h @ w[p + "feed_forward.gate_proj.weight"].T
            u = h @ w[p + "feed_forward.up_proj.weight"].T
            x = x + (silu(g) * u) @ w[p + "feed_forward.down_proj.weight"].T
        else:
            p = f"backbone.layers.{i}."
            x = x + mixer(m, w, p + "mixer.", rmsnorm(x, w[p + "norm.weight"], m.eps), ls, ng)
    st["pos"] += len(tokens)
    x = rmsnorm(x, w["model.final_layernorm.weight" if bamba else "backbone.norm_f.weight"], m.eps)
    emb = "model.embed_tokens.weight" if bamba else "backbone.embeddings.weight"
    return x @ w.get("lm_head.weight", w[emb]).T, st


# ---- against devio-ref ----

def prompt(vocab, n):
    return [(i * 7919 + 13) % vocab for i in range(n)]


def devio_logits(bin_dir, mdir, chunks, tmp, adapter=None, quiet=0):
    """Logits of devio-ref for the token chunks, each one step with logits "all",
    concatenated; (None, message) when devio-ref refuses. adapter: (root, path)
    of a PEFT adapter the rows run with. The first `quiet` chunks ask for none."""
    script = os.path.join(tmp, "ssm_check.jsonl")
    row = {"seq": "$s", "logits": "all"}
    extra = []
    skip = 1
    with open(script, "w") as f:
        if adapter:
            f.write(json.dumps({"op": "lora", "cmd": {"kind": "load", "name": "x",
                                                      "path": adapter[1]}}) + "\n")
            row["adapter"] = "x"
            extra = ["--adapters", adapter[0]]
            skip = 2
        f.write('{"op":"create","as":"s"}\n')
        for i, c in enumerate(chunks):
            f.write(json.dumps({"op": "step", "full": True, "plan": {"rows": [
                dict(row, tokens=c, logits="none" if i < quiet else "all")]}}) + "\n")
    n = sum(len(c) for c in chunks)
    r = subprocess.run([os.path.join(bin_dir, "ref", "devio-ref"), "--model", mdir,
                        "--logits-rows", str(max(256, n))] + extra + [script],
                       capture_output=True, text=True)
    lines = r.stdout.splitlines()
    res = [json.loads(line) for line in lines[skip:skip + len(chunks)]]
    if r.returncode != 0 or len(res) < len(chunks) or not all(x.get("ok") for x in res):
        why = (r.stderr.strip() or (lines[-1] if lines else "no output"))[:300]
        return None, why
    parts = []
    for x in res[quiet:]:
        lg = x["result"]["rows"][0]["logits"]
        parts.append(np.array(lg["values"], dtype=np.float64).reshape(lg["shape"]))
    return np.concatenate(parts), None


def run(bin_dir, arch, preset, extra, n_tokens, cuts, tmp, tail=None):
    """(relative error, None, hint) or (None, why devio-ref refused, None) for one
    variant; the prompt goes in one step per piece between the cuts. tail: compare
    only the last `tail` positions (the steps before them ask for no logits)."""
    name = "-".join([arch, preset] + [a.strip("-").replace("=", "") for a in extra])
    mdir = os.path.join(tmp, name)
    subprocess.run([os.path.join(bin_dir, "tools", "mkmodel", "devio-mkmodel"), "--arch", arch,
                    "--preset", preset, "--seed", "5", "--out", mdir] + extra,
                   check=True, stdout=subprocess.DEVNULL)
    cfg, w = load(mdir)
    tokens = prompt(cfg["vocab_size"], n_tokens)
    first = n_tokens - tail if tail else 0
    edges = sorted(set([0, first] + [c for c in cuts if 0 < c < n_tokens] + [n_tokens]))
    chunks = [tokens[a:b] for a, b in zip(edges, edges[1:])]
    quiet = sum(1 for b in edges[1:] if b <= first)
    got, why = devio_logits(bin_dir, mdir, chunks, tmp, quiet=quiet)
    if got is None:
        return None, why, None
    want, _ = forward(cfg, w, tokens)
    want = want[first:]
    err = np.max(np.abs(got - want)) / np.max(np.abs(want))
    hint = None
    if err >= LIMIT and Dims(cfg).G > 1:
        # Which gated norm devio computes, if not the per-group one.
        alt, _ = forward(cfg, w, tokens, norm_groups=1)
        alt = alt[first:]
        e1 = np.max(np.abs(got - alt)) / np.max(np.abs(alt))
        hint = f"against the norm over all I channels: {e1:.3e}"
    return err, None, hint


def run_adapter(bin_dir, arch, preset, targets, n_tokens, tmp):
    """Relative error of a LoRA row against the merged weights, or (None, why)."""
    mdir = os.path.join(tmp, f"{arch}-{preset}-lora-base")
    root = os.path.join(tmp, f"{arch}-{preset}-adapters")
    mk = os.path.join(bin_dir, "tools", "mkmodel", "devio-mkmodel")
    if not os.path.exists(mdir):
        subprocess.run([mk, "--arch", arch, "--preset", preset, "--seed", "6", "--out", mdir],
                       check=True, stdout=subprocess.DEVNULL)
    name = targets.replace(",", "-")
    subprocess.run([mk, "--adapter", "--model", mdir, "--seed", "9", "--rank", "8", "--alpha",
                    "16", "--targets", targets, "--out", os.path.join(root, name)],
                   check=True, stdout=subprocess.DEVNULL)
    cfg, w = load(mdir)
    tokens = prompt(cfg["vocab_size"], n_tokens)
    got, why = devio_logits(bin_dir, mdir, [tokens], tmp, adapter=(root, name))
    if got is None:
        return None, why
    want, _ = forward(cfg, merge_adapter(cfg, w, os.path.join(root, name)), tokens)
    base, _ = forward(cfg, w, tokens)
    if np.max(np.abs(want - base)) <= 1e-3 * np.max(np.abs(base)):
        return None, "the adapter changes nothing"
    return np.max(np.abs(got - want)) / np.max(np.abs(want)), None


# Adapters per architecture: the mixer's projections, and (Bamba) attention and MLP too.
LORA_TARGETS = {"bamba": ["in_proj,out_proj", "q_proj,v_proj,o_proj,gate_proj,down_proj,in_proj"],
                "mamba2": ["in_proj,out_proj", "out_proj"]}


def variants(preset, n_tokens):
    """(label, extra flags, cuts) per variant: the dtypes, the other tying, no conv bias,
    the other group count (the presets: tiny 2, small 1), projection biases, and the
    prompt in three steps (a cut inside the first conv window, one further on)."""
    tied = preset == "small"
    groups = ["--ssm-groups", "1"] if preset == "tiny" else ["--ssm-groups", "3"]
    return [("f32", ["--dtype", "f32"], []),
            ("bf16", ["--dtype", "bf16"], []),
            ("f16", ["--dtype", "f16"], []),
            ("--tied=false" if tied else "--tied", ["--tied=false" if tied else "--tied"], []),
            ("--no-conv-bias", ["--no-conv-bias"], []),
            (" ".join(groups), groups, []),
            ("--proj-bias", ["--proj-bias"], []),
            ("three steps", ["--dtype", "f32"], [2, n_tokens // 3])]


# ---- self-test: chunk invariance on numpy weights ----

def synthetic(arch, rng, conv_bias, proj_bias, G):
    """A small config and weights of the shapes and ranges devio-mkmodel writes."""
    d, V, H, P, N, K, L = 32, 64, 4, 16, 8, 4, 3
    I = H * P
    if arch == "bamba":
        cfg = {"model_type": "bamba", "hidden_size": d, "num_hidden_layers": L, "vocab_size": V,
               "mamba_n_heads": H, "mamba_d_head": P, "mamba_d_state": N, "mamba_n_groups": G,
               "mamba_d_conv": K, "mamba_expand": 2, "rms_norm_eps": 1e-5,
               "attn_layer_indices": [1],
               "num_attention_heads": 4, "num_key_value_heads": 2, "rope_theta": 10000.0,
               "intermediate_size": 48, "time_step_limit": [0.0, float("inf")]}
    else:
        cfg = {"model_type": "mamba2", "hidden_size": d, "num_hidden_layers": L, "vocab_size": V,
               "num_heads": H, "head_dim": P, "state_size": N, "n_groups": G, "conv_kernel": K,
               "expand": 2, "layer_norm_epsilon": 1e-5, "time_step_limit": [0.0, float("inf")]}
    m = Dims(cfg)
    u = lambda *s: rng.uniform(-1.0, 1.0, s)  # noqa: E731
    w = {}
    top = "model." if arch == "bamba" else "backbone."
    emb = "embed_tokens.weight" if arch == "bamba" else "embeddings.weight"
    w[top + emb] = u(V, d) / np.sqrt(d)
    w[top + ("final_layernorm.weight" if arch == "bamba" else "norm_f.weight")] = 1 + 0.1 * u(d)
    w["lm_head.weight"] = u(V, d) / np.sqrt(d)
    in_dim = I + m.conv_dim + H
    for i in range(L):
        p = f"{top}layers.{i}."
        if arch == "mamba2":
            w[p + "norm.weight"] = 1 + 0.1 * u(d)
            mp = p + "mixer."
        else:
            f = cfg["intermediate_size"]
            for n in ("input_layernorm.weight", "pre_ff_layernorm.weight"):
                w[p + n] = 1 + 0.1 * u(d)
            w[p + "feed_forward.gate_proj.weight"] = u(f, d) / np.sqrt(d)
            w[p + "feed_forward.up_proj.weight"] = u(f, d) / np.sqrt(d)
            w[p + "feed_forward.down_proj.weight"] = u(d, f) / np.sqrt(f)
            mp = p + "mamba."
            if i in m.attn:
                for n, o_, i_ in (("q", m.nh * m.hd, d), ("k", m.nkv * m.hd, d),
                                  ("v", m.nkv * m.hd, d), ("o", d, m.nh * m.hd)):
                    w[p + f"self_attn.{n}_proj.weight"] = u(o_, i_) / np.sqrt(i_)
                continue
        w[mp + "in_proj.weight"] = u(in_dim, d) / np.sqrt(d)
        w[mp + "conv1d.weight"] = u(m.conv_dim, 1, K) / np.sqrt(K)
        w[mp + "dt_bias"] = np.log(np.expm1(np.exp(rng.uniform(np.log(1e-3), np.log(0.1), H))))
        w[mp + "A_log"] = np.log(rng.uniform(1.0, 16.0, H))
        w[mp + "D"] = 1 + 0.5 * u(H)
        w[mp + "norm.weight"] = 1 + 0.1 * u(I)
        w[mp + "out_proj.weight"] = u(d, I) / np.sqrt(I)
        if conv_bias:
            w[mp + "conv1d.bias"] = 0.1 * u(m.conv_dim)
        if proj_bias:
            w[mp + "in_proj.bias"] = 0.05 * u(in_dim)
            w[mp + "out_proj.bias"] = 0.05 * u(d)
    return cfg, w


def scan_quadratic(m, A, D, x, B, C, dt):
    """The scan from zero state in its closed (SSD) form, as a cross-check of scan():
    y_t = sum_{s<=t} (C_t . B_s) exp(A sum_{s<r<=t} dt_r) dt_s x_s + D x_t."""
    T = x.shape[0]
    group = np.arange(m.H) // (m.H // m.G)
    cum = np.cumsum(dt, axis=0)  # [T, H]
    xs = x.reshape(T, m.H, m.P)
    y = D[None, :, None] * xs
    for t in range(T):
        for s_ in range(t + 1):
            cb = np.sum(C[t][group] * B[s_][group], axis=-1)  # [H]
            y[t] += (cb * np.exp(A * (cum[t] - cum[s_])) * dt[s_])[:, None] * xs[s_]
    return y.reshape(T, m.I)


def self_test_scan(rng):
    """scan() against scan_quadratic() on random inputs; the largest relative error."""
    cfg, _ = synthetic("mamba2", rng, True, False, 2)
    m = Dims(cfg)
    T = 24
    x = rng.uniform(-1, 1, (T, m.I))
    B, C = rng.uniform(-1, 1, (2, T, m.G, m.N))
    dt = np.exp(rng.uniform(np.log(1e-3), np.log(0.5), (T, m.H)))
    w = {"p.A_log": np.log(rng.uniform(1.0, 16.0, m.H)), "p.D": rng.uniform(0.5, 1.5, m.H)}
    st = new_state(m)["layers"][0]
    y = scan(m, w, "p.", x, B, C, dt, st)
    want = scan_quadratic(m, -np.exp(w["p.A_log"]), w["p.D"], x, B, C, dt)
    return np.max(np.abs(y - want)) / np.max(np.abs(want))


def self_test():
    rng = np.random.default_rng(7)
    n = 40
    e = self_test_scan(rng)
    ok = e < 1e-12
    print(f"ssm_check self-test scan against its closed form: relative error {e:.1e} "
          f"({'ok' if ok else 'FAIL'})")
    for arch in ("bamba", "mamba2"):
        for conv_bias, proj_bias, G in ((True, False, 2), (False, True, 1)):
            cfg, w = synthetic(arch, rng, conv_bias, proj_bias, G)
            tokens = list(rng.integers(0, cfg["vocab_size"], n))
            whole, _ = forward(cfg, w, tokens)
            scale = np.max(np.abs(whole))
            worst = 0.0
            for k in (1, 3, 4, n // 2, n - 1):
                a, st = forward(cfg, w, tokens[:k])
                b, _ = forward(cfg, w, tokens[k:], st)
                worst = max(worst, np.max(np.abs(np.concatenate([a, b]) - whole)) / scale)
            # The carried state must matter, or the check above proves nothing.
            fresh, _ = forward(cfg, w, tokens[n // 2:])
            carried = np.max(np.abs(fresh - whole[n // 2:])) / scale
            good = worst < 1e-12 and carried > 1e-3
            ok = ok and good
            print(f"ssm_check self-test {arch} conv_bias={conv_bias} proj_bias={proj_bias} "
                  f"groups={G}: split error {worst:.1e}, state effect {carried:.1e} "
                  f"({'ok' if good else 'FAIL'})")
    print("ok" if ok else "FAIL")
    return ok


def task(t):
    """One variant or adapter (a tuple of tasks()) in its own folder under t's tmp: its line
    and whether it failed."""
    kind, b, arch, preset, n, tmp, what = t
    tmp = tempfile.mkdtemp(dir=tmp)
    if kind == "lora":
        err, why = run_adapter(b, arch, preset, what, 64, tmp)
        ok = err is not None and err < LIMIT
        return (f"ssm_check {arch} {preset} LoRA {what}: "
                + (f"relative error {err:.3e}" if err is not None else why)
                + f" ({'ok' if ok else 'FAIL'}, limit {LIMIT:g})"), not ok
    label, extra, cuts = what
    err, why, hint = run(b, arch, preset, extra, n, cuts, tmp, COMPARED.get(preset))
    if err is None:
        return f"ssm_check {arch} {preset} {label}: devio-ref refused the model (FAIL): {why}", True
    ok = err < LIMIT
    return (f"ssm_check {arch} {preset} {label}: relative error {err:.3e} "
            f"({'ok' if ok else 'FAIL'}, limit {LIMIT:g})" + (f"; {hint}" if hint else "")), not ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", help="bazel-bin directory")
    ap.add_argument("--archs", default="bamba,mamba2")
    ap.add_argument("--presets", default="tiny,small")
    ap.add_argument("--tokens", type=int, help="prompt length [300 for tiny, 96 for small]")
    ap.add_argument("--jobs", type=int, default=min(4, os.cpu_count() or 1),
                    help="variants run side by side [the cores, at most 4]")
    ap.add_argument("--self-test", action="store_true",
                    help="check the numpy forward's chunk invariance; needs no devio")
    a = ap.parse_args()
    if a.self_test:
        sys.exit(0 if self_test() else 1)
    if not a.bin:
        ap.error("--bin is required (or --self-test)")
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        # Every variant and adapter a task, a.jobs at a time (one devio-ref and one numpy
        # each), their lines printed in this order.
        tasks, heads = [], {}
        for preset in a.presets.split(","):
            n = a.tokens or DEFAULT_TOKENS.get(preset, 96)
            tail = COMPARED.get(preset)
            heads[len(tasks)] = (f"ssm_check {preset}: {n} tokens per prompt, logits of "
                                 + (f"the last {tail} positions" if tail else "every position")
                                 + " compared")
            for arch in a.archs.split(","):
                tasks += [("variant", a.bin, arch, preset, n, tmp, v) for v in variants(preset, n)]
                tasks += [("lora", a.bin, arch, preset, n, tmp, targets)
                          for targets in (LORA_TARGETS[arch] if preset == "tiny" else [])]
        with multiprocessing.get_context("fork").Pool(max(1, a.jobs)) as pool:
            for i, (line, bad) in enumerate(pool.imap(task, tasks)):
                if i in heads:
                    print(heads[i])
                print(line, flush=True)
                failed += bad
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
