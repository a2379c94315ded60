#!/usr/bin/env python3
"""hf_check.py - devio's reference against an independent forward pass of the Llama family.

Writes models with devio-mkmodel (--arch llama, qwen2, qwen3, mistral, granite),
runs a 300-token prompt through devio-ref and recomputes the same logits with
numpy in float64, following transformers' definitions: RMSNorm, rotate_half
RoPE with its scaling (modeling_rope_utils: linear, llama3, yarn), GQA, a
SiLU-gated MLP, tied or separate lm_head; Qwen2's q/k/v biases, Qwen3's q/k
norms before RoPE, Mistral's sliding window (keys i - W < j <= i), Granite's
embedding, attention, residual and logits multipliers. Tiny models compare
every position's logits; small ones the last 48 (the steps before them ask for
none). Prints the relative error max|devio - numpy| / max|numpy| per variant
and fails above 1e-4, or when devio-ref refuses a model.

Each variant that switches a feature on (a family's own, or a RoPE scaling)
also recomputes numpy with it off and requires the logits to move by more
than 1e-3 relative: a feature devio ignored would fail the first check.

--self-test needs no devio: the llama3 and yarn inverse frequencies against
values worked out by hand, the window mask on a small case and against RoPE's
relativity, Qwen3's q/k norms, Granite's multipliers reducing to Llama.

Variants run side by side in --jobs processes (one BLAS and one devio-ref
thread each); the lines print in order.

usage: hf_check.py --bin DIR [--archs llama,qwen2,...] [--presets tiny,small] [--tokens N]
                   [--jobs N]
       hf_check.py --self-test
Needs only numpy.
"""
import argparse
import json
import math
import multiprocessing
import os
import struct
import subprocess
import sys
import tempfile

if __name__ == "__main__":
    # One BLAS thread per process: --jobs runs the variants side by side.
    for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_v, "1")
import numpy as np  # noqa: E402

LIMIT = 1e-4
EFFECT = 1e-3  # least relative change a switched-on feature must make
ARCHS = ["llama", "qwen2", "qwen3", "mistral", "granite"]
TOKENS = 300
COMPARED = {"tiny": None, "small": 48}  # positions compared: all, or the last N


# ---- weights ----

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


# ---- RoPE (transformers' modeling_rope_utils) ----

def head_dim(cfg):
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


def rope_type(cfg):
    rs = cfg.get("rope_scaling")
    if not rs:
        return "default"
    return rs.get("rope_type", rs.get("type", "default"))


def inv_freq_default(theta, d):
    return 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)


def inv_freq_llama3(rs, inv):
    """Llama 3.1's smooth interpolation between two wavelength bounds."""
    factor, orig = rs["factor"], rs["original_max_position_embeddings"]
    lo_f, hi_f = rs["low_freq_factor"], rs["high_freq_factor"]
    low_wavelen, high_wavelen = orig / lo_f, orig / hi_f
    wavelen = 2 * math.pi / inv
    inv_l = np.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (orig / wavelen - lo_f) / (hi_f - lo_f)
    smoothed = (1 - smooth) * inv_l / factor + smooth * inv_l
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return np.where(medium, smoothed, inv_l)


def yarn_mscale(scale, m=1.0):
    return 0.1 * m * math.log(scale) + 1.0 if scale > 1 else 1.0


