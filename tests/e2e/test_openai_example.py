"""test_openai_example.py - examples/openai end to end: the OpenAI-compatible server over a real
devio-server serving SmolLM2-135M-Instruct (deploy/fetch-model.sh), driven by the official `openai`
client. At temperature 0 its text is the greedy decode devio gives when driven directly
(devio_client, tokenized here with tools/gguf/vocab.py), concurrent requests share devio's steps
(devio_step_batch_rows), and stop, max_tokens, seed, logit_bias and logprobs are honoured.
Bodies nested too deep and fields of the wrong type are 400, and a step devio refuses for a while
(another client holding its one ticket slot) is retried until it runs, or answered 503.
The example runs with --step-tokens 32, below a chat prompt's length, so every prompt is prefilled
in chunks. Skipped only when the model cannot be fetched; every wait is bounded, every process killed."""
import concurrent.futures
import contextlib
import http.client
import json
import os
import re
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from client import devio_client

openai = pytest.importorskip("openai")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools" / "gguf"))
import gguf_file  # noqa: E402
from vocab import build_tokenizer, render_chat  # noqa: E402

START_S = 60.0
STOP_S = 15.0
ANSWER_S = 60.0
EOS = 2            # SmolLM2's <|im_end|>: its GGUF's eos_token_id and GET /v1/model's (checked)
STEP_TOKENS = 32   # below a chat prompt's length: every prompt is prefilled in chunks
FRANCE = "What is the capital of France?"
COLORS = "Name three colors, one per line."


@pytest.fixture(scope="module")
def smollm2():
    p = subprocess.run(["bash", str(REPO / "deploy" / "fetch-model.sh")], capture_output=True,
                       text=True, timeout=900)
    if p.returncode != 0:
        pytest.skip("SmolLM2 cannot be fetched: " + p.stderr.strip()[-300:])
    return Path(p.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def meta(smollm2):
    m = gguf_file.read(str(smollm2)).metadata
    m["tokenizer"] = build_tokenizer(m)
    assert m["tokenizer.ggml.eos_token_id"] == EOS
    return m


@pytest.fixture(scope="module")
def devio(module_servers, smollm2):
    srv = module_servers.start(smollm2)
    with devio_client.Client("http://127.0.0.1:%d" % srv.port, timeout=30) as c:
        assert c.model()["eos_token_id"] == EOS
    return srv


@contextlib.contextmanager
def run_example(devio_port, smollm2, log, *args):
    """examples/openai/serve.py on a free loopback port, driving the devio-server on devio_port
    (or, given a list, with those arguments naming its servers); (process, port), the process
    stopped (and checked to end cleanly) on leaving."""
    servers = (["--devio", "http://127.0.0.1:%d" % devio_port] if isinstance(devio_port, int)
               else list(devio_port))
    with open(log, "wb") as err:
        proc = subprocess.Popen([sys.executable, str(REPO / "examples" / "openai" / "serve.py")]
                                + servers + ["--listen", "127.0.0.1:0", "--model", str(smollm2),
                                 "--served-model-name", "smollm2", "--log-level", "warning",
                                 "--step-tokens", str(STEP_TOKENS), "--max-running", "16"]
                                + list(args),
                                stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL)
    try:
        port = _read_port(proc, log)
        yield proc, port
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=STOP_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=STOP_S)
        proc.stdout.close()
    # uvicorn shuts down on SIGTERM, then ends by the signal it caught
    assert proc.returncode in (0, -signal.SIGTERM), log.read_text(errors="replace")[-3000:]


@pytest.fixture(scope="module")
def example(devio, smollm2, tmp_path_factory):
    """examples/openai/serve.py on a free loopback port; (process, port)."""
    with run_example(devio.port, smollm2, tmp_path_factory.mktemp("openai") / "serve.log") as ex:
        yield ex


def _read_port(proc, log):
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline, buf = time.monotonic() + START_S, b""
    try:
        while b"\n" not in buf:
            assert time.monotonic() < deadline and proc.poll() is None, \
                "serve.py did not start:\n" + log.read_text(errors="replace")[-3000:]
            if sel.select(timeout=0.5):
                buf += os.read(proc.stdout.fileno(), 4096)
    finally:
        sel.close()
    word, port = buf.split(b"\n")[0].decode().split()
    assert word == "listening"
    return int(port)


@pytest.fixture(scope="module")
def oai(example):
    c = openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % example[1], api_key="unused",
                      timeout=ANSWER_S, max_retries=0)
    yield c
    c.close()


