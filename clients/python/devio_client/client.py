"""client.py - a devio-server client over one keep-alive HTTP connection, standard library only.
One method per route of api/openapi.yaml; an error answer raises DevioError and is never returned as data."""
import http.client
import json
import socket
import ssl
import time
import uuid
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple, Union
from urllib.parse import quote, urlencode, urlsplit

from .types import (AdapterRecord, Device, Facts, LogitsHandle, LogitsTop, Model, Outcome, Plan,
                    SampleParams, Sequence, StepResult, Teardown, TicketHistory, TicketRecord, TicketStatus)

__all__ = ["Client", "Response", "DevioError", "ConnectionLost", "TicketPending"]


class DevioError(Exception):
    """An error answer: HTTP status and the body's {"error": {code, message, details}}."""

    def __init__(self, status: int, code: str, message: str, details: Dict[str, int]):
        super().__init__("%d %s: %s" % (status, code, message))
        self.status = status
        self.code = code
        self.message = message
        self.details = details


class ConnectionLost(Exception):
    """The connection failed before an answer came: the server may or may not have acted."""


class Response:
    """One answer as it came: status, headers (names as sent) and raw body."""

    def __init__(self, status: int, headers: Dict[str, str], body: bytes):
        self.status = status
        self.headers = headers
        self.body = body

    def header(self, name: str) -> Optional[str]:
        low = name.lower()
        for k, v in self.headers.items():
            if k.lower() == low:
                return v
        return None

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


class TicketPending(DevioError):
    """An await whose timeout passed before the step settled (HTTP 202, "pending"): ask again."""

    def __init__(self, ticket: int):
        super().__init__(202, "ticket_pending", "ticket %d has not settled yet" % ticket,
                         {"ticket": ticket})


def _error_of(r: Response) -> DevioError:
    try:
        e = r.json()["error"]
        return DevioError(r.status, e["code"], e["message"], e.get("details") or {})
    except (ValueError, KeyError, TypeError):
        return DevioError(r.status, "http_%d" % r.status, r.body[:200].decode("utf-8", "replace"),
                          {})


