"""test_sampling.py - the sample object's logit processing and top logprobs over HTTP, on plan rows
and on the sample effect: logit_bias (+-inf too), allowed_tokens (one token, none), banned_tokens,
the penalties over the sequence's own tokens from penalty_from, logprobs n. Every answer is checked
against api/openapi.yaml by the client; the arithmetic is checked by tests/python/sampler_numpy_check.py.
"""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "clients" / "python"))
from devio_client import allowed_tokens  # noqa: E402

VOCAB = 256  # the tiny preset
PROMPT = [5, 17, 42, 99, 3]


@pytest.fixture(scope="module")
def c(module_servers, tiny_model):
    return module_servers.start(tiny_model).client()


def step1(c, sample, prompt=PROMPT, **row):
    s = c.create()
    r = {"seq": s, "tokens": prompt, "sample": sample}
    r.update(row)
    return c.step({"rows": [r]})["rows"][0]


def refused(c, sample, prompt=PROMPT):
    s = c.create()
    return c.request("POST", "/v1/launch", {"rows": [{"seq": s, "tokens": prompt,
                                                       "sample": sample}]})


def test_logprobs_are_the_raw_top_n(c):
    r = step1(c, {"temperature": 0, "logprobs": 5})
    top = r["top_logprobs"][0]
    assert len(top) == 5
    assert top[0]["id"] == r["tokens"][0] and top[0]["logprob"] == r["logprobs"][0]
    lps = [t["logprob"] for t in top]
    assert lps == sorted(lps, reverse=True)
    assert "top_logprobs" not in step1(c, {"temperature": 0})


def test_bias_and_bans_move_the_greedy_token(c):
    g = step1(c, {"temperature": 0})["tokens"][0]
    r = step1(c, {"temperature": 0, "logit_bias": {str(g): "-inf"}, "logprobs": 1})
    assert r["tokens"][0] != g
    # The reported logprobs stay those of the raw logits: g is still the top one.
    assert r["top_logprobs"][0][0]["id"] == g
    assert step1(c, {"temperature": 0, "logit_bias": {"200": "inf"}})["tokens"] == [200]
    assert step1(c, {"temperature": 0, "logit_bias": {"201": 1e39}})["tokens"] == [201]
    assert step1(c, {"temperature": 0, "banned_tokens": [g]})["tokens"][0] != g
    # Sampled at a temperature, a banned token is never drawn either.
    for seed in range(20):
        r = step1(c, {"temperature": 5.0, "seed": seed, "banned_tokens": list(range(0, VOCAB, 2))})
        assert r["tokens"][0] % 2 == 1


def test_allowed_tokens(c):
    for tok in (0, 31, 32, 255):
        r = step1(c, {"temperature": 1.0, "seed": 9, "allowed_tokens": allowed_tokens(VOCAB, [tok])})
        assert r["tokens"] == [tok]
    few = [7, 70, 170]
    for seed in range(10):
        r = step1(c, {"temperature": 3.0, "seed": seed, "allowed_tokens": allowed_tokens(VOCAB, few)})
        assert r["tokens"][0] in few


def test_processing_that_leaves_nothing_is_refused(c):
    for sample in ({"allowed_tokens": allowed_tokens(VOCAB, [])},
                   {"allowed_tokens": allowed_tokens(VOCAB, [4]), "banned_tokens": [4]},
                   {"allowed_tokens": allowed_tokens(VOCAB, [4, 5]),
                    "logit_bias": {"4": "-inf", "5": "-inf"}}):
        r = refused(c, sample)
        assert r.status == 400 and r.code == "invalid_input", r
        assert r.details == {"row": 0}, r
        assert "leave no token" in r.json["error"]["message"], r
    r = refused(c, {"allowed_tokens": allowed_tokens(64, [1])})  # 2 words; 256 tokens need 8
    assert r.status == 400 and "8" in r.json["error"]["message"], r
    for sample, field in (({"logprobs": 21}, "logprobs"), ({"banned_tokens": [256]}, "banned"),
                          ({"logit_bias": {"-1": 1}}, "logit_bias"),
                          ({"repetition_penalty": 0}, "repetition_penalty"),
                          ({"allowed_tokens": "not base64!"}, "allowed_tokens")):
        r = refused(c, sample)
        assert r.status == 400 and field in r.json["error"]["message"], (sample, r)
    assert c.facts()["tickets_in_flight"] == 0


def test_penalties_count_the_sequence_from_penalty_from(c):
    """A prompt of every token but one: a large presence penalty over it leaves that one the
    greedy pick; counting from the prompt's end counts nothing and changes nothing."""
    for left_out in (77, 78, 79):  # one the random model would not pick by itself
        prompt = [t for t in range(VOCAB) if t != left_out]
        plain = step1(c, {"temperature": 0}, prompt=prompt)["tokens"][0]
        if plain != left_out:
            break
    r = step1(c, {"temperature": 0, "presence_penalty": 1e30}, prompt=prompt)
    assert r["tokens"] == [left_out]
    r = step1(c, {"temperature": 0, "presence_penalty": 1e30, "penalty_from": len(prompt)},
              prompt=prompt)
    assert r["tokens"] == [plain]
    # Tokens fed by later steps count too: the history is the sequence's.
    s = c.create()
    c.step({"rows": [{"seq": s, "tokens": prompt[:100]}]})
    r = c.step({"rows": [{"seq": s, "tokens": prompt[100:],
                          "sample": {"temperature": 0, "presence_penalty": 1e30}}]})["rows"][0]
    assert r["tokens"] == [left_out]


