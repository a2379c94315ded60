#!/usr/bin/env python3
"""chat.py - text in, text out, through devio-server, which takes and gives token ids only.

usage: python3 clients/python/examples/chat.py [--url URL] [--model FILE.gguf] [--max N] MESSAGE

The tokenizer is the served model's own vocabulary, read from its GGUF file (the same file
the server was given; default the SmolLM2 file `deploy/devio.sh up` serves) with the
`tokenizers` package; the chat template, the end-of-turn token and the context come from
GET /v1/model. Each turn is one POST /v1/step of the previous token, greedy (temperature 0),
until the end-of-turn token or --max tokens. Needs `tokenizers` and `jinja2` besides the
standard-library client (clients/python)."""
import argparse
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "clients" / "python"))
sys.path.insert(0, str(ROOT / "tools" / "gguf"))
from devio_client import Client  # noqa: E402
import gguf_file  # noqa: E402
from vocab import encode_prompt  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("message")
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--model", default=str(ROOT / ".devio" / "models" /
                                           "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--max", type=int, default=64, help="tokens to generate at most [64]")
    a = ap.parse_args()
    meta = gguf_file.read(a.model).metadata
    with Client(a.url) as c:
        m = c.model()
        if m["chat_template"]:
            meta["tokenizer.chat_template"] = m["chat_template"]  # the server's word
        tk, _, ids = encode_prompt(meta, a.message)
        seq = c.create_sequence()
        out, nxt = [], ids
        while len(out) < a.max and len(ids) + len(out) < m["limits"]["max_seq_len"]:
            r = c.step({"rows": [{"seq": seq, "tokens": nxt, "logits": "last",
                                  "sample": {"temperature": 0}}]})
            c.release_logits(r["rows"][0]["logits"])  # the sampled token is all it needed
            nxt = r["rows"][0]["tokens"]
            if nxt[0] == m["eos_token_id"]:
                break
            out += nxt
        c.free(seq)
    print(tk.decode(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