class _UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP over a unix-domain stream socket (a server started with --listen unix:/PATH)."""

    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self.unix_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


class Client:
    """A client of one devio-server.

        c = Client("http://127.0.0.1:8080", token="secret")
        seq = c.create_sequence()
        r = c.step({"rows": [{"seq": seq, "tokens": [1, 2, 3], "sample": {"temperature": 0}}]})

    Not thread-safe: give each thread its own Client. A dropped connection is
    reopened once for GET and HEAD. The calls that change state (create and
    delete a sequence, launch, step, effects) carry an Idempotency-Key, new
    for each call (or the `key` given), and are retried up to `retries` times
    with the same key on a lost connection, a 503 or a 409 key_in_use: the
    server answers a retry with the first answer, so nothing runs twice. An
    await is retried the same way (a settled ticket answers again). Other
    requests are never sent twice behind the caller's back.
    `url` is http://host:port, http://[::1]:port, https://host:port (then
    `tls_context`, or the system's default context, checks the server), or
    unix:///path/to/socket. `source_address` is the local address to connect
    from (e.g. "127.0.0.2"), or None for any.
    """

    def __init__(self, url: str = "http://127.0.0.1:8080", token: Optional[str] = None,
                 timeout: float = 60.0, tls_context: Optional[ssl.SSLContext] = None,
                 source_address: Optional[str] = None, retries: int = 3,
                 retry_delay: float = 0.1):
        self._url = url
        u = urlsplit(url)
        self.unix_path = u.path if u.scheme == "unix" and not u.netloc and u.path else None
        if self.unix_path is None and (u.scheme not in ("http", "https") or not u.hostname):
            raise ValueError("url must be http://host:port, https://host:port or "
                             "unix:///path, not %r" % url)
        self.host = u.hostname or "localhost"
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.https = u.scheme == "https"
        self.token = token
        self.timeout = timeout
        self.tls_context = tls_context
        self.source = (source_address, 0) if source_address else None
        self.retries = retries
        self.retry_delay = retry_delay
        self._conn: Optional[http.client.HTTPConnection] = None

    # ---- transport ----------------------------------------------------------

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            if self.unix_path is not None:
                self._conn = _UnixHTTPConnection(self.unix_path, self.timeout)
            elif self.https:
                ctx = self.tls_context or ssl.create_default_context()
                self._conn = http.client.HTTPSConnection(self.host, self.port,
                                                         timeout=self.timeout, context=ctx,
                                                         source_address=self.source)
            else:
                self._conn = http.client.HTTPConnection(self.host, self.port,
                                                        timeout=self.timeout,
                                                        source_address=self.source)
        return self._conn

    def request(self, method: str, path: str, body: Optional[Union[bytes, str]] = None,
                headers: Optional[Mapping[str, str]] = None, token: Union[bool, str] = True,
                content_type: Optional[str] = "application/json") -> Response:
        """Send one request as given and return the answer, whatever its status.

        token: True sends the client's token (if any), a string sends that
        one, False sends no Authorization header."""
        hdrs: Dict[str, str] = {}
        data = body.encode() if isinstance(body, str) else body
        if data is not None and content_type:
            hdrs["Content-Type"] = content_type
        tok = self.token if token is True else (token or None)
        if tok:
            hdrs["Authorization"] = "Bearer " + tok
        hdrs.update(headers or {})
        for attempt in (0, 1):
            try:
                conn = self._connection()
                conn.request(method, path, body=data, headers=hdrs)
                resp = conn.getresponse()
                raw = resp.read()
                out = Response(resp.status, dict(resp.getheaders()), raw)
                if resp.will_close:
                    self.close()
                return out
            except (ConnectionError, http.client.HTTPException, socket.timeout, OSError) as e:
                self.close()
                if attempt == 0 and method in ("GET", "HEAD") and not isinstance(e, socket.timeout):
                    continue
                raise ConnectionLost("%s %s: %s: %s" % (method, path, type(e).__name__, e)) from None
        raise AssertionError("unreachable")

    def _call(self, method: str, path: str, value: Any = None, expect: Tuple[int, ...] = (200,),
              headers: Optional[Mapping[str, str]] = None) -> Response:
        body = None if value is None else json.dumps(value)
        r = self.request(method, path, body, headers=headers)
        if r.status not in expect:
            raise _error_of(r)
        return r

    def _json(self, method: str, path: str, value: Any = None,
              expect: Tuple[int, ...] = (200,)) -> Any:
        return self._call(method, path, value, expect).json()

    def _retrying(self, method: str, path: str, value: Any = None,
                  expect: Tuple[int, ...] = (200,), key: Optional[str] = None,
                  raw: Optional[bytes] = None,
                  content_type: str = "application/json") -> Response:
        """A request that is safe to send again: with an Idempotency-Key when `key`, or one
        whose answer the server gives again (an await). Retried on a lost connection, a 503
        and a 409 key_in_use, after Retry-After (at most 5 s) or a doubling delay. `raw`
        is sent as it is (with `content_type`) instead of `value` as JSON."""
        body = raw if raw is not None else (None if value is None else json.dumps(value))
        headers = {"Idempotency-Key": key} if key else None
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            try:
                r = self.request(method, path, body, headers=headers, content_type=content_type)
            except ConnectionLost:
                if last:
                    raise
                time.sleep(self.retry_delay * 2 ** attempt)
                continue
            if r.status in expect:
                return r
            err = _error_of(r)
            if last or not (r.status == 503 or err.code == "key_in_use"):
                raise err
            after = r.header("Retry-After")
            time.sleep(min(5.0, float(after)) if after and after.isdigit()
                       else self.retry_delay * 2 ** attempt)
        raise AssertionError("unreachable")

    def _keyed(self, method: str, path: str, value: Any = None,
               expect: Tuple[int, ...] = (200,), key: Optional[str] = None) -> Any:
        return self._retrying(method, path, value, expect, key or uuid.uuid4().hex).json()

    # ---- health and operations ----------------------------------------------

    def healthz(self) -> bool:
        """True when the process answers and its backend has not failed for good."""
        return self.request("GET", "/healthz", token=False).status == 200

    def readyz(self) -> bool:
        """True when the server takes launches (false while draining or failed)."""
        return self.request("GET", "/readyz", token=False).status == 200

    def metrics(self) -> str:
        """The Prometheus text exposition."""
        return self._call("GET", "/metrics").body.decode()

    def openapi(self) -> str:
        return self._call("GET", "/v1/openapi.yaml").body.decode()

    def device(self) -> Device:
        return self._json("GET", "/v1/device")

    def model(self) -> Model:
        """Token ids, chat template, context length and limits of the served model."""
        return self._json("GET", "/v1/model")

    def facts(self) -> Facts:
        return self._json("GET", "/v1/facts")

    def teardown(self) -> Teardown:
        return self._json("POST", "/v1/teardown")

    # ---- sequences ----------------------------------------------------------

    def create_sequence(self, key: Optional[str] = None) -> int:
        return self._keyed("POST", "/v1/sequences", expect=(201,), key=key)["seq"]

    def sequences(self) -> List[Sequence]:
        """Every live sequence, by id."""
        return self._json("GET", "/v1/sequences")["sequences"]

    def sequence(self, seq: int) -> Sequence:
        return self._json("GET", "/v1/sequences/%d" % seq)

    def delete_sequence(self, seq: int, key: Optional[str] = None) -> Outcome:
        return self._keyed("DELETE", "/v1/sequences/%d" % seq, key=key)

    # ---- a sequence's state -------------------------------------------------

    def export_state(self, seq: int, snapshots: bool = False) -> bytes:
        """Sequence seq's whole state (its tokens, keys and values, a hybrid model's recurrent
        state and, with `snapshots`, its SSM snapshots): bytes that import_state takes on any
        server of the same model and numerics. A sequence in an unawaited ticket is 409
        seq_busy; while the bytes stream, launches and effects on it are refused the same way."""
        q = "true" if snapshots else "false"
        return self._call("GET", "/v1/sequences/%d/state?snapshots=%s" % (seq, q)).body

    def import_state(self, data: bytes, key: Optional[str] = None, keyed: bool = True) -> int:
        """A state export_state gave, made a new sequence of this server; returns its id.
        Keyed and retried as create_sequence is. A state of another model or numerics, or
        altered or cut short, is 400 invalid_input; one over --max-state-bytes 413 too_large;
        no room for it 409 (out_of_kv_blocks, out_of_seqs, ...). A refused import holds nothing.
        With keyed=False it is sent once, without an Idempotency-Key, on a new connection (a
        kept-alive one that the server closed meanwhile cannot fail it): the server neither
        hashes the body nor records the key (a large state goes in several times faster), and
        a connection lost before the answer leaves it unknown whether the sequence was made."""
        if not keyed:
            self.close()
            r = self.request("POST", "/v1/sequences", bytes(data),
                             content_type="application/octet-stream")
            if r.status != 201:
                raise _error_of(r)
            return r.json()["seq"]
        r = self._retrying("POST", "/v1/sequences", expect=(201,), key=key or uuid.uuid4().hex,
                           raw=bytes(data), content_type="application/octet-stream")
        return r.json()["seq"]

    # ---- events -------------------------------------------------------------

    def events(self, last_event_id: Optional[int] = None, epoch: Optional[int] = None,
               timeout: float = 30.0) -> Iterator[Tuple[int, str, Dict[str, Any]]]:
        """GET /v1/events: yields (id, kind, data) for each event as it comes, starting with
        ("hello", {"epoch", "last_id"}) and, when some asked for are no longer kept,
        ("missed", {"missed", "from"}). With `last_event_id` (and the `epoch` it came from) the
        stream resumes after that event. It runs on a connection of its own, not the client's;
        a stream that ends or breaks, or is silent past `timeout` seconds (the server sends a
        keep-alive every 15 s), raises ConnectionLost: resume with the last id seen. A refusal
        (503 too_many_connections, ...) raises DevioError."""
        path = "/v1/events"
        if epoch is not None:
            path += "?epoch=%d" % epoch
        headers = {"Accept": "text/event-stream"}
        if last_event_id is not None:
            headers["Last-Event-ID"] = str(last_event_id)
        if self.token:
            headers["Authorization"] = "Bearer " + self.token
        stream = Client(self._url, self.token, timeout, self.tls_context,
                        self.source[0] if self.source else None)
        conn = stream._connection()
        try:
            try:
                conn.request("GET", path, headers=headers)
                resp = conn.getresponse()
            except (ConnectionError, http.client.HTTPException, OSError) as e:
                raise ConnectionLost("GET /v1/events: %s: %s" % (type(e).__name__, e)) from None
            if resp.status != 200:
                raise _error_of(Response(resp.status, dict(resp.getheaders()), resp.read()))
            yield from _sse(resp)
        finally:
            stream.close()

    # ---- steps --------------------------------------------------------------

    def launch(self, plan: Plan, key: Optional[str] = None) -> int:
        """Queue a step; returns its ticket at once."""
        return self._keyed("POST", "/v1/launch", plan, expect=(202,), key=key)["ticket"]

    def await_ticket(self, ticket: int, timeout_ms: Optional[int] = None) -> StepResult:
        """The step's result; TicketPending (a DevioError, code ticket_pending) when timeout_ms
        passes first (the server answers 202 {"status": "pending"}).
        Safe to repeat: a ticket awaited already answers its result again from the history."""
        q = "" if timeout_ms is None else "?timeout_ms=%d" % timeout_ms
        r = self._retrying("POST", "/v1/tickets/%d/await%s" % (ticket, q), expect=(200, 202))
        if r.status == 202:
            raise TicketPending(ticket)
        return r.json()

    def step(self, plan: Plan, key: Optional[str] = None) -> StepResult:
        """launch and await in one round trip."""
        return self._keyed("POST", "/v1/step", plan, key=key)

    def ticket(self, ticket: int) -> TicketRecord:
        """One ticket's history record with the answer it settled with (`answer`)."""
        return self._json("GET", "/v1/tickets/%d" % ticket)

    def tickets(self, limit: int = 50, before: Optional[int] = None,
                since_ms: Optional[int] = None, until_ms: Optional[int] = None,
                status: Optional[TicketStatus] = None) -> TicketHistory:
        """One page of the history, newest first; pass the page's `next` as `before`."""
        q = {k: v for k, v in (("limit", limit), ("before", before), ("since_ms", since_ms),
                               ("until_ms", until_ms), ("status", status)) if v is not None}
        return self._json("GET", "/v1/tickets?" + urlencode(q))

    # ---- effects ------------------------------------------------------------

    def effect(self, effect: Mapping[str, Any], key: Optional[str] = None) -> Outcome:
        return self._keyed("POST", "/v1/effects", dict(effect), key=key)

    def sample(self, logits: int, params: Optional[SampleParams] = None,
               row: Optional[int] = None) -> Outcome:
        e: Dict[str, Any] = {"kind": "sample", "logits": logits}
        if params is not None:
            e["params"] = params
        if row is not None:
            e["row"] = row
        return self.effect(e)

    def fork(self, seq: int) -> int:
        """A new sequence sharing seq's blocks; returns its id."""
        return self.effect({"kind": "fork", "seq": seq})["seq"]

    def truncate(self, seq: int, length: int) -> Outcome:
        return self.effect({"kind": "truncate", "seq": seq, "len": length})

    def snapshot(self, seq: int) -> Outcome:
        return self.effect({"kind": "snapshot", "seq": seq})

    def free(self, seq: int) -> Outcome:
        return self.effect({"kind": "free", "seq": seq})

    def release_logits(self, logits: int) -> Outcome:
        return self.effect({"kind": "release", "logits": logits})

    def release_snapshots(self, seq: int) -> Outcome:
        return self.effect({"kind": "release", "seq": seq})

    # ---- logits -------------------------------------------------------------

    def logits_list(self) -> List[LogitsHandle]:
        """The live logits handles, by id (each belongs to its sequence)."""
        return self._json("GET", "/v1/logits")["handles"]

    def logits_top(self, logits: int, top: int = 5, row: int = 0) -> LogitsTop:
        return self._json("GET", "/v1/logits/%d?top=%d&row=%d" % (logits, top, row))

    def logits_raw(self, logits: int) -> bytes:
        """Every position's row as little-endian float32, position-major."""
        r = self._call("GET", "/v1/logits/%d" % logits,
                       headers={"Accept": "application/octet-stream"})
        return r.body

    # ---- adapters -----------------------------------------------------------

    def adapters(self) -> List[AdapterRecord]:
        return self._json("GET", "/v1/adapters")

    def adapter(self, name: str) -> AdapterRecord:
        return self._json("GET", "/v1/adapters/" + quote(name, safe=""))

    def load_adapter(self, name: str, path: str, pin: bool = False) -> AdapterRecord:
        return self._json("PUT", "/v1/adapters/" + quote(name, safe=""),
                          {"path": path, "pin": pin})

    def unload_adapter(self, name: str) -> AdapterRecord:
        return self._json("DELETE", "/v1/adapters/" + quote(name, safe=""))

    def pin_adapter(self, name: str) -> AdapterRecord:
        return self._json("POST", "/v1/adapters/%s/pin" % quote(name, safe=""))

    def unpin_adapter(self, name: str) -> AdapterRecord:
        return self._json("POST", "/v1/adapters/%s/unpin" % quote(name, safe=""))


def _sse(resp: http.client.HTTPResponse) -> Iterator[Tuple[int, str, Dict[str, Any]]]:
    """The events of a server-sent-event stream, until it ends (ConnectionLost)."""
    ident, kind, data = 0, "message", []
    while True:
        try:
            line = resp.readline()
        except (ConnectionError, http.client.HTTPException, OSError) as e:
            raise ConnectionLost("GET /v1/events: %s: %s" % (type(e).__name__, e)) from None
        if not line:
            raise ConnectionLost("GET /v1/events: the stream ended")
        text = line.decode("utf-8").rstrip("\r\n")
        if text == "":
            if data:
                yield ident, kind, json.loads("\n".join(data))
            kind, data = "message", []
        elif text.startswith(":"):
            continue
        else:
            name, _, value = text.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "id" and value.isdigit():
                ident = int(value)
            elif name == "event":
                kind = value
            elif name == "data":
                data.append(value)
