"""tolerance.py - how run.py --fast judges a backend's fast numerics against the reference:
by tolerance on the numbers computed from the weights, exactly on everything else.

Both runs use the suite's script with "full": true on every line, so each logits handle prints
its values. Then, line by line:
- a logits handle: the same id and shape; each position's values within 1e-2 of the
  reference's in the 2-norm over the vocabulary (relative to the reference's norm); its argmax
  counted as agreeing or not;
- a sampled token list (rows[i].tokens, a sample effect's tokens): counted as agreeing or not
  (a temperature draw may fall the other way on logits that moved by a rounding); where the
  tokens differ, the logprobs beside them are of other tokens and are not compared;
- a logprob (a non-integer number): within 5e-2 of the reference's, or 5e-2 of its magnitude;
- top-n logprobs: the same count (ties among nearly equal logits may order differently);
- a compare line's "equal" and digests: not compared with the reference's (fast numerics need
  not keep batch or chunk invariance; the values of both handles are held to the reference
  instead); run.py --cpu-fast requires every compare to say equal, since the cpu backend keeps
  both invariances;
- an export's size and digest, and the host bytes of parked states: not compared (a state
  names its numerics and keeps the backend's KV elements; what continues from it is held to
  the reference instead);
- everything else (lengths, blocks, facts, errors, names, SSM counters): exactly.
Over all the suites judged, argmaxes and sampled tokens must agree at 99% of their places or
more (agreement_failure; a single suite has too few places to judge alone).
"""
import json
import math
import os

REL = 1e-2
LOGPROB = 5e-2
AGREE = 0.99


class Tally:
    """What one run's judging counted."""

    def __init__(self):
        self.rows = self.argmax_same = self.tokens = self.tokens_same = 0
        self.worst = 0.0

    def agreement(self):
        n = self.rows + self.tokens
        return (self.argmax_same + self.tokens_same) / n if n else 1.0

    def summary(self):
        return ("%d logits rows, relative error at most %.3g, argmax and sampled tokens agreeing "
                "at %.2f%% of %d places" % (self.rows, self.worst, 100 * self.agreement(),
                                            self.rows + self.tokens))


def full_script(script, tmp):
    """The script with "full": true on every operation line, written under tmp."""
    out = os.path.join(tmp, "full-" + os.path.basename(script))
    if not os.path.exists(out):
        lines = []
        for line in open(script):
            s = line.strip()
            if s and not s.startswith("#") and s.startswith("{"):
                j = json.loads(s)
                j["full"] = True
                s = json.dumps(j, separators=(",", ":"))
            lines.append(s)
        with open(out + ".tmp", "w") as f:
            f.write("\n".join(lines) + "\n")
        os.replace(out + ".tmp", out)
    return out


def _num(v):
    return float("nan") if v is None else float(v)


def _logits(a, b, path, t):
    if not isinstance(b, dict) or b.get("shape") != a.get("shape") or b.get("id") != a.get("id"):
        return "%s: a logits handle of shape %s, got %s" % (path, a.get("shape"), json.dumps(b)[:120])
    rows, vocab = a["shape"]
    va, vb = a["values"], b.get("values")
    if not isinstance(vb, list) or len(vb) != len(va):
        return "%s: %d values expected" % (path, len(va))
    for r in range(rows):
        ra = [_num(x) for x in va[r * vocab:(r + 1) * vocab]]
        rb = [_num(x) for x in vb[r * vocab:(r + 1) * vocab]]
        norm = math.sqrt(sum(x * x for x in ra if math.isfinite(x)))
        diff = math.sqrt(sum((x - y) ** 2 for x, y in zip(ra, rb) if math.isfinite(x)))
        if any(math.isfinite(x) != math.isfinite(y) for x, y in zip(ra, rb)):
            return "%s position %d: a value is finite on one side only" % (path, r)
        rel = diff / norm if norm else diff
        t.worst = max(t.worst, rel)
        t.rows += 1
        t.argmax_same += max(range(vocab), key=lambda i: ra[i]) == max(range(vocab),
                                                                        key=lambda i: rb[i])
        if rel > REL:
            return "%s position %d: relative error %.3g (limit %g)" % (path, r, rel, REL)
    return None


def _walk(a, b, path, op, t):
    if isinstance(a, dict) and "values" in a and "shape" in a:
        return _logits(a, b, path, t)
    if isinstance(a, dict):
        if not isinstance(b, dict):
            return "%s: an object expected" % path
        skip = ("equal", "sha256", "sha256_b") if op == "compare" else ()
        if op == "export":  # a fast state's header and KV elements are its own
            skip = ("bytes", "sha256")
        # A parked state's size follows the backend's KV element (binary16 under fast).
        skip += ("parked_bytes",) + (("bytes",) if path.endswith(".parked") else ())
        if a.get("tokens") != b.get("tokens"):
            skip += ("logprobs", "top_logprobs")
            why = _walk(a.get("tokens"), b.get("tokens"), path + ".tokens", op, t)
            if why:
                return why
            skip += ("tokens",)
        keys = set(a) | set(b)
        for k in sorted(keys - set(skip)):
            if k not in a or k not in b:
                return "%s.%s: on one side only" % (path, k)
            why = _walk(a[k], b[k], path + "." + k, op, t)
            if why:
                return why
        return None
    if isinstance(a, list):
        if not isinstance(b, list) or len(a) != len(b):
            return "%s: a list of %d expected" % (path, len(a))
        if path.endswith(".top_logprobs"):
            return None if all(isinstance(x, list) and isinstance(y, list) and len(x) == len(y)
                               for x, y in zip(a, b)) else "%s: top-n counts differ" % path
        if path.endswith(".tokens") and all(isinstance(x, int) for x in a):
            t.tokens += len(a)
            t.tokens_same += sum(x == y for x, y in zip(a, b))
            return None
        for i, (x, y) in enumerate(zip(a, b)):
            why = _walk(x, y, "%s[%d]" % (path, i), op, t)
            if why:
                return why
        return None
    if isinstance(a, float) or isinstance(b, float):
        if a is None or b is None:
            return None if a == b else "%s: %r, got %r" % (path, a, b)
        if abs(a - b) <= LOGPROB * max(1.0, abs(a)):
            return None
        return "%s: %r, got %r (limit %g)" % (path, a, b, LOGPROB)
    return None if a == b else "%s: %r, got %r" % (path, a, b)


def difference(want, got, tally):
    """None when got holds to want as the module docstring says, else where it does not."""
    la, lb = want.decode().splitlines(), got.decode().splitlines()
    if len(la) != len(lb):
        return "%d lines, expected %d" % (len(lb), len(la))
    for i, (x, y) in enumerate(zip(la, lb)):
        a, b = json.loads(x), json.loads(y)
        why = _walk(a, b, "", a.get("op") if isinstance(a, dict) else None, tally)
        if why:
            return "line %d: %s" % (i + 1, why)
    return None


def agreement_failure(tally):
    """Over every run judged: None when argmaxes and sampled tokens agree often enough."""
    if tally.agreement() >= AGREE:
        return None
    return "argmax and sampled tokens agree at %.2f%% of %d places (limit %.0f%%)" % (
        100 * tally.agreement(), tally.rows + tally.tokens, 100 * AGREE)