def inv_freq_yarn(cfg, rs, theta, d):
    """YaRN: a linear ramp between interpolated and extrapolated frequencies over
    the dimensions the correction range names; returns (inv, attention_factor)."""
    factor = rs["factor"]
    orig = rs.get("original_max_position_embeddings")
    if orig is None:
        orig = cfg["max_position_embeddings"]
    elif cfg["max_position_embeddings"] / orig != factor:
        # transformers 4.x computes with this ratio, 5.x with "factor": only
        # a config where they agree means one thing.
        raise ValueError(f"yarn factor {factor} != max_position_embeddings / "
                         f"original_max_position_embeddings = "
                         f"{cfg['max_position_embeddings'] / orig}")
    att = rs.get("attention_factor")
    if att is None:
        m, m_all = rs.get("mscale"), rs.get("mscale_all_dim")
        att = yarn_mscale(factor, m) / yarn_mscale(factor, m_all) if m and m_all \
            else yarn_mscale(factor)
    beta_fast = rs.get("beta_fast") or 32
    beta_slow = rs.get("beta_slow") or 1

    def correction_dim(rotations):
        return d * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if rs.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(d // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    pos_freqs = theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    extrap, interp = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    keep = 1 - ramp  # the extrapolation factor
    return interp * (1 - keep) + extrap * keep, att


def rope_inv_freq(cfg, d):
    """(inverse frequencies [d/2], attention factor cos and sin are scaled by)."""
    theta = cfg.get("rope_theta", 10000.0)
    rs = cfg.get("rope_scaling")
    kind = rope_type(cfg)
    inv = inv_freq_default(theta, d)
    if kind == "default":
        return inv, 1.0
    if kind == "linear":
        return inv / rs["factor"], 1.0
    if kind == "llama3":
        return inv_freq_llama3(rs, inv), 1.0
    if kind == "yarn":
        return inv_freq_yarn(cfg, rs, theta, d)
    raise ValueError(f"rope_type {kind!r} is not one hf_check computes")


def rope_tables(cfg, d, T):
    inv, att = rope_inv_freq(cfg, d)
    ang = np.outer(np.arange(T, dtype=np.float64), inv)
    cos = np.concatenate([np.cos(ang), np.cos(ang)], axis=-1) * att
    sin = np.concatenate([np.sin(ang), np.sin(ang)], axis=-1) * att
    return cos, sin


# ---- the forward pass ----

def rmsnorm(x, w, eps):
    return w * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps))


def window_of(cfg):
    """Mistral's sliding window (None: every earlier key); Qwen2/3's stays off."""
    if cfg.get("use_sliding_window"):
        raise ValueError("use_sliding_window true is not what devio-mkmodel writes")
    return cfg.get("sliding_window") if cfg.get("model_type") == "mistral" else None


def causal_mask(T, window):
    """0 where query i sees key j (j <= i, and i - W < j with a window), else -inf."""
    i = np.arange(T)[:, None]
    j = np.arange(T)[None, :]
    seen = j <= i
    if window:
        seen &= j > i - window
    return np.where(seen, 0.0, -np.inf)


class Arch:
    """What the forward does beyond Llama, read from config.json; `plain`
    names the features switched off (the same weights without them)."""

    def __init__(self, cfg, plain=()):
        self.d = cfg["hidden_size"]
        self.nh = cfg["num_attention_heads"]
        self.nkv = cfg.get("num_key_value_heads", self.nh)
        self.hd = head_dim(cfg)
        self.eps = cfg.get("rms_norm_eps", 1e-6)
        self.layers = cfg["num_hidden_layers"]
        kind = cfg.get("model_type")
        if "rope_scaling" in plain:
            cfg = dict(cfg, rope_scaling=None)
        self.cfg = cfg
        self.qk_norm = kind == "qwen3" and "qk_norm" not in plain
        self.bias = "bias" not in plain
        self.window = None if "window" in plain else window_of(cfg)
        granite = kind == "granite" and "multipliers" not in plain

        def mult(key, plain_value):
            return cfg[key] if granite and key not in plain else plain_value

        self.emb_mult = mult("embedding_multiplier", 1.0)
        self.res_mult = mult("residual_multiplier", 1.0)
        self.logit_div = mult("logits_scaling", 1.0)
        self.scale = mult("attention_multiplier", 1.0 / math.sqrt(self.hd))


