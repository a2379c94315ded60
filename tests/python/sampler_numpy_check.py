#!/usr/bin/env python3
"""sampler_numpy_check.py - the device sampler's logit processing and logprobs against numpy.

    python3 tests/python/sampler_numpy_check.py --bin bazel-bin [--cases 4000] [--seed 1]

Random cases (vocabularies of 1 to 300 tokens, logits with ties, NaN and infinities; logit_bias
with +-inf, allowed-token masks that leave many, one or no tokens, banned tokens, repetition,
frequency and presence penalties over a history, top-n logprobs) run through tests/sampler_cases
(the device's codec and sampler) and through a restatement of docs/numerics.md in numpy float32.
Exact: the greedy token, the top-n ids, refusals (no token left, or every logit NaN or -inf);
the drawn token of a sampled case lies among the tokens processing left, and within top_k.
Within 1e-5: logprobs, which use devio_expf/devio_logf where numpy has its own exp and log.
"""
import argparse
import base64
import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np

F32 = np.float32
NEG_INF = F32(-np.inf)
FMAX = np.finfo(np.float32).max
GREEDY_BELOW = F32(1e-5)


def clean(x):
    """Step 0: NaN -> -inf, +inf -> FLT_MAX (elementwise, float32)."""
    x = np.array(x, dtype=F32)
    x[np.isnan(x)] = NEG_INF
    x[x == np.inf] = FMAX
    return x


def process(raw, s, history):
    """Step 0b on the cleaned logits: bias, mask, banned, penalties (float32, each op rounded)."""
    w = clean(raw)
    V = len(w)
    for k, b in s.get("logit_bias", {}).items():
        i = int(k)
        with np.errstate(invalid="ignore", over="ignore"):
            bb = F32({"inf": np.inf, "+inf": np.inf, "-inf": -np.inf}[b] if isinstance(b, str)
                     else b)
            w[i] = clean([F32(w[i] + bb)])[0]
    if "allowed_tokens" in s:
        words = np.frombuffer(base64.b64decode(s["allowed_tokens"]), dtype="<u4")
        for i in range(V):
            if not (int(words[i >> 5]) >> (i & 31)) & 1:
                w[i] = NEG_INF
    for i in s.get("banned_tokens", []):
        w[i] = NEG_INF
    rp = F32(s.get("repetition_penalty", 1.0))
    pp = F32(s.get("presence_penalty", 0.0))
    fp = F32(s.get("frequency_penalty", 0.0))
    if rp != 1 or pp != 0 or fp != 0:
        seen = []
        for t in history:
            if t not in seen:
                seen.append(t)
        for i in seen:
            c = history.count(i)
            x = w[i]
            if x == NEG_INF:
                continue
            with np.errstate(over="ignore", invalid="ignore"):
                if rp != 1:
                    x = clean([x / rp if x > 0 else x * rp])[0]
                if fp != 0 and x != NEG_INF:
                    x = clean([F32(x - F32(fp * F32(c)))])[0]
                if pp != 0 and x != NEG_INF:
                    x = clean([F32(x - pp)])[0]
            w[i] = x
    return w


def expected(case):
    """What docs/numerics.md says: refusal, or the greedy token / allowed set, raw logprobs."""
    raw = [{"nan": np.nan, "inf": np.inf, "-inf": -np.inf}.get(x, x) if isinstance(x, str) else x
           for x in case["logits"]]
    s = case["sample"]
    lc = clean(raw)
    if np.all(lc == NEG_INF):
        return {"error": True}
    w = process(raw, s, case["history"])
    if np.all(w == NEG_INF):
        return {"error": True}
    m = np.float64(lc.max())
    with np.errstate(invalid="ignore"):
        lz = np.log(np.sum(np.exp(lc.astype(np.float64) - m)))
        lp = lc.astype(np.float64) - m - lz
    order = sorted(range(len(lc)), key=lambda i: (-float(lc[i]), i))
    n = s.get("logprobs", 0)
    t = F32(s.get("temperature", 1.0))
    out = {"lp": lp, "top": order[:n], "allowed": set(np.nonzero(w != NEG_INF)[0].tolist())}
    if t < GREEDY_BELOW:
        out["token"] = int(np.argmax(w))  # first of the largest
    else:
        k = s.get("top_k", 0)
        if 0 < k < len(w):
            with np.errstate(over="ignore"):
                z = (w / t).astype(F32)
            z[z == np.inf] = FMAX  # an overflowed quotient reads as +-FLT_MAX
            z[(z == NEG_INF) & (w != NEG_INF)] = -FMAX
            zo = sorted(range(len(z)), key=lambda i: (-float(z[i]), i))
            out["allowed"] &= set(zo[:k])
    return out


