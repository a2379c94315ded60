"""test_model_route.py - GET /v1/model: what a client needs around devio (token ids, the chat
template, the context the checkpoint declares, the weight types, devio's limits), from a Hugging
Face directory (config.json, tokenizer_config.json) and from a GGUF file written by the `gguf`
package (tools/bench/llama_gguf.py); the GGUF file serves the directory's very tokens."""
import importlib.util
import json
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def llama_gguf():
    spec = importlib.util.spec_from_file_location("llama_gguf",
                                                  ROOT / "tools" / "bench" / "llama_gguf.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_plain_directory(servers, tiny_model):
    m = servers.start(tiny_model).client().call("GET", "/v1/model").json
    assert m["format"] == "safetensors" and m["architecture"] == "LlamaForCausalLM", m
    assert m["weight_types"] == ["F32"]
    assert (m["vocab_size"], m["hidden_size"], m["layers"], m["heads"], m["kv_heads"],
            m["head_dim"], m["context_length"]) == (256, 64, 2, 4, 2, 16, 512)
    cfg = json.loads((Path(tiny_model) / "config.json").read_text())
    assert m["bos_token_id"] == cfg.get("bos_token_id") and m["pad_token_id"] is None
    assert m["eos_token_id"] == cfg.get("eos_token_id")
    assert m["chat_template"] is None
    assert m["limits"]["max_seq_len"] == 512 and m["limits"]["kv_tokens"] > 0


def test_directory_ids_and_template(servers, tiny_model, tmp_path):
    d = tmp_path / "model"
    shutil.copytree(tiny_model, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(bos_token_id=1, eos_token_id=[2, 7], pad_token_id=0)
    (d / "config.json").write_text(json.dumps(cfg))
    (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": [
        {"name": "tool_use", "template": "T{{tools}}"},
        {"name": "default", "template": "{% for m in messages %}{{m.content}}{% endfor %}"}]}))
    m = servers.start(d).client().call("GET", "/v1/model").json
    assert (m["bos_token_id"], m["eos_token_id"], m["pad_token_id"]) == (1, 2, 0)
    assert m["chat_template"] == "{% for m in messages %}{{m.content}}{% endfor %}"
    # A tokenizer_config.json devio cannot read changes nothing it computes.
    (d / "tokenizer_config.json").write_text("{not json")
    m = servers.start(d).client().call("GET", "/v1/model").json
    assert m["chat_template"] is None and m["bos_token_id"] == 1


def greedy(c, n=8):
    seq = c.create()
    out, nxt = [], [3, 1, 4, 1, 5, 9, 2, 6]
    for _ in range(n):
        r = c.step({"rows": [{"seq": seq, "tokens": nxt, "logits": "last",
                              "sample": {"temperature": 0}}]})
        nxt = [r["rows"][0]["tokens"][0]]
        out += nxt
    return out


def test_gguf_file(servers, bins, tmp_path):
    pytest.importorskip("gguf")
    # llama_gguf.py's stand-in vocabulary needs 259 tokens at least.
    tiny_model = tmp_path / "tiny300"
    subprocess.run([str(bins.mkmodel), "--preset", "tiny", "--vocab", "300", "--out",
                    str(tiny_model)], check=True, capture_output=True, timeout=120)
    path = tmp_path / "tiny.gguf"
    llama_gguf().convert(str(tiny_model), str(path))
    g = servers.start(path).client()
    m = g.call("GET", "/v1/model").json
    assert m["format"] == "gguf" and m["architecture"] == "LlamaForCausalLM", m
    assert m["weight_types"] == ["F32"] and m["vocab_size"] == 300 and m["context_length"] == 512
    # The stand-in vocabulary llama_gguf.py writes: <unk> <s> </s>.
    assert (m["bos_token_id"], m["eos_token_id"]) == (1, 2), m
    # Interleaved q and k rows put back: the directory's tokens, greedy, exactly.
    h = servers.start(tiny_model).client()
    assert greedy(g) == greedy(h)