def attention(a, w, p, h, cos, sin, mask):
    T = h.shape[0]
    q = h @ w[p + "self_attn.q_proj.weight"].T
    k = h @ w[p + "self_attn.k_proj.weight"].T
    v = h @ w[p + "self_attn.v_proj.weight"].T
    if a.bias and p + "self_attn.q_proj.bias" in w:
        q = q + w[p + "self_attn.q_proj.bias"]
        k = k + w[p + "self_attn.k_proj.bias"]
        v = v + w[p + "self_attn.v_proj.bias"]
    q = q.reshape(T, a.nh, a.hd)
    k = k.reshape(T, a.nkv, a.hd)
    v = v.reshape(T, a.nkv, a.hd)
    if a.qk_norm:  # Qwen3: per head, before RoPE
        q = rmsnorm(q, w[p + "self_attn.q_norm.weight"], a.eps)
        k = rmsnorm(k, w[p + "self_attn.k_norm.weight"], a.eps)
    half = a.hd // 2

    def rope(x):
        rot = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
        return x * cos[:, None, :] + rot * sin[:, None, :]

    q, k = rope(q), rope(k)
    rep = a.nh // a.nkv
    k = np.repeat(k, rep, axis=1)
    v = np.repeat(v, rep, axis=1)
    s = np.einsum("thd,shd->hts", q, k) * a.scale + mask
    s = np.exp(s - s.max(axis=-1, keepdims=True))
    s = s / s.sum(axis=-1, keepdims=True)
    o = np.einsum("hts,shd->thd", s, v).reshape(T, a.nh * a.hd)
    return o @ w[p + "self_attn.o_proj.weight"].T


def forward(cfg, w, tokens, tail=None, plain=()):
    """Logits of every position, or of the last `tail`; `plain`: features off
    ("rope_scaling", "qk_norm", "window", "bias", "multipliers" or one of
    Granite's four by its config key)."""
    a = Arch(cfg, plain)
    T = len(tokens)
    cos, sin = rope_tables(a.cfg, a.hd, T)
    mask = causal_mask(T, a.window)
    x = w["model.embed_tokens.weight"][tokens] * a.emb_mult
    for i in range(a.layers):
        p = f"model.layers.{i}."
        h = rmsnorm(x, w[p + "input_layernorm.weight"], a.eps)
        x = x + attention(a, w, p, h, cos, sin, mask) * a.res_mult
        h = rmsnorm(x, w[p + "post_attention_layernorm.weight"], a.eps)
        g = h @ w[p + "mlp.gate_proj.weight"].T
        u = h @ w[p + "mlp.up_proj.weight"].T
        x = x + ((g / (1.0 + np.exp(-g))) * u) @ w[p + "mlp.down_proj.weight"].T * a.res_mult
    if tail:
        x = x[T - tail:]
    x = rmsnorm(x, w["model.norm.weight"], a.eps)
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    return (x @ head.T) / a.logit_div


def rel(got, want):
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


# ---- against devio-ref ----

def prompt(vocab, n):
    return [(i * 7919 + 13) % vocab for i in range(n)]


def mkmodel(bin_dir, args):
    subprocess.run([os.path.join(bin_dir, "tools", "mkmodel", "devio-mkmodel")] + args,
                   check=True, stdout=subprocess.DEVNULL)


def devio_logits(bin_dir, mdir, tokens, tail=None, adapter=None, threads=0):
    """devio-ref's logits of the prompt (of its last `tail` positions: the
    steps before ask for none), or (None, why) when it refuses. adapter:
    (root, path) of a PEFT adapter the rows run with."""
    script = mdir + ".jsonl"
    row = {"seq": "$s"}
    extra, skip = [], 1
    first = len(tokens) - tail if tail else 0
    chunks = [(tokens[:first], "none")] if first else []
    chunks.append((tokens[first:], "all"))
    with open(script, "w") as f:
        if adapter:
            f.write(json.dumps({"op": "lora", "cmd": {"kind": "load", "name": "x",
                                                      "path": adapter[1]}}) + "\n")
            row["adapter"] = "x"
            extra, skip = ["--adapters", adapter[0]], 2
        f.write('{"op":"create","as":"s"}\n')
        for toks, logits in chunks:
            f.write(json.dumps({"op": "step", "full": True, "plan": {"rows": [
                dict(row, tokens=toks, logits=logits)]}}) + "\n")
    r = subprocess.run([os.path.join(bin_dir, "ref", "devio-ref"), "--model", mdir,
                        "--threads", str(threads), "--logits-rows", str(max(256, len(tokens)))]
                       + extra + [script], capture_output=True, text=True)
    lines = r.stdout.splitlines()
    res = [json.loads(line) for line in lines[skip:skip + len(chunks)]]
    if r.returncode != 0 or len(res) < len(chunks) or not all(x.get("ok") for x in res):
        bad = [x for x in res if not x.get("ok")]
        why = json.dumps(bad[0].get("error")) if bad else (r.stderr.strip() or "no output")
        return None, why[:300]
    lg = res[-1]["result"]["rows"][0]["logits"]
    return np.array(lg["values"], dtype=np.float64).reshape(lg["shape"]), None