def greedy(devio, meta, ids, n, sample=None):
    """devio driven directly: prefill, then one token a step; (ids, logprobs), the EOS
    token included when it comes."""
    out, lps = [], []
    with devio_client.Client("http://127.0.0.1:%d" % devio.port, timeout=ANSWER_S) as c:
        seq = c.create_sequence()
        feed = ids
        while len(out) < n and (not out or out[-1] != EOS):
            row = c.step({"rows": [{"seq": seq, "tokens": feed,
                                    "sample": sample or {"temperature": 0}}]})["rows"][0]
            out += row["tokens"]
            lps += row["logprobs"]
            feed = row["tokens"]
        c.free(seq)
    return out, lps


def chat_ids(meta, question):
    return meta["tokenizer"].encode(render_chat(meta, question), add_special_tokens=False).ids


def text_of(meta, ids):
    return meta["tokenizer"].decode([t for t in ids if t != EOS])


def step_counts(devio):
    """(steps, steps of at most 4 rows, steps of at most STEP_TOKENS tokens) so far."""
    text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % devio.port, timeout=30).read().decode()

    def value(pattern):
        return float(re.search(r"^%s (\S+)$" % pattern, text, re.M).group(1))

    return (value("devio_step_batch_rows_count"), value(r'devio_step_batch_rows_bucket\{le="4"\}'),
            value(r'devio_step_batch_tokens_bucket\{le="%d"\}' % STEP_TOKENS))


def ask(oai, question, **kw):
    return oai.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": question}],
                                       **kw)


def test_models_and_completion(oai, devio, meta):
    assert [m.id for m in oai.models.list().data] == ["smollm2"]
    prompt = "The capital of France is"
    ids = meta["tokenizer"].encode(prompt, add_special_tokens=False).ids
    want, _ = greedy(devio, meta, ids, 8)
    r = oai.completions.create(model="smollm2", prompt=prompt, max_tokens=8, temperature=0)
    assert r.object == "text_completion" and r.choices[0].text == text_of(meta, want)
    assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == len(want)
    assert r.choices[0].finish_reason == ("stop" if want[-1] == EOS else "length")


def test_chat_is_devio_greedy(oai, devio, meta):
    want, lps = greedy(devio, meta, chat_ids(meta, FRANCE), 24)
    r = ask(oai, FRANCE, max_tokens=24, temperature=0, logprobs=True, top_logprobs=3)
    c = r.choices[0]
    assert c.message.role == "assistant" and c.message.content == text_of(meta, want)
    assert "Paris" in c.message.content
    assert c.finish_reason == ("stop" if want[-1] == EOS else "length")
    assert r.usage.completion_tokens == len(want)
    entries = c.logprobs.content   # every token of the text (not the EOS token), devio's logprob
    assert [e.logprob for e in entries] == [lp for t, lp in zip(want, lps) if t != EOS]
    for e in entries:   # greedy: the chosen token is the most likely one
        assert len(e.top_logprobs) == 3 and e.top_logprobs[0].token == e.token
        assert bytes(e.bytes).decode("utf-8", "replace") == e.token


def test_streamed_chat(oai):
    whole = ask(oai, COLORS, max_tokens=20, temperature=0)
    chunks = list(ask(oai, COLORS, max_tokens=20, temperature=0, stream=True,
                      stream_options={"include_usage": True}))
    deltas = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(deltas) > 3 and "".join(deltas) == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_eight_concurrent_requests_share_steps(oai, devio, meta):
    questions = ["Give me one word that rhymes with %s." % w for w in
                 ("cat", "tree", "blue", "night", "rain", "stone", "light", "sun")]
    before = step_counts(devio)
    with concurrent.futures.ThreadPoolExecutor(len(questions)) as pool:
        got = list(pool.map(lambda q: ask(oai, q, max_tokens=12, temperature=0), questions))
    steps, small, within = (b - a for a, b in zip(before, step_counts(devio)))
    assert steps > small, "no step carried more than 4 rows"
    assert within == steps, "a step went over the budget of %d tokens" % STEP_TOKENS
    for q, r in zip(questions, got):   # a row's numbers do not depend on its batch
        want, _ = greedy(devio, meta, chat_ids(meta, q), 12)
        assert r.choices[0].message.content == text_of(meta, want), q


