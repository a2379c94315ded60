"""router.py - the example over several devio-servers: one engine (engine.py) per server, and
the router that places each request on one of them.

- Placement: a new request goes to the server that holds the longest run of its prompt's
  leading KV blocks (the prefix hashes of GET /v1/events' block_stored events, followed per
  server by a Watcher), unless that server has more requests than the least loaded one plus
  `prefix_slack`; otherwise, and on a tie, to the least loaded server.
- Disaggregation (`prefill` and `decode` servers): a request is prefilled on a prefill server,
  which samples its first token; that server's engine exports its state and frees it there
  before its next step, and the least loaded decode server's engine imports it before its own
  next step (KV blocks reserved first), so neither waits behind a step; the request decodes on.
  A state the decode server refuses is prefilled there again instead.
- A lost server: the requests it held go on elsewhere, each prefilled again with its prompt and
  the tokens it has produced (engine.Job.resume_feed); under strict numerics every following
  token is the one the lost server would have sampled.
The router offers the engine's face to api.py (submit, cancel, check, start, stop, the model's
limits), so the OpenAI routes are the same over one server or many."""
import collections
import logging
import threading
import time

from engine import Engine, Job
from devio_client import Client, ConnectionLost, DevioError, hex_of, prefix_hashes

log = logging.getLogger("devio.openai")

PREFIX_SLACK = 4       # a server holding a prompt's prefix may have this many more requests
WATCH_RETRY_S = 0.5    # pause before a watcher connects again to a server it lost
START_WAIT_S = 5.0     # how long start() waits for every watcher's first event


class Watcher:
    """Follows one server's event stream: the prefix hashes of the KV blocks stored there, and
    whether the server answers. Resumes with Last-Event-ID after a break; starts afresh (no
    hashes) on a new server process or when events were missed."""

    def __init__(self, engine, token):
        self.engine, self.token = engine, token
        self.lock = threading.Lock()
        self.stored = collections.Counter()   # hex prefix hash -> blocks holding it
        self.blocks = {}                      # block -> its hex prefix hash
        self.up = False                       # the stream is open
        self.since = 0.0                      # time.monotonic() of the stream's hello
        self.opened = threading.Event()
        self.thread = threading.Thread(target=self._run, name="events " + engine.url, daemon=True)

    def matched(self, hashes):
        """How many of `hashes` (a prompt's leading blocks) are stored, from the first on."""
        with self.lock:
            n = 0
            while n < len(hashes) and self.stored.get(hashes[n]):
                n += 1
            return n

    def _reset(self):
        with self.lock:
            self.stored.clear()
            self.blocks.clear()

    def _run(self):
        last, epoch = None, None
        client = Client(self.engine.url, token=self.token, timeout=30.0, retries=0)
        while True:
            try:
                for ident, kind, data in client.events(last, epoch):
                    self._take(kind, data)
                    if kind == "hello":
                        if data["epoch"] != epoch:
                            self._reset()
                        epoch, self.up, self.since = data["epoch"], True, time.monotonic()
                        self.opened.set()
                    last = ident if kind != "missed" else last
            except (ConnectionLost, DevioError, OSError, ValueError) as e:
                if self.up:
                    log.warning("events of %s: %s", self.engine.url, e)
                self.up = False
                self.opened.set()
                time.sleep(WATCH_RETRY_S)

    def _take(self, kind, data):
        with self.lock:
            if kind == "block_stored":
                self.stored[data["prefix_hash"]] += 1
                self.blocks[data["block"]] = data["prefix_hash"]
            elif kind == "block_removed":
                h = self.blocks.pop(data["block"], data["prefix_hash"])
                if self.stored[h] > 1:
                    self.stored[h] -= 1
                else:
                    self.stored.pop(h, None)
            elif kind == "missed":   # what was removed meanwhile is unknown: forget it all
                self.stored.clear()
                self.blocks.clear()