# The features each family adds to Llama, each switched off to see it matter.
FAMILY_FEATURES = {"qwen2": ("bias",), "qwen3": ("qk_norm",), "mistral": ("window",),
                   "granite": ("embedding_multiplier", "attention_multiplier",
                               "residual_multiplier", "logits_scaling")}
# Granite's own attention_multiplier leaves attention nearly uniform on random
# weights, and RoPE with it: its RoPE variants sharpen attention to see RoPE.
ROPE_EXTRA = {"granite": ["--attention-multiplier", "0.5"]}


def variants(arch, preset):
    """(label, extra flags, features the variant switches on)."""
    tied = {"tiny": False, "small": arch != "mistral"}[preset]
    untie = "--tied=false" if tied else "--tied"
    out = [("f32", [], FAMILY_FEATURES.get(arch, ())),
           ("bf16", ["--dtype", "bf16"], ()),
           ("f16", ["--dtype", "f16"], ()),
           (untie, [untie], ())]
    for kind in ("linear", "llama3", "yarn"):
        extra = ["--rope-scaling", kind] + ROPE_EXTRA.get(arch, [])
        out.append((" ".join(extra), extra, ("rope_scaling",)))
    if arch == "llama":
        out.append(("--tied --bias --head-dim 24", ["--tied", "--bias", "--head-dim", "24"],
                    ("bias",)))
    if arch == "mistral":
        out.append(("--window 0", ["--window", "0"], ()))
    return out


# LoRA rows per family: llama two adapters (tiny and small), the others one on q and v (tiny).
LORA = {"llama": [["--rank", "8", "--alpha", "16", "--targets", "q_proj,v_proj"],
                  ["--rank", "16", "--alpha", "32", "--rslora", "--dtype", "bf16", "--targets",
                   "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"]]}
LORA_OTHER = [["--rank", "8", "--alpha", "16", "--targets", "q_proj,v_proj"]]


class Task:
    """One line of the report: a model variant, or a LoRA row on a model."""

    def __init__(self, opts, arch, preset, label, extra, features=(), lora=None):
        self.bin, self.tmp, self.n = opts.bin, opts.tmp, opts.tokens
        self.threads = 1 if opts.jobs > 1 else 0
        self.arch, self.preset, self.extra, self.features = arch, preset, extra, features
        self.lora = lora
        self.tail = COMPARED.get(preset)
        self.label = f"{arch} {preset} " + (f"LoRA {' '.join(lora)}" if lora else label)
        self.mdir = os.path.join(self.tmp, "-".join(
            [arch, preset] + [x.strip("-").replace("=", "").replace(",", "_")
                              for x in extra + (["lora"] + lora if lora else [])]))


def run_task(t):
    """(label, devio's relative error or None, [(feature, effect)], why refused)."""
    seed = "6" if t.lora else "5"
    mkmodel(t.bin, ["--arch", t.arch, "--preset", t.preset, "--seed", seed, "--out", t.mdir]
            + t.extra)
    cfg, w = load(t.mdir)
    tokens = prompt(cfg["vocab_size"], t.n)
    adapter = None
    if t.lora:
        adapter = (t.mdir + "-adapters", "a")
        mkmodel(t.bin, ["--adapter", "--model", t.mdir, "--seed", "9", "--out",
                        os.path.join(*adapter)] + t.lora)
        base = w
        w = merge_adapter(cfg, w, os.path.join(*adapter))
    want = forward(cfg, w, tokens, t.tail)
    effects = [(f, rel(forward(cfg, w, tokens, t.tail, plain=(f,)), want)) for f in t.features]
    if t.lora:
        effects.append(("the adapter", rel(forward(cfg, base, tokens, t.tail), want)))
    got, why = devio_logits(t.bin, t.mdir, tokens, t.tail, adapter, t.threads)
    return t.label, (None if got is None else rel(got, want)), effects, why


