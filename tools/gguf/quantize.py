#!/usr/bin/env python3
"""quantize.py - devio's own GGUF quantizers, requantization and Hugging Face conversion.

    quantize.py requant IN.gguf OUT.gguf --type T
    quantize.py from-hf HF_DIR OUT.gguf [--type T]

T is one of F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q4_K Q5_K Q6_K Q4_K_M.

The quantizers round to nearest with a simple per-block scale (the block's
largest magnitude, or its range for the types with a minimum). They aim at
valid, deterministic blocks, not at the smallest error: the same input gives
the same bytes on every machine (numpy's IEEE float32 arithmetic, ties to even).

Which type a tensor gets:
- 1-D tensors (norm weights) are F32;
- other tensors get T; when T is a K type (blocks of 256) and a row's length is
  not a multiple of 256, Q4_K falls back to Q5_0 and Q5_K and Q6_K to Q8_0; when
  a row is not whole blocks of 32 either, the tensor is F16;
- Q4_K_M is Q4_K except Q6_K for attn_v, ffn_down, token_embd and output, with
  the same fallbacks.

from-hf reads a Llama-family directory (config.json and model.safetensors, or
shards with model.safetensors.index.json; F32, F16 or BF16 weights), writes
llama.cpp's tensor names and llama.* metadata, and reorders the rows of every
attn_q and attn_k as llama.cpp's converter does: within each head of hd rows,
GGUF row 2*i + j is Hugging Face row j*(hd/2) + i. It writes no vocabulary:
tokenizer.ggml.model is "none" and there are no token lists.
"""
import argparse
import json
import os
import re
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_file as gf  # noqa: E402

F32_ = np.float32


# ---- scalar helpers ---------------------------------------------------------

def _as_f16(x):
    """f32 values -> (f16 bits as [n, 2] uint8, the f16 values widened back to f32)."""
    h = np.asarray(x, np.float32).astype(np.float16)
    return h.reshape(-1, 1).view(np.uint8).reshape(-1, 2), h.astype(np.float32)


def _inverse(d):
    """1/d where d is nonzero, else 0 (f32)."""
    out = np.zeros_like(d, dtype=np.float32)
    nz = d != 0
    out[nz] = np.float32(1) / d[nz]
    return out


def _round(x, lo, hi):
    return np.clip(np.rint(x), lo, hi).astype(np.int32)


def _pack_nibbles(q):
    """[n, 32] values 0..15 -> [n, 16] bytes: element j in the low nibble of byte j,
    element j+16 in its high nibble."""
    q = q.astype(np.uint8)
    return q[:, :16] | (q[:, 16:] << 4)


def _pack_q5_high(q):
    """[n, 32] values 0..31 -> [n, 4] bytes of a little-endian uint32 of their bit 4."""
    return np.packbits((q >> 4).astype(np.uint8), axis=1, bitorder="little")


# ---- 32-element blocks ------------------------------------------------------

def _blocks(x, bs):
    x = np.asarray(x, np.float32)
    if not np.all(np.isfinite(x)):
        raise ValueError("values to quantize must be finite")
    if x.size % bs:
        raise ValueError(f"{x.size} values are not whole blocks of {bs}")
    return x.reshape(-1, bs)


def q8_0(x):
    b = _blocks(x, 32)
    dbits, d = _as_f16(np.abs(b).max(axis=1) / F32_(127))
    q = _round(b * _inverse(d)[:, None], -127, 127)
    return np.concatenate([dbits, q.astype(np.int8).view(np.uint8)], axis=1)


def q4_0(x):
    b = _blocks(x, 32)
    dbits, d = _as_f16(np.abs(b).max(axis=1) / F32_(7))
    q = _round(b * _inverse(d)[:, None], -8, 7) + 8
    return np.concatenate([dbits, _pack_nibbles(q)], axis=1)


def q5_0(x):
    b = _blocks(x, 32)
    dbits, d = _as_f16(np.abs(b).max(axis=1) / F32_(15))
    q = _round(b * _inverse(d)[:, None], -16, 15) + 16
    return np.concatenate([dbits, _pack_q5_high(q), _pack_nibbles(q & 15)], axis=1)


def _affine(b, levels):
    lo, hi = b.min(axis=1), b.max(axis=1)
    dbits, d = _as_f16((hi - lo) / F32_(levels))
    mbits, m = _as_f16(lo)
    q = _round((b - m[:, None]) * _inverse(d)[:, None], 0, levels)
    return dbits, mbits, q


def q4_1(x):
    dbits, mbits, q = _affine(_blocks(x, 32), 15)
    return np.concatenate([dbits, mbits, _pack_nibbles(q)], axis=1)


