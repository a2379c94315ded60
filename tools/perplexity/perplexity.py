#!/usr/bin/env python3
"""perplexity.py - a text's perplexity under a model, computed through devio's prompt_logprobs, as
users measure it: the text is tokenized with the GGUF file's own vocabulary (tools/gguf/vocab.py),
cut into windows of --ctx tokens, each window run as the prefill of a fresh sequence (two steps, its
halves), and the tokens of each window's second half scored (each with at least ctx/2 tokens of context before it;
llama.cpp's llama-perplexity scores the same ones). The perplexity is exp of the mean negative
log-probability over every scored token.

    python3 tools/perplexity/perplexity.py --url http://127.0.0.1:8080 --gguf MODEL.gguf [--token T]
    python3 tools/perplexity/perplexity.py --serve bazel-bin --gguf MODEL.gguf --numerics strict,fast

--url measures a running server (which must serve that GGUF file); --serve starts devio-server
from that build folder for each --numerics given (strict: the reference, fast: the cpu backend),
on a loopback port, and prints each beside the first. --llama also runs llama.cpp's
llama-perplexity on the same file and text (-c CTX, the same windows), built once from the
pinned source tools/bench/side_by_side.py builds llama-bench from, into its cache. --max-diff P exits 1 unless every run's
perplexity is within P percent of the first's. The text defaults to the GNU GPL v3 under
/usr/share/common-licenses, which every Debian machine has.
"""
import argparse
import math
import pathlib
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "clients" / "python"))
sys.path.insert(0, str(ROOT / "tools" / "gguf"))
sys.path.insert(0, str(ROOT / "tests" / "bench"))

DEFAULT_TEXT = "/usr/share/common-licenses/GPL-3"


def tokenize(gguf, text):
    """The text's token ids under the file's vocabulary, BOS first if the file adds one."""
    import gguf_file
    from vocab import build_tokenizer
    meta = gguf_file.read(gguf).metadata
    ids = build_tokenizer(meta).encode(text, add_special_tokens=False).ids
    bos = meta.get("tokenizer.ggml.bos_token_id")
    return ids, (bos if meta.get("tokenizer.ggml.add_bos_token") else None)


def windows(ids, ctx, bos, limit):
    """Consecutive windows of ctx tokens (the first replaced by BOS when the model adds one)."""
    out = []
    for i in range(0, len(ids) - ctx + 1, ctx):
        w = list(ids[i:i + ctx])
        if bos is not None:
            w[0] = bos
        out.append(w)
        if limit and len(out) == limit:
            break
    return out


def measure(client, wins):
    """(perplexity, scored tokens, seconds): each window a prefill with prompt_logprobs."""
    nll, n, t0 = 0.0, 0, time.monotonic()
    for w in wins:
        # The first half as context, then the second with prompt_logprobs: lps[j] is
        # log p(w[h + j] | w[:h + j]), j >= 1 (the first is null: its context was the
        # step before). Scoring only the second half keeps the logits rows a step
        # borrows to ctx / 2 - 1.
        h = len(w) // 2
        seq = client.create_sequence()
        try:
            client.step({"rows": [{"seq": seq, "tokens": w[:h]}]})
            r = client.step({"rows": [{"seq": seq, "tokens": w[h:], "prompt_logprobs": True}]})
        finally:
            client.free(seq)
        for lp in r["rows"][0]["prompt_logprobs"][1:]:
            nll -= lp
            n += 1
    return math.exp(nll / n), n, time.monotonic() - t0


