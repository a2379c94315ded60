"""conftest.py - fixtures that run real devio-server processes for the end-to-end tests.
Every server started here is killed at teardown and every wait is bounded; it must never leave a process behind.

    python3 -m pytest -q tests/e2e --bin bazel-bin

--bin is the folder holding service/devio-server, tools/mkmodel/devio-mkmodel and
ref/devio-ref (Bazel's bazel-bin, or any tree with the same layout).
"""
import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE))

from client import Client  # noqa: E402
from openapi_check import Contract  # noqa: E402

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0


def pytest_addoption(parser):
    parser.addoption("--bin", default="bazel-bin",
                     help="folder with service/devio-server, tools/mkmodel/devio-mkmodel, ref/devio-ref")


class Bins:
    def __init__(self, root):
        self.root = root
        self.server = root / "service" / "devio-server"
        self.mkmodel = root / "tools" / "mkmodel" / "devio-mkmodel"
        self.ref = root / "ref" / "devio-ref"


@pytest.fixture(scope="session")
def bins(request):
    root = Path(request.config.getoption("--bin"))
    if not root.is_absolute():
        root = (Path.cwd() / root) if (Path.cwd() / root).exists() else (REPO / root)
    b = Bins(root.resolve())
    for p in (b.server, b.mkmodel, b.ref):
        if not os.access(p, os.X_OK):
            pytest.exit("no executable %s (build first: bazel build //...)" % p, returncode=2)
    return b


@pytest.fixture(scope="session")
def contract():
    return Contract(str(REPO / "api" / "openapi.yaml"))


def make_model(bins, out, preset="tiny", seed=None):
    cmd = [str(bins.mkmodel), "--preset", preset, "--out", str(out)]
    if seed is not None:
        cmd += ["--seed", str(seed)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    return out


@pytest.fixture(scope="session")
def tiny_model(bins, tmp_path_factory):
    return make_model(bins, tmp_path_factory.mktemp("models") / "tiny")


@pytest.fixture(scope="session")
def small_model(bins, tmp_path_factory):
    return make_model(bins, tmp_path_factory.mktemp("models") / "small", "small")


class Server:
    """One devio-server process on a free loopback port."""

    def __init__(self, bins, contract, model, workdir, args=(), env=None, token=None, db=None):
        self.contract = contract
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.db = Path(db) if db else self.workdir / "devio.db"
        self.token = token
        self.log_path = self.workdir / ("server-%d.log" % time.monotonic_ns())
        adapters = self.workdir / "adapters"
        adapters.mkdir(exist_ok=True)
        penv = {k: v for k, v in os.environ.items() if not k.startswith("DEVIO_")}
        penv.update(env or {})
        cmd = [str(bins.server), "--model", str(model), "--listen", "127.0.0.1:0",
               "--db", str(self.db), "--adapters", str(adapters)] + [str(a) for a in args]
        self.cmd = cmd
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._log, env=penv,
                                     stdin=subprocess.DEVNULL)
        self.clients = []
        self.ended = False  # stopped or killed by the test, not on its own
        try:
            self.port = self._read_port()
        except BaseException:
            self.kill()
            raise

    def _read_port(self):
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + START_TIMEOUT_S
        buf = b""
        try:
            while b"\n" not in buf:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError("devio-server did not print 'listening PORT' in %.0f s\n%s"
                                         % (START_TIMEOUT_S, self.log()))
                if not sel.select(timeout=left):
                    continue
                chunk = os.read(self.proc.stdout.fileno(), 4096)
                if not chunk:
                    self.proc.wait(timeout=STOP_TIMEOUT_S)
                    raise AssertionError("devio-server exited %s before listening\n%s"
                                         % (self.proc.returncode, self.log()))
                buf += chunk
        finally:
            sel.close()
        line = buf.split(b"\n", 1)[0].decode()
        word, port = line.split()
        assert word == "listening", line
        return int(port)

    def log(self):
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def client(self, token=True, timeout=60.0):
        c = Client("127.0.0.1", self.port, self.contract,
                   token=self.token if token is True else token, timeout=timeout)
        self.clients.append(c)
        return c

    def alive(self):
        return self.proc.poll() is None

    def _close_clients(self):
        for c in self.clients:
            c.close()

    def stop(self, timeout=STOP_TIMEOUT_S):
        """SIGTERM and wait (bounded); the exit status, or raises after killing it."""
        self.ended = True
        self._close_clients()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError("devio-server ignored SIGTERM for %.0f s\n%s" % (timeout, self.log()))
        self._finish()
        return self.proc.returncode

    def kill(self):
        """SIGKILL (kill -9) and reap."""
        self.ended = True
        self._close_clients()
        if self.proc.poll() is None:
            self.proc.kill()
            try:
                self.proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                pass
        self._finish()
        return self.proc.returncode

    def _finish(self):
        if self.proc.stdout:
            self.proc.stdout.close()
        if not self._log.closed:
            self._log.close()


class Servers:
    """Starts servers for one scope and kills whatever is left at its end."""

    def __init__(self, bins, contract, tmp):
        self.bins = bins
        self.contract = contract
        self.tmp = Path(tmp)
        self.all = []
        self.n = 0

    def start(self, model, args=(), env=None, token=None, db=None, workdir=None):
        self.n += 1
        wd = Path(workdir) if workdir else self.tmp / ("srv%d" % self.n)
        s = Server(self.bins, self.contract, model, wd, args=args, env=env, token=token, db=db)
        self.all.append(s)
        return s

    def cleanup(self):
        for s in self.all:
            if s.alive():
                s.kill()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test shows every server of its pools that ended on its own: its exit status
    (a negative one is the signal) and the end of its log, so that a lost connection says why."""
    outcome = yield
    rep = outcome.get_result()
    if rep.when != "call" or not rep.failed:
        return
    for name in ("servers", "module_servers"):
        pool = item.funcargs.get(name) if hasattr(item, "funcargs") else None
        for s in getattr(pool, "all", ()):
            if not s.ended and not s.alive():
                rep.sections.append(("devio-server %s" % s.log_path.name,
                                     "exited on its own with status %s\n%s"
                                     % (s.proc.returncode, s.log())))


@pytest.fixture
def stream(servers, tiny_model, bins):
    """start(*args, step_ms=20, db=None, workdir=None): a server on the tiny model and the
    stream test device (tests/backend), each step lasting step_ms."""
    def start(*args, step_ms=20, db=None, workdir=None):
        return servers.start(tiny_model, ["--backend", "stream", "--backend-path",
                                          bins.root / "tests" / "backend", *args],
                             env={"STREAM_BACKEND_STEP_MS": str(step_ms)}, db=db,
                             workdir=workdir)
    return start


@pytest.fixture
def servers(bins, contract, tmp_path):
    pool = Servers(bins, contract, tmp_path)
    yield pool
    pool.cleanup()


@pytest.fixture(scope="module")
def module_servers(bins, contract, tmp_path_factory):
    pool = Servers(bins, contract, tmp_path_factory.mktemp("servers"))
    yield pool
    pool.cleanup()