def test_sample_effect_takes_the_same_processing(c):
    s = c.create()
    h = c.step({"rows": [{"seq": s, "tokens": PROMPT, "logits": "all"}]})["rows"][0]["logits"]
    g = c.effect({"kind": "sample", "logits": h, "params": {"temperature": 0}})["tokens"]
    out = c.effect({"kind": "sample", "logits": h,
                    "params": {"temperature": 0, "logprobs": 3,
                               "banned_tokens": [g[-1]]}})
    assert len(out["tokens"]) == len(PROMPT) and out["tokens"][-1] != g[-1]
    assert [len(t) for t in out["top_logprobs"]] == [3] * len(PROMPT)
    assert out["top_logprobs"][-1][0]["id"] == g[-1]
    # Penalties at row i count the tokens at positions 0..i of the handle's sequence.
    pen = c.effect({"kind": "sample", "logits": h, "row": 4,
                    "params": {"temperature": 0, "presence_penalty": 1e30,
                               "allowed_tokens": allowed_tokens(VOCAB, PROMPT + [g[-1]])}})
    assert pen["tokens"] == [g[-1]] if g[-1] not in PROMPT else pen["tokens"][0] in PROMPT
    c.effect({"kind": "truncate", "seq": s, "len": 2})
    r = c.request("POST", "/v1/effects", {"kind": "sample", "logits": h,
                                          "params": {"presence_penalty": 1.0}})
    assert r.status == 400 and "no longer holds" in r.json["error"]["message"], r
    assert c.effect({"kind": "sample", "logits": h, "params": {"temperature": 0}})["tokens"] == g
    # The handle belongs to the sequence: freeing it releases the handle.
    assert c.call("DELETE", "/v1/sequences/%d" % s).json["freed_logits"] == 1
    c.call("POST", "/v1/effects", {"kind": "sample", "logits": h}, expect=404,
           code="unknown_logits")


def test_forks_carry_the_token_record(c):
    left_out = 11
    prompt = [t for t in range(VOCAB) if t != left_out]
    s = c.create()
    c.step({"rows": [{"seq": s, "tokens": prompt}]})
    child = c.effect({"kind": "fork", "seq": s})["seq"]
    r = c.step({"rows": [{"seq": child, "tokens": [left_out],
                          "sample": {"temperature": 0, "presence_penalty": 1e30,
                                     "banned_tokens": [left_out]}}]})["rows"][0]
    # Every token is in the child's history now: all are penalised alike, the raw order decides.
    assert r["tokens"][0] != left_out
    c.effect({"kind": "truncate", "seq": child, "len": 100})
    r = c.step({"rows": [{"seq": child, "tokens": [prompt[100]],
                          "sample": {"temperature": 0, "presence_penalty": 1e30,
                                     "allowed_tokens": allowed_tokens(VOCAB, [prompt[100],
                                                                             prompt[200]])}}]})
    # After the truncate the record holds positions 0..100: prompt[200] is no longer counted.
    assert r["rows"][0]["tokens"] == [prompt[200]]


def test_prompt_logprobs(c):
    """Each token's raw logprob given those before it: what a sample of that token at the
    previous position reports, bit for bit, and numpy's log-softmax of the raw logits."""
    import numpy as np
    tokens = [9, 200, 31, 4, 4, 77]
    s = c.create()
    r = c.step({"rows": [{"seq": s, "tokens": tokens, "logits": "all",
                          "prompt_logprobs": True}]})["rows"][0]
    pl = r["prompt_logprobs"]
    assert len(pl) == len(tokens) and pl[0] is None
    raw = np.frombuffer(c.logits_raw(r["logits"]), dtype="<f4").reshape(len(tokens), VOCAB)
    for i in range(1, len(tokens)):
        x = raw[i - 1].astype(np.float64)
        want = x[tokens[i]] - x.max() - np.log(np.exp(x - x.max()).sum())
        assert abs(pl[i] - want) < 1e-5, (i, pl[i], want)
        # The sample effect reports the same raw logprob for the same token at that position.
        got = c.effect({"kind": "sample", "logits": r["logits"], "row": i - 1,
                        "params": {"temperature": 0,
                                   "allowed_tokens": allowed_tokens(VOCAB, [tokens[i]])}})
        assert got["tokens"] == [tokens[i]] and got["logprobs"] == [pl[i]]
    # A row keeping no logits gives the same values, and its borrowed handle goes back.
    live = c.facts()["logits_live"]
    s2 = c.create()
    r2 = c.step({"rows": [{"seq": s2, "tokens": tokens, "prompt_logprobs": True,
                           "sample": {"temperature": 0}}]})["rows"][0]
    assert r2["prompt_logprobs"] == pl and "logits" not in r2
    assert c.facts()["logits_live"] == live
    one = c.step({"rows": [{"seq": s2, "tokens": [5], "prompt_logprobs": True}]})["rows"][0]
    assert one["prompt_logprobs"] == [None]