def test_stop_and_max_tokens(oai):
    r = oai.completions.create(model="smollm2", prompt="One, two, three,", max_tokens=5, temperature=0)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 5
    full = ask(oai, COLORS, max_tokens=20, temperature=0).choices[0].message.content
    stop = full[6:9]
    want = full[:full.find(stop)]
    for stream in (False, True):
        r = ask(oai, COLORS, max_tokens=20, temperature=0, stop=[stop, "never appears"],
                stream=stream)
        if stream:
            chunks = list(r)
            text = "".join(c.choices[0].delta.content or "" for c in chunks)
            finish = chunks[-1].choices[0].finish_reason
        else:
            text, finish = r.choices[0].message.content, r.choices[0].finish_reason
        assert (text, finish) == (want, "stop"), (stop, full)


def test_sampling_parameters(oai, devio, meta):
    sample = {"temperature": 0.9, "top_p": 0.95, "seed": 1234}
    want, _ = greedy(devio, meta, chat_ids(meta, COLORS), 10, sample)
    got = [ask(oai, COLORS, max_tokens=10, temperature=0.9, top_p=0.95, seed=1234)
           .choices[0].message.content for _ in range(2)]
    assert got == [text_of(meta, want)] * 2

    prompt = "The capital of France is"
    first = oai.completions.create(model="smollm2", prompt=prompt, max_tokens=1, temperature=0,
                                   logprobs=2)
    lp = first.choices[0].logprobs
    assert len(lp.tokens) == 1 and len(lp.top_logprobs[0]) == 2 and lp.text_offset == [0]
    assert lp.top_logprobs[0][lp.tokens[0]] == lp.token_logprobs[0]
    (banned,), _ = greedy(devio, meta, meta["tokenizer"].encode(prompt).ids, 1)
    assert meta["tokenizer"].decode([banned]) == lp.tokens[0]
    other = oai.completions.create(model="smollm2", prompt=prompt, max_tokens=1, temperature=0,
                                   logit_bias={str(banned): -100})
    assert other.choices[0].text != first.choices[0].text


def test_refusals_and_cleanup(oai, devio, example):
    with pytest.raises(openai.BadRequestError):
        ask(oai, FRANCE, n=2)
    with pytest.raises(openai.BadRequestError):
        ask(oai, FRANCE, max_tokens=10 ** 6)
    with pytest.raises(openai.NotFoundError):
        oai.chat.completions.create(model="other", messages=[{"role": "user", "content": "hi"}])
    # two requests that would take far longer than the wait below, unless cancelled
    endless = {"max_tokens": 4000, "temperature": 0, "logit_bias": {str(EOS): -100}}
    stream = ask(oai, "Tell me a long story.", stream=True, **endless)
    for i, _ in enumerate(stream):
        if i == 2:
            break
    stream.close()   # the client goes away: its sequence must be freed
    body = json.dumps(dict(endless, model="smollm2",
                           messages=[{"role": "user", "content": "Tell me a long story."}])).encode()
    with socket.create_connection(("127.0.0.1", example[1]), timeout=10) as s:   # whole, then gone
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                  b"\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        time.sleep(0.3)
    with devio_client.Client("http://127.0.0.1:%d" % devio.port, timeout=30) as c:
        deadline = time.monotonic() + 10
        while True:
            f = c.facts()
            if f["kv"]["blocks_free"] == f["kv"]["blocks_total"] and f["tickets_in_flight"] == 0:
                break
            assert time.monotonic() < deadline, json.dumps(f)
            time.sleep(0.05)


def post(port, path, body):
    """One POST of raw bytes (or a value, as JSON) to the example: (status, headers, answer)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=ANSWER_S)
    try:
        conn.request("POST", path, body=data, headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        raw = r.read()
        try:
            answer = json.loads(raw)
        except ValueError:   # a crash's text/plain "Internal Server Error", say
            answer = raw.decode(errors="replace")
        return r.status, {k.lower(): v for k, v in r.getheaders()}, answer
    finally:
        conn.close()


def test_deep_nesting_is_refused(example):
    """Python's json module recurses: 100,000 nested arrays must be a 400, not a 500."""
    for body in (b"[" * 100000, b"[" * 100000 + b"]" * 100000,
                 b'{"model":"smollm2","messages":[{"role":"user","content":"hi"}],"x":'
                 + b"[" * 100000 + b"]" * 100000 + b"}"):
        status, _, answer = post(example[1], "/v1/chat/completions", body)
        assert status == 400, (status, answer)
        assert answer["error"]["type"] == "invalid_request_error"
        assert "nest" in answer["error"]["message"]
    # brackets inside strings do not count, nor do escaped quotes end a string early
    content = '[[[[\\"{{{{' * 40
    status, _, answer = post(example[1], "/v1/completions", b'{"model":"smollm2","prompt":"%s",'
                             b'"max_tokens":1,"temperature":0}' % content.encode())
    assert status == 200, answer