class Router:
    """Engines for `devio` servers (prefill and decode both), or for `prefill` and `decode`
    servers. Every server must serve the same model; `engine_kw` goes to each Engine."""

    def __init__(self, devio=(), prefill=(), decode=(), token=None, prefix_slack=PREFIX_SLACK,
                 **engine_kw):
        if bool(prefill) != bool(decode):
            raise ValueError("--prefill and --decode go together")
        specs = [(u, "both") for u in devio] + [(u, "prefill") for u in prefill] + \
            [(u, "both") for u in decode]
        if not specs:
            raise ValueError("no devio-server given")
        self.token, self.prefix_slack = token, prefix_slack
        self.engines = []
        for url, role in specs:
            try:
                self.engines.append(Engine(url, token=token, role=role, on_lost=self._lost,
                                           on_handoff=self._handoff, **engine_kw))
            except Exception as e:   # ConnectionLost, DevioError, a limit that does not fit
                raise ValueError("cannot drive devio-server at %s: %s" % (url, e)) from None
        first = self.engines[0]
        for e in self.engines[1:]:
            for key in ("vocab_size", "bos_token_id", "eos_token_id", "chat_template"):
                if e.model.get(key) != first.model.get(key):
                    raise ValueError("%s and %s do not serve the same model (%s differs)"
                                     % (first.url, e.url, key))
        self.model, self.vocab_size, self.eos = first.model, first.vocab_size, first.eos
        self.front = [e for e in self.engines if e.role == "prefill"] or self.engines
        self.back = [e for e in self.engines if e.role != "prefill"]
        self.max_seq_len = min(e.max_seq_len for e in self.engines)
        self.max_running = sum(e.max_running for e in self.front)
        self.step_tokens = first.step_tokens
        self.watchers = {id(e): Watcher(e, token) for e in self.engines}
        self.counts = collections.Counter()
        self.lock = threading.Lock()

    # ---- the engine's face, for api.py --------------------------------------------------------

    def check(self, prompt_len, max_tokens):
        whys = [e.check(prompt_len, max_tokens) for e in self.front + self.back]
        return next((w for w in whys if w), None)

    def submit(self, job):
        engine = self._place(job, self.front)
        if engine is None:
            raise RuntimeError("no devio-server is reachable")
        engine.submit(job)

    def cancel(self, job):
        engine = job.engine
        job.cancelled = True
        if engine is not None:
            engine.cancel(job)

    def start(self):
        for w in self.watchers.values():
            w.thread.start()
        deadline = time.monotonic() + START_WAIT_S
        for w in self.watchers.values():
            w.opened.wait(max(0.0, deadline - time.monotonic()))
        for e in self.engines:
            e.start()

    def stop(self, timeout=30.0):
        for e in self.engines:
            e.stop(timeout)

    def stats(self):
        """Each server's role, state and load, and the router's counts, for GET /health."""
        with self.lock:
            counts = self.counts.copy()
        for e in self.engines:
            counts.update(e.moves)
        counts["move_ms"] = round(counts.get("move_ms", 0))
        return {"devio": [{"url": e.url, "role": e.role, "up": self._usable(e),
                           "requests": e.load(), "steps": e.steps,
                           "shared_prompt_tokens": e.shared_tokens} for e in self.engines],
                "router": {k: v for k, v in counts.items() if v}}

    # ---- placement ----------------------------------------------------------------------------

    def _usable(self, engine):
        """The server answers: its events stream is open and, when its engine lost its
        connection, it has reopened since."""
        w = self.watchers[id(engine)]
        if not w.up:
            return False
        if not engine.alive and w.since > engine.lost_at:
            engine.alive = True
        return engine.alive

    def _place(self, job, engines, avoid=None):
        """The engine for a job among `engines`: prefix first, within the slack, then load."""
        live = [e for e in engines if e is not avoid and self._usable(e)]
        if not live:
            return None
        least = min(e.load() for e in live)
        best, best_key = None, None
        for e in live:
            hashes = [hex_of(h) for h in prefix_hashes(job.feed or job.prompt, e.block_size)]
            matched = self.watchers[id(e)].matched(hashes)
            if e.load() > least + self.prefix_slack:
                matched = 0
            key = (matched, -e.load())
            if best_key is None or key > best_key:
                best, best_key = e, key
        with self.lock:
            self.counts["placed"] += 1
            if best_key[0]:
                self.counts["placed_by_prefix"] += 1
        return best

    # ---- lost servers and moves ------------------------------------------------------------------

    def _lost(self, jobs, engine):
        """On `engine`'s thread: its server is lost; its jobs (reset to prefill their prompt and
        tokens again) go to other servers. Returns those that no server can take."""
        left = []
        for job in jobs:
            to = self._place(job, self.back, avoid=engine)
            if to is None:
                left.append(job)
                continue
            with self.lock:
                self.counts["resumed"] += 1
            to.submit(job)
        return left

    def _handoff(self, job, engine, state):
        """On a prefill engine's thread: a prefilled job, its state exported (and its sequence
        freed there), for the least loaded decode server to import between its steps."""
        to = self._place(job, self.back)
        if to is None:
            engine._fail([job], "no decode devio-server is reachable", 503)
            return
        to.adopt(job, state)


__all__ = ["Router", "Watcher", "Job"]