def q5_1(x):
    dbits, mbits, q = _affine(_blocks(x, 32), 31)
    return np.concatenate([dbits, mbits, _pack_q5_high(q), _pack_nibbles(q & 15)], axis=1)


# ---- 256-element K blocks ---------------------------------------------------

def pack_k_scales(sc, mn):
    """[n, 8] 6-bit scales and mins -> the 12 bytes Q4_K and Q5_K keep them in."""
    sc = sc.astype(np.uint8)
    mn = mn.astype(np.uint8)
    out = np.empty((sc.shape[0], 12), np.uint8)
    out[:, 0:4] = (sc[:, :4] & 63) | ((sc[:, 4:] >> 4) << 6)
    out[:, 4:8] = (mn[:, :4] & 63) | ((mn[:, 4:] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:] & 15) | ((mn[:, 4:] & 15) << 4)
    return out


def _k_affine(x, levels):
    """Sub-blocks of 32 with y = d1*q - m1: returns d, dmin bits, packed scales and q [n, 8, 32]."""
    b = _blocks(x, 256).reshape(-1, 8, 32)
    lo = np.minimum(b.min(axis=2), F32_(0))            # [n, 8], <= 0
    s = (b.max(axis=2) - lo) / F32_(levels)             # sub-block steps, >= 0
    mv = -lo                                            # sub-block offsets, >= 0
    dbits, d = _as_f16(s.max(axis=1) / F32_(63))
    mbits, dmin = _as_f16(mv.max(axis=1) / F32_(63))
    sc = _round(s * _inverse(d)[:, None], 0, 63)
    mn = _round(mv * _inverse(dmin)[:, None], 0, 63)
    d1 = d[:, None] * sc.astype(np.float32)
    m1 = dmin[:, None] * mn.astype(np.float32)
    q = _round((b + m1[:, :, None]) * _inverse(d1)[:, :, None], 0, levels)
    return dbits, mbits, pack_k_scales(sc, mn), q