CHAT = {"model": "smollm2", "messages": [{"role": "user", "content": FRANCE}], "max_tokens": 2,
        "temperature": 0}
COMPLETION = {"model": "smollm2", "prompt": "The capital of France is", "max_tokens": 2,
              "temperature": 0}


@pytest.mark.parametrize("route,change,param", [
    ("chat", {"stream": "yes"}, "stream"),
    ("completions", {"stream": 1}, "stream"),
    ("chat", {"stream": True, "stream_options": ["include_usage"]}, "stream_options"),
    ("chat", {"stream": True, "stream_options": {"include_usage": "yes"}}, "stream_options"),
    ("chat", {"n": True}, "n"),
    ("completions", {"best_of": True}, "best_of"),
    ("completions", {"echo": 0}, "echo"),
    ("completions", {"suffix": 0}, "suffix"),
    ("chat", {"max_completion_tokens": 1.5}, "max_completion_tokens"),
    ("completions", {"logit_bias": {"\u00b2": 1}}, "logit_bias"),
    ("chat", {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
     "messages"),
    ("chat", {"model": 5}, "model"),
])
def test_wrong_types_are_refused(example, route, change, param):
    """Every field read is type-checked, as OpenAI does: 400 naming the field, never taken as
    false, coerced into text, nor a 500."""
    body = dict(CHAT if route == "chat" else COMPLETION, **change)
    path = "/v1/chat/completions" if route == "chat" else "/v1/completions"
    status, _, answer = post(example[1], path, body)
    assert status == 400, (status, answer)
    assert answer["error"]["type"] == "invalid_request_error" and answer["error"]["param"] == param


def http_errors(devio, code):
    """devio's count of error answers with this code (devio_http_errors_total)."""
    text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % devio.port,
                                  timeout=30).read().decode()
    m = re.search(r'^devio_http_errors_total\{code="%s"\} (\S+)$' % code, text, re.M)
    return float(m.group(1))


@pytest.fixture(scope="module")
def shallow(module_servers, smollm2, tmp_path_factory):
    """A devio-server that takes one ticket in flight (--max-depth 1), the example over it with a
    retry deadline of 1.5 s, and a second client of the devio: (devio, example port, client)."""
    srv = module_servers.start(smollm2, args=["--max-depth", "1"])
    log = tmp_path_factory.mktemp("openai-shallow") / "serve.log"
    with run_example(srv.port, smollm2, log, "--devio-retry-s", "1.5") as ex, \
            devio_client.Client("http://127.0.0.1:%d" % srv.port, timeout=30) as other:
        yield srv, ex[1], other


def hold_ticket(other):
    """The other client launches a step and leaves it unawaited: devio's one slot is taken."""
    seq = other.create_sequence()
    return seq, other.launch({"rows": [{"seq": seq, "tokens": [1, 2, 3]}]})


def test_transient_refusal_is_waited_out(shallow, devio, meta):
    """Another client's ticket in flight makes devio refuse the example's step (409
    depth_exceeded): the example waits for the slot and retries, and the user gets the
    completion devio gives."""
    srv, port, other = shallow
    want, _ = greedy(devio, meta, chat_ids(meta, FRANCE), 6)
    before = http_errors(srv, "depth_exceeded")
    seq, ticket = hold_ticket(other)
    release = threading.Timer(0.4, other.await_ticket, (ticket,))
    release.start()
    try:
        status, _, answer = post(port, "/v1/chat/completions", dict(CHAT, max_tokens=6))
    finally:
        release.join()
        other.free(seq)
    assert status == 200, answer
    assert answer["choices"][0]["message"]["content"] == text_of(meta, want)
    assert http_errors(srv, "depth_exceeded") > before, "devio never refused the example's step"


def test_refusal_past_the_deadline_is_503(shallow):
    """A slot that stays taken past --devio-retry-s: 503 with Retry-After in OpenAI's error shape
    (never 500), and the example serves again once the slot is free."""
    srv, port, other = shallow
    seq, ticket = hold_ticket(other)
    try:
        t0 = time.monotonic()
        status, headers, answer = post(port, "/v1/chat/completions", CHAT)
        waited = time.monotonic() - t0
        assert status == 503 and headers.get("retry-after"), (status, answer)
        assert answer["error"]["type"] == "server_error"
        assert answer["error"]["code"] == "service_unavailable"
        assert "depth_exceeded" in answer["error"]["message"]
        assert 1.5 <= waited < 10, waited
    finally:
        other.await_ticket(ticket)
        other.free(seq)
    status, _, answer = post(port, "/v1/chat/completions", CHAT)
    assert status == 200, answer
