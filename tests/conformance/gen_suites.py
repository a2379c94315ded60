#!/usr/bin/env python3
# long because every conformance suite is written here as data, one function each, over one set of shared row and script helpers.
"""gen_suites.py - writes devio's conformance scripts (docs/conformance.md) into tests/conformance/.

The scripts are data: deterministic, reviewed, and committed. Their expected
outputs are made by `tests/conformance/run.py --regen` from the native reference and
reviewed too; the test run never regenerates them.

Invariance suites check themselves with the runner's `compare` op: every
`compare` line must say "equal":true on every target.

usage: gen_suites.py [OUT_DIR]
"""
import json
import os
import sys

VOCAB = 256  # every suite model has the tiny vocabulary


def toks(n, salt):
    """n deterministic token ids."""
    x = (salt * 2654435761 + 12345) & 0xFFFFFFFF
    out = []
    for _ in range(n):
        x = (x * 1103515245 + 12345) & 0x7FFFFFFF
        out.append((x >> 8) % VOCAB)
    return out


class Script:
    def __init__(self, title):
        self.lines = ["# " + title]
        self.n = 0

    def note(self, text):
        self.lines.append("# " + text)

    def op(self, **kw):
        self.lines.append(json.dumps(kw, separators=(",", ":")))

    def name(self, prefix):
        self.n += 1
        return "%s%d" % (prefix, self.n)

    def create(self, name):
        self.op(op="create", **{"as": name})

    def step(self, rows, name=None, full=False):
        kw = {"op": "step", "plan": {"rows": rows}}
        if name:
            kw["as"] = name
        if full:
            kw["full"] = True
        self.op(**kw)

    def release(self, ref):
        self.op(op="apply", effect={"kind": "release", "logits": ref})

    def free(self, seq):
        self.op(op="apply", effect={"kind": "free", "seq": "$" + seq})

    def compare(self, a, b, a_row=None, b_row=None):
        kw = {"op": "compare", "a": a, "b": b}
        if a_row is not None:
            kw["a_row"] = a_row
        if b_row is not None:
            kw["b_row"] = b_row
        self.op(**kw)

    def text(self):
        return "\n".join(self.lines) + "\n"


def row(seq, tokens, logits="none", **kw):
    r = {"seq": "$" + seq, "tokens": tokens, "logits": logits}
    r.update(kw)
    return r


def batch_around(s, b, target, history_salt, snapshots=False):
    """Row `target` of a fresh sequence t in the middle of a batch of b rows of
    other sequences of mixed lengths (every third with a history of its own
    first, so that it decodes or extends; with snapshots, the first 16 take
    end or each ones), compared with $alone. Returns (others, t, pos)."""
    s.note("batch of %d" % b)
    others = []
    for i in range(b - 1):
        o = "b%d_%d" % (b, i)
        others.append(o)
        s.create(o)
        if i % 3 == 0:
            s.step([row(o, toks(1 + i % 11, history_salt + i))])
    t = "t%d" % b
    s.create(t)
    rows = []
    for i, o in enumerate(others):
        n = 1 if i % 2 else 1 + i % 12
        snap = [None, "end", None, "each"][i % 4] if snapshots and i < 16 else None
        rows.append(snap_row(o, toks(n, 300 + i), "last" if i % 4 == 1 else "none", snap))
    pos = len(rows) // 2
    rows.insert(pos, row(t, target, "all"))
    s.step(rows, "r%d" % b)
    s.compare("$alone.rows[0].logits", "$r%d.rows[%d].logits" % (b, pos))
    for i in range(len(rows)):
        if rows[i]["logits"] != "none":
            s.release("$r%d.rows[%d].logits" % (b, i))
    return others, t, pos


def suite_batch():
    s = Script("batch invariance: one row alone vs the same row in batches of 2, 8 and 64 "
               "rows of mixed lengths, mixed prefill and decode")
    target = toks(9, 1)
    s.create("x")
    s.step([row("x", target, "all")], "alone")
    for b in (2, 8, 64):
        others, t, _ = batch_around(s, b, target, 100)
        for o in others + [t]:
            s.free(o)
    s.op(op="facts")
    return s


def suite_chunks():
    s = Script("chunk invariance: one prefill of 40 tokens vs chunks of 1, 7 and 16")
    t = toks(40, 2)
    s.create("one")
    s.step([row("one", t, "all")], "whole")
    for c in (1, 7, 16):
        seq = "c%d" % c
        s.create(seq)
        for start in range(0, len(t), c):
            chunk = t[start:start + c]
            name = "%s_%d" % (seq, start)
            s.step([row(seq, chunk, "all")], name)
            for k in range(len(chunk)):
                s.compare("$whole.rows[0].logits", "$%s.rows[0].logits" % name, start + k, k)
            s.release("$%s.rows[0].logits" % name)
    return s


def suite_depth():
    s = Script("depth 1 vs 2: two tickets in flight give the numbers of one at a time")
    ta, tb = toks(12, 3), toks(12, 4)
    for q in ("a1", "b1", "a2", "b2"):
        s.create(q)
    s.note("one at a time")
    s.op(op="launch", plan={"rows": [row("a1", ta, "last")]}, **{"as": "la1"})
    s.op(op="await", ticket="$la1", **{"as": "ra1"})
    s.op(op="launch", plan={"rows": [row("b1", tb, "last")]}, **{"as": "lb1"})
    s.op(op="await", ticket="$lb1", **{"as": "rb1"})
    s.note("pipelined: both launched before either is awaited")
    s.op(op="launch", plan={"rows": [row("a2", ta, "last")]}, **{"as": "la2"})
    s.op(op="launch", plan={"rows": [row("b2", tb, "last")]}, **{"as": "lb2"})
    s.op(op="facts")
    s.op(op="await", ticket="$lb2", **{"as": "rb2"})
    s.op(op="await", ticket="$la2", **{"as": "ra2"})
    s.compare("$ra1.rows[0].logits", "$ra2.rows[0].logits")
    s.compare("$rb1.rows[0].logits", "$rb2.rows[0].logits")
    s.note("decode steps pipelined across two sequences")
    for i in range(4):
        s.op(op="launch", plan={"rows": [row("a2", [toks(1, 50 + i)[0]], "last")]},
             **{"as": "pa%d" % i})
        s.op(op="launch", plan={"rows": [row("b2", [toks(1, 60 + i)[0]], "last")]},
             **{"as": "pb%d" % i})
        s.op(op="await", ticket="$pa%d" % i)
        s.op(op="await", ticket="$pb%d" % i)
    return s


def suite_fork():
    s = Script("fork shares blocks, copy-on-write on the shared partial block, "
               "then divergent continuations equal fresh sequences")
    p = toks(20, 5)
    xa, xb = toks(5, 6), toks(3, 7)
    s.create("a")
    s.step([row("a", p)])
    s.op(op="apply", effect={"kind": "fork", "seq": "$a"}, **{"as": "b"})
    s.op(op="facts")
    s.op(op="seq", seq="$b")
    s.step([row("a", xa, "all")], "ca")
    s.op(op="facts")
    s.step([row("b", xb, "all")], "cb")
    s.op(op="facts")
    s.create("fa")
    s.create("fb")
    s.step([row("fa", p + xa, "all"), row("fb", p + xb, "all")], "fresh")
    for k in range(len(xa)):
        s.compare("$ca.rows[0].logits", "$fresh.rows[0].logits", k, len(p) + k)
    for k in range(len(xb)):
        s.compare("$cb.rows[0].logits", "$fresh.rows[1].logits", k, len(p) + k)
    s.note("a fork of a fork, and freeing the parent keeps the children's blocks")
    s.op(op="apply", effect={"kind": "fork", "seq": "$b"}, **{"as": "c"})
    s.free("b")
    s.op(op="facts")
    s.step([row("c", xa, "last")], "cc")
    s.create("fc")
    s.step([row("fc", p + xb + xa, "last")], "fcr")
    s.compare("$cc.rows[0].logits", "$fcr.rows[0].logits")
    return s


def suite_truncate():
    s = Script("truncate then continue equals a fresh sequence")
    t = toks(30, 8)
    more = toks(5, 9)
    s.create("a")
    s.step([row("a", t)])
    s.op(op="apply", effect={"kind": "truncate", "seq": "$a", "len": 31})
    s.op(op="apply", effect={"kind": "truncate", "seq": "$a", "len": 17})
    s.op(op="seq", seq="$a")
    s.step([row("a", more, "all")], "ta")
    s.create("f")
    s.step([row("f", t[:17] + more, "all")], "tf")
    for k in range(len(more)):
        s.compare("$ta.rows[0].logits", "$tf.rows[0].logits", k, 17 + k)
    s.op(op="apply", effect={"kind": "truncate", "seq": "$a", "len": 0})
    s.op(op="seq", seq="$a")
    s.step([row("a", t[:4], "last")], "t0")
    s.create("g")
    s.step([row("g", t[:4], "last")], "tg")
    s.compare("$t0.rows[0].logits", "$tg.rows[0].logits")
    s.op(op="facts")
    return s


def suite_free_reuse():
    s = Script("free returns blocks; reused blocks compute what fresh ones do "
               "(run with --kv-blocks 12 --block-size 4)")
    t = toks(24, 10)
    s.create("a")
    s.step([row("a", t, "last")], "ra")
    s.op(op="facts")
    s.create("b")
    s.step([row("b", t[:8], "none")])
    s.op(op="facts")
    s.free("a")
    s.op(op="facts")
    s.create("c")
    s.step([row("c", t, "last")], "rc")
    s.compare("$ra.rows[0].logits", "$rc.rows[0].logits")
    s.op(op="facts")
    s.op(op="apply", effect={"kind": "free", "seq": "$a"})
    s.op(op="seq", seq="$a")
    return s