def mask_of(V, ids):
    words = np.zeros((V + 31) // 32, dtype="<u4")
    for i in ids:
        words[i >> 5] |= np.uint32(1 << (i & 31))
    return base64.b64encode(words.tobytes()).decode()


def make_case(rng):
    V = rng.choice([1, 2, 3, 7, 31, 32, 33, 64, 100, 300])
    pool = [0.0, 1.0, -1.0, 2.5, 1e30, -1e30]
    logits = []
    for _ in range(V):
        r = rng.random()
        if r < 0.04:
            logits.append(rng.choice(["nan", "inf", "-inf"]))
        elif r < 0.25:
            logits.append(rng.choice(pool))  # ties
        else:
            logits.append(float(F32(rng.gauss(0, 4))))
    if rng.random() < 0.02:
        logits = ["-inf"] * V
    s = {"temperature": rng.choice([0.0, 0.0, 1e-6, 0.5, 1.0, 2.0])}
    if rng.random() < 0.3:
        s["top_k"] = rng.randint(0, V + 1)
    if rng.random() < 0.4:
        s["logit_bias"] = {str(rng.randrange(V)): rng.choice([rng.uniform(-5, 5), "-inf", "inf",
                                                             -1e39, 100.0])
                           for _ in range(rng.randint(1, 4))}
    r = rng.random()
    if r < 0.15:
        s["allowed_tokens"] = mask_of(V, [rng.randrange(V)])  # exactly one token
    elif r < 0.2:
        s["allowed_tokens"] = mask_of(V, [])  # none: refused
    elif r < 0.45:
        s["allowed_tokens"] = mask_of(V, rng.sample(range(V), rng.randint(1, V)))
    if rng.random() < 0.3:
        s["banned_tokens"] = [rng.randrange(V) for _ in range(rng.randint(0, 3))]
    history = [rng.randrange(V) for _ in range(rng.randint(0, 12))]
    if rng.random() < 0.5:
        s["repetition_penalty"] = rng.choice([1.0, 1.3, 0.7, 2.0])
    if rng.random() < 0.5:
        s["frequency_penalty"] = rng.choice([0.0, 0.5, -0.5, 1e38])
    if rng.random() < 0.5:
        s["presence_penalty"] = rng.choice([0.0, 1.0, -1.0])
    if rng.random() < 0.5:
        s["logprobs"] = rng.randint(0, min(V, 20))
    s["seed"] = rng.randrange(1 << 62)
    return {"logits": logits, "sample": s, "history": history, "position": rng.randrange(1000)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default="bazel-bin")
    ap.add_argument("--cases", type=int, default=4000)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    tool = Path(a.bin) / "tests" / "sampler_cases"
    rng = random.Random(a.seed)
    cases = [make_case(rng) for _ in range(a.cases)]
    text = "".join(json.dumps(c) + "\n" for c in cases)
    run = subprocess.run([str(tool)], input=text, capture_output=True, text=True, timeout=600)
    if run.returncode != 0:
        sys.exit("sampler_cases failed: %s" % run.stderr[-2000:])
    got = [json.loads(line) for line in run.stdout.splitlines()]
    assert len(got) == len(cases), (len(got), len(cases))
    bad, kinds = [], {"refused": 0, "greedy": 0, "drawn": 0, "one_token": 0, "top": 0}
    for i, (c, g) in enumerate(zip(cases, got)):
        e = expected(c)
        why = None
        if e.get("error") or "error" in g:
            if not (e.get("error") and g.get("error") == "invalid"):
                why = "refusal: expected %s, got %s" % (e.get("error", False), g)
            kinds["refused"] += 1
        else:
            tok = g["token"]
            if "token" in e:
                kinds["greedy"] += 1
                if tok != e["token"]:
                    why = "greedy token %d, numpy %d" % (tok, e["token"])
            else:
                kinds["drawn"] += 1
                if tok not in e["allowed"]:
                    why = "drawn token %d is not among those processing and top_k left" % tok
            kinds["one_token"] += len(e["allowed"]) == 1
            if why is None and abs(g["logprob"] - e["lp"][tok]) > 1e-5 * max(1, abs(e["lp"][tok])):
                why = "logprob %r, numpy %r" % (g["logprob"], e["lp"][tok])
            ids = [x[0] for x in g["top"]]
            kinds["top"] += len(ids) > 0
            if why is None and ids != e["top"]:
                why = "top ids %s, numpy %s" % (ids, e["top"])
            for tid, tlp in g["top"]:
                want = e["lp"][tid]
                if tlp is None:  # JSON's word for -inf
                    if why is None and want != -np.inf:
                        why = "top logprob of %d: -inf, numpy %r" % (tid, want)
                elif why is None and abs(tlp - want) > 1e-5 * max(1, abs(want)):
                    why = "top logprob of %d: %r, numpy %r" % (tid, tlp, want)
        if why:
            bad.append((i, why, c))
    for i, why, c in bad[:10]:
        print("case %d: %s\n  %s" % (i, why, json.dumps(c)[:600]))
    print("sampler_numpy_check: %d cases (%s): %d differ" %
          (len(cases), ", ".join("%s %d" % kv for kv in kinds.items()), len(bad)))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
