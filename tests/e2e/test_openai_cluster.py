"""test_openai_cluster.py - examples/openai over several devio-server processes on SmolLM2,
driven by the official `openai` client: with `--prefill A --decode B` every request's state moves
from A to B after its first token, and the text (greedy, streamed, seeded sampling, concurrent)
is the text one server gives; over three servers (`--devio` three times) a request goes where its
prompt's prefix is stored (GET /v1/events) and forks the sequence holding it, and a request
whose server is killed (kill -9) half way goes on on another server with the same text.
Every server runs one compute thread; every wait is bounded, every process stopped."""
import json
import threading
import urllib.request

import pytest

from test_openai_example import meta, run_example, smollm2  # noqa: F401  (fixtures)

openai = pytest.importorskip("openai")

MODEL = "smollm2"
SYSTEM = {"role": "system", "content": "You answer in one short sentence, carefully. " * 6}
POEM = "Write a short poem about the sea."
TIMEOUT_S = 120


@pytest.fixture(scope="module")
def trio(module_servers, smollm2):  # noqa: F811
    return [module_servers.start(smollm2, ["--threads", "1"]) for _ in range(3)]


def url(srv):
    return "http://127.0.0.1:%d" % srv.port


def client(port):
    return openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % port, api_key="unused",
                         max_retries=0, timeout=TIMEOUT_S)


def chat(port, question, system=None, **kw):
    kw.setdefault("temperature", 0)
    kw.setdefault("max_tokens", 32)
    msgs = ([system] if system else []) + [{"role": "user", "content": question}]
    r = client(port).chat.completions.create(model=MODEL, messages=msgs, **kw)
    return r.choices[0].message.content


def streamed(port, question, max_tokens, after=None, at=0):
    """The streamed text; after(n) runs once `at` chunks with text have come."""
    parts = []
    for ch in client(port).chat.completions.create(
            model=MODEL, stream=True, temperature=0, max_tokens=max_tokens,
            messages=[SYSTEM, {"role": "user", "content": question}]):
        if ch.choices and ch.choices[0].delta.content:
            parts.append(ch.choices[0].delta.content)
            if after is not None and len(parts) == at:
                after()
    return "".join(parts)


def health(port):
    with urllib.request.urlopen("http://127.0.0.1:%d/health" % port, timeout=10) as r:
        return json.load(r)


@pytest.fixture(scope="module")
def single(trio, smollm2, tmp_path_factory):  # noqa: F811
    """The example over one server: the text every cluster must give."""
    with run_example(trio[2].port, smollm2, tmp_path_factory.mktemp("one") / "serve.log") as ex:
        yield ex[1]


def test_disaggregated_is_one_server(trio, single, smollm2, tmp_path):  # noqa: F811
    args = ["--prefill", url(trio[0]), "--decode", url(trio[1])]
    with run_example(args, smollm2, tmp_path / "serve.log") as (_, port):
        assert chat(port, POEM, max_tokens=40) == chat(single, POEM, max_tokens=40)
        sampled = dict(temperature=0.9, seed=11, max_tokens=24)
        assert chat(port, POEM, **sampled) == chat(single, POEM, **sampled)
        assert streamed(port, "Name two rivers.", 24) == streamed(single, "Name two rivers.", 24)
        questions = ["Count to %d." % n for n in range(3, 7)]
        want = {q: chat(single, q, SYSTEM) for q in questions}
        got, threads = {}, [threading.Thread(target=lambda q=q: got.update({q: chat(port, q,
                                                                                     SYSTEM)}))
                            for q in questions]
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT_S)
        assert got == want
        h = health(port)
        roles = {d["url"]: d["role"] for d in h["devio"]}
        assert roles == {url(trio[0]): "prefill", url(trio[1]): "both"}
        assert h["router"]["moved"] == 3 + len(questions), h
        assert h["router"]["moved_bytes"] > 0 and "move_failed" not in h["router"], h
        steps = {d["url"]: d["steps"] for d in h["devio"]}
        assert steps[url(trio[1])] > steps[url(trio[0])], h   # the decode steps are B's


def test_placed_where_the_prefix_is(trio, single, smollm2, tmp_path):  # noqa: F811
    """While a request runs on one server, another with the same system prompt goes there and
    forks its sequence for the shared blocks; both texts are one server's."""
    args = [a for s in trio for a in ("--devio", url(s))]
    with run_example(args, smollm2, tmp_path / "serve.log") as (_, port):
        first = {}

        def second():   # the first request's prompt is in: its first token has come
            first["during"] = chat(port, "Name a fruit.", SYSTEM)
            first["health"] = health(port)

        text = streamed(port, POEM, 48, after=second, at=1)
        assert text == streamed(single, POEM, 48)
        assert first["during"] == chat(single, "Name a fruit.", SYSTEM)
        h = first["health"]
        assert h["router"].get("placed_by_prefix") == 1, h
        shared = [d for d in h["devio"] if d["shared_prompt_tokens"]]
        assert len(shared) == 1 and shared[0]["shared_prompt_tokens"] >= 32, h


def test_killed_server_continues_elsewhere(trio, single, servers, smollm2, tmp_path):  # noqa: F811
    """Three servers; the one a streamed request runs on is killed half way: the request is
    prefilled again on another with its prompt and the tokens it had, and its text is the same."""
    doomed = servers.start(smollm2, ["--threads", "1"])
    args = ["--devio", url(doomed), "--devio", url(trio[0]), "--devio", url(trio[1])]
    with run_example(args, smollm2, tmp_path / "serve.log") as (_, port):
        def kill():
            busy = [d["url"] for d in health(port)["devio"] if d["requests"]]
            assert busy == [url(doomed)], busy
            doomed.kill()   # kill -9

        text = streamed(port, POEM, 64, after=kill, at=12)
        assert text == streamed(single, POEM, 64)
        h = health(port)
        assert h["router"]["resumed"] == 1, h
        assert [d["up"] for d in h["devio"]] == [False, True, True], h
        assert chat(port, POEM, max_tokens=16) == chat(single, POEM, max_tokens=16)