def suite_sampling():
    s = Script("seeded sampling: fused in the step and as an effect, every filter")
    s.create("a")
    s.step([row("a", toks(10, 11), "all")], "r")
    params = [
        {"temperature": 0},
        {"temperature": 1.0, "seed": 1},
        {"temperature": 1.0, "seed": 2},
        {"temperature": 0.7, "top_k": 5, "seed": 3},
        {"temperature": 1.3, "top_p": 0.8, "seed": 4},
        {"temperature": 1.0, "min_p": 0.05, "seed": 5},
        {"temperature": 0.9, "top_k": 40, "top_p": 0.95, "min_p": 0.02, "seed": 6},
        {"temperature": 1.0, "top_k": 1, "seed": 7},
        {"temperature": 2.5, "top_p": 1.0, "seed": 9223372036854775807},
    ]
    for p in params:
        s.op(op="apply", effect={"kind": "sample", "logits": "$r.rows[0].logits", "row": 9,
                                 "params": p})
    s.op(op="apply", effect={"kind": "sample", "logits": "$r.rows[0].logits",
                             "params": {"temperature": 1.0, "seed": 9}})
    s.note("fused: the same draw as the effect on the last position")
    s.create("b")
    s.step([row("b", toks(10, 11), "none", sample=params[6])], "fb")
    s.note("generation with feedback, several seeds side by side")
    for k in range(3):
        s.create("g%d" % k)
    s.step([row("g%d" % k, toks(6, 12), sample={"temperature": 0.8, "top_k": 20, "seed": k})
            for k in range(3)], "s0")
    for i in range(1, 8):
        s.step([row("g%d" % k, ["$s%d.rows[%d].tokens[0]" % (i - 1, k)],
                    sample={"temperature": 0.8, "top_k": 20, "seed": k}) for k in range(3)],
               "s%d" % i)
    s.op(op="apply", effect={"kind": "sample", "logits": "$r.rows[0].logits", "row": 10,
                             "params": {"temperature": 0}})
    s.op(op="apply", effect={"kind": "sample", "logits": "$r.rows[0].logits",
                             "params": {"temperature": 1, "top_p": 0}})
    return s


