#!/usr/bin/env python3
"""Convert a Hugging Face Llama model directory (config.json + model.safetensors,
as devio-mkmodel writes them) into a GGUF file that llama.cpp loads.

    python3 tools/bench/llama_gguf.py MODEL_DIR OUT.gguf

Needs numpy and the `gguf` package (tools/bench/side_by_side.py installs both
into its own virtual environment). Weights keep their type (f32, f16 or bf16);
1-D norm weights become f32, as llama.cpp's converter writes them.

Facts this relies on:
- llama.cpp's `llama` architecture rotates adjacent pairs of each head's values
  (its "normal" RoPE), while Hugging Face's Llama pairs value i with value
  i + head_dim/2 (rotate_half). So the rows of q_proj and k_proj are reordered
  within each head: the new rows 2j and 2j+1 are the old rows j and
  j + head_dim/2. The two layouts then compute the same attention.
- GGUF lists a tensor's dimensions fastest first: an [out, in] safetensors
  matrix is written as is and read by ggml as ne = [in, out].
- devio's models have no tokenizer. llama.cpp still wants a vocabulary, so a
  stand-in SentencePiece ("llama") one is written: <unk> <s> </s>, the 256
  byte tokens, then placeholders up to vocab_size. Token ids are all the
  benchmarks use; text through it becomes byte tokens.
"""

import json
import os
import struct
import sys

import gguf
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "gguf"))
from quantize import LAYER_NAMES, TOP_NAMES  # noqa: E402

# Safetensors dtype -> (numpy storage dtype, GGUF type name).
_ST_TYPES = {
    "F32": (np.float32, "F32"),
    "F16": (np.float16, "F16"),
    "BF16": (np.uint16, "BF16"),  # raw bits: numpy has no bfloat16
}


def read_safetensors(path):
    """Return {name: (array, type name)} with the arrays memory-mapped from path."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in _ST_TYPES:
            raise ValueError(f"{path}: {name}: dtype {info['dtype']} is not f32, f16 or bf16")
        np_type, type_name = _ST_TYPES[info["dtype"]]
        start, end = info["data_offsets"]
        count = (end - start) // np.dtype(np_type).itemsize
        arr = np.memmap(path, dtype=np_type, mode="r", offset=base + start, shape=(count,))
        out[name] = (arr.reshape(info["shape"]), type_name)
    return out


def read_model(model_dir):
    """All tensors of a model directory, one file or an index of shards."""
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    tensors = {}
    for name in files:
        tensors.update(read_safetensors(os.path.join(model_dir, name)))
    return tensors


def to_f32(arr, type_name):
    """A tensor's values as float32 (bf16 is the top half of a float32's bits)."""
    if type_name == "BF16":
        return (arr.astype(np.uint32) << 16).view(np.float32)
    return arr.astype(np.float32)


def rope_pairs_adjacent(w, n_heads):
    """Reorder the rows of a q/k projection from rotate_half pairs to adjacent pairs."""
    rows = w.shape[0]
    head_dim = rows // n_heads
    half = head_dim // 2
    # [heads, 2 halves, half, in] -> [heads, half, 2, in]: row j of the first half
    # and row j of the second half end up next to each other.
    return np.ascontiguousarray(
        w.reshape(n_heads, 2, half, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))


def check_config(cfg):
    """Refuse what this converter does not write (rather than write it wrong)."""
    arch = cfg.get("architectures", ["?"])[0]
    if arch != "LlamaForCausalLM" or cfg.get("model_type") != "llama":
        raise ValueError(f"only LlamaForCausalLM is converted, not {arch}")
    if cfg.get("rope_scaling"):
        raise ValueError("rope_scaling is not converted")
    if cfg.get("attention_bias") or cfg.get("mlp_bias"):
        raise ValueError("biases are not converted")


def add_vocab(w, n_vocab, bos, eos):
    """A stand-in SentencePiece vocabulary of n_vocab tokens (the model has none)."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    types += [gguf.TokenType.BYTE] * 256
    if n_vocab < len(tokens):
        raise ValueError(f"vocab_size {n_vocab} is below the {len(tokens)} tokens of the stand-in")
    tokens += [f"<t{i}>" for i in range(len(tokens), n_vocab)]
    types += [gguf.TokenType.NORMAL] * (n_vocab - len(types))
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * n_vocab)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)


def convert(model_dir, out_path):
    """Write out_path from model_dir; returns the number of tensors written."""
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    check_config(cfg)
    n_heads = cfg["num_attention_heads"]
    n_kv = cfg.get("num_key_value_heads", n_heads)
    hidden = cfg["hidden_size"]
    head_dim = cfg.get("head_dim") or hidden // n_heads
    n_layers = cfg["num_hidden_layers"]
    tensors = read_model(model_dir)

    names = dict(TOP_NAMES)
    per_layer = LAYER_NAMES
    for i in range(n_layers):
        for hf, gg in per_layer.items():
            names[f"model.layers.{i}.{hf}"] = f"blk.{i}.{gg}"
    unknown = sorted(set(tensors) - set(names))
    if unknown:
        raise ValueError(f"tensors not converted: {', '.join(unknown[:5])}")
    missing = sorted(n for n in names if n not in tensors and n != "lm_head.weight")
    if missing:
        raise ValueError(f"tensors missing: {', '.join(missing[:5])}")

    main_type = tensors["model.layers.0.self_attn.q_proj.weight"][1]
    file_type = {"F32": gguf.LlamaFileType.ALL_F32, "F16": gguf.LlamaFileType.MOSTLY_F16,
                 "BF16": gguf.LlamaFileType.MOSTLY_BF16}[main_type]

    w = gguf.GGUFWriter(out_path, "llama")
    w.add_name(os.path.basename(os.path.normpath(model_dir)))
    w.add_file_type(int(file_type))
    w.add_vocab_size(cfg["vocab_size"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(hidden)
    w.add_block_count(n_layers)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(n_heads)
    w.add_head_count_kv(n_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(float(cfg.get("rope_theta", 10000.0)))
    w.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    add_vocab(w, cfg["vocab_size"], cfg.get("bos_token_id", 1), cfg.get("eos_token_id", 2))

    raw = {"BF16": gguf.GGMLQuantizationType.BF16}
    for hf, gg in names.items():
        if hf not in tensors:
            continue  # tied: llama.cpp reuses token_embd for the output
        arr, type_name = tensors[hf]
        if arr.ndim == 1:
            w.add_tensor(gg, to_f32(arr, type_name))
            continue
        if gg.endswith("attn_q.weight"):
            arr = rope_pairs_adjacent(arr, n_heads)
        elif gg.endswith("attn_k.weight"):
            arr = rope_pairs_adjacent(arr, n_kv)
        w.add_tensor(gg, arr, raw_dtype=raw.get(type_name))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return sum(1 for n in names if n in tensors)


def main(argv):
    if len(argv) != 3 or argv[1] in ("-h", "--help"):
        print(__doc__.strip().splitlines()[0])
        print(f"usage: {argv[0]} MODEL_DIR OUT.gguf")
        return 0 if len(argv) == 2 else 2
    n = convert(argv[1], argv[2])
    print(f"llama_gguf: wrote {argv[2]}: {n} tensors")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
