#!/usr/bin/env python3
"""make_corpus.py - writes the seed corpora of devio's fuzz targets into tests/fuzz/corpus/<target>/.

Usage: python3 tests/fuzz/make_corpus.py --bin bazel-bin
Valid inputs (devio-mkmodel's micro model and adapter, the same shapes fuzz_common.c
writes, the micro model as a GGUF file, and operations the reference answers) and
near-valid ones (one field, key, tensor or byte off). Deterministic: the same tree gives
the same files. Regression inputs of found bugs are kept by hand under the same folders,
named regress-*: the rewrite leaves them alone.
"""
import argparse
import json
import math
import pathlib
import struct
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent / "tools" / "gguf"))
import gguf_file as gf  # noqa: E402
import quantize  # noqa: E402
MICRO = ["--vocab", "32", "--hidden", "16", "--ffn", "32", "--layers", "1", "--heads", "2",
         "--kv-heads", "1", "--head-dim", "8", "--max-pos", "64", "--seed", "7"]


def st_parts(b):
    n = struct.unpack("<Q", b[:8])[0]
    return json.loads(b[8:8 + n]), b[8 + n:]


def st_join(h, data, raw=None):
    s = raw if raw is not None else json.dumps(h, separators=(",", ":")).encode()
    return struct.pack("<Q", len(s)) + s + data


def put(target, name, data):
    d = HERE / "corpus" / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data if isinstance(data, bytes) else data.encode())


def safetensors_seeds(st):
    put("safetensors", "valid", st)
    h, data = st_parts(st)
    names = sorted(k for k in h if k != "__metadata__")
    a, b = names[0], names[1]
    h2 = json.loads(json.dumps(h))
    h2[b]["data_offsets"] = list(h2[a]["data_offsets"])
    put("safetensors", "overlap", st_join(h2, data))
    h2 = json.loads(json.dumps(h))
    del h2[names[-1]]
    put("safetensors", "hole", st_join(h2, data))
    put("safetensors", "trailing", st + b"\0\0\0\0")
    h2 = json.loads(json.dumps(h))
    h2[a]["data_offsets"] = h2[a]["data_offsets"][::-1]
    put("safetensors", "reversed", st_join(h2, data))
    off = h[a]["data_offsets"][0]
    d2 = bytearray(data)
    d2[off:off + 4] = struct.pack("<I", 0x7FC00000)
    put("safetensors", "nan", st_join(h, bytes(d2)))
    h2 = json.loads(json.dumps(h))
    h2[a]["dtype"] = "I64"
    put("safetensors", "dtype", st_join(h2, data))
    h2 = json.loads(json.dumps(h))
    h2["__metadata__"] = {"format": "pt"}
    put("safetensors", "metadata", st_join(h2, data))
    put("safetensors", "short", st[:40])
    put("safetensors", "empty-header", st_join(None, b"", raw=b"{}"))