def _k_pack_low(q):
    """[n, 8, 32] -> [n, 128]: bytes 32c..32c+31 hold sub-block 2c (low nibbles)
    and 2c+1 (high nibbles)."""
    q = (q & 15).astype(np.uint8).reshape(-1, 4, 2, 32)
    return (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(-1, 128)


def q4_k(x):
    dbits, mbits, scales, q = _k_affine(x, 15)
    return np.concatenate([dbits, mbits, scales, _k_pack_low(q)], axis=1)


def q5_k(x):
    dbits, mbits, scales, q = _k_affine(x, 31)
    hi = (q >> 4).astype(np.uint8).transpose(0, 2, 1)      # [n, 32 (l), 8 (sub-block)]
    qh = np.packbits(hi, axis=2, bitorder="little").reshape(-1, 32)
    return np.concatenate([dbits, mbits, scales, qh, _k_pack_low(q)], axis=1)


def q6_k(x):
    b = _blocks(x, 256).reshape(-1, 16, 16)
    s = np.abs(b).max(axis=2) / F32_(31)                # [n, 16]
    dbits, d = _as_f16(s.max(axis=1) / F32_(127))
    sc = _round(s * _inverse(d)[:, None], 0, 127)
    ds = d[:, None] * sc.astype(np.float32)
    q = (_round(b * _inverse(ds)[:, :, None], -32, 31) + 32).astype(np.uint8)
    q = q.reshape(-1, 2, 4, 32)                        # [n, half, quarter, l]
    ql = np.concatenate([q[:, :, 0] & 15 | (q[:, :, 2] & 15) << 4,
                         q[:, :, 1] & 15 | (q[:, :, 3] & 15) << 4], axis=2)  # [n, 2, 64]
    qh = (q[:, :, 0] >> 4) | (q[:, :, 1] >> 4) << 2 | (q[:, :, 2] >> 4) << 4 | \
        (q[:, :, 3] >> 4) << 6                          # [n, 2, 32]
    return np.concatenate([ql.reshape(-1, 128), qh.reshape(-1, 64),
                           sc.astype(np.int8).view(np.uint8), dbits], axis=1)


# ---- float types ------------------------------------------------------------

def f32(x):
    return np.ascontiguousarray(np.asarray(x, "<f4")).reshape(-1).view(np.uint8)


def f16(x):
    return np.asarray(x, np.float32).astype("<f2").reshape(-1).view(np.uint8)


def bf16(x):
    """Round to nearest, ties to even; NaN stays a quiet NaN."""
    u = np.asarray(x, np.float32).reshape(-1).view(np.uint32)
    r = ((u + np.uint32(0x7FFF) + ((u >> 16) & 1)) >> 16).astype("<u2")
    nan = np.isnan(np.asarray(x, np.float32).reshape(-1))
    r[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return r.view(np.uint8)


QUANTIZERS = {
    gf.F32: f32, gf.F16: f16, gf.BF16: bf16, gf.Q8_0: q8_0, gf.Q4_0: q4_0, gf.Q4_1: q4_1,
    gf.Q5_0: q5_0, gf.Q5_1: q5_1, gf.Q4_K: q4_k, gf.Q5_K: q5_k, gf.Q6_K: q6_k,
}


def quantize(x, tid):
    """float values [rows, row_len] -> the encoded bytes (uint8, rows * row bytes)."""
    x = np.asarray(x, np.float32)
    gf.row_bytes(tid, x.shape[-1] if x.ndim else 1)  # whole blocks per row
    if tid not in QUANTIZERS:
        raise ValueError(f"no quantizer for {gf.type_name(tid)}")
    return np.ascontiguousarray(QUANTIZERS[tid](x)).reshape(-1)


# ---- choosing a type per tensor ---------------------------------------------

# llama.cpp's llama_ftype numbers for general.file_type
FILE_TYPES = {
    "F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9,
    "Q4_K": 14, "Q4_K_M": 15, "Q5_K": 16, "Q6_K": 18, "BF16": 32,
}
TARGETS = tuple(FILE_TYPES)
_K_FALLBACK = {gf.Q4_K: gf.Q5_0, gf.Q5_K: gf.Q8_0, gf.Q6_K: gf.Q8_0}
_M_SIX = re.compile(r"(^|\.)(attn_v|ffn_down)\.weight$|^(token_embd|output)\.weight$")


def choose_type(name, dims, target):
    """The ggml type a tensor named name with dims (ne0 first) gets under target."""
    if len(dims) <= 1:
        return gf.F32
    if target == "Q4_K_M":
        tid = gf.Q6_K if _M_SIX.search(name) else gf.Q4_K
    else:
        tid = gf.TYPE_IDS[target]
    row = dims[0]
    if tid in _K_FALLBACK and row % 256:
        tid = _K_FALLBACK[tid]
    if gf.TYPES[tid][1] > 1 and row % gf.TYPES[tid][1]:
        tid = gf.F16
    return tid


def _encode_tensor(name, dims, values, target, counts):
    tid = choose_type(name, dims, target)
    counts[gf.type_name(tid)] = counts.get(gf.type_name(tid), 0) + 1
    return gf.TensorData(name, tid, tuple(dims), quantize(values.reshape(-1, dims[0]), tid))


# ---- requant ----------------------------------------------------------------

def requant(src, dst, target, log=sys.stderr):
    f = gf.read(src)
    meta = dict(f.fields)
    meta["general.file_type"] = gf.u32(FILE_TYPES[target])
    counts, out = {}, []
    for t in f.tensors:
        out.append(_encode_tensor(t.name, t.dims, gf.dequantize(t), target, counts))
    gf.write(dst, meta, out, alignment=f.alignment)
    print(f"{dst}: {len(out)} tensors: " +
          ", ".join(f"{k} x{v}" for k, v in sorted(counts.items())), file=log)


# ---- Hugging Face --------------------------------------------------------------

_ST_DTYPES = {"F32": "<f4", "F16": "<f2", "BF16": "<u2"}


def read_safetensors(path):
    """{name: float32 array} of one safetensors file (F32, F16 or BF16)."""
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(n))
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dt = info["dtype"]
        if dt not in _ST_DTYPES:
            raise ValueError(f"{path}: {name}: dtype {dt} (F32, F16 and BF16 are read)")
        a, b = info["data_offsets"]
        v = raw[base + a:base + b].view(_ST_DTYPES[dt])
        if dt == "BF16":
            v = (v.astype(np.uint32) << 16).view(np.float32)
        else:
            v = v.astype(np.float32)
        shape = info["shape"]
        if v.size != int(np.prod(shape, dtype=np.int64)):
            raise ValueError(f"{path}: {name}: {v.size} values for shape {shape}")
        out[name] = v.reshape(shape)
    return out


def read_hf_weights(d):
    index = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as fh:
            files = sorted(set(json.load(fh)["weight_map"].values()))
        out = {}
        for name in files:
            out.update(read_safetensors(os.path.join(d, name)))
        return out
    return read_safetensors(os.path.join(d, "model.safetensors"))


# Hugging Face's tensor names and llama.cpp's (tools/bench/llama_gguf.py uses these too).
LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
TOP_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight"}


def gguf_name(hf):
    if hf in TOP_NAMES:
        return TOP_NAMES[hf]
    m = re.match(r"model\.layers\.(\d+)\.(.+)$", hf)
    if m and m.group(2) in LAYER_NAMES:
        return f"blk.{m.group(1)}.{LAYER_NAMES[m.group(2)]}"
    return None


def permute_rows(w, heads):
    """Hugging Face's rotate-half rows -> llama.cpp's adjacent pairs: within each
    head of hd rows, new row 2*i + j is old row j*(hd/2) + i."""
    rows = w.shape[0]
    hd = rows // heads
    return w.reshape(heads, 2, hd // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_metadata(cfg, name, target):
    arch = cfg.get("architectures") or ["LlamaForCausalLM"]
    if arch[0] != "LlamaForCausalLM":
        raise ValueError(f"architecture {arch[0]}: from-hf converts LlamaForCausalLM")
    if cfg.get("rope_scaling"):
        raise ValueError("rope_scaling is set: from-hf converts plain RoPE only")
    if cfg.get("attention_bias") or cfg.get("mlp_bias"):
        raise ValueError("attention or MLP biases: from-hf converts Llama without biases")
    if cfg.get("hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act {cfg['hidden_act']}: from-hf converts SiLU models")
    h = cfg["hidden_size"]
    heads = cfg["num_attention_heads"]
    hd = cfg.get("head_dim") or h // heads
    m = {
        "general.architecture": gf.string("llama"),
        "general.name": gf.string(name),
        "general.file_type": gf.u32(FILE_TYPES[target]),
        "llama.context_length": gf.u32(cfg.get("max_position_embeddings", 2048)),
        "llama.embedding_length": gf.u32(h),
        "llama.block_count": gf.u32(cfg["num_hidden_layers"]),
        "llama.feed_forward_length": gf.u32(cfg["intermediate_size"]),
        "llama.attention.head_count": gf.u32(heads),
        "llama.attention.head_count_kv": gf.u32(cfg.get("num_key_value_heads") or heads),
        "llama.rope.freq_base": gf.f32(cfg.get("rope_theta", 10000.0)),
        "llama.attention.layer_norm_rms_epsilon": gf.f32(cfg.get("rms_norm_eps", 1e-6)),
        "llama.rope.dimension_count": gf.u32(hd),
        "llama.vocab_size": gf.u32(cfg["vocab_size"]),
    }
    if hd != h // heads:
        m["llama.attention.key_length"] = gf.u32(hd)
        m["llama.attention.value_length"] = gf.u32(hd)
    m["tokenizer.ggml.model"] = gf.string("none")
    for key, hf_key in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id")):
        if isinstance(cfg.get(hf_key), int):
            m[f"tokenizer.ggml.{key}"] = gf.u32(cfg[hf_key])
    return m


def from_hf(src, dst, target, log=sys.stderr):
    with open(os.path.join(src, "config.json")) as fh:
        cfg = json.load(fh)
    meta = hf_metadata(cfg, os.path.basename(os.path.normpath(src)), target)
    weights = read_hf_weights(src)
    heads = cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads") or heads
    tied = "lm_head.weight" not in weights
    if cfg.get("tie_word_embeddings") is False and tied:
        raise ValueError("tie_word_embeddings is false but there is no lm_head.weight")
    order = ["model.embed_tokens.weight"]
    for i in range(cfg["num_hidden_layers"]):
        order += [f"model.layers.{i}.{k}" for k in LAYER_NAMES]
    order += ["model.norm.weight"] + ([] if tied else ["lm_head.weight"])
    unknown = sorted(set(weights) - set(order))
    if unknown:
        raise ValueError(f"{src}: tensors from-hf does not convert: {', '.join(unknown[:5])}")
    counts, out = {}, []
    for hf in order:
        if hf not in weights:
            raise ValueError(f"{src}: tensor {hf} is missing")
        w = weights[hf]
        if hf.endswith("q_proj.weight"):
            w = permute_rows(w, heads)
        elif hf.endswith("k_proj.weight"):
            w = permute_rows(w, kv)
        dims = tuple(reversed(w.shape))
        out.append(_encode_tensor(gguf_name(hf), dims, w, target, counts))
    gf.write(dst, meta, out)
    print(f"{dst}: {len(out)} tensors: " +
          ", ".join(f"{k} x{v}" for k, v in sorted(counts.items())), file=log)


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("requant", help="dequantize every tensor of a GGUF and write it as --type")
    r.add_argument("src")
    r.add_argument("dst")
    r.add_argument("--type", required=True, choices=TARGETS)
    h = sub.add_parser("from-hf", help="convert a Hugging Face Llama directory to GGUF")
    h.add_argument("src")
    h.add_argument("dst")
    h.add_argument("--type", default="F32", choices=TARGETS)
    a = p.parse_args(argv)
    try:
        if a.cmd == "requant":
            requant(a.src, a.dst, a.type)
        else:
            from_hf(a.src, a.dst, a.type)
    except (ValueError, OSError, KeyError) as e:
        print(f"quantize.py: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
