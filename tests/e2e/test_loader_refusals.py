"""test_loader_refusals.py - weights files the loader must refuse: NaN and infinite values, overlapping and holed data, in the model (the server does not start) and in adapters (PUT answers 400).
Files are written by devio-mkmodel and then edited byte by byte; every server run is bounded by a timeout.
"""
import json
import shutil
import struct
import subprocess

import pytest

START_LIMIT_S = 60
NAN = {"F32": struct.pack("<I", 0x7FC00000), "BF16": struct.pack("<H", 0x7FC0),
       "F16": struct.pack("<H", 0x7E00)}
INF = {"F32": struct.pack("<I", 0x7F800000), "BF16": struct.pack("<H", 0x7F80),
       "F16": struct.pack("<H", 0x7C00)}
SIZE = {"F32": 4, "BF16": 2, "F16": 2}


def read_st(path):
    """(header dict, offset of the data section, whole file bytes)."""
    b = path.read_bytes()
    n = struct.unpack("<Q", b[:8])[0]
    return json.loads(b[8:8 + n]), 8 + n, bytearray(b)


def poke(path, name, index, values):
    """Element `index` of tensor `name` set from values[dtype]."""
    h, data, b = read_st(path)
    t = h[name]
    at = data + t["data_offsets"][0] + index * SIZE[t["dtype"]]
    v = values[t["dtype"]]
    b[at:at + len(v)] = v
    path.write_bytes(bytes(b))


def set_header(path, h):
    _, data, b = read_st(path)
    s = json.dumps(h, separators=(",", ":")).encode()
    path.write_bytes(struct.pack("<Q", len(s)) + s + bytes(b[data:]))


def start_refused(bins, model, tmp, args=(), env=None):
    """Runs devio-server on `model`, which must exit non-zero before listening; its stderr."""
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "adapters").mkdir(exist_ok=True)
    cmd = [str(bins.server), "--model", str(model), "--listen", "127.0.0.1:0",
           "--db", str(tmp / "devio.db"), "--adapters", str(tmp / "adapters")] + list(args)
    r = subprocess.run(cmd, capture_output=True, timeout=START_LIMIT_S, stdin=subprocess.DEVNULL,
                       env=env)
    assert r.returncode != 0, r
    assert b"listening" not in r.stdout, r
    return r.stderr.decode(errors="replace")


@pytest.fixture
def model_copy(tiny_model, tmp_path):
    d = tmp_path / "model"
    shutil.copytree(tiny_model, d)
    return d


def test_nan_model_refused_at_start(bins, servers, model_copy, tmp_path):
    name = "model.layers.1.mlp.down_proj.weight"
    poke(model_copy / "model.safetensors", name, 7, NAN)
    err = start_refused(bins, model_copy, tmp_path / "run1")
    assert "model.safetensors: tensor '%s' holds NaN at element 7" % name in err, err
    assert "model_error" in err or "non-finite" in err, err
    # The scan may be skipped by flag or by its environment twin; then it starts.
    srv = servers.start(model_copy, args=["--skip-weight-scan"])
    assert srv.client().facts()
    srv.stop()
    srv = servers.start(model_copy, env={"DEVIO_SKIP_WEIGHT_SCAN": "1"})
    assert srv.client().facts()
    srv.stop()


def test_inf_model_refused_at_start(bins, model_copy, tmp_path):
    poke(model_copy / "model.safetensors", "model.norm.weight", 0, INF)
    err = start_refused(bins, model_copy, tmp_path / "run")
    assert "tensor 'model.norm.weight' holds an infinity at element 0" in err, err


def test_overlapping_and_holed_model_refused(bins, model_copy, tmp_path):
    p = model_copy / "model.safetensors"
    orig = p.read_bytes()
    h, _, _ = read_st(p)
    a, b = "model.layers.0.input_layernorm.weight", "model.layers.1.input_layernorm.weight"
    if h[a]["data_offsets"][0] > h[b]["data_offsets"][0]:
        a, b = b, a
    h[b]["data_offsets"] = list(h[a]["data_offsets"])  # the later onto the earlier
    set_header(p, h)
    err = start_refused(bins, model_copy, tmp_path / "overlap")
    assert "overlaps tensor" in err and b in err, err
    p.write_bytes(orig)
    h, _, _ = read_st(p)
    del h["model.layers.0.mlp.up_proj.weight"]
    set_header(p, h)
    err = start_refused(bins, model_copy, tmp_path / "hole")
    assert "belong to no tensor" in err, err


def mkadapter(bins, model, out):
    subprocess.run([str(bins.mkmodel), "--adapter", "--model", str(model), "--rank", "8",
                    "--alpha", "16", "--targets", "q_proj,v_proj", "--out", str(out)],
                   check=True, capture_output=True, timeout=120)
    return out


@pytest.mark.parametrize("kind", ["nan", "inf", "overlap"])
def test_bad_adapter_put_answers_400(bins, servers, tiny_model, kind):
    srv = servers.start(tiny_model)
    c = srv.client()
    root = srv.workdir / "adapters"
    d = mkadapter(bins, tiny_model, root / "bad")
    p = d / "adapter_model.safetensors"
    name = "base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight"
    if kind == "overlap":
        h, _, _ = read_st(p)
        x = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
        y = "base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight"
        if h[x]["data_offsets"][0] > h[y]["data_offsets"][0]:
            x, y = y, x
        h[y]["data_offsets"] = list(h[x]["data_offsets"])
        set_header(p, h)
        words = "overlaps tensor"
    else:
        poke(p, name, 2, NAN if kind == "nan" else INF)
        words = "tensor '%s' holds %s at element 2" % (name, "NaN" if kind == "nan" else
                                                        "an infinity")
    e = c.call("PUT", "/v1/adapters/bad", {"path": "bad"}, expect=400, code="invalid_input")
    assert words in e.json["error"]["message"], e.json
    assert c.facts()["adapters_loaded"] == 0
    # Nothing was left half-loaded: a good adapter loads and a step with it runs.
    mkadapter(bins, tiny_model, root / "good")
    rec = c.call("PUT", "/v1/adapters/good", {"path": "good"}).json
    assert rec["state"] == "loaded"
    s = c.create()
    r = c.step({"rows": [{"seq": s, "tokens": [1, 2, 3], "adapter": "good", "logits": "last"}]})
    assert len(r["rows"]) == 1
    srv.stop()