def mask_b64(ids):
    """allowed_tokens of the tiny vocabulary allowing exactly ids."""
    import base64
    import struct
    words = [0] * ((VOCAB + 31) // 32)
    for i in ids:
        words[i >> 5] |= 1 << (i & 31)
    return base64.b64encode(struct.pack("<%dI" % len(words), *words)).decode()


def suite_sampling_proc():
    s = Script("logit processing and top logprobs: bias, masks, bans, penalties over the "
               "sequence's own tokens, fused in the step and as an effect")
    s.create("a")
    s.step([row("a", toks(12, 21), "all")], "r")
    params = [
        {"temperature": 0, "logprobs": 5},
        {"temperature": 0, "logit_bias": {"17": 3.5, "200": "-inf", "3": "inf"}, "logprobs": 2},
        {"temperature": 1.0, "seed": 3, "allowed_tokens": mask_b64(range(0, VOCAB, 3))},
        {"temperature": 1.0, "seed": 4, "allowed_tokens": mask_b64([9])},
        {"temperature": 0.8, "seed": 5, "banned_tokens": list(range(0, 128)), "top_k": 10},
        {"temperature": 0, "repetition_penalty": 1.5},
        {"temperature": 0.9, "seed": 6, "frequency_penalty": 0.7, "presence_penalty": 0.4,
         "penalty_from": 4, "logprobs": 3},
        {"temperature": 1.2, "seed": 7, "top_p": 0.9, "min_p": 0.05,
         "logit_bias": {"5": -1.25}, "repetition_penalty": 0.8, "logprobs": 20},
    ]
    for p in params:
        s.op(op="apply", effect={"kind": "sample", "logits": "$r.rows[0].logits", "row": 11,
                                 "params": p})
    s.op(op="apply", effect={"kind": "sample", "logits": "$r.rows[0].logits",
                             "params": params[6]})
    s.note("fused: the same draws as the effects on the last position")
    s.create("b")
    s.step([row("b", toks(12, 21), "none", sample=params[6])], "fb")
    s.create("c")
    s.step([row("c", toks(12, 21), "none", sample=params[7])], "fc")
    s.note("generation with feedback: the penalties see every token fed so far")
    for k in range(2):
        s.create("g%d" % k)
    gen = [{"temperature": 0.7, "seed": k, "repetition_penalty": 1.3, "frequency_penalty": 0.5,
            "penalty_from": 6, "logprobs": 2} for k in range(2)]
    s.step([row("g%d" % k, toks(6, 22), sample=gen[k]) for k in range(2)], "s0")
    for i in range(1, 6):
        s.step([row("g%d" % k, ["$s%d.rows[%d].tokens[0]" % (i - 1, k)], sample=gen[k])
                for k in range(2)], "s%d" % i)
    s.note("a fork carries the record, a truncate cuts it")
    s.op(op="apply", effect={"kind": "fork", "seq": "$g0"}, **{"as": "f"})
    s.op(op="apply", effect={"kind": "truncate", "seq": "$g1", "len": 7})
    s.step([row("f.seq", [1], sample=gen[0]), row("g1", [1], sample=gen[1])], "t0")
    s.note("prompt logprobs, with and without logits of the row's own")
    s.create("p")
    s.step([row("p", toks(9, 23), "all", prompt_logprobs=True),
            row("b", toks(5, 24), "none", prompt_logprobs=True, sample={"temperature": 0})],
           "pl")
    s.note("refused: no token left, a mask of the wrong size, too many logprobs")
    s.op(op="launch", plan={"rows": [{"seq": "$b", "tokens": [1], "sample": {
        "allowed_tokens": mask_b64([4]), "banned_tokens": [4]}}]})
    s.op(op="launch", plan={"rows": [{"seq": "$b", "tokens": [1], "sample": {
        "allowed_tokens": "AAAAAA=="}}]})
    s.op(op="apply", effect={"kind": "sample", "logits": "$r.rows[0].logits",
                             "params": {"logprobs": 21}})
    return s


def suite_long():
    s = Script("a long sequence crossing many blocks: chunked prefill and decode equal "
               "one prefill of the same tokens")
    t = toks(300, 13)
    s.create("a")
    for start in range(0, 300, 64):
        s.step([row("a", t[start:start + 64])])
    s.step([row("a", [toks(1, 14)[0]], "last", sample={"temperature": 0})], "d0")
    for i in range(1, 20):
        s.step([row("a", ["$d%d.rows[0].tokens[0]" % (i - 1)], "last",
                    sample={"temperature": 0})], "d%d" % i)
        if i < 19:
            s.release("$d%d.rows[0].logits" % (i - 1))
    s.op(op="seq", seq="$a")
    s.create("b")
    gen = [toks(1, 14)[0]] + ["$d%d.rows[0].tokens[0]" % i for i in range(19)]
    s.step([row("b", t + gen, "last")], "whole")
    s.compare("$d19.rows[0].logits", "$whole.rows[0].logits")
    s.op(op="facts")
    return s


def suite_kv_exhaustion():
    s = Script("KV exhaustion refuses a plan whole and changes nothing "
               "(run with --kv-blocks 8 --block-size 4)")
    s.create("a")
    s.create("b")
    s.step([row("a", toks(20, 15), "last")], "ra")
    s.op(op="facts")
    s.op(op="launch", plan={"rows": [row("a", toks(2, 16)), row("b", toks(9, 17))]})
    s.op(op="facts")
    s.op(op="seq", seq="$a")
    s.op(op="seq", seq="$b")
    s.op(op="apply", effect={"kind": "fork", "seq": "$a"}, **{"as": "f"})
    s.note("f shares a's 5 blocks; 13 more tokens need 4 blocks, 3 are free")
    s.op(op="launch", plan={"rows": [row("f", toks(13, 18))]})
    s.op(op="facts")
    s.free("a")
    s.op(op="facts")
    s.step([row("f", toks(1, 18), "last")], "rf")
    s.step([row("b", toks(8, 17), "last")], "rb")
    s.op(op="facts")
    return s


def suite_errors():
    s = Script("every error code of the device core (run with --max-depth 2 --max-rows 4 "
               "--max-batch-tokens 64 --logits-handles 3 --logits-rows 8 --max-seqs 6 "
               "--max-seq-len 64 --kv-blocks 12 --block-size 4)")
    s.create("a")
    s.create("b")
    s.note("invalid_input")
    s.op(op="launch", plan={"rows": []})
    s.op(op="launch", plan={"rows": [row("a", [])]})
    s.op(op="launch", plan={"rows": [row("a", [VOCAB])]})
    s.op(op="launch", plan={"rows": [row("a", [-1])]})
    s.op(op="launch", plan={"rows": [row("a", [1]), row("a", [2])]})
    s.op(op="launch", plan={"rows": [row("a", [1], "some")]})
    s.op(op="launch", plan={"rows": [row("a", [1], sample={"temperature": -1})]})
    s.op(op="launch", plan={"rows": [row("a", [1], logit="all")]})
    s.op(op="apply", effect={"kind": "explode", "seq": "$a"})
    s.note("unknown ids")
    s.op(op="launch", plan={"rows": [{"seq": 999999, "tokens": [1]}]})
    s.op(op="await", ticket=999999)
    s.op(op="apply", effect={"kind": "release", "logits": 999999})
    s.op(op="apply", effect={"kind": "fork", "seq": 999999})
    s.op(op="seq", seq=999999)
    s.op(op="launch", plan={"rows": [row("a", [1], adapter="sql")]})
    s.op(op="lora", cmd={"kind": "unload", "name": "sql"})
    s.op(op="lora", cmd={"kind": "pin", "name": "sql"})
    s.note("too_large")
    s.op(op="launch", plan={"rows": [row("a", [1])] + [row("b", [1])] * 4})
    s.op(op="launch", plan={"rows": [row("a", toks(65, 19))]})
    s.op(op="launch", plan={"rows": [row("a", toks(60, 19)), row("b", toks(10, 20))]})
    s.note("seq_busy, depth_exceeded, ticket_consumed")
    s.op(op="launch", plan={"rows": [row("a", toks(3, 21), "last")]}, **{"as": "t1"})
    s.op(op="launch", plan={"rows": [row("a", toks(1, 22))]})
    for kind in ("fork", "snapshot", "free"):
        s.op(op="apply", effect={"kind": kind, "seq": "$a"})
    s.op(op="apply", effect={"kind": "truncate", "seq": "$a", "len": 1})
    s.op(op="launch", plan={"rows": [row("b", toks(2, 23), "last")]}, **{"as": "t2"})
    s.create("c")
    s.op(op="launch", plan={"rows": [row("c", toks(2, 24))]})
    s.op(op="await", ticket="$t1", **{"as": "r1"})
    s.op(op="await", ticket="$t1")
    s.op(op="await", ticket="$t2", **{"as": "r2"})
    s.note("out_of_logits: 3 handles, 8 rows")
    s.op(op="launch", plan={"rows": [row("c", toks(9, 25), "all")]})
    s.step([row("c", toks(2, 26), "last")], "r3")
    s.op(op="launch", plan={"rows": [row("c", toks(1, 27), "last")]})
    s.release("$r1.rows[0].logits")
    s.op(op="facts")
    s.note("out_of_kv_blocks")
    s.op(op="launch", plan={"rows": [row("c", toks(60, 28))]})
    s.op(op="launch", plan={"rows": [row("b", toks(30, 28)), row("c", toks(20, 29))]})
    s.op(op="facts")
    s.note("out_of_seqs: 6 sequences")
    for q in ("d", "e", "f"):
        s.create(q)
    s.op(op="create")
    s.op(op="apply", effect={"kind": "fork", "seq": "$d"})
    s.note("truncate past the end, sample row past the end, bad params")
    s.op(op="apply", effect={"kind": "truncate", "seq": "$a", "len": 100})
    s.op(op="apply", effect={"kind": "sample", "logits": "$r2.rows[0].logits", "row": 1,
                             "params": {"temperature": 0}})
    s.op(op="apply", effect={"kind": "sample", "logits": "$r2.rows[0].logits",
                             "params": {"top_p": 0}})
    s.note("unsupported: adapter loading")
    s.op(op="lora", cmd={"kind": "load", "name": "sql", "path": "sql-r8"})
    s.op(op="lora", cmd={"kind": "list"})
    s.op(op="facts")
    return s


def lora(kind, name=None, path=None, pin=None):
    cmd = {"kind": kind}
    if name:
        cmd["name"] = name
    if path:
        cmd["path"] = path
    if pin is not None:
        cmd["pin"] = pin
    return {"op": "lora", "cmd": cmd}


def suite_lora_batch():
    s = Script("multi-LoRA batches: a row with adapter sql alone equals the same row batched "
               "with rows of other adapters and rows without one")
    for name in ("sql", "chat", "code"):
        s.op(**lora("load", name, name))
    t = toks(11, 40)
    s.create("x")
    s.step([row("x", t, "all", adapter="sql")], "alone")
    s.create("nb")
    s.step([row("nb", t, "all")], "base")
    seqs = []
    rows = []
    for i in range(12):
        q = "m%d" % i
        seqs.append(q)
        s.create(q)
        ad = [None, "chat", "code", "sql"][i % 4]
        kw = {"adapter": ad} if ad else {}
        rows.append(row(q, toks(1 + i % 5, 50 + i), "last" if i % 3 == 0 else "none", **kw))
    s.create("xb")
    rows.insert(5, row("xb", t, "all", adapter="sql"))
    s.step(rows, "mixed")
    s.compare("$alone.rows[0].logits", "$mixed.rows[5].logits")
    s.note("decode steps: adapters per row, with sampling")
    s.step([row("x", [toks(1, 60)[0]], "last", adapter="sql",
                sample={"temperature": 0}),
            row("nb", [toks(1, 60)[0]], "last", sample={"temperature": 0})], "d1")
    s.step([row("xb", [toks(1, 60)[0]], "last", adapter="sql", sample={"temperature": 0}),
            row("m1", [toks(1, 61)[0]], "last", adapter="chat")], "d2")
    s.compare("$d1.rows[0].logits", "$d2.rows[0].logits")
    s.op(**lora("list"))
    s.op(op="facts")
    return s


def suite_lora_lifecycle():
    s = Script("load, step, unload, step, load again: the same numbers")
    t = toks(7, 41)
    s.op(**lora("load", "sql", "sql"))
    s.op(**lora("load", "sql", "sql"))
    s.op(**lora("load", "sql", "chat"))
    s.create("a")
    s.step([row("a", t, "all", adapter="sql")], "r1")
    s.op(**lora("unload", "sql"))
    s.op(**lora("unload", "sql"))
    s.create("b")
    s.op(op="step", plan={"rows": [row("b", t, "all", adapter="sql")]})
    s.op(**lora("load", "sql", "sql"))
    s.step([row("b", t, "all", adapter="sql")], "r2")
    s.compare("$r1.rows[0].logits", "$r2.rows[0].logits")
    s.note("errors: a path outside the root, a missing adapter")
    s.op(**lora("load", "bad", "../sql"))
    s.op(**lora("load", "bad", "/etc"))
    s.op(**lora("load", "bad", "nothing-here"))
    s.op(**lora("list"))
    return s


def suite_lora_evict():
    s = Script("eviction at capacity (run with --max-loras 2): the least recently used "
               "unpinned adapter goes, pinned ones and ones in unawaited tickets never")
    s.op(**lora("load", "sql", "sql", pin=True))
    s.op(**lora("load", "chat", "chat"))
    s.create("a")
    s.step([row("a", toks(3, 42), "last", adapter="chat")], "r1")
    s.op(**lora("load", "code", "code"))
    s.op(**lora("list"))
    s.op(op="step", plan={"rows": [row("a", toks(1, 43), adapter="chat")]})
    s.note("code is in an unawaited ticket: it is not evicted, and sql is pinned")
    s.op(op="launch", plan={"rows": [row("a", toks(1, 44), "last", adapter="code")]},
         **{"as": "t"})
    s.op(**lora("load", "math", "math"))
    s.op(op="await", ticket="$t")
    s.op(**lora("load", "math", "math"))
    s.op(**lora("list"))
    s.op(**lora("pin", "math"))
    s.op(**lora("load", "chat", "chat"))
    s.op(**lora("unpin", "sql"))
    s.op(**lora("load", "chat", "chat"))
    s.op(**lora("list"))
    s.op(op="facts")
    return s


# ---- hybrid models (Bamba: mixers and attention; Mamba2: mixers only) --------------------
#
# Every sequence of a hybrid model holds an SSM state slot from its first
# tokens until it is truncated to 0 or freed; snapshots of that state are
# taken by a plan row ("snapshot": "end" or "each") or by the snapshot
# effect, and truncate restores the one at exactly the new length.


def snap_row(seq, tokens, logits="none", snapshot=None, **kw):
    r = row(seq, tokens, logits, **kw)
    if snapshot:
        r["snapshot"] = snapshot
    return r


def effect(s, kind, name=None, **kw):
    e = {"kind": kind}
    for k, v in kw.items():
        e[k] = "$" + v if k == "seq" else v
    line = {"op": "apply", "effect": e}
    if name:
        line["as"] = name
    s.op(**line)


def seq_op(s, q):
    s.op(op="seq", seq="$" + q)


def compare_rows(s, a, b, n, a0=0, b0=0):
    """Positions a0..a0+n-1 of handle a against b0..b0+n-1 of handle b."""
    for k in range(n):
        s.compare(a, b, a0 + k, b0 + k)


def suite_ssm_chunks():
    s = Script("hybrid chunk invariance: one prefill of 40 tokens vs chunks of 1, 3 (under the "
               "conv width), 7 and 16, and chunks of uneven sizes; the state carries across "
               "every chunk boundary")
    t = toks(40, 200)
    s.create("one")
    s.step([row("one", t, "all")], "whole")
    plans = [("c1", [1] * 40), ("c3", [3] * 13 + [1]), ("c7", [7] * 5 + [5]),
             ("c16", [16, 16, 8]), ("cu", [2, 5, 1, 13, 4, 1, 1, 9, 4])]
    for seq, sizes in plans:
        assert sum(sizes) == len(t)
        s.create(seq)
        start = 0
        for c in sizes:
            name = "%s_%d" % (seq, start)
            s.step([row(seq, t[start:start + c], "all")], name)
            compare_rows(s, "$whole.rows[0].logits", "$%s.rows[0].logits" % name, c, start, 0)
            s.release("$%s.rows[0].logits" % name)
            start += c
    s.note("every chunked sequence holds one state slot and no snapshot")
    seq_op(s, "c16")
    s.op(op="facts")
    s.note("decode after a chunked prefill equals decode after the whole one")
    nxt = toks(3, 201)
    for i, tok in enumerate(nxt):
        s.step([row("one", [tok], "last"), row("c7", [tok], "last")], "d%d" % i)
        s.compare("$d%d.rows[0].logits" % i, "$d%d.rows[1].logits" % i)
    return s


def suite_ssm_batch():
    s = Script("hybrid batch invariance: one row alone vs the same row in batches of 2, 8 and "
               "64 rows with other hybrid sequences of different lengths (prefill, decode, "
               "snapshots), for a prefill and then for a decode step")
    target = toks(9, 210)
    nxt = toks(1, 211)
    s.create("x")
    s.step([row("x", target, "all")], "alone")
    s.step([row("x", nxt, "last")], "alone_d")
    for b in (2, 8, 64):
        others, t, pos = batch_around(s, b, target, 220, snapshots=True)
        s.note("the decode step, batched the other way round")
        rows = [row(o, toks(1 + i % 3, 400 + i), "none") for i, o in enumerate(others)]
        rows.insert(len(rows) - pos, row(t, nxt, "last"))
        s.step(rows, "d%d" % b)
        s.compare("$alone_d.rows[0].logits", "$d%d.rows[%d].logits" % (b, len(rows) - 1 - pos))
        s.release("$d%d.rows[%d].logits" % (b, len(rows) - 1 - pos))
        s.op(op="facts")
        for o in others + [t]:
            s.free(o)
    s.op(op="facts")
    return s


def suite_ssm_fork():
    s = Script("hybrid fork: the child gets a copy of the parent's state in a new slot and no "
               "snapshots; parent and child continue differently and each equals a fresh "
               "sequence fed the same tokens")
    p = toks(20, 230)
    xa, xb = toks(5, 231), toks(3, 232)
    s.create("a")
    s.step([snap_row("a", p, "none", "end")])
    effect(s, "fork", "b", seq="a")
    s.op(op="facts")
    seq_op(s, "a")
    seq_op(s, "b")
    s.step([row("a", xa, "all")], "ca")
    s.step([row("b", xb, "all")], "cb")
    s.create("fa")
    s.create("fb")
    s.step([row("fa", p + xa, "all"), row("fb", p + xb, "all")], "fresh")
    compare_rows(s, "$ca.rows[0].logits", "$fresh.rows[0].logits", len(xa), 0, len(p))
    compare_rows(s, "$cb.rows[0].logits", "$fresh.rows[1].logits", len(xb), 0, len(p))
    s.note("the child has no snapshot of its own; the parent goes back to its own at 20 and "
           "takes the child's path")
    effect(s, "truncate", seq="b", len=len(p))
    seq_op(s, "b")
    effect(s, "truncate", seq="a", len=len(p))
    s.step([row("a", xb, "all")], "ab")
    s.compare("$ab.rows[0].logits", "$cb.rows[0].logits")
    s.note("a fork of a fork; freeing the parent leaves the child's state alone")
    effect(s, "fork", "c", seq="b")
    s.free("b")
    s.op(op="facts")
    s.step([row("c", xa, "last")], "cc")
    s.create("fc")
    s.step([row("fc", p + xb + xa, "last")], "fcr")
    s.compare("$cc.rows[0].logits", "$fcr.rows[0].logits")
    s.note("a fork mid-decode, both sides batched together in one step")
    effect(s, "fork", "d", seq="c")
    y = toks(2, 233)
    s.step([row("c", y, "all"), row("d", y[::-1], "all")], "cd")
    s.create("fd")
    s.step([row("fd", p + xb + xa + y[::-1], "all")], "fdr")
    compare_rows(s, "$cd.rows[1].logits", "$fdr.rows[0].logits", 2, 0, len(p + xb + xa))
    s.note("a fork of an empty sequence takes no slot; a parent truncated to 0 and refilled "
           "leaves its child alone")
    s.create("e")
    effect(s, "fork", "ef", seq="e")
    seq_op(s, "ef")
    s.op(op="facts")
    effect(s, "truncate", seq="c", len=0)
    s.step([row("c", toks(4, 234))])
    s.step([row("d", toks(1, 235), "last")], "dl")
    s.create("fd2")
    s.step([row("fd2", p + xb + xa + y[::-1] + toks(1, 235), "last")], "fd2r")
    s.compare("$dl.rows[0].logits", "$fd2r.rows[0].logits")
    s.op(op="facts")
    return s


def suite_ssm_snapshot():
    s = Script("hybrid snapshots: the snapshot effect and rows with snapshot end|each, "
               "truncate back to them, continue = a fresh sequence; truncate needs a snapshot "
               "at exactly the new length; release drops a sequence's snapshots")
    t = toks(26, 240)
    s.create("a")
    s.step([row("a", t[:12])])
    seq_op(s, "a")
    effect(s, "snapshot", seq="a")
    effect(s, "snapshot", seq="a")
    seq_op(s, "a")
    s.op(op="facts")
    s.step([snap_row("a", t[12:20], "none", "end")])
    s.step([row("a", t[20:26])])
    seq_op(s, "a")
    s.note("truncate to the current length needs no snapshot; to 23 there is none: "
           "no_snapshot, and nothing changed")
    effect(s, "truncate", seq="a", len=26)
    s.op(op="facts")
    effect(s, "truncate", seq="a", len=23)
    seq_op(s, "a")
    s.op(op="facts")
    s.note("back to 20 (a row's end snapshot), continue; a fresh sequence agrees")
    y = toks(5, 241)
    effect(s, "truncate", seq="a", len=20)
    seq_op(s, "a")
    s.step([row("a", y, "all")], "ra")
    s.create("f")
    s.step([row("f", t[:20] + y, "all")], "rf")
    compare_rows(s, "$ra.rows[0].logits", "$rf.rows[0].logits", len(y), 0, 20)
    s.note("back to 12 (the effect's snapshot) drops the one at 20; a restored snapshot stays "
           "and serves again")
    z = toks(6, 242)
    effect(s, "truncate", seq="a", len=12)
    seq_op(s, "a")
    s.step([row("a", z, "all")], "rb")
    s.create("g")
    s.step([row("g", t[:12] + z, "all")], "rg")
    compare_rows(s, "$rb.rows[0].logits", "$rg.rows[0].logits", len(z), 0, 12)
    w = toks(3, 243)
    effect(s, "truncate", seq="a", len=12)
    s.step([row("a", w, "last")], "rc")
    s.create("h")
    s.step([row("h", t[:12] + w, "last")], "rh")
    s.compare("$rc.rows[0].logits", "$rh.rows[0].logits")
    s.note("snapshot each: one after every token of the row; back to 3, then to 1")
    u = toks(10, 244)
    s.create("b")
    s.step([snap_row("b", u[:6], "none", "each")])
    seq_op(s, "b")
    s.op(op="facts")
    effect(s, "truncate", seq="b", len=3)
    seq_op(s, "b")
    s.step([row("b", u[3:10], "all")], "rb3")
    s.create("k")
    s.step([row("k", u, "all")], "rk")
    compare_rows(s, "$rb3.rows[0].logits", "$rk.rows[0].logits", 7, 0, 3)
    effect(s, "truncate", seq="b", len=1)
    seq_op(s, "b")
    s.step([row("b", u[1:10], "all")], "rb1")
    compare_rows(s, "$rb1.rows[0].logits", "$rk.rows[0].logits", 9, 0, 1)
    s.note("a snapshot at length 0 takes nothing; truncate to 0 releases the slot and every "
           "snapshot, and the refilled sequence is fresh")
    s.create("e")
    effect(s, "snapshot", seq="e")
    seq_op(s, "e")
    s.op(op="facts")
    effect(s, "truncate", seq="a", len=0)
    seq_op(s, "a")
    s.op(op="facts")
    s.step([row("a", u[:5], "last")], "r0")
    s.create("m")
    s.step([row("m", u[:5], "last")], "rm")
    s.compare("$r0.rows[0].logits", "$rm.rows[0].logits")
    s.note("release {seq}: every snapshot of b goes, its state stays; truncate back then has "
           "none; release takes exactly one of logits and seq")
    effect(s, "snapshot", seq="b")
    seq_op(s, "b")
    effect(s, "release", seq="b")
    seq_op(s, "b")
    s.op(op="facts")
    effect(s, "truncate", seq="b", len=1)
    effect(s, "release", seq="b")
    v = toks(2, 245)
    s.step([row("b", v, "all")], "rv")
    s.step([row("k", v, "all")], "rkv")
    s.compare("$rv.rows[0].logits", "$rkv.rows[0].logits")
    s.op(op="apply", effect={"kind": "release", "seq": "$b", "logits": "$rv.rows[0].logits"})
    s.op(op="apply", effect={"kind": "release"})
    s.op(op="apply", effect={"kind": "release", "seq": 999999})
    s.op(op="facts")
    return s


def suite_ssm_spec():
    s = Script("speculative decoding: k = 4 draft tokens in one row with snapshot each, accept "
               "j of them, truncate to L + j, continue; bit for bit what decoding only the "
               "accepted tokens one at a time gives")
    prompt = toks(10, 250)
    s.create("a")  # the speculating sequence
    s.create("r")  # decodes only the accepted tokens
    s.step([row("a", prompt, "last")], "pa")
    s.step([row("r", prompt, "last")], "pr")
    s.compare("$pa.rows[0].logits", "$pr.rows[0].logits")
    length = len(prompt)
    last = "$pa.rows[0].logits"  # the logits the next token is chosen from
    for cycle, accept in enumerate((2, 0, 4, 1, 3)):
        i = cycle + 1
        s.note("cycle %d: draft 4 at length %d, accept %d" % (i, length, accept))
        drafts = toks(4, 260 + i)
        s.step([snap_row("a", drafts, "all", "each")], "draft%d" % i)
        s.op(op="facts")
        effect(s, "truncate", seq="a", len=length + accept)
        if accept < 4 and i <= 2:
            seq_op(s, "a")
        s.op(op="facts")
        for j in range(accept):
            s.step([row("r", [drafts[j]], "last")], "acc%d_%d" % (i, j))
            s.compare("$draft%d.rows[0].logits" % i, "$acc%d_%d.rows[0].logits" % (i, j), j, 0)
        # The next token: greedy from the logits after the last accepted one.
        src = ("$draft%d.rows[0].logits" % i, accept - 1) if accept else (last, None)
        sample = {"kind": "sample", "logits": src[0], "params": {"temperature": 0}}
        if src[1] is not None:
            sample["row"] = src[1]
        s.op(op="apply", effect=sample, **{"as": "next%d" % i})
        tok = "$next%d.tokens[0]" % i
        # The continuation keeps a snapshot at its end, so that the next cycle
        # can accept nothing.
        s.step([snap_row("a", [tok], "last", "end")], "cont%d" % i)
        s.step([row("r", [tok], "last")], "ref%d" % i)
        s.compare("$cont%d.rows[0].logits" % i, "$ref%d.rows[0].logits" % i)
        length += accept + 1
        last = "$cont%d.rows[0].logits" % i
    s.note("two sequences speculating in one batch, accepting 3 and 1; fresh sequences fed "
           "the accepted tokens agree")
    p2 = toks(7, 270)
    s.create("s1")
    s.create("s2")
    s.step([row("s1", p2), row("s2", p2[::-1])])
    d1, d2 = toks(4, 271), toks(4, 272)
    s.step([snap_row("s1", d1, "all", "each"), snap_row("s2", d2, "all", "each")], "bd")
    effect(s, "truncate", seq="s1", len=7 + 3)
    effect(s, "truncate", seq="s2", len=7 + 1)
    seq_op(s, "s1")
    seq_op(s, "s2")
    e1, e2 = toks(2, 273), toks(2, 274)
    s.step([row("s1", e1, "all"), row("s2", e2, "all")], "bc")
    s.create("f1")
    s.create("f2")
    s.step([row("f1", p2 + d1[:3] + e1, "all"), row("f2", p2[::-1] + d2[:1] + e2, "all")],
           "bf")
    compare_rows(s, "$bd.rows[0].logits", "$bf.rows[0].logits", 3, 0, 7)
    compare_rows(s, "$bd.rows[1].logits", "$bf.rows[1].logits", 1, 0, 7)
    compare_rows(s, "$bc.rows[0].logits", "$bf.rows[0].logits", 2, 0, 10)
    compare_rows(s, "$bc.rows[1].logits", "$bf.rows[1].logits", 2, 0, 8)
    s.op(op="facts")
    return s


def suite_ssm_free_reuse():
    s = Script("hybrid free and reuse (run with --ssm-slots 2 --ssm-snapshots 4): free and "
               "truncate to 0 return a slot and its snapshots; a reused slot or snapshot "
               "computes what a fresh one does")
    t = toks(24, 280)
    s.create("a")
    s.step([snap_row("a", t, "last", "end")], "ra")
    s.op(op="facts")
    s.create("b")
    s.step([snap_row("b", t[:8], "last", "end")], "rb")
    s.op(op="facts")
    effect(s, "free", seq="a")
    s.op(op="facts")
    s.note("c takes a's slot and snapshot")
    s.create("c")
    s.step([snap_row("c", t, "last", "end")], "rc")
    s.compare("$ra.rows[0].logits", "$rc.rows[0].logits")
    s.op(op="facts")
    s.step([row("c", t[:3])])
    effect(s, "truncate", seq="c", len=24)
    s.step([row("c", t[:3], "last")], "rc2")
    s.op(op="facts")
    s.note("truncate to 0 returns b's slot and snapshot; d takes them")
    effect(s, "truncate", seq="b", len=0)
    seq_op(s, "b")
    s.op(op="facts")
    s.create("d")
    s.step([row("d", t[:5])])
    s.step([snap_row("d", t[5:8], "last", "each")], "rd")
    s.compare("$rb.rows[0].logits", "$rd.rows[0].logits")
    s.op(op="facts")
    effect(s, "truncate", seq="d", len=6)
    s.step([row("d", t[6:8], "last")], "rd6")
    s.compare("$rb.rows[0].logits", "$rd6.rows[0].logits")
    s.op(op="facts")
    s.note("free d; b refills in its slot; c's snapshot at 24 still restores c")
    effect(s, "free", seq="d")
    s.op(op="facts")
    s.step([row("b", t[:8], "last")], "rb2")
    s.compare("$rb.rows[0].logits", "$rb2.rows[0].logits")
    s.op(op="facts")
    effect(s, "truncate", seq="c", len=24)
    s.step([row("c", t[:3], "last")], "rc3")
    s.compare("$rc2.rows[0].logits", "$rc3.rows[0].logits")
    s.note("a freed sequence is gone")
    effect(s, "free", seq="a")
    seq_op(s, "a")
    s.op(op="facts")
    return s


def suite_ssm_slots():
    s = Script("SSM slot exhaustion (run with --ssm-slots 3 --ssm-snapshots 8): a plan or a "
               "fork that needs more state slots than are free is refused whole and changes "
               "nothing")
    for q in ("a", "b", "c", "d"):
        s.create(q)
    for i, q in enumerate(("a", "b", "c")):
        s.step([row(q, toks(5 + i, 290 + i))])
    s.op(op="facts")
    s.note("d has no slot and none is free")
    s.op(op="launch", plan={"rows": [row("d", toks(3, 293))]})
    s.op(op="facts")
    seq_op(s, "d")
    s.op(op="launch", plan={"rows": [row("a", toks(1, 294), "last"), row("d", toks(3, 293))]})
    s.op(op="facts")
    seq_op(s, "a")
    seq_op(s, "d")
    effect(s, "fork", seq="a")
    s.op(op="facts")
    s.note("a fork of the empty d needs no slot; sequences hold none until their first tokens")
    effect(s, "fork", "e", seq="d")
    s.create("f")
    s.op(op="facts")
    s.step([row("a", toks(1, 294), "last")], "ra")
    s.note("truncate c to 0: one slot for two new sequences is not enough")
    effect(s, "truncate", seq="c", len=0)
    s.op(op="facts")
    s.op(op="launch", plan={"rows": [row("d", toks(3, 293)), row("e", toks(2, 295))]})
    s.op(op="facts")
    seq_op(s, "d")
    seq_op(s, "e")
    s.step([row("d", toks(3, 293), "last")], "rd")
    s.op(op="facts")
    s.note("free b: the fork refused above now succeeds, and its child continues as a would")
    effect(s, "free", seq="b")
    effect(s, "fork", "g", seq="a")
    s.op(op="facts")
    x = toks(2, 296)
    s.step([row("a", x, "all"), row("g", x, "all")], "ag")
    s.compare("$ag.rows[0].logits", "$ag.rows[1].logits")
    s.op(op="facts")
    s.op(op="launch", plan={"rows": [row("f", toks(1, 297))]})
    s.op(op="facts")
    seq_op(s, "f")
    return s


def suite_ssm_snapshots():
    s = Script("SSM snapshot exhaustion (run with --ssm-slots 4 --ssm-snapshots 6): a plan "
               "or a snapshot effect that needs more snapshots than are free is refused "
               "whole and changes nothing")
    for q in ("a", "b", "c"):
        s.create(q)
    t = toks(12, 300)
    s.step([snap_row("a", t[:4], "none", "each")])
    s.step([row("b", t[:2])])
    s.op(op="facts")
    s.note("3 snapshots asked, 2 free")
    s.op(op="launch", plan={"rows": [snap_row("a", t[4:7], "last", "each")]})
    s.op(op="facts")
    seq_op(s, "a")
    s.op(op="launch", plan={"rows": [snap_row("a", t[4:5], "none", "end"),
                                     snap_row("b", t[2:4], "none", "each")]})
    s.op(op="facts")
    seq_op(s, "a")
    seq_op(s, "b")
    s.note("2 asked, 2 free: every snapshot in use")
    s.step([snap_row("b", t[2:4], "last", "each")], "rb")
    s.op(op="facts")
    seq_op(s, "b")
    s.note("full: a snapshot where one exists, or at length 0, needs none; any other is "
           "refused")
    effect(s, "snapshot", seq="b")
    effect(s, "snapshot", seq="c")
    s.op(op="launch", plan={"rows": [snap_row("c", t[:2], "none", "end")]})
    s.op(op="facts")
    seq_op(s, "c")
    s.step([row("b", t[4:5])])
    s.op(op="facts")
    effect(s, "snapshot", seq="b")
    seq_op(s, "b")
    s.op(op="facts")
    s.note("rows without snapshots still run")
    s.step([row("a", t[4:6]), row("c", t[:2])])
    s.op(op="facts")
    s.note("truncate a back to 2 returns two snapshots; a row with snapshot each fits again")
    effect(s, "truncate", seq="a", len=2)
    s.op(op="facts")
    s.step([snap_row("b", t[5:7], "last", "each")], "rb7")
    seq_op(s, "b")
    s.op(op="facts")
    s.note("and the states behind them are right: back to 6, continue = what came before")
    effect(s, "truncate", seq="b", len=6)
    s.step([row("b", t[6:7], "last")], "rb6")
    s.compare("$rb7.rows[0].logits", "$rb6.rows[0].logits")
    s.op(op="facts")
    return s


def suite_ssm_errors():
    s = Script("the hybrid error codes (run with --ssm-slots 2 --ssm-snapshots 2): "
               "no_snapshot, out_of_ssm_slots, out_of_snapshots, a bad snapshot mode")
    for q in ("a", "b", "c"):
        s.create(q)
    s.note("invalid_input: a snapshot mode other than end and each")
    for mode in ("all", "none", 1, True):
        s.op(op="launch", plan={"rows": [dict(row("a", [1]), snapshot=mode)]})
    s.step([snap_row("a", toks(6, 310), "none", "end")])
    s.note("no_snapshot: truncate to a length without a snapshot")
    effect(s, "truncate", seq="a", len=3)
    effect(s, "truncate", seq="a", len=5)
    seq_op(s, "a")
    s.note("out_of_snapshots: a row and an effect")
    s.op(op="launch", plan={"rows": [snap_row("a", toks(2, 311), "none", "each")]})
    s.step([row("a", toks(1, 312))])
    effect(s, "snapshot", seq="a")
    effect(s, "snapshot", seq="a")
    s.step([row("a", toks(1, 313))])
    effect(s, "snapshot", seq="a")
    seq_op(s, "a")
    s.op(op="facts")
    s.note("out_of_ssm_slots: a plan and a fork")
    s.step([row("b", toks(2, 314))])
    s.op(op="launch", plan={"rows": [row("c", toks(2, 315))]})
    effect(s, "fork", seq="a")
    s.op(op="facts")
    return s


# ---- sliding window (Mistral: the token at position pos reads the keys j > pos - W) -------
#
# Each window script is written for one window W and block size: the notes
# say which positions lie wholly below the window of a sequence's next token
# (its blocks are given back to the pool once the step that left them behind
# is awaited, docs/objects.md), and truncate lengths are picked either side
# of the earliest one a sequence still has every key for.


def below(n, w, bs):
    """Whole blocks that the next token of a sequence of length n (at position
    n, reading keys from n - w + 1) reads nothing of."""
    return max(0, (n - w + 1) // bs)


def earliest(n, w, bs):
    """The shortest length > 0 a sequence of length n can be truncated to while
    it still holds every key the token at that length reads."""
    r = below(n, w, bs) * bs
    return r + w - 1 if r else 1


def at(s, q, n, w, bs):
    r = below(n, w, bs)
    if r:
        s.note("%s at %d: its next token reads keys from %d; blocks 0..%d (positions 0..%d) lie "
               "below the window" % (q, n, n - w + 1, r - 1, r * bs - 1))
    else:
        s.note("%s at %d: its next token reads keys from %d; no block lies wholly below the "
               "window" % (q, n, max(0, n - w + 1)))


def window_chunks(w, bs, n, uneven, salt):
    s = Script("sliding-window chunk invariance (window %d, blocks of %d): one prefill of %d "
               "tokens (%d windows and more) vs chunks of 1, 7 and 16 and uneven chunks %s, "
               "every chunk boundary either side of the window's; decode afterwards agrees too"
               % (w, bs, n, n // w, uneven))
    t = toks(n, salt)
    s.create("one")
    s.step([row("one", t, "all")], "whole")
    plans = [("c1", [1] * n), ("c7", [7] * (n // 7) + [n % 7]),
             ("c16", [16] * (n // 16) + [n % 16]), ("cu", uneven)]
    for seq, sizes in plans:
        sizes = [c for c in sizes if c]
        assert sum(sizes) == n
        s.create(seq)
        start = 0
        for c in sizes:
            name = "%s_%d" % (seq, start)
            s.step([row(seq, t[start:start + c], "all")], name)
            compare_rows(s, "$whole.rows[0].logits", "$%s.rows[0].logits" % name, c, start, 0)
            s.release("$%s.rows[0].logits" % name)
            start += c
    at(s, "every sequence", n, w, bs)
    seq_op(s, "one")
    seq_op(s, "c16")
    s.op(op="facts")
    s.note("decode after a chunked prefill equals decode after the whole one, past more "
           "block boundaries")
    nxt = toks(bs + 2, salt + 1)
    for i, tok in enumerate(nxt):
        s.step([row("one", [tok], "last"), row("c7", [tok], "last"), row("cu", [tok], "last")],
               "d%d" % i)
        s.compare("$d%d.rows[0].logits" % i, "$d%d.rows[1].logits" % i)
        s.compare("$d%d.rows[0].logits" % i, "$d%d.rows[2].logits" % i)
        s.release("$d%d.rows[0].logits" % i)
        s.release("$d%d.rows[1].logits" % i)
        s.release("$d%d.rows[2].logits" % i)
    at(s, "one, c7 and cu", n + len(nxt), w, bs)
    seq_op(s, "c7")
    s.op(op="facts")
    return s


def window_batch(w, bs, salt):
    s = Script("sliding-window batch invariance (window %d, blocks of %d): rows alone vs the "
               "same rows inside batches of 2, 8 and 64 rows of sequences at other offsets "
               "from their windows (histories of 0, 1, W-1, W, W+1, 2W, 2W+3, a block, a "
               "block and one, 3W+1 tokens), prefill and decode mixed" % (w, bs))
    hx, hy = toks(2 * w + 5, salt), toks(w - 3, salt + 1)
    target, nxt = toks(9, salt + 2), toks(1, salt + 3)
    s.note("x: 9 tokens after %d, well past its window; y: 9 tokens after %d, across the "
           "window's first boundary" % (len(hx), len(hy)))
    s.create("x")
    s.create("y")
    s.step([row("x", hx)])
    s.step([row("y", hy)])
    s.step([row("x", target, "all")], "ax")
    s.step([row("y", target, "all")], "ay")
    s.step([row("x", nxt, "last")], "dx")
    s.step([row("y", nxt, "last")], "dy")
    hist = [0, 1, w - 1, w, w + 1, 2 * w, 2 * w + 3, bs, bs + 1, 3 * w + 1]
    for b in (2, 8, 64):
        s.note("batch of %d" % b)
        others = ["b%d_%d" % (b, i) for i in range(b - 2)]
        for o in others:
            s.create(o)
        tx, ty = "tx%d" % b, "ty%d" % b
        s.create(tx)
        s.create(ty)
        hrows = [row(o, toks(hist[i % 10], salt + 100 + i)) for i, o in enumerate(others)
                 if hist[i % 10]]
        s.step(hrows + [row(tx, hx), row(ty, hy)])
        rows = []
        for i, o in enumerate(others):
            n = 1 if i % 2 else 1 + i % 12
            rows.append(row(o, toks(n, salt + 200 + i), "last" if i % 4 == 1 else "none"))
        px, py = len(rows) // 3, 2 * len(rows) // 3 + 1
        rows.insert(px, row(tx, target, "all"))
        rows.insert(py, row(ty, target, "all"))
        s.step(rows, "r%d" % b)
        s.compare("$ax.rows[0].logits", "$r%d.rows[%d].logits" % (b, px))
        s.compare("$ay.rows[0].logits", "$r%d.rows[%d].logits" % (b, py))
        for i in range(len(rows)):
            if rows[i]["logits"] != "none":
                s.release("$r%d.rows[%d].logits" % (b, i))
        s.note("a decode step of every row")
        drows = [row(o, toks(1, salt + 300 + i)) for i, o in enumerate(others)]
        drows.insert(px, row(tx, nxt, "last"))
        drows.insert(py, row(ty, nxt, "last"))
        s.step(drows, "e%d" % b)
        s.compare("$dx.rows[0].logits", "$e%d.rows[%d].logits" % (b, px))
        s.compare("$dy.rows[0].logits", "$e%d.rows[%d].logits" % (b, py))
        s.release("$e%d.rows[%d].logits" % (b, px))
        s.release("$e%d.rows[%d].logits" % (b, py))
        for o in others + [tx, ty]:
            s.free(o)
    s.op(op="facts")
    return s


def window_fork(w, bs, salt):
    s = Script("fork with a sliding window (window %d, blocks of %d): the child shares the "
               "blocks the parent holds, copy-on-write of the shared partial block, parent and "
               "child leave shared blocks below their windows one after the other, and every "
               "continuation equals a fresh sequence" % (w, bs))
    p = toks(2 * w - 3, salt)
    xa, xb = toks(5, salt + 1), toks(3, salt + 2)
    ya, yb = toks(2 * bs, salt + 3), toks(2 * bs + 1, salt + 4)
    s.create("a")
    s.step([row("a", p)])
    at(s, "a", len(p), w, bs)
    effect(s, "fork", "b", seq="a")
    s.op(op="facts")
    seq_op(s, "a")
    seq_op(s, "b")
    s.step([row("a", xa, "all")], "ca")
    at(s, "a", len(p + xa), w, bs)
    s.op(op="facts")
    s.step([row("b", xb, "all")], "cb")
    at(s, "b", len(p + xb), w, bs)
    s.op(op="facts")
    s.create("fa")
    s.create("fb")
    s.step([row("fa", p + xa, "all"), row("fb", p + xb, "all")], "fresh")
    compare_rows(s, "$ca.rows[0].logits", "$fresh.rows[0].logits", len(xa), 0, len(p))
    compare_rows(s, "$cb.rows[0].logits", "$fresh.rows[1].logits", len(xb), 0, len(p))
    s.free("fa")
    s.free("fb")
    s.note("a runs on: blocks it shares with b fall below a's window first")
    s.step([row("a", ya, "last")], "ca2")
    at(s, "a", len(p + xa + ya), w, bs)
    seq_op(s, "a")
    seq_op(s, "b")
    s.op(op="facts")
    s.step([row("b", yb, "last")], "cb2")
    at(s, "b", len(p + xb + yb), w, bs)
    seq_op(s, "b")
    s.op(op="facts")
    s.create("ga")
    s.step([row("ga", p + xa + ya, "last")], "fa2")
    s.compare("$ca2.rows[0].logits", "$fa2.rows[0].logits")
    s.create("gb")
    s.step([row("gb", p + xb + yb, "last")], "fb2")
    s.compare("$cb2.rows[0].logits", "$fb2.rows[0].logits")
    s.free("ga")
    s.free("gb")
    s.note("a fork of b after its release; freeing b keeps c's blocks; c continues")
    effect(s, "fork", "c", seq="b")
    seq_op(s, "c")
    s.free("b")
    s.op(op="facts")
    s.step([row("c", xa, "last")], "cc")
    s.create("fc")
    s.step([row("fc", p + xb + yb + xa, "last")], "fcr")
    s.compare("$cc.rows[0].logits", "$fcr.rows[0].logits")
    s.free("a")
    s.free("c")
    s.free("fc")
    s.op(op="facts")
    return s


def window_truncate(w, bs, salt):
    s = Script("truncate with a sliding window (window %d, blocks of %d): to a length whose "
               "next token still has every key it reads, then continue, equals a fresh "
               "sequence (parent and fork); to a length whose next token would read a "
               "released key it is refused and changes nothing (facts and sequence before and "
               "after); to 0 always works" % (w, bs))
    l0 = w + 3 * bs - 2
    t = toks(l0, salt)
    m1, m2, m3 = toks(5, salt + 1), toks(5, salt + 2), toks(4, salt + 3)
    s.create("a")
    s.step([row("a", t)])
    at(s, "a", l0, w, bs)
    seq_op(s, "a")
    s.op(op="facts")
    e1 = earliest(l0, w, bs)
    s.note("within the window: truncate to %d (the earliest length is %d), continue" % (e1 + 2, e1))
    effect(s, "truncate", seq="a", len=e1 + 2)
    seq_op(s, "a")
    s.step([row("a", m1, "all")], "ta")
    h1 = t[:e1 + 2] + m1
    s.create("f1")
    s.step([row("f1", h1, "all")], "tf1")
    compare_rows(s, "$ta.rows[0].logits", "$tf1.rows[0].logits", len(m1), 0, e1 + 2)
    s.free("f1")
    at(s, "a", len(h1), w, bs)
    e2 = earliest(len(h1), w, bs)
    s.note("at the boundary: truncate to %d, the earliest length, continue" % e2)
    effect(s, "truncate", seq="a", len=e2)
    s.step([row("a", m2, "all")], "tb")
    h2 = h1[:e2] + m2
    s.create("f2")
    s.step([row("f2", h2, "all")], "tf2")
    compare_rows(s, "$tb.rows[0].logits", "$tf2.rows[0].logits", len(m2), 0, e2)
    s.free("f2")
    at(s, "a", len(h2), w, bs)
    e3 = earliest(len(h2), w, bs)
    r3 = below(len(h2), w, bs) * bs
    s.note("a fork inherits what a released: the same lengths are refused and accepted")
    effect(s, "fork", "c", seq="a")
    seq_op(s, "c")
    s.op(op="facts")
    s.note("into the released positions 0..%d: truncate to %d, %d and 1 is refused, nothing "
           "changes" % (r3 - 1, e3 - 1, r3 - 1))
    for n in (e3 - 1, r3 - 1, 1):
        effect(s, "truncate", seq="a", len=n)
    seq_op(s, "a")
    s.op(op="facts")
    effect(s, "truncate", seq="c", len=e3 - 1)
    seq_op(s, "c")
    s.op(op="facts")
    s.note("c truncated to %d and continued equals a fresh sequence" % e3)
    effect(s, "truncate", seq="c", len=e3)
    s.step([row("c", m3, "all")], "tc")
    s.create("f3")
    s.step([row("f3", h2[:e3] + m3, "all")], "tf3")
    compare_rows(s, "$tc.rows[0].logits", "$tf3.rows[0].logits", len(m3), 0, e3)
    s.free("f3")
    s.note("truncate to 0 reads no key: accepted, and the sequence starts over")
    effect(s, "truncate", seq="a", len=0)
    seq_op(s, "a")
    s.op(op="facts")
    s.step([row("a", t[:4], "last")], "t0")
    s.create("g")
    s.step([row("g", t[:4], "last")], "tg")
    s.compare("$t0.rows[0].logits", "$tg.rows[0].logits")
    s.op(op="facts")
    return s


def suite_window_chunks():
    return window_chunks(24, 16, 100, [23, 1, 24, 25, 2, 16, 9], 400)


def suite_window_chunks_w8():
    return window_chunks(8, 4, 40, [7, 1, 8, 9, 2, 4, 9], 410)


def suite_window_batch():
    return window_batch(24, 16, 420)


def suite_window_batch_w8():
    return window_batch(8, 4, 430)


def suite_window_fork():
    return window_fork(24, 16, 440)


def suite_window_fork_w8():
    return window_fork(8, 4, 450)


def suite_window_truncate():
    return window_truncate(24, 16, 460)


def suite_window_truncate_w8():
    return window_truncate(8, 4, 470)


def suite_window_facts():
    w, bs = 8, 4
    s = Script("facts as a sequence leaves blocks below its sliding window (window %d, blocks of "
               "%d; run with --block-size 4 --kv-blocks 32): decode token by token, facts after "
               "every step that takes a block or leaves one below the window; the blocks go "
               "back when the step is awaited, not at launch; a prefill over several windows "
               "gives back several at once" % (w, bs))
    n = 3 * w + 2 * bs
    t = toks(n, 480)
    s.create("a")
    s.op(op="facts")
    for i in range(n):
        last = i == n - 1
        s.step([row("a", [t[i]], "last" if last else "none")], "da" if last else None)
        seq_op(s, "a")
        took = i % bs == 0
        left = below(i + 1, w, bs) > below(i, w, bs)
        if took or left:
            s.note("a at %d: %s" % (i + 1, " and ".join(
                ([("took block %d" % (i // bs))] if took else []) +
                ([("block %d is below the window" % (below(i + 1, w, bs) - 1))] if left else []))))
            s.op(op="facts")
    more = toks(3, 481)
    assert below(n + len(more), w, bs) > below(n, w, bs) and n % bs == 0
    s.note("launched, not yet awaited: block %d is taken for positions %d..%d, and block %d, "
           "below the window of the token at %d, goes back only when the step is awaited"
           % (n // bs, n, n + len(more) - 1, below(n + len(more), w, bs) - 1, n + len(more)))
    s.op(op="launch", plan={"rows": [row("a", more, "last")]}, **{"as": "la"})
    seq_op(s, "a")
    s.op(op="facts")
    s.op(op="await", ticket="$la", **{"as": "ra"})
    seq_op(s, "a")
    s.op(op="facts")
    s.note("one prefill of %d tokens takes every block it writes and leaves %d below the "
           "window when awaited" % (2 * w + 3, below(2 * w + 3, w, bs)))
    s.create("b")
    s.step([row("b", toks(2 * w + 3, 482))])
    seq_op(s, "b")
    s.op(op="facts")
    s.note("a's numbers equal one prefill of the same tokens")
    s.create("c")
    s.step([row("c", t + more, "last")], "rc")
    s.compare("$ra.rows[0].logits", "$rc.rows[0].logits")
    s.create("d")
    s.step([row("d", t, "last")], "rd")
    s.compare("$da.rows[0].logits", "$rd.rows[0].logits")
    s.op(op="facts")
    for q in ("a", "b", "c", "d"):
        s.free(q)
    s.op(op="facts")
    return s


def suite_window_free_reuse():
    w, bs = 8, 4
    s = Script("free and reuse with a sliding window (window %d, blocks of %d; run with "
               "--kv-blocks 12 --block-size 4): blocks a sequence leaves below its window and "
               "blocks it frees are taken by other sequences, which compute what fresh blocks "
               "do; free returns only the blocks still held" % (w, bs))
    t, t2, t3 = toks(24, 490), toks(8, 491), toks(4, 492)
    s.note("z computes b's tokens on blocks never used before")
    s.create("z")
    s.step([row("z", t2, "last")], "rz")
    s.free("z")
    s.create("a")
    s.step([row("a", t, "last")], "ra")
    at(s, "a", len(t), w, bs)
    seq_op(s, "a")
    s.op(op="facts")
    s.note("b takes blocks a gave back, which still hold a's keys")
    s.create("b")
    s.step([row("b", t2, "last")], "rb")
    s.compare("$rz.rows[0].logits", "$rb.rows[0].logits")
    s.op(op="facts")
    s.step([row("a", t3, "all")], "ra2")
    at(s, "a", len(t + t3), w, bs)
    seq_op(s, "a")
    s.op(op="facts")
    s.free("a")
    s.op(op="facts")
    s.create("c")
    s.step([row("c", t + t3, "all")], "rc")
    s.compare("$ra.rows[0].logits", "$rc.rows[0].logits", 0, len(t) - 1)
    compare_rows(s, "$ra2.rows[0].logits", "$rc.rows[0].logits", len(t3), 0, len(t))
    seq_op(s, "c")
    s.op(op="facts")
    s.free("c")
    s.free("b")
    s.op(op="facts")
    s.op(op="apply", effect={"kind": "free", "seq": "$a"})
    s.op(op="seq", seq="$a")
    return s


# name -> (builder, model, device flags)
def state_moves(s, prompt, more, snapshot=None):
    """Sequence a prefilled with `prompt`, exported (`snapshots` along when the rows took
    them) and imported as b; the next rows `more` on a and b alike give the same bits; then
    a fork's child moves too."""
    s.create("a")
    s.step([snap_row("a", prompt, "none", snapshot)])
    s.op(op="export", seq="$a", snapshots=snapshot is not None, **{"as": "st"})
    s.op(op="import", state="st", **{"as": "b"})
    seq_op(s, "b")
    s.op(op="facts")
    for i, t in enumerate(more):
        s.step([row("a", t, "all"), row("b", t, "all")], "m%d" % i)
        s.compare("$m%d.rows[0].logits" % i, "$m%d.rows[1].logits" % i)
        s.release("$m%d.rows[0].logits" % i)
        s.release("$m%d.rows[1].logits" % i)
    s.note("a fork's child, its blocks shared with the parent, moves as well")
    effect(s, "fork", "f", seq="a")
    s.op(op="export", seq="$f", **{"as": "fs"})
    s.op(op="import", state="fs", **{"as": "g"})
    t = toks(3, 77)
    s.step([row("f", t, "all"), row("g", t, "all")], "fg")
    s.compare("$fg.rows[0].logits", "$fg.rows[1].logits")
    s.release("$fg.rows[0].logits")
    s.release("$fg.rows[1].logits")


def state_refusals(s):
    """An altered byte, a state cut short and the export of a sequence in a ticket not yet
    awaited are refused; the facts say nothing was kept."""
    s.note("refused: an altered byte (checksum), a state cut short, a busy sequence")
    s.op(op="import", state="st", flip=300)
    s.op(op="import", state="st", cut=20)
    s.op(op="import", state="st", cut=1)
    s.op(op="facts")
    s.op(op="launch", plan={"rows": [row("b", toks(1, 78), "none")]}, **{"as": "t"})
    s.op(op="export", seq="$b", **{"as": "busy"})
    s.op(op="await", ticket="$t")
    s.note("the exporting sequence freed, its import goes on alone")
    s.free("a")
    s.step([row("b", toks(2, 79), "all")], "after")
    s.op(op="facts")


def suite_state():
    s = Script("a sequence's state exported and imported continues bit for bit; its bytes "
               "are the same on every target")
    state_moves(s, toks(21, 70), [toks(1, 71), toks(4, 72), toks(1, 73)])
    state_refusals(s)
    return s


def suite_ssm_state():
    s = Script("a hybrid sequence's state (its state slot and snapshots) exported and imported "
               "continues bit for bit, also after a truncate to a snapshot it carried")
    state_moves(s, toks(13, 80), [toks(1, 81), toks(3, 82)], snapshot="each")
    s.note("truncate both to a snapshot the state carried, continue alike")
    effect(s, "truncate", seq="a", len=7)
    effect(s, "truncate", seq="b", len=7)
    t = toks(2, 83)
    s.step([row("a", t, "all"), row("b", t, "all")], "tr")
    s.compare("$tr.rows[0].logits", "$tr.rows[1].logits")
    s.release("$tr.rows[0].logits")
    s.release("$tr.rows[1].logits")
    state_refusals(s)
    return s


def park_moves(s, snapshot=None):
    """Sequence a parked and restored against its twin t that stays: the same bits after; a
    fork of a holds the blocks they share through the park; what a parked sequence refuses."""
    prompt = toks(18, 90)
    for q in ("a", "t"):
        s.create(q)
        s.step([snap_row(q, prompt, "none", snapshot)])
    effect(s, "fork", "c", seq="a")
    s.step([row("a", toks(5, 91), "none"), row("t", toks(5, 91), "none")])
    s.op(op="facts")
    effect(s, "park", "p", seq="a")
    seq_op(s, "a")
    s.op(op="facts")
    s.note("a parked sequence takes no step and no effect but free and restore")
    s.step([row("a", toks(1, 92), "last")])
    effect(s, "fork", seq="a")
    effect(s, "truncate", seq="a", len=4)
    effect(s, "park", seq="a")
    effect(s, "restore", seq="c")
    s.op(op="export", seq="$a", **{"as": "pa"})
    s.note("its fork goes on through the blocks they share")
    s.step([row("c", toks(2, 93), "all")], "cc")
    s.release("$cc.rows[0].logits")
    effect(s, "restore", "r", seq="a")
    seq_op(s, "a")
    s.op(op="facts")
    t = toks(3, 94)
    s.step([row("a", t, "all"), row("t", t, "all")], "after")
    s.compare("$after.rows[0].logits", "$after.rows[1].logits")
    s.release("$after.rows[0].logits")
    s.release("$after.rows[1].logits")
    if snapshot:
        s.note("the snapshots came back with it")
        effect(s, "truncate", seq="a", len=9)
        effect(s, "truncate", seq="t", len=9)
        s.step([row("a", t, "all"), row("t", t, "all")], "tr")
        s.compare("$tr.rows[0].logits", "$tr.rows[1].logits")
        s.release("$tr.rows[0].logits")
        s.release("$tr.rows[1].logits")
    s.note("parked, then freed: its host bytes go")
    effect(s, "park", seq="a")
    s.free("a")
    s.op(op="facts")


def suite_park():
    s = Script("park and restore: a sequence's state to host memory and back continues bit "
               "for bit; a fork keeps the blocks it shares; a parked sequence refuses steps "
               "and effects but free and restore; a restore without room changes nothing")
    park_moves(s)
    s.note("no room to restore: refused, still parked; room made, restored")
    s.create("big")
    s.step([row("big", toks(30, 95), "none")])
    effect(s, "park", seq="big")
    s.create("fill")
    s.step([row("fill", toks(44, 96), "none")])
    s.op(op="facts")
    effect(s, "restore", seq="big")
    s.op(op="facts")
    s.free("fill")
    effect(s, "restore", seq="big")
    s.op(op="facts")
    return s


def suite_ssm_park():
    s = Script("park and restore on a hybrid model: the state slot and every snapshot go to "
               "host memory and come back; after the restore a truncate to a snapshot continues "
               "as the twin that stayed")
    park_moves(s, snapshot="each")
    return s


SUITES = {
    "batch": (suite_batch, "tiny", ""),
    "chunks": (suite_chunks, "tiny", ""),
    "depth": (suite_depth, "tiny", ""),
    "fork": (suite_fork, "tiny", ""),
    "truncate": (suite_truncate, "tiny", ""),
    "free_reuse": (suite_free_reuse, "tiny", "--kv-blocks 12 --block-size 4"),
    "sampling": (suite_sampling, "tiny", ""),
    "sampling_proc": (suite_sampling_proc, "tiny", ""),
    "long": (suite_long, "tiny", ""),
    "kv_exhaustion": (suite_kv_exhaustion, "tiny", "--kv-blocks 8 --block-size 4"),
    "errors": (suite_errors, "tiny", "--max-depth 2 --max-rows 4 --max-batch-tokens 64 "
               "--logits-handles 3 --logits-rows 8 --max-seqs 6 --max-seq-len 64 "
               "--kv-blocks 12 --block-size 4"),
    "batch_gqa": (suite_batch, "gqa", ""),
    "chunks_gqa": (suite_chunks, "gqa", ""),
    "fork_gqa": (suite_fork, "gqa", ""),
    "long_gqa": (suite_long, "gqa", ""),
    "chunks_bias": (suite_chunks, "bias", ""),
    "sampling_bias": (suite_sampling, "bias", ""),
    "state": (suite_state, "tiny", ""),
    "state_gqa": (suite_state, "gqa", ""),
    "state_qwen3": (suite_state, "qwen3", ""),
    "state_w8": (suite_state, "mistral_w8", "--block-size 4"),
    "park": (suite_park, "tiny", "--kv-blocks 24 --block-size 4"),
    "park_w8": (suite_park, "mistral_w8", "--kv-blocks 24 --block-size 4"),
    "ssm_park": (suite_ssm_park, "bamba", ""),
    "ssm_park_mamba2": (suite_ssm_park, "mamba2", ""),
    "ssm_state": (suite_ssm_state, "bamba", ""),
    "ssm_state_mamba2": (suite_ssm_state, "mamba2", ""),
    "lora_batch": (suite_lora_batch, "tiny", ""),
    "lora_lifecycle": (suite_lora_lifecycle, "tiny", ""),
    "lora_evict": (suite_lora_evict, "tiny", "--max-loras 2"),
    "ssm_chunks": (suite_ssm_chunks, "bamba", ""),
    "ssm_chunks_g1": (suite_ssm_chunks, "bamba_g1", ""),
    "ssm_chunks_mamba2": (suite_ssm_chunks, "mamba2", ""),
    "ssm_chunks_nb": (suite_ssm_chunks, "mamba2_nb", ""),
    "ssm_batch": (suite_ssm_batch, "bamba", ""),
    "ssm_batch_g1": (suite_ssm_batch, "bamba_g1", ""),
    "ssm_batch_mamba2": (suite_ssm_batch, "mamba2", ""),
    "ssm_batch_nb": (suite_ssm_batch, "mamba2_nb", ""),
    "ssm_depth": (suite_depth, "bamba", ""),
    "ssm_depth_mamba2": (suite_depth, "mamba2", ""),
    "ssm_long": (suite_long, "bamba", ""),
    "ssm_long_mamba2": (suite_long, "mamba2", ""),
    "ssm_fork": (suite_ssm_fork, "bamba", ""),
    "ssm_fork_mamba2": (suite_ssm_fork, "mamba2", ""),
    "ssm_snapshot": (suite_ssm_snapshot, "bamba", ""),
    "ssm_snapshot_mamba2": (suite_ssm_snapshot, "mamba2", ""),
    "ssm_spec": (suite_ssm_spec, "bamba", ""),
    "ssm_spec_g1": (suite_ssm_spec, "bamba_g1", ""),
    "ssm_spec_mamba2": (suite_ssm_spec, "mamba2", ""),
    "ssm_spec_nb": (suite_ssm_spec, "mamba2_nb", ""),
    "ssm_free_reuse": (suite_ssm_free_reuse, "bamba", "--ssm-slots 2 --ssm-snapshots 4"),
    "ssm_free_reuse_mamba2": (suite_ssm_free_reuse, "mamba2", "--ssm-slots 2 --ssm-snapshots 4"),
    "ssm_slots": (suite_ssm_slots, "bamba", "--ssm-slots 3 --ssm-snapshots 8"),
    "ssm_slots_mamba2": (suite_ssm_slots, "mamba2", "--ssm-slots 3 --ssm-snapshots 8"),
    "ssm_snapshots": (suite_ssm_snapshots, "bamba", "--ssm-slots 4 --ssm-snapshots 6"),
    "ssm_snapshots_mamba2": (suite_ssm_snapshots, "mamba2", "--ssm-slots 4 --ssm-snapshots 6"),
    "ssm_errors": (suite_ssm_errors, "bamba", "--ssm-slots 2 --ssm-snapshots 2"),
    "ssm_errors_mamba2": (suite_ssm_errors, "mamba2", "--ssm-slots 2 --ssm-snapshots 2"),
    # the Llama family: Qwen3's q/k norms, Granite's multipliers, RoPE scaling, Mistral
    "chunks_qwen3": (suite_chunks, "qwen3", ""),
    "batch_qwen3": (suite_batch, "qwen3", ""),
    "fork_qwen3": (suite_fork, "qwen3", ""),
    "long_qwen3": (suite_long, "qwen3", ""),
    "chunks_granite": (suite_chunks, "granite", ""),
    "batch_granite": (suite_batch, "granite", ""),
    "long_granite": (suite_long, "granite", ""),
    "sampling_granite": (suite_sampling, "granite", ""),
    "chunks_llama3rope": (suite_chunks, "llama3rope", ""),
    "batch_llama3rope": (suite_batch, "llama3rope", ""),
    "long_llama3rope": (suite_long, "llama3rope", ""),
    "chunks_yarn": (suite_chunks, "yarn", ""),
    "batch_yarn": (suite_batch, "yarn", ""),
    "long_yarn": (suite_long, "yarn", ""),
    "sampling_yarn": (suite_sampling, "yarn", ""),
    "chunks_mistral": (suite_chunks, "mistral", ""),
    "fork_mistral": (suite_fork, "mistral", ""),
    "long_mistral": (suite_long, "mistral", ""),
    "chunks_mistral_w8": (suite_chunks, "mistral_w8", ""),
    "fork_mistral_w8": (suite_fork, "mistral_w8", ""),
    "long_mistral_w8": (suite_long, "mistral_w8", ""),
    # sliding window: mistral (window 24, blocks of 16), mistral_w8 (window 8, blocks of 4)
    "window_chunks": (suite_window_chunks, "mistral", ""),
    "window_chunks_w8": (suite_window_chunks_w8, "mistral_w8", "--block-size 4"),
    "window_batch": (suite_window_batch, "mistral", ""),
    "window_batch_w8": (suite_window_batch_w8, "mistral_w8", "--block-size 4"),
    "window_fork": (suite_window_fork, "mistral", ""),
    "window_fork_w8": (suite_window_fork_w8, "mistral_w8", "--block-size 4 --kv-blocks 64"),
    "window_truncate": (suite_window_truncate, "mistral", ""),
    "window_truncate_w8": (suite_window_truncate_w8, "mistral_w8",
                           "--block-size 4 --kv-blocks 64"),
    "window_facts": (suite_window_facts, "mistral_w8", "--block-size 4 --kv-blocks 32"),
    "window_free_reuse": (suite_window_free_reuse, "mistral_w8", "--kv-blocks 12 --block-size 4"),
}

# adapter name -> (base model, devio-mkmodel --adapter arguments); each is
# written to ROOT/name, and every target runs with --adapters ROOT.
ADAPTERS = {
    "sql": ("tiny", "--rank 8 --alpha 16 --targets q_proj,v_proj --seed 1"),
    "chat": ("tiny", "--rank 4 --alpha 8 --dtype bf16 --seed 2 --targets "
                     "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"),
    "code": ("tiny", "--rank 16 --alpha 16 --rslora --targets o_proj,gate_proj,up_proj,down_proj "
                     "--seed 3"),
    "math": ("tiny", "--rank 2 --alpha 4 --dtype f16 --targets k_proj --seed 4"),
}

# model name -> devio-mkmodel arguments (same seed, same bytes)
MODELS = {
    "tiny": "--preset tiny --seed 11",
    "gqa": "--preset tiny --seed 12 --heads 8 --kv-heads 2 --head-dim 8 --layers 3 --tied "
           "--dtype bf16",
    "bias": "--preset tiny --seed 13 --bias --head-dim 24 --dtype f16 --rope-theta 500000",
    # hybrid: Mamba-2 mixers with attention in layer 1 (Bamba), mixers only (Mamba2)
    "bamba": "--preset tiny --arch bamba --seed 21",
    "bamba_g1": "--preset tiny --arch bamba --seed 23 --ssm-groups 1 --dtype bf16 --tied",
    "mamba2": "--preset tiny --arch mamba2 --seed 22",
    "mamba2_nb": "--preset tiny --arch mamba2 --seed 24 --no-conv-bias --dtype f16",
    # the Llama family: Qwen3 (q_norm/k_norm, head_dim 32 on hidden 64), Granite (its four
    # multipliers), Mistral (sliding window 24, and 8), RoPE scaling (llama3: factor 8 from
    # 64 original positions, every regime of its smoothing; yarn: factor 8, attention factor)
    "qwen3": "--preset tiny --arch qwen3 --seed 31",
    "mistral": "--preset tiny --arch mistral --seed 32",
    "mistral_w8": "--preset tiny --arch mistral --seed 36 --window 8 --dtype bf16",
    "granite": "--preset tiny --arch granite --seed 33 --dtype f16",
    "llama3rope": "--preset tiny --rope-scaling llama3 --seed 34",
    "yarn": "--preset tiny --rope-scaling yarn --seed 35 --tied",
}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(out, "suites.txt"), "w") as f:
        f.write("# suite | script | model | devio-ref / devio-server flags "
                "(written by gen_suites.py)\n")
        for name, (build, model, flags) in SUITES.items():
            f.write("%s | %s.jsonl | %s | %s\n" % (name, build.__name__[len("suite_"):], model,
                                                   flags))
    with open(os.path.join(out, "models.txt"), "w") as f:
        f.write("# model | devio-mkmodel arguments (written by gen_suites.py)\n")
        for name, args in MODELS.items():
            f.write("%s | %s\n" % (name, args))
    with open(os.path.join(out, "adapters.txt"), "w") as f:
        f.write("# adapter | base model | devio-mkmodel --adapter arguments "
                "(written by gen_suites.py)\n")
        for name, (model, args) in ADAPTERS.items():
            f.write("%s | %s | %s\n" % (name, model, args))
    done = set()
    for build, _, _ in SUITES.values():
        base = build.__name__[len("suite_"):]
        if base in done:
            continue
        done.add(base)
        with open(os.path.join(out, base + ".jsonl"), "w") as f:
            f.write(build().text())
    print("wrote %d scripts, %d suites, %d models into %s" % (len(done), len(SUITES),
                                                             len(MODELS), out))


if __name__ == "__main__":
    main()