def report(label, err, effects, why):
    """Prints one task's line; True when it passed."""
    note, moved = "", True
    if effects:
        f, e = min(effects, key=lambda fe: fe[1])
        moved = e > EFFECT
        names = ", ".join(x for x, _ in effects)
        note = (f"; without {f}: {e:.3e}" if len(effects) == 1 else
                f"; without each of {names}: at least {e:.3e} ({f})")
        note += "" if moved else f" (FAIL: not above {EFFECT:g})"
    if err is None:
        print(f"hf_check {label}: devio-ref refused the model (FAIL): {why}{note}")
        return False
    print(f"hf_check {label}: relative error {err:.3e} ({'ok' if err < LIMIT else 'FAIL'}, "
          f"limit {LIMIT:g}){note}")
    return err < LIMIT and moved


def tasks(a):
    for preset in a.presets.split(","):
        for arch in a.archs.split(","):
            for label, extra, features in variants(arch, preset):
                yield Task(a, arch, preset, label, extra, features)
            for lora in LORA.get(arch, LORA_OTHER if preset == "tiny" else []):
                yield Task(a, arch, preset, None, [], lora=lora)


def check_all(a):
    """Runs every task, a.jobs at a time, and prints their lines in order;
    the number that failed."""
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        a.tmp = tmp
        variants_to_run = list(tasks(a))
        with multiprocessing.get_context("fork").Pool(a.jobs) as pool:
            preset = None
            for t, (label, err, effects, why) in zip(variants_to_run, pool.imap(run_task, variants_to_run)):
                if t.preset != preset:
                    preset, tail = t.preset, t.tail
                    print(f"hf_check {preset}: {a.tokens} tokens per prompt, logits of "
                          + (f"the last {tail} positions" if tail else "every position")
                          + " compared", flush=True)
                failed += not report(label, err, effects, why)
                sys.stdout.flush()
    return failed


# ---- self-test: the numpy side on its own ----

def synthetic(model_type, rng, layers=2, extra=None):
    """A small config of `model_type` and weights of the shapes and ranges
    devio-mkmodel writes."""
    d, V, nh, nkv, hd, f = 32, 64, 4, 2, 8, 48
    cfg = {"model_type": model_type, "hidden_size": d, "num_attention_heads": nh,
           "num_key_value_heads": nkv, "head_dim": hd, "num_hidden_layers": layers,
           "vocab_size": V, "intermediate_size": f, "rms_norm_eps": 1e-6,
           "rope_theta": 10000.0, "max_position_embeddings": 512, "rope_scaling": None}
    cfg.update(extra or {})
    u = lambda *s: rng.uniform(-1.0, 1.0, s)  # noqa: E731
    w = {"model.embed_tokens.weight": u(V, d) / np.sqrt(d), "model.norm.weight": 1 + 0.1 * u(d),
         "lm_head.weight": u(V, d) / np.sqrt(d)}
    for i in range(layers):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = 1 + 0.1 * u(d)
        w[p + "post_attention_layernorm.weight"] = 1 + 0.1 * u(d)
        for n, o, k in (("q", nh * hd, d), ("k", nkv * hd, d), ("v", nkv * hd, d),
                        ("o", d, nh * hd)):
            w[p + f"self_attn.{n}_proj.weight"] = u(o, k) / np.sqrt(k)
        w[p + "self_attn.q_norm.weight"] = 1 + 0.1 * u(hd)
        w[p + "self_attn.k_norm.weight"] = 1 + 0.1 * u(hd)
        w[p + "mlp.gate_proj.weight"] = u(f, d) / np.sqrt(d)
        w[p + "mlp.up_proj.weight"] = u(f, d) / np.sqrt(d)
        w[p + "mlp.down_proj.weight"] = u(d, f) / np.sqrt(f)
    return cfg, w


