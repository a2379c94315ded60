"""api.py - OpenAI's routes over the engine: GET /v1/models, POST /v1/completions and
POST /v1/chat/completions, answered whole or streamed as server-sent events
(`data: {chunk}` lines, then `data: [DONE]`). Request fields are read as OpenAI documents
them; the ones this example does not serve are refused with 400, never ignored, and every
field it reads is type-checked (a wrong type is a 400 naming the field, never taken as false).
A body nested deeper than MAX_JSON_DEPTH is refused before it is decoded."""
import array
import asyncio
import itertools
import json
import random
import re
import time
import uuid

from starlette.applications import Starlette
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from engine import Job
from text import TextStream

MAX_TOP_LOGPROBS = 20   # devio's limit on the top logprobs of a sampled token
MAX_STOPS = 4
DISCONNECT_CHECK_S = 1.0   # how often a whole answer's wait looks for its client having gone
MAX_JSON_DEPTH = 64        # deepest nesting of arrays and objects a body may have (OpenAI's need 5)
RETRY_AFTER_S = 1          # the Retry-After of a 503: devio was busy or going away

_JSON_ESCAPE = re.compile(rb"\\.", re.S)     # a backslash and the character it escapes
_JSON_STRING = re.compile(rb'"[^"]*"')       # a string, once its escapes are gone
_NOT_BRACKET = re.compile(rb"[^\[\]{}]+")
_NESTING = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")   # +1 and -1 as signed bytes


class ApiError(Exception):
    def __init__(self, status, message, param=None, kind="invalid_request_error", code=None):
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = status, message, param, kind, code

    def response(self):
        headers = {"Retry-After": str(RETRY_AFTER_S)} if self.status in (429, 503) else None
        return JSONResponse({"error": {"message": self.message, "type": self.kind,
                                       "param": self.param, "code": self.code}}, self.status,
                            headers=headers)


def _too_deep(raw, limit=MAX_JSON_DEPTH):
    """Whether the JSON text nests arrays and objects more than `limit` deep, found without
    recursion (json.loads recurses, and a deep enough body exhausts the stack) and in linear
    time: escapes, then strings, then all but the brackets are cut out, and the brackets
    counted. A body that is not JSON is read the way the decoder reads it up to where the
    decoder stops, so a body passing here never nests deeper than `limit` within what is decoded."""
    brackets = array.array("b")
    brackets.frombytes(_NOT_BRACKET.sub(b"", _JSON_STRING.sub(b"", _JSON_ESCAPE.sub(b"", raw)))
                       .translate(_NESTING))
    return max(itertools.accumulate(brackets), default=0) > limit


def _boolean(body, name, default=False):
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise ApiError(400, "%s must be true or false" % name, name)
    return v


def _string(body, name):
    v = body.get(name)
    if v is not None and not isinstance(v, str):
        raise ApiError(400, "%s must be a string" % name, name)
    return v


def _number(body, name, default, lo, hi):
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
        raise ApiError(400, "%s must be a number from %g to %g" % (name, lo, hi), name)
    return v


def _integer(body, name, default, lo, hi, param=None):
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ApiError(400, "%s must be an integer from %d to %d" % (param or name, lo, hi),
                       param or name)
    return v


def _refuse_unsupported(body):
    """Fields whose meaning this example does not implement: refused, not ignored."""
    for name in ("n", "best_of"):
        if _integer(body, name, 1, 1, 128) != 1:
            raise ApiError(400, "%s must be 1: one choice per request" % name, name)
    if _boolean(body, "echo"):
        raise ApiError(400, "echo is not supported", "echo")
    if _string(body, "suffix"):
        raise ApiError(400, "suffix is not supported", "suffix")
    for name in ("tools", "functions", "tool_choice", "function_call"):
        if body.get(name) not in (None, [], "none"):
            raise ApiError(400, "%s is not supported" % name, name)
    fmt = body.get("response_format")
    if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") != "text"):
        raise ApiError(400, "response_format other than text is not supported", "response_format")


