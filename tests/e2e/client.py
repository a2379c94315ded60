"""client.py - a small HTTP client for devio-server that checks every answer
against api/openapi.yaml; it must never hand a test an answer it did not validate.

    from client import Client
    c = Client("127.0.0.1", port, contract)
    seq = c.create()
    r = c.call("POST", "/v1/launch", {"rows": [...]}, expect=202)

One keep-alive connection per Client (http.client is not thread-safe: give
each thread its own Client). A dropped connection is reopened once for
requests that change nothing (GET); others raise, so a test never sends a
launch twice without knowing.
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "clients" / "python"))
import devio_client  # noqa: E402

__all__ = ["Client", "Answer", "ServerGone"]


class ServerGone(Exception):
    """The connection failed: the server is not answering (killed, stopped)."""


class Answer:
    """One validated answer: status, headers, raw bytes and decoded JSON (or None)."""

    def __init__(self, method, path, status, headers, raw, value):
        self.method = method
        self.path = path
        self.status = status
        self.headers = headers
        self.raw = raw
        self.json = value if not isinstance(value, (bytes, bytearray)) else None

    @property
    def ctype(self):
        return self.headers.get("Content-Type", "")

    @property
    def code(self):
        """The error code of an error answer, else None."""
        if isinstance(self.json, dict) and isinstance(self.json.get("error"), dict):
            return self.json["error"].get("code")
        return None

    @property
    def details(self):
        if self.code is None:
            return None
        return self.json["error"]["details"]

    def __repr__(self):
        body = self.raw[:300]
        return "<%s %s -> %d %s>" % (self.method, self.path, self.status, body)


class Client:
    """The end-to-end tests' client: devio_client's transport, every answer validated."""

    def __init__(self, host, port, contract, token=None, timeout=60.0, source=None):
        self.host = host
        self.port = port
        self.source = source  # local address to connect from, e.g. "127.0.0.2"
        self.contract = contract
        self.token = token
        self.http = devio_client.Client("http://%s:%d" % (host, port), token=token,
                                        timeout=timeout, source_address=source)

    def close(self):
        self.http.close()

    def request(self, method, path, body=None, raw=None, headers=None, token=True,
                content_type="application/json"):
        """Send one request; validate the answer against the contract; return an Answer.

        body: a JSON value to send; raw: bytes or str to send as they are.
        token: True sends the client's token (if any), a string sends that
        token, False or None sends no Authorization header.
        """
        data = raw if raw is not None else (json.dumps(body) if body is not None else None)
        tok = self.token if token is True else (token or False)
        try:
            r = self.http.request(method, path, data, headers=headers, token=tok,
                                  content_type=content_type)
        except devio_client.ConnectionLost as e:
            raise ServerGone(str(e)) from None
        value = self.contract.check(method, path, r.status, r.header("Content-Type"), r.body)
        ans = Answer(method, path, r.status, r.headers, r.body, value)
        if r.status == 401:
            assert r.header("WWW-Authenticate") == "Bearer", ans
        return ans

    def call(self, method, path, body=None, expect=200, code=None, **kw):
        """request() and assert the status (and the error code when given)."""
        a = self.request(method, path, body, **kw)
        assert a.status == expect, "expected %d%s, got %r" % (expect, " " + code if code else "", a)
        if code is not None:
            assert a.code == code, "expected %s, got %r" % (code, a)
        return a

    # ---- the routes, happy paths ---------------------------------------------

    def create(self):
        return self.call("POST", "/v1/sequences", expect=201).json["seq"]

    def seq(self, seq):
        return self.call("GET", "/v1/sequences/%d" % seq).json

    def launch(self, plan):
        return self.call("POST", "/v1/launch", plan, expect=202).json["ticket"]

    def await_(self, ticket, timeout_ms=None):
        q = "" if timeout_ms is None else "?timeout_ms=%d" % timeout_ms
        return self.call("POST", "/v1/tickets/%d/await%s" % (ticket, q)).json

    def step(self, plan):
        return self.call("POST", "/v1/step", plan).json

    def effect(self, effect):
        out = self.call("POST", "/v1/effects", effect).json
        assert out["kind"] == effect["kind"], out
        return out

    def facts(self):
        return self.call("GET", "/v1/facts").json

    def device(self):
        return self.call("GET", "/v1/device").json

    def tickets(self, query=""):
        return self.call("GET", "/v1/tickets" + query).json

    def all_tickets(self, status=None, page=1000, max_pages=1000):
        """Every ticket in the history, newest first, following `next` (bounded)."""
        out = []
        before = None
        for _ in range(max_pages):
            q = "?limit=%d" % page
            if status:
                q += "&status=" + status
            if before is not None:
                q += "&before=%d" % before
            h = self.tickets(q)
            out.extend(h["tickets"])
            before = h["next"]
            if before is None:
                return out
        raise AssertionError("history did not end within %d pages" % max_pages)

    def logits_top(self, handle, top=5, row=0):
        return self.call("GET", "/v1/logits/%d?top=%d&row=%d" % (handle, top, row)).json

    def logits_raw(self, handle):
        a = self.call("GET", "/v1/logits/%d" % handle,
                      headers={"Accept": "application/octet-stream"})
        assert a.ctype == "application/octet-stream", a
        return a.raw

    def metrics(self):
        a = self.call("GET", "/metrics")
        return a.raw.decode()