def self_test_rope():
    """rope_inv_freq on head_dim 16, theta 10000, factor 8, original max 64,
    against the values worked out index by index (inv_i = 10^(-i/2))."""
    cfg = {"hidden_size": 64, "num_attention_heads": 4, "head_dim": 16, "rope_theta": 10000.0,
           "max_position_embeddings": 512}
    inv = [10 ** (-i / 2) for i in range(8)]
    # llama3 (low 1, high 4): wavelengths 2 pi 10^(i/2) = 6.28, 19.9, 62.8, 199, ...;
    # 6.28 < 16 stays; 19.9 and 62.8 lie in [16, 64] and are smoothed with
    # s = (64 / wavelength - 1) / 3; from 199 on they are divided by 8.
    s1 = (64 / (2 * math.pi * 10 ** 0.5) - 1) / 3
    s2 = (64 / (2 * math.pi * 10) - 1) / 3
    llama3 = {0: inv[0], 1: (1 - s1) * inv[1] / 8 + s1 * inv[1],
              2: (1 - s2) * inv[2] / 8 + s2 * inv[2], 3: inv[3] / 8, 7: inv[7] / 8}
    # yarn (beta 32 and 1): the correction dims 16 ln(64 / (32 * 2 pi)) / (2 ln 1e4) = -0.99
    # and 16 ln(64 / (2 pi)) / (2 ln 1e4) = 2.02 give low 0 (floor, clamped) and high 3
    # (ceil); index i keeps 1 - i/3 of its own frequency, the rest divided by 8.
    yarn = {0: inv[0], 1: inv[1] * (2 / 3 + (1 / 3) / 8), 2: inv[2] * (1 / 3 + (2 / 3) / 8),
            3: inv[3] / 8, 6: inv[6] / 8}
    cases = [("llama3", {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
              llama3, 1.0),
             ("yarn", {"rope_type": "yarn", "factor": 8.0, "beta_fast": 32.0, "beta_slow": 1.0,
                       "original_max_position_embeddings": 64}, yarn,
              0.1 * math.log(8) + 1),
             ("yarn mscale", {"rope_type": "yarn", "factor": 8.0, "mscale": 0.707,
                              "mscale_all_dim": 0.707}, None, 1.0),
             ("yarn attention_factor", {"rope_type": "yarn", "factor": 8.0,
                                        "attention_factor": 0.5}, None, 0.5),
             ("linear", {"rope_type": "linear", "factor": 4.0},
              {i: inv[i] / 4 for i in range(8)}, 1.0),
             ("default", None, {i: inv[i] for i in range(8)}, 1.0)]
    ok = True
    for name, rs, want, want_att in cases:
        got, att = rope_inv_freq(dict(cfg, rope_scaling=rs), 16)
        worst = max([abs(got[i] - v) / v for i, v in (want or {}).items()] + [0.0])
        good = worst < 1e-12 and abs(att - want_att) < 1e-15
        if rs and rs["rope_type"] != "linear" and want:
            # some frequencies change and some do not: the scaled band is crossed
            changed = np.abs(got / inv_freq_default(10000.0, 16) - 1) > 1e-9
            good = good and 0 < changed.sum() < 8
        ok = ok and good
        print(f"hf_check self-test inv_freq {name}: error {worst:.1e}, attention factor "
              f"{att:.6f} ({'ok' if good else 'FAIL'})")
    try:  # a yarn factor transformers 4.x and 5.x read differently is refused
        rope_inv_freq(dict(cfg, rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                              "original_max_position_embeddings": 64}), 16)
        ok = False
        print("hf_check self-test yarn factor != max / original: accepted (FAIL)")
    except ValueError:
        pass
    return ok