class Api:
    def __init__(self, engine, vocab, name, default_max_tokens):
        self.engine, self.vocab, self.name = engine, vocab, name
        self.default_max_tokens = default_max_tokens
        self.created = int(time.time())

    def app(self, lifespan=None):
        return Starlette(routes=[
            Route("/health", self.health),
            Route("/v1/models", self.models),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/chat/completions", self.chat, methods=["POST"]),
        ], lifespan=lifespan)

    async def health(self, request):
        stats = getattr(self.engine, "stats", None)   # the router's servers, when several
        return JSONResponse({"status": "ok", **(stats() if stats else {})})

    async def models(self, request):
        return JSONResponse({"object": "list", "data": [
            {"id": self.name, "object": "model", "created": self.created, "owned_by": "devio",
             "max_model_len": self.engine.max_seq_len}]})

    async def completions(self, request):
        try:
            body = await self._body(request)
            ids = self._prompt_ids(body.get("prompt"))
            job, opts = self._job(body, ids, chat=False)
        except ApiError as e:
            return e.response()
        return await self._answer(request, job, opts, CompletionShape(self, opts))

    async def chat(self, request):
        try:
            body = await self._body(request)
            text = self.vocab.render_chat(self._messages(body.get("messages")))
            job, opts = self._job(body, self.vocab.encode(text), chat=True)
        except ApiError as e:
            return e.response()
        except ValueError as e:   # the template refused the messages
            return ApiError(400, str(e), "messages").response()
        return await self._answer(request, job, opts, ChatShape(self, opts))

    # ---- requests ---------------------------------------------------------------------------

    async def _body(self, request):
        raw = await request.body()
        if _too_deep(raw):
            raise ApiError(400, "the body nests arrays and objects more than %d deep"
                           % MAX_JSON_DEPTH)
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError):   # RecursionError: not expected past _too_deep
            raise ApiError(400, "the body is not JSON") from None
        if not isinstance(body, dict):
            raise ApiError(400, "the body must be a JSON object")
        model = _string(body, "model")
        if model is not None and model != self.name:
            raise ApiError(404, "the model %r does not exist; this server serves %r"
                           % (model, self.name), "model", code="model_not_found")
        _refuse_unsupported(body)
        return body

    def _prompt_ids(self, prompt):
        """One prompt: a string, or token ids; a list of one of those too."""
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str):
            ids = self.vocab.encode(prompt)
        elif isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool)
                                              for t in prompt):
            ids = prompt
            if any(not 0 <= t < self.engine.vocab_size for t in ids):
                raise ApiError(400, "a prompt token id is outside the vocabulary", "prompt")
        else:
            raise ApiError(400, "prompt must be one string or one list of token ids", "prompt")
        if not ids and self.vocab.bos_id is not None:
            ids = [self.vocab.bos_id]
        if not ids:
            raise ApiError(400, "the prompt is empty", "prompt")
        return ids

    def _messages(self, messages):
        if not isinstance(messages, list) or not messages:
            raise ApiError(400, "messages must be a non-empty list", "messages")
        out = []
        for m in messages:
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise ApiError(400, "each message needs a role", "messages")
            content = m.get("content")
            if isinstance(content, list):
                if any(not isinstance(p, dict) or p.get("type") != "text" for p in content):
                    raise ApiError(400, "only text content parts are supported", "messages")
                if any(not isinstance(p.get("text"), str) for p in content):
                    raise ApiError(400, "a text content part's text must be a string", "messages")
                content = "".join(p["text"] for p in content)
            elif content is not None and not isinstance(content, str):
                raise ApiError(400, "a message's content must be text", "messages")
            out.append({"role": m["role"], "content": content or ""})
        return out

    def _stops(self, stop):
        stops = [stop] if isinstance(stop, str) else stop if stop is not None else []
        if not isinstance(stops, list) or len(stops) > MAX_STOPS or \
                not all(isinstance(s, str) for s in stops):
            raise ApiError(400, "stop must be a string or a list of at most %d strings" % MAX_STOPS,
                           "stop")
        return stops

    def _logit_bias(self, bias):
        if bias is None:
            return None
        if not isinstance(bias, dict):
            raise ApiError(400, "logit_bias must map token ids to biases", "logit_bias")
        out = {}
        for k, v in bias.items():   # JSON keys are strings; "²".isdigit() is true, hence ASCII
            if not re.fullmatch(r"[0-9]{1,10}", k) or int(k) >= self.engine.vocab_size:
                raise ApiError(400, "logit_bias names %r, not a token id of the vocabulary" % k,
                               "logit_bias")
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not -100 <= v <= 100:
                raise ApiError(400, "a logit_bias value must be a number from -100 to 100",
                               "logit_bias")
            out[str(int(k))] = float(v)
        return out

    def _job(self, body, ids, chat):
        """The engine's Job for a request, and the options its answer needs."""
        want, top = self._logprobs(body, chat)
        max_tokens = self._max_tokens(body, len(ids), chat)
        stream = _boolean(body, "stream")
        options = body.get("stream_options")
        if options is not None and not isinstance(options, dict):
            raise ApiError(400, "stream_options must be an object", "stream_options")
        try:
            usage = _boolean(options or {}, "include_usage")
        except ApiError:
            raise ApiError(400, "stream_options.include_usage must be true or false",
                           "stream_options") from None
        opts = {"stream": stream, "logprobs": want, "usage_chunk": stream and usage}
        stops = self._stops(body.get("stop"))
        return Job(ids, self._sample(body, len(ids), top), max_tokens,
                   TextStream(self.vocab, stops), None), opts

    def _logprobs(self, body, chat):
        """(whether the answer carries logprobs, how many top ones per token)."""
        if not chat:   # completions: logprobs is the count
            top = _integer(body, "logprobs", None, 0, MAX_TOP_LOGPROBS)
            return top is not None, top or 0
        want = _boolean(body, "logprobs")
        top = _integer(body, "top_logprobs", 0, 0, MAX_TOP_LOGPROBS)
        if body.get("top_logprobs") is not None and not want:
            raise ApiError(400, "top_logprobs needs logprobs: true", "top_logprobs")
        return bool(want), top

    def _max_tokens(self, body, prompt_len, chat):
        name = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None \
            else "max_tokens"
        room = self.engine.max_seq_len - prompt_len
        max_tokens = _integer(body, name, max(1, min(self.default_max_tokens, room)), 1, 1 << 31)
        why = self.engine.check(prompt_len, max_tokens)
        if why:
            raise ApiError(400, why, name if room > 0 else "messages" if chat else "prompt")
        return max_tokens

    def _sample(self, body, prompt_len, top):
        """devio's sample object for every sampled row of the request."""
        seed = body.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ApiError(400, "seed must be an integer", "seed")
        sample = {"temperature": _number(body, "temperature", 1.0, 0, 2),
                  "top_p": _number(body, "top_p", 1.0, 0, 1),
                  "seed": (seed if seed is not None else random.getrandbits(63)) % (1 << 63)}
        if sample["top_p"] == 0:   # only the most likely token: greedy
            sample["temperature"], sample["top_p"] = 0.0, 1.0
        for name in ("frequency_penalty", "presence_penalty"):
            v = _number(body, name, 0, -2, 2)
            if v:
                sample[name], sample["penalty_from"] = v, prompt_len   # the output's tokens only
        bias = self._logit_bias(body.get("logit_bias"))
        if bias:
            sample["logit_bias"] = bias
        if top:
            sample["logprobs"] = top
        return sample

    # ---- answers ----------------------------------------------------------------------------

    async def _answer(self, request, job, opts, shape):
        loop = asyncio.get_running_loop()
        queue = asyncio.Queue()

        def sink(event):   # on the scheduler thread
            try:
                loop.call_soon_threadsafe(queue.put_nowait, event)
            except RuntimeError:   # the event loop has closed: nobody is listening
                pass

        job.sink = sink
        try:
            self.engine.submit(job)
        except RuntimeError as e:
            return ApiError(503, str(e), kind="server_error", code="service_unavailable").response()
        if opts["stream"]:
            return StreamingResponse(self._stream(job, queue, shape), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        events, check_at = [], loop.time() + DISCONNECT_CHECK_S
        while not events or events[-1].finish is None:
            try:
                events.append(await asyncio.wait_for(queue.get(), max(0, check_at - loop.time())))
            except asyncio.TimeoutError:
                pass
            if loop.time() >= check_at:   # has the client gone away meanwhile?
                if await request.is_disconnected():
                    self.engine.cancel(job)
                    return JSONResponse({}, 499)
                check_at = loop.time() + DISCONNECT_CHECK_S
        last = events[-1]
        if last.finish == "error":   # 503: devio stayed busy past the retry deadline, or is going
            return ApiError(last.status, last.error, kind="server_error",
                            code=_error_code(last.status)).response()
        return JSONResponse(shape.whole(events))

    async def _stream(self, job, queue, shape):
        finished = False
        try:
            for chunk in shape.opening():
                yield _sse(chunk)
            while not finished:
                event = await queue.get()
                finished = event.finish is not None
                if event.finish == "error":   # after the 200: the code tells a 503 from a 500
                    yield _sse({"error": {"message": event.error, "type": "server_error",
                                          "param": None, "code": _error_code(event.status)}})
                    break
                for chunk in shape.chunks(event):
                    yield _sse(chunk)
            yield "data: [DONE]\n\n"
        finally:
            if not finished:   # the client went away first
                self.engine.cancel(job)


def _error_code(status):
    """The error code of a request that devio failed: service_unavailable when it was busy past
    the retry deadline or is going away (try again later, or elsewhere), else none."""
    return "service_unavailable" if status == 503 else None


def _sse(obj):
    return "data: %s\n\n" % json.dumps(obj, separators=(",", ":"))


def _usage(event):
    return {"prompt_tokens": event.prompt_tokens, "completion_tokens": event.completion_tokens,
            "total_tokens": event.prompt_tokens + event.completion_tokens}


class _Shape:
    """How one kind of answer is written: whole, or as stream chunks."""
    object_whole = object_chunk = ""

    def __init__(self, api, opts):
        self.api, self.opts, self.vocab = api, opts, api.vocab
        self.id = self.prefix + uuid.uuid4().hex
        self.created = int(time.time())

    def _head(self, kind):
        return {"id": self.id, "object": kind, "created": self.created, "model": self.api.name}

    def opening(self):
        return []

    def chunks(self, event):
        out = []
        if event.text or event.tokens or event.finish:
            c = self._head(self.object_chunk)
            c["choices"] = [self.chunk_choice(event)]
            out.append(c)
        if event.finish and self.opts["usage_chunk"]:
            c = self._head(self.object_chunk)
            c["choices"], c["usage"] = [], _usage(event)
            out.append(c)
        return out

    def whole(self, events):
        last = events[-1]
        text = "".join(e.text for e in events)
        tokens = [t for e in events for t in e.tokens]
        offsets = [o for e in events for o in e.offsets]
        out = self._head(self.object_whole)
        out["choices"] = [self.whole_choice(text, tokens, offsets, last.finish)]
        out["usage"] = _usage(last)
        return out


class CompletionShape(_Shape):
    prefix, object_whole, object_chunk = "cmpl-", "text_completion", "text_completion"

    def logprobs(self, tokens, offsets):
        if not self.opts["logprobs"]:
            return None
        text = self.vocab.token_text
        return {"tokens": [text(t) for t, _, _ in tokens],
                "token_logprobs": [lp for _, lp, _ in tokens],
                "top_logprobs": [{text(i): lp for i, lp in top} for _, _, top in tokens],
                "text_offset": offsets}

    def chunk_choice(self, event):
        return {"index": 0, "text": event.text, "logprobs": self.logprobs(event.tokens, event.offsets),
                "finish_reason": event.finish}

    def whole_choice(self, text, tokens, offsets, finish):
        return {"index": 0, "text": text, "logprobs": self.logprobs(tokens, offsets),
                "finish_reason": finish}


class ChatShape(_Shape):
    prefix, object_whole, object_chunk = "chatcmpl-", "chat.completion", "chat.completion.chunk"

    def _entry(self, token, lp):
        b = self.vocab.token_bytes(token)
        return {"token": b.decode("utf-8", "replace"), "logprob": lp, "bytes": list(b)}

    def logprobs(self, tokens):
        if not self.opts["logprobs"]:
            return None
        return {"content": [dict(self._entry(t, lp), top_logprobs=[self._entry(i, l) for i, l in top])
                            for t, lp, top in tokens]}

    def opening(self):
        c = self._head(self.object_chunk)
        c["choices"] = [{"index": 0, "delta": {"role": "assistant", "content": ""},
                         "logprobs": None, "finish_reason": None}]
        return [c]

    def chunk_choice(self, event):
        return {"index": 0, "delta": {"content": event.text} if event.text else {},
                "logprobs": self.logprobs(event.tokens), "finish_reason": event.finish}

    def whole_choice(self, text, tokens, offsets, finish):
        return {"index": 0, "message": {"role": "assistant", "content": text},
                "logprobs": self.logprobs(tokens), "finish_reason": finish}