def llama_perplexity(a, n_windows):
    """llama.cpp's llama-perplexity on the same file, text and windows: (name, (ppl, n, s))."""
    import re
    import subprocess
    sys.path.insert(0, str(ROOT / "tools" / "bench"))
    import side_by_side
    cache = pathlib.Path(a.cache)
    cache.mkdir(parents=True, exist_ok=True)
    exe = side_by_side.ensure_llama_tool(cache, side_by_side.ensure_venv(cache), "2",
                                         "llama-perplexity")
    t0 = time.monotonic()
    p = subprocess.run([str(exe), "-m", a.gguf, "-f", a.text, "-c", str(a.ctx), "--chunks",
                        str(n_windows), "-t", str(a.threads), "-b", str(a.ctx)],
                       capture_output=True, text=True, timeout=3600)
    m = re.search(r"Final estimate: PPL = ([0-9.]+)", p.stdout + p.stderr)
    if p.returncode != 0 or not m:
        raise SystemExit("perplexity: llama-perplexity failed (%d):\n%s"
                         % (p.returncode, (p.stdout + p.stderr)[-2000:]))
    n = n_windows * (a.ctx - a.ctx // 2 - 1)
    return ("llama.cpp %s llama-perplexity" % side_by_side.LLAMA_CPP_COMMIT,
            (float(m.group(1)), n, time.monotonic() - t0))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", required=True, help="the GGUF file (its vocabulary; with --serve "
                    "the model served), or 'fetch': SmolLM2 by deploy/fetch-model.sh")
    ap.add_argument("--url", help="a running devio-server serving that file")
    ap.add_argument("--token", help="the server's bearer token (with --url)")
    ap.add_argument("--serve", metavar="BIN", help="start devio-server from this build folder")
    ap.add_argument("--numerics", default="strict,fast",
                    help="with --serve: the runs, comma-separated, of strict (the reference) "
                         "and fast (the cpu backend) [strict,fast]")
    ap.add_argument("--threads", type=int, default=2, help="with --serve: compute threads [2]")
    ap.add_argument("--text", default=DEFAULT_TEXT, help="a UTF-8 text file [%s]" % DEFAULT_TEXT)
    ap.add_argument("--ctx", type=int, default=512, help="tokens a window [512]")
    ap.add_argument("--windows", type=int, default=0, help="at most this many windows [all]")
    ap.add_argument("--llama", action="store_true",
                    help="also run llama.cpp's llama-perplexity (built into --cache)")
    ap.add_argument("--cache", default=str(pathlib.Path.home() / ".cache" / "devio-side"),
                    help="with --llama: side_by_side.py's cache [~/.cache/devio-side]")
    ap.add_argument("--max-diff", type=float, help="percent: exit 1 unless every run's perplexity "
                    "is within this of the first's")
    a = ap.parse_args()
    if bool(a.url) == bool(a.serve):
        ap.error("give one of --url and --serve")
    if a.ctx < 4:
        ap.error("--ctx must be at least 4")
    if a.gguf == "fetch":
        from server_bench import fetch_smollm2
        path, why = fetch_smollm2()
        if path is None:
            print("perplexity: skipped, the model cannot be fetched: " + why)
            return 77
        a.gguf = str(path)
    ids, bos = tokenize(a.gguf, pathlib.Path(a.text).read_text(encoding="utf-8"))
    wins = windows(ids, a.ctx, bos, a.windows)
    if not wins:
        ap.error("the text has %d tokens, fewer than one window of %d" % (len(ids), a.ctx))
    print("perplexity: %s, %d tokens of %s, %d window(s) of %d, %d tokens scored a window"
          % (pathlib.Path(a.gguf).name, len(ids), a.text, len(wins), a.ctx,
             a.ctx - a.ctx // 2 - 1))
    from devio_client import Client
    results = []
    if a.url:
        with Client(a.url, token=a.token) as c:
            results.append((c.device()["device"]["name"], measure(c, wins)))
    else:
        from server_bench import start_server, stop_server
        for num in a.numerics.split(","):
            if num not in ("strict", "fast"):
                ap.error("--numerics: %r is neither strict nor fast" % num)
            extra = ["--max-seq-len", str(a.ctx)]
            extra += ["--backend", "cpu", "--numerics", "fast"] if num == "fast" else \
                     ["--backend", "ref"]
            with tempfile.TemporaryDirectory() as tmp:
                proc, port = start_server(pathlib.Path(a.serve) / "service" / "devio-server",
                                          a.gguf, pathlib.Path(tmp), a.threads, 1, extra)
                try:
                    with Client("http://127.0.0.1:%d" % port) as c:
                        name = "%s: %s" % (num, c.device()["device"]["name"])
                        results.append((name, measure(c, wins)))
                finally:
                    stop_server(proc)
    if a.llama:
        results.append(llama_perplexity(a, len(wins)))
    first = results[0][1][0]
    worst = 0.0
    for name, (ppl, n, secs) in results:
        diff = 100.0 * (ppl - first) / first
        worst = max(worst, abs(diff))
        print("  %-60s perplexity %.4f over %d tokens (%+.3f%% of the first) in %.1f s"
              % (name, ppl, n, diff, secs))
    if a.max_diff is not None:
        ok = worst <= a.max_diff
        print("perplexity: %s: every run within %.3f%% of the first (limit %.3f%%)"
              % ("ok" if ok else "FAILED", worst, a.max_diff))
        return 0 if ok else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