def self_test_window(rng):
    """The mask on 5 positions with window 2, and a 1-layer Mistral: with window W
    the last logits equal those of the last W tokens alone (RoPE is relative)."""
    want = np.array([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 1, 1, 0, 0], [0, 0, 1, 1, 0],
                     [0, 0, 0, 1, 1]], dtype=bool)
    good_mask = np.array_equal(causal_mask(5, 2) == 0, want) and \
        np.array_equal(causal_mask(5, None) == 0, np.tril(np.ones((5, 5), dtype=bool)))
    W = 6
    for rs in (None, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64}):
        cfg, w = synthetic("mistral", rng, layers=1, extra={"sliding_window": W,
                                                            "rope_scaling": rs})
        tokens = list(rng.integers(0, cfg["vocab_size"], 30))
        full = forward(cfg, w, tokens)[-1]
        alone = forward(cfg, w, tokens[-W:])[-1]
        unwindowed = forward(cfg, w, tokens, plain=("window",))[-1]
        e, moved = rel(full, alone), rel(unwindowed, full)
        good = good_mask and e < 1e-12 and moved > EFFECT
        print(f"hf_check self-test window {W} ({rope_type(cfg)} RoPE): against the last {W} "
              f"tokens alone {e:.1e}, without the window {moved:.1e} "
              f"({'ok' if good else 'FAIL'})")
        if not good:
            return False
    return True


def self_test_families(rng):
    """Qwen3's q/k norms make q_proj's and k_proj's scale irrelevant (they matter
    without them); Granite with multipliers 1, 1/sqrt(head_dim), 1, s is Llama's
    logits / s."""
    ok = True
    cfg, w = synthetic("qwen3", rng, extra={"rms_norm_eps": 1e-30})
    tokens = list(rng.integers(0, cfg["vocab_size"], 20))
    base = forward(cfg, w, tokens)
    w2 = dict(w)
    for i in range(cfg["num_hidden_layers"]):
        for name, by in (("q_proj", 3.0), ("k_proj", 0.5)):
            key = f"model.layers.{i}.self_attn.{name}.weight"
            w2[key] = by * w[key]
    e = rel(forward(cfg, w2, tokens), base)
    moved = rel(forward(cfg, w2, tokens, plain=("qk_norm",)),
                forward(cfg, w, tokens, plain=("qk_norm",)))
    good = e < 1e-12 and moved > EFFECT
    ok = ok and good
    print(f"hf_check self-test qwen3 q/k norms: q x3, k x0.5 change {e:.1e}, "
          f"without the norms {moved:.1e} ({'ok' if good else 'FAIL'})")
    lcfg, w = synthetic("llama", rng)
    gcfg = dict(lcfg, model_type="granite", embedding_multiplier=1.0, residual_multiplier=1.0,
                attention_multiplier=1 / math.sqrt(head_dim(lcfg)), logits_scaling=4.0)
    e = rel(forward(gcfg, w, tokens) * 4.0, forward(lcfg, w, tokens))
    g2 = dict(gcfg, embedding_multiplier=12.0, residual_multiplier=0.22,
              attention_multiplier=0.0078125)
    moved = rel(forward(g2, w, tokens), forward(g2, w, tokens, plain=("multipliers",)))
    good = e < 1e-12 and moved > EFFECT
    ok = ok and good
    print(f"hf_check self-test granite multipliers: reduced to llama {e:.1e}, Granite 3's "
          f"against none {moved:.1e} ({'ok' if good else 'FAIL'})")
    return ok


def self_test():
    rng = np.random.default_rng(11)
    ok = self_test_rope()
    ok = self_test_window(rng) and ok
    ok = self_test_families(rng) and ok
    print("ok" if ok else "FAIL")
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", help="bazel-bin directory")
    ap.add_argument("--archs", default=",".join(ARCHS))
    ap.add_argument("--presets", default="tiny,small")
    ap.add_argument("--tokens", type=int, default=TOKENS, help=f"prompt length [{TOKENS}]")
    ap.add_argument("--jobs", type=int, default=min(4, os.cpu_count() or 1),
                    help="variants run side by side [the cores, at most 4]")
    ap.add_argument("--self-test", action="store_true",
                    help="check the numpy forward on its own; needs no devio")
    a = ap.parse_args()
    if a.self_test:
        sys.exit(0 if self_test() else 1)
    if not a.bin:
        ap.error("--bin is required (or --self-test)")
    sys.exit(1 if check_all(a) else 0)


if __name__ == "__main__":
    main()
