"""bench_server.py - what the Python benches of devio-server share: a server process on a free
loopback port with its own SQLite file, one request on a connection, a /v1/step closed mid-way by
FIN or RST, and a Prometheus value read. It must never leave a server running past stop()."""
import http.client
import json
import os
import selectors
import socket
import struct
import subprocess
import time


class Server:
    """devio-server on the model, its history in `work`; args and env added to its own."""

    def __init__(self, bins, model, work, *args, env=None):
        self.db = work / ("h%d.db" % time.monotonic_ns())
        penv = {k: v for k, v in os.environ.items() if not k.startswith("DEVIO_")}
        penv.update(env or {})
        self.proc = subprocess.Popen(
            [str(bins / "service" / "devio-server"), "--model", str(model), "--listen",
             "127.0.0.1:0", "--db", str(self.db), "--adapters", str(work), "--log-level", "warn",
             *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
            env=penv)
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        line = b""
        deadline = time.monotonic() + 60
        while b"\n" not in line and time.monotonic() < deadline:
            if sel.select(timeout=1):
                chunk = os.read(self.proc.stdout.fileno(), 256)
                if not chunk:
                    break
                line += chunk
        sel.close()
        if not line.startswith(b"listening "):
            self.stop()
            raise SystemExit("devio-server did not start")
        self.port = int(line.split()[1])

    def conn(self, timeout=60):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def request(self, method, path, body=None, headers=None, con=None):
        """(status, decoded body or None, response) on `con`, or on a connection of its own."""
        c = con or self.conn()
        try:
            h = {"Content-Type": "application/json"}
            h.update(headers or {})
            c.request(method, path, json.dumps(body) if body is not None else None, h)
            r = c.getresponse()
            data = r.read()
            try:
                return r.status, json.loads(data), r
            except ValueError:
                return r.status, None, r
        finally:
            if con is None:
                c.close()

    def call(self, method, path, body=None):
        """(status, decoded body or None) on a connection of its own."""
        return self.request(method, path, body)[:2]

    def metrics(self):
        """The /metrics text."""
        c = self.conn(30)
        try:
            c.request("GET", "/metrics")
            return c.getresponse().read().decode()
        finally:
            c.close()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def plan(seq, tokens, **row):
    r = {"seq": seq, "tokens": tokens}
    r.update(row)
    return {"rows": [r]}


def step_and_close(port, body, after_s, reset):
    """POST /v1/step and close the connection after_s later: by FIN, or by RST (SO_LINGER 0)."""
    data = json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        s.sendall(b"POST /v1/step HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(data) + data)
        time.sleep(after_s)
        if reset:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    finally:
        s.close()


def metric(text, key):
    """The value of the sample `key` (name and labels as written) in Prometheus text; 0 if none."""
    for line in text.splitlines():
        if line.startswith(key + " "):
            return float(line.split()[-1])
    return 0.0


def tiny_model(bins, work):
    """devio-mkmodel's tiny preset written under `work`; its directory."""
    model = work / "tiny"
    subprocess.run([str(bins / "tools" / "mkmodel" / "devio-mkmodel"), "--preset", "tiny",
                    "--out", str(model)], check=True, capture_output=True)
    return model