def config_seeds(cfg):
    put("config", "valid", cfg)
    c = json.loads(cfg)
    variants = {
        "rope-llama3": dict(c, rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                             "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                             "original_max_position_embeddings": 16}),
        "rope-yarn": dict(c, rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                           "original_max_position_embeddings": 16}),
        "mistral": dict(c, architectures=["MistralForCausalLM"], sliding_window=8),
        "qwen3": dict(c, architectures=["Qwen3ForCausalLM"]),
        "granite": dict(c, architectures=["GraniteForCausalLM"], embedding_multiplier=12.0,
                        attention_multiplier=0.125, residual_multiplier=0.22,
                        logits_scaling=8.0),
        "bamba": dict(c, architectures=["BambaForCausalLM"], mamba_n_heads=2,
                      mamba_d_head=8, mamba_n_groups=1, mamba_d_state=4, mamba_d_conv=4,
                      attn_layer_indices=[0]),
        "bad-heads": dict(c, num_attention_heads=3),
        "zero-vocab": dict(c, vocab_size=0),
        "tied": dict(c, tie_word_embeddings=True),
    }
    for name, v in variants.items():
        put("config", name, json.dumps(v, indent=1))
    put("config", "infinity", cfg.replace('"rope_theta": 10000.0', '"rope_theta": Infinity'))
    put("config", "truncated", cfg[:len(cfg) // 2])


def adapter_seeds(cfg, st):
    def pack(c, s):
        c = c.encode() if isinstance(c, str) else c
        return struct.pack("<H", len(c)) + c + s
    put("adapter", "valid", pack(cfg, st))
    c = json.loads(cfg)
    put("adapter", "rslora", pack(json.dumps(dict(c, use_rslora=True)), st))
    put("adapter", "layers", pack(json.dumps(dict(c, layers_to_transform=[0])), st))
    put("adapter", "dora", pack(json.dumps(dict(c, use_dora=True)), st))
    put("adapter", "rank0", pack(json.dumps(dict(c, r=0)), st))
    h, data = st_parts(st)
    names = sorted(k for k in h if k != "__metadata__")
    d2 = bytearray(data)
    off = h[names[0]]["data_offsets"][0]
    d2[off:off + 4] = struct.pack("<I", 0x7F800000)
    put("adapter", "inf", pack(cfg, st_join(h, bytes(d2))))
    h2 = json.loads(json.dumps(h))
    h2[names[1]]["data_offsets"] = list(h2[names[0]]["data_offsets"])
    put("adapter", "overlap", pack(cfg, st_join(h2, data)))
    put("adapter", "truncated", pack(cfg, st[: len(st) // 2]))


DISPATCH = {
    "create-step": 'c\nl{"rows":[{"seq":1,"tokens":[1,2,3],"logits":"last"}]}\nw{"ticket":1}\n'
                   'a{"kind":"sample","logits":1,"row":0,"params":{"temperature":0.8,"seed":5}}\n',
    "step-sample": 'c\ns{"rows":[{"seq":1,"tokens":[4,5],"logits":"all",'
                   '"sample":{"temperature":0}}]}\nq{"seq":1}\nf\n',
    "fork-truncate": 'c\ns{"rows":[{"seq":1,"tokens":[1,2,3,4,5,6,7,8,9]}]}\n'
                     'a{"kind":"fork","seq":1}\na{"kind":"truncate","seq":2,"len":3}\n'
                     'a{"kind":"free","seq":1}\n',
    "lora": 'o{"kind":"load","name":"a","path":"a"}\nc\n'
            's{"rows":[{"seq":1,"tokens":[1],"adapter":"a","logits":"last"}]}\n'
            'o{"kind":"unload","name":"a"}\n',
    "depth": 'c\nc\nl{"rows":[{"seq":1,"tokens":[1]}]}\nl{"rows":[{"seq":2,"tokens":[2]}]}\n'
             'l{"rows":[{"seq":1,"tokens":[3]}]}\nw{"ticket":2,"timeout_ms":0}\nw{"ticket":1}\n',
    "bad": 'l{"rows":[{"seq":99,"tokens":[-1]}]}\na{"kind":"nope"}\nw{"ticket":"x"}\n',
}


def script_seeds():
    for folder in ("e2e/scripts", "conformance"):
        for p in sorted((HERE.parent / folder).glob("*.jsonl")):
            if p.stat().st_size <= 8192 and not p.name.startswith("ssm_"):
                put("script", p.stem, p.read_bytes())
    put("script", "lora-micro", '{"op":"lora","cmd":{"kind":"load","name":"a","path":"a"}}\n'
                          '{"op":"create","as":"s"}\n'
                          '{"op":"step","plan":{"rows":[{"seq":"$s","tokens":[1,2],'
                          '"adapter":"a","logits":"last"}]}}\n')


def gguf_str(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def gguf_kv(key, vtype, payload):
    return gguf_str(key) + struct.pack("<I", vtype) + payload


def gguf_file(kvs, tensors, data, version=3, align=32):
    """tensors: (name, dims, ggml type, offset); data: the data section's bytes."""
    head = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs)) + b"".join(kvs)
    for name, dims, t, off in tensors:
        head += gguf_str(name) + struct.pack("<I", len(dims))
        head += b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", t, off)
    head += b"\0" * (-len(head) % align)
    return head + data


def gguf_seeds():
    kvs = [gguf_kv("general.architecture", 8, gguf_str("llama")),
           gguf_kv("llama.block_count", 4, struct.pack("<I", 1)),
           gguf_kv("llama.rope.freq_base", 6, struct.pack("<f", 10000.0)),
           gguf_kv("tokenizer.ggml.tokens", 9,
                   struct.pack("<IQ", 8, 2) + gguf_str("a") + gguf_str("b")),
           gguf_kv("x.nested", 9, struct.pack("<IQ", 9, 1) + struct.pack("<IQ", 4, 1) +
                   struct.pack("<I", 7))]
    # F32 [8], Q8_0 [32, 2], Q4_K [256]: 32 + 68 (+ pad to 128) + 144 bytes.
    tensors = [("output_norm.weight", [8], 0, 0), ("token_embd.weight", [32, 2], 8, 32),
               ("blk.0.ffn_up.weight", [256], 12, 128)]
    data = bytes(range(256)) + bytes(16)
    put("gguf", "valid", gguf_file(kvs, tensors, data))
    put("gguf", "v2", gguf_file(kvs, tensors, data, version=2))
    put("gguf", "overlap", gguf_file(kvs, [tensors[0], ("b", [16], 0, 0)], data))
    put("gguf", "past-end", gguf_file(kvs, tensors, data[:200]))
    put("gguf", "unknown-type", gguf_file(kvs, [("t", [4], 77, 0)], data))
    put("gguf", "align64", gguf_file(kvs + [gguf_kv("general.alignment", 4, struct.pack("<I", 64))],
                                     [tensors[0], ("t2", [32], 8, 64)], data, align=64))
    put("gguf", "empty", gguf_file([], [], b""))


def gguf_model(src, out, meta=None, drop=(), retype=None, extra=()):
    """The GGUF file src rewritten: metadata entries of meta set (None: removed), keys of
    drop removed, tensor retype=(name, type) given the new type over its first bytes (the
    F32 bytes read as the new type, as a retyped header does), extra tensors (name, dims,
    float32 values) added."""
    g = gf.read(str(src))
    fields = {k: v for k, v in g.fields.items() if k not in drop}
    for k, v in (meta or {}).items():
        if v is None:
            fields.pop(k, None)
        else:
            fields[k] = v
    ts = []
    for t in g.tensors:
        data, tid = bytes(t.data), t.type
        if retype and t.name == retype[0]:
            tid = retype[1]
            data = data[:gf.row_bytes(tid, t.row_len) * t.rows]
        ts.append(gf.TensorData(t.name, tid, t.dims, data))
    for name, dims, values in extra:
        ts.append(gf.TensorData(name, gf.F32, dims, struct.pack("<%df" % len(values), *values)))
    b = b"".join(gf.encode(fields, ts))
    out.write_bytes(b)
    return b


def gguf_model_seeds(model_dir, tmp):
    """The micro model as GGUF (F16 matrices, F32 vectors, tied) and one file per rule of
    the loader: value ranges, token ids, tensors used or refused, vector types, RoPE keys."""
    base = tmp / "micro.gguf"
    quantize.from_hf(str(model_dir), str(base), "F16", log=open("/dev/null", "w"))
    nan, inf = float("nan"), math.inf
    f32, u32 = gf.f32, gf.u32
    g = gf.read(str(base))
    granite = {("granite." + k[6:] if k.startswith("llama.") else k): v
               for k, v in g.fields.items()}
    granite.update({"general.architecture": gf.string("granite"),
                    "granite.embedding_scale": f32(12.0), "granite.residual_scale": f32(0.22),
                    "granite.attention.scale": f32(0.125), "granite.logit_scale": f32(8.0)})
    seeds = {
        "model-valid": {},
        "model-rope-untyped": {"meta": {"llama.rope.scaling.factor": f32(2.0)}},
        "model-rope-yarn": {"meta": {"llama.rope.scaling.type": gf.string("yarn"),
                                     "llama.rope.scaling.factor": f32(4.0),
                                     "llama.rope.scaling.original_context_length": u32(16)}},
        "model-granite": {"meta": dict(granite), "drop": [k for k in g.fields
                                                           if k.startswith("llama.")]},
        "model-nan-freq-base": {"meta": {"llama.rope.freq_base": f32(nan)}},
        "model-inf-eps": {"meta": {"llama.attention.layer_norm_rms_epsilon": f32(inf)}},
        "model-nan-factor": {"meta": {"llama.rope.scale_linear": f32(nan)}},
        "model-granite-nan-logit-scale": {
            "meta": dict(granite, **{"granite.logit_scale": f32(nan)}),
            "drop": [k for k in g.fields if k.startswith("llama.")]},
        "model-rope-unknown-key": {"meta": {"llama.rope.scaling.yarn_log_multiplier": f32(0.1)}},
        "model-bos-65537": {"meta": {"tokenizer.ggml.bos_token_id": u32(65537)}},
        "model-vocab-size": {"meta": {"llama.vocab_size": u32(33)}},
        "model-past-block-count": {"extra": [("blk.1.attn_norm.weight", (16,), [1.0] * 16)]},
        "model-unknown-tensor": {"extra": [("blk.0.attn_rot_embd", (4,), [1.0] * 4)]},
        "model-bias-in-llama": {"extra": [("blk.0.attn_q.bias", (16,), [0.5] * 16)]},
        "model-bf16-norm": {"retype": ("output_norm.weight", gf.BF16)},
    }
    for name, edit in seeds.items():
        put("gguf", name, gguf_model(base, tmp / "seed.gguf", **edit))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default="bazel-bin")
    a = ap.parse_args()
    mk = pathlib.Path(a.bin) / "tools" / "mkmodel" / "devio-mkmodel"
    for p in sorted((HERE / "corpus").glob("*/*")):
        if not p.name.startswith("regress-"):
            p.unlink()
    with tempfile.TemporaryDirectory() as tmp:
        m = pathlib.Path(tmp) / "model"
        subprocess.run([str(mk), "--out", str(m)] + MICRO, check=True, capture_output=True)
        ad = pathlib.Path(tmp) / "ad"
        subprocess.run([str(mk), "--adapter", "--model", str(m), "--rank", "2", "--alpha", "4",
                        "--targets", "q_proj,v_proj", "--seed", "3", "--out", str(ad)],
                       check=True, capture_output=True)
        safetensors_seeds((m / "model.safetensors").read_bytes())
        config_seeds((m / "config.json").read_text())
        adapter_seeds((ad / "adapter_config.json").read_text(),
                      (ad / "adapter_model.safetensors").read_bytes())
        tied = pathlib.Path(tmp) / "tied"
        subprocess.run([str(mk), "--out", str(tied), "--tied"] + MICRO, check=True,
                       capture_output=True)
        gguf_model_seeds(tied, pathlib.Path(tmp))
    for name, text in DISPATCH.items():
        put("dispatch", name, text)
    script_seeds()
    gguf_seeds()


if __name__ == "__main__":
    main()
