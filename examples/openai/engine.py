"""engine.py - continuous batching over devio-server: one scheduler thread plans every step.

A step's plan holds one decode row for every running request (the token the step before
sampled), then chunks of the prompts not yet prefilled, oldest request first, within a
per-step token budget; the last chunk of a prompt samples the request's first token. New
requests join the running batch between steps, as soon as the KV blocks they may need are
free. The scheduler launches step n+1 as soon as step n is awaited, and only then turns step
n's tokens into text (stop strings, streaming), so that work overlaps the device computing.

devio is shared: another client's tickets in flight, KV blocks or logits handles can make it
refuse a step for a while (409 depth_exceeded, ...; the TRANSIENT codes). The scheduler then
launches the same plan again, with the same Idempotency-Key, after a growing pause, for up to
`retry_s` seconds; only then are the step's requests failed, with 503 for their clients. A
devio that is going away (503 not_ready while it drains, torn_down) fails them with 503 at
once: waiting would not bring it back.

Over several servers (router.py) each has its engine, and the router gets what one engine cannot
finish: the jobs of a server whose connection broke (on_lost), and on a prefill server the jobs
whose prompt is in (on_handoff), whose state moves to a decode server's engine (adopt).
"""
import collections
import logging
import math
import pathlib
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "clients" / "python"))
from devio_client import Client, ConnectionLost, DevioError, TicketPending  # noqa: E402

log = logging.getLogger("devio.openai")

AWAIT_SLICE_MS = 1000   # one await's wait; the scheduler asks again while the step runs
AWAIT_LIMIT_S = 300     # a step not settled after this is given up on
IDLE_WAIT_S = 0.5       # how long the idle scheduler sleeps when nothing wakes it
RETRY_S = 30.0          # how long a transient refusal is retried (serve.py --devio-retry-s)
RETRY_FIRST_S = 0.005   # the pause before the first retry; it doubles with each one
RETRY_MAX_S = 0.25      # ... up to this

# devio's refusals that another client of the same devio causes and ends (its tickets in
# flight, its KV blocks, logits handles or SSM slots, a key still under way, a history file
# that cannot be written for a moment, too many connections): waited out, the request kept.
# seq_busy is not among them: the example's sequences are its own, in at most one ticket.
TRANSIENT = frozenset({"depth_exceeded", "out_of_kv_blocks", "out_of_logits", "out_of_ssm_slots",
                       "key_in_use", "store_unavailable", "too_many_connections"})


def user_status(e):
    """The HTTP status a request failed by devio's error `e` answers its client: 503 (try again
    later, or elsewhere) when devio was busy or is going away, else 500."""
    if isinstance(e, ConnectionLost) or e.code in TRANSIENT or e.status == 503:
        return 503
    return 500


@dataclass
class Event:
    """What a request's client gets: new text and the sampled tokens that carry it
    ((id, logprob, top) each, top a list of (id, logprob)); the last event has `finish`
    ("stop", "length" or "error", with `error` the reason) and the token counts. offsets[i]
    is where tokens[i]'s text begins in the whole output text."""
    text: str
    tokens: List[Tuple[int, float, list]]
    offsets: List[int]
    finish: Optional[str] = None
    error: Optional[str] = None
    status: int = 500   # with "error": the HTTP status for the client (503: devio busy or gone)
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass
class Job:
    """One request's generation. `sample` is devio's sample object for every sampled row;
    `stream` the request's TextStream; `sink` is called on the scheduler thread with each
    Event."""
    prompt: List[int]
    sample: dict
    max_tokens: int
    stream: object
    sink: object
    seq: Optional[int] = None
    blocks: int = 0                 # KV blocks reserved for it
    feed: Optional[list] = None     # the tokens to prefill: the prompt, or after a lost
                                    # devio-server the prompt and the tokens sampled so far
    fed: int = 0                    # of `feed`, the tokens launched so far
    pending: Optional[int] = None   # the last sampled token, input of its next decode row
    tokens: list = field(default_factory=list)      # every sampled (id, logprob, top), EOS too
    published: int = 0              # of `tokens`, those turned into text
    text_tokens: list = field(default_factory=list)  # of those, the ones in the text (no EOS)
    tokens_out: int = 0             # of `text_tokens`, those sent in events
    finish: Optional[str] = None
    error: Optional[str] = None
    error_status: int = 500
    cancelled: bool = False
    done: bool = False              # its last event was sent
    seq_key: str = field(default_factory=lambda: uuid.uuid4().hex)  # its create's Idempotency-Key
    refused_since: Optional[float] = None   # when devio first refused to create its sequence
    handoff: bool = False           # prefilled on a prefill engine: its state moves to a decode one
    engine: object = None           # the engine it runs on (the router's cancel wakes it)
    moves: int = 0                  # times its state moved to another devio-server
    resumes: int = 0                # times it was prefilled again after a devio-server was lost

    def resume_feed(self):
        """What to prefill on another devio-server: the prompt and every token sampled so far,
        whose last chunk samples the next token (at the same position, so in strict numerics
        the same token the lost server would have sampled)."""
        return list(self.prompt) + [t[0] for t in self.tokens]


@dataclass
class Refused:
    """A step devio refused for a transient reason, launched again as it was at `retry_at`."""
    rows: list
    jobs: list
    key: str                        # the Idempotency-Key of every launch of it
    since: float                    # time.monotonic() of the first refusal
    tries: int = 0
    retry_at: float = 0.0


class Engine:
    """The scheduler. submit() and cancel() may be called from any thread; everything else
    runs on the engine's own thread, which alone talks to devio-server."""

    def __init__(self, url, token=None, step_tokens=512, max_running=0, retry_s=RETRY_S,
                 role="both", on_lost=None, on_handoff=None):
        self.url, self.role = url, role
        self.on_lost = on_lost          # router: called with the jobs of a lost devio-server
        self.on_handoff = on_handoff    # router: called with a prefilled job (role "prefill")
        self.alive = True               # False once the connection to devio-server was lost
        self.lost_at = 0.0              # time.monotonic() when it was last lost
        self.aborts = []                # (job, reason, status) failed by another thread
        self.client = Client(url, token=token, timeout=60.0)
        self.retry_s = retry_s
        self.refused: Optional[Refused] = None   # the step waiting to be launched again
        self.model = self.client.model()
        dev = self.client.device()
        lim = dev["limits"]
        self.eos = self.model["eos_token_id"]
        self.vocab_size = self.model["vocab_size"]
        self.max_seq_len = lim["max_seq_len"]
        self.block_size = lim["block_size"]
        self.kv_blocks = lim["kv_blocks"]
        # a new request may fork a running one that computed its prompt's first blocks (not on
        # a hybrid model, whose recurrent state cannot be truncated back to a block's end)
        self.share = lim.get("ssm_slots", 0) == 0
        self.shared_tokens = 0          # prompt tokens taken from forks instead of prefilled
        self.max_rows = lim["max_rows"]
        self.step_tokens = min(step_tokens, lim["max_batch_tokens"])
        self.max_running = min(max_running or min(lim["max_rows"], self.step_tokens),
                               lim["max_rows"], lim["max_seqs"])
        if self.step_tokens < self.max_running:
            raise ValueError("--step-tokens %d is below the %d decode rows a step may carry"
                             % (self.step_tokens, self.max_running))
        self.waiting = collections.deque()
        self.adopted = collections.deque()   # (job, state) moved here from a prefill server
        self.moves = collections.Counter()   # states imported here: moved, bytes, ms, failed
        self.running: List[Job] = []
        self.reserved = 0
        self.touched: List[Job] = []    # jobs with something to tell their client
        self.steps = 0
        self._cond = threading.Condition()
        self._woken = False
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="scheduler", daemon=True)

    # ---- any thread -----------------------------------------------------------------------

    def blocks_for(self, prompt_len, max_tokens):
        return math.ceil((prompt_len + max_tokens) / self.block_size)

    def check(self, prompt_len, max_tokens):
        """Why a request of this size can never run, or None."""
        if prompt_len + max_tokens > self.max_seq_len:
            return ("the prompt (%d tokens) and max_tokens (%d) exceed the context of %d tokens"
                    % (prompt_len, max_tokens, self.max_seq_len))
        if self.blocks_for(prompt_len, max_tokens) > self.kv_blocks:
            return "the request needs more KV cache than devio-server has"
        return None

    def submit(self, job):
        if job.feed is None:
            job.feed = job.prompt
        job.engine = self
        with self._cond:
            if self._stopping:
                raise RuntimeError("the server is shutting down")
            self.waiting.append(job)
            self._woken = True
            self._cond.notify()

    def adopt(self, job, state):
        """A job prefilled on another server, with its sequence's exported state: imported here
        between two steps (no step waits for it, and it waits for none), then it joins the batch
        with its next decode row."""
        job.engine = self
        with self._cond:
            self.adopted.append((job, state))
            self._woken = True
            self._cond.notify()

    def abort(self, job, reason, status=500):
        """Fail a job that is on no engine's list (the router's mover holds it): its client gets
        the error from this engine's thread, which published its earlier events."""
        with self._cond:
            self.aborts.append((job, reason, status))
            self._woken = True
            self._cond.notify()

    def try_reserve(self, blocks):
        """Reserve KV blocks for a job, when they are free (False when not)."""
        with self._cond:
            if self.reserved + blocks > self.kv_blocks:
                return False
            self.reserved += blocks
            return True

    def release(self, blocks):
        with self._cond:
            self.reserved -= blocks

    def load(self):
        """Requests placed here and not yet ended."""
        return len(self.running) + len(self.waiting) + len(self.adopted)

    def cancel(self, job):
        """The client went away: the job ends at the next step without another event."""
        job.cancelled = True
        with self._cond:
            self._woken = True
            self._cond.notify()

    def start(self):
        self._thread.start()

    def stop(self, timeout=30.0):
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join(timeout)

    # ---- the scheduler thread ---------------------------------------------------------------

    def _run(self):
        step = None
        while True:
            with self._cond:
                stopping = self._stopping
            try:
                if step is not None:
                    self._await(step)
                    self._handoffs()   # nothing in flight: their states leave at once
                if stopping:
                    break
                if self.refused is None:   # else its plan stands as it was: change nothing
                    self._retire()
                    self._admit()
                step = self._launch()
                busy = bool(self.touched or self.aborts) or step is not None
                self._publish()
            except Exception as e:  # keep serving: fail what was running, start afresh
                log.exception("scheduler")
                self.refused = None
                self._fail(self.running, "scheduler error: %s" % e)
                step, busy = self._settle(step), True
                self._publish()
            if self.refused is not None:
                self._pause(self.refused.retry_at - time.monotonic())
            elif not busy:
                self._idle()
        self._shutdown()

    def _settle(self, step):
        """After a failure, wait for the step still in flight so that its sequences can be freed."""
        try:
            if step is not None:
                self._await(step)
        except Exception:
            log.exception("awaiting step %s after a failure", step[0])
        return None

    def _idle(self):
        with self._cond:
            if not self._woken and not self._stopping:
                self._cond.wait(IDLE_WAIT_S)
            self._woken = False

    def _pause(self, seconds):
        """Sleep before a retry; a new request or stop() may end it early."""
        with self._cond:
            if seconds > 0 and not self._stopping:
                self._cond.wait(seconds)

    def _backoff(self, tries, since):
        """When to try again after `tries` retries of a refusal first met at `since`: never
        past the deadline, so that the last try comes at it."""
        return min(time.monotonic() + min(RETRY_MAX_S, RETRY_FIRST_S * 2 ** tries),
                   since + self.retry_s)

    def _await(self, step):
        """Wait for a step and record each sampled row's token; a failed step fails its jobs."""
        ticket, jobs = step
        waited, since, tries = 0, None, 0
        while True:
            try:
                result = self.client.await_ticket(ticket, timeout_ms=AWAIT_SLICE_MS)
                break
            except TicketPending:
                waited += AWAIT_SLICE_MS / 1000.0
                if waited >= AWAIT_LIMIT_S:
                    self._fail([j for j, _ in jobs], "devio step %d did not settle" % ticket)
                    return
            except ConnectionLost as e:
                self._lost("devio-server: %s" % e)
                return
            except DevioError as e:
                # 503 store_unavailable: the ticket stays settled and awaitable; ask again
                since = time.monotonic() if since is None else since
                if e.code in TRANSIENT and time.monotonic() - since < self.retry_s:
                    self._pause(self._backoff(tries, since) - time.monotonic())
                    tries += 1
                    continue
                self._fail([j for j, _ in jobs], "devio step failed: %s" % e, user_status(e))
                return
        self.steps += 1
        for (job, sampled), row in zip(jobs, result["rows"]):
            if sampled and job.finish is None and not job.cancelled:
                self._record(job, row)

    def _record(self, job, row):
        token = row["tokens"][0]
        top = [(t["id"], t["logprob"]) for t in row.get("top_logprobs", [[]])[0]
               if t["logprob"] is not None]
        job.tokens.append((token, row["logprobs"][0], top))
        job.pending = token
        if token == self.eos:
            job.finish = "stop"
        elif len(job.tokens) >= job.max_tokens:
            job.finish = "length"
        elif self.role == "prefill":
            job.handoff = True
        self.touched.append(job)

    def _retire(self):
        """Free the sequences of jobs that ended (nothing is in flight now)."""
        keep = []
        for job in self.running:
            if job.finish is None and not job.cancelled:
                keep.append(job)
                continue
            self.release(job.blocks)
            try:
                self.client.free(job.seq)
            except (DevioError, ConnectionLost) as e:
                log.warning("freeing sequence %s: %s", job.seq, e)
        self.running = keep

    def _import(self, job, state):
        """Import an adopted job's state (its KV blocks reserved): True when it joined the batch,
        False when it must wait (no room yet); a refused state is prefilled here again."""
        need = self.blocks_for(len(job.prompt), job.max_tokens)
        if not self.try_reserve(need):
            return False
        t0 = time.monotonic()
        try:
            seq = self.client.import_state(state, keyed=False)   # lost: the job moves on
        except DevioError as e:
            self.release(need)
            if e.code in TRANSIENT:   # another client's blocks or slots: wait for them
                return False
            log.warning("importing a state on %s: %s; prefilling it here again", self.url, e)
            self.moves["move_failed"] += 1
            job.fed, job.pending, job.handoff = 0, None, False
            job.feed = job.resume_feed()
            job.resumes += 1
            self._requeue(job)
            return True
        job.seq, job.blocks, job.handoff = seq, need, False
        job.moves += 1
        self.moves["moved"] += 1
        self.moves["moved_bytes"] += len(state)
        self.moves["move_ms"] += (time.monotonic() - t0) * 1000
        self.running.append(job)
        return True

    def _admit(self):
        """Adopted jobs join the batch (their states imported), then waiting ones, oldest first,
        while rows and KV blocks allow."""
        while len(self.running) < self.max_running:
            with self._cond:
                if not self.adopted:
                    break
                job, state = self.adopted.popleft()
            if job.cancelled:
                continue
            try:
                joined = self._import(job, state)
            except ConnectionLost as e:
                with self._cond:
                    self.adopted.appendleft((job, state))
                self._lost("devio-server: %s" % e)
                return
            if not joined:
                with self._cond:
                    self.adopted.appendleft((job, state))
                break
        while len(self.running) < self.max_running:
            with self._cond:
                if not self.waiting:
                    return
                job = self.waiting.popleft()
            if job.cancelled:
                continue
            need = self.blocks_for(len(job.prompt), job.max_tokens)
            if not self.try_reserve(need):
                self._requeue(job)
                return
            try:   # the same key on every try: a create whose answer was lost counts once
                if not self._fork_shared(job):
                    job.seq = self.client.create_sequence(key=job.seq_key)
            except DevioError as e:
                if e.code == "out_of_seqs":   # held by another client of devio: wait in line
                    self._requeue(job)
                    return
                now = time.monotonic()
                if job.refused_since is None:
                    job.refused_since = now
                self.release(need)
                if e.code in TRANSIENT and now - job.refused_since < self.retry_s:
                    self._requeue(job)   # tried again at the next pass, as for out_of_seqs
                    return
                self._fail([job], "devio-server: %s" % e, user_status(e))
                continue
            except ConnectionLost as e:
                self.release(need)
                self._requeue(job)
                self._lost("devio-server: %s" % e)
                return
            job.blocks = need
            self.running.append(job)

    def _shared(self, job):
        """The running job whose computed prompt shares the most whole KV blocks with job's
        feed (leaving at least its last token to prefill), and the tokens shared."""
        bs, best, best_n = self.block_size, None, 0
        cap = (len(job.feed) - 1) // bs * bs
        for r in self.running:
            if r.seq is None or r.handoff:
                continue
            n, top = 0, min(cap, r.fed // bs * bs, len(r.feed) // bs * bs)
            while n < top and r.feed[n:n + bs] == job.feed[n:n + bs]:
                n += bs
            if n > best_n:
                best, best_n = r, n
        return best, best_n

    def _fork_shared(self, job):
        """Start job's sequence as a fork of a running one that holds its prompt's first blocks,
        cut back to them (blocks shared, not computed again; in strict numerics the same bits as
        a prefill). False when there is none, or the fork is refused."""
        if not self.share:
            return False
        src, n = self._shared(job)
        if src is None:
            return False
        try:
            seq = self.client.fork(src.seq)
        except DevioError as e:
            log.info("forking sequence %s: %s", src.seq, e)
            return False
        try:
            self.client.truncate(seq, n)
        except DevioError as e:
            log.info("cutting fork %s of %s back to %d tokens: %s", seq, src.seq, n, e)
            self.client.free(seq)
            return False
        job.seq, job.fed = seq, n
        self.shared_tokens += n
        return True

    def _requeue(self, job):
        with self._cond:
            self.waiting.appendleft(job)

    def _plan(self):
        """(rows, [(job, sampled)]): decode rows first, then prompt chunks within the budget."""
        rows, jobs, budget = [], [], self.step_tokens
        for job in self.running:
            if job.pending is not None and not job.handoff:
                rows.append({"seq": job.seq, "tokens": [job.pending], "sample": job.sample})
                jobs.append((job, True))
                budget -= 1
        for job in self.running:
            left = len(job.feed) - job.fed
            if left <= 0 or budget <= 0 or len(rows) >= self.max_rows:
                continue
            n = min(left, budget)
            row = {"seq": job.seq, "tokens": job.feed[job.fed:job.fed + n]}
            if n == left:
                row["sample"] = job.sample
            rows.append(row)
            jobs.append((job, n == left))
            budget -= n
        return rows, jobs

    def _launch(self):
        """Launch the next step, or the refused one again once its pause is over; (ticket,
        [(job, sampled)]), or None when nothing was launched."""
        held = self.refused
        if held is not None:
            if time.monotonic() < held.retry_at:
                return None
            rows, jobs, key = held.rows, held.jobs, held.key
        else:
            rows, jobs = self._plan()
            if not rows:
                return None
            key = uuid.uuid4().hex
        try:
            ticket = self.client.launch({"rows": rows}, key=key)
        except ConnectionLost as e:
            self.refused = None
            self._lost("devio-server: %s" % e)
            return None
        except DevioError as e:
            now = time.monotonic()
            since = held.since if held is not None else now
            if e.code in TRANSIENT and now - since < self.retry_s:
                tries = held.tries + 1 if held is not None else 0
                if held is None:
                    log.info("devio-server refused a step, trying again: %s", e)
                self.refused = Refused(rows, jobs, key, since, tries, self._backoff(tries, since))
                return None
            self.refused = None
            row = e.details.get("row")
            bad = [jobs[row][0]] if row is not None and 0 <= row < len(jobs) else [j for j, _ in jobs]
            if e.code in TRANSIENT:
                log.warning("devio-server refused a step for %.1f s: %s", now - since, e)
                self._fail(bad, "devio-server refused the step for %.1f s: %s" % (now - since, e),
                           503)
            else:
                self._fail(bad, "devio-server refused the step: %s" % e, user_status(e))
            return None
        self.refused = None
        for (job, _), row in zip(jobs, rows):
            if job.fed == len(job.feed):   # a decode row: its pending token is in
                job.pending = None
            else:
                job.fed += len(row["tokens"])
        return ticket, jobs

    def _handoffs(self):
        """On a prefill engine, between a step's await and the next launch: the jobs whose prompt
        is in (their first token just sampled) leave. Their first token goes to their clients,
        their state is exported and their sequence freed here while no step holds the device,
        and the router imports the state on a decode server (on_handoff)."""
        moving = [j for j in self.running if j.handoff and j.finish is None and not j.cancelled]
        if not moving or self.on_handoff is None:
            return
        self._publish()   # the first tokens reach their clients before the jobs move
        for job in moving:
            try:
                data = self.client.export_state(job.seq)
            except ConnectionLost as e:
                self._lost("devio-server: %s" % e)
                return
            except DevioError as e:
                self._fail([job], "exporting the request's state: %s" % e, user_status(e))
                continue
            try:
                self.client.free(job.seq)
            except (DevioError, ConnectionLost) as e:
                log.warning("freeing sequence %s: %s", job.seq, e)
            self.running.remove(job)
            self.release(job.blocks)
            job.seq, job.blocks = None, 0
            self.on_handoff(job, self, data)

    def _lost(self, reason):
        """The connection to devio-server broke. Without a router, the jobs it held fail (503);
        with one, they go on elsewhere: the router prefills each job's prompt and the tokens it
        has already produced on another devio-server (Job.resume_feed)."""
        if self.on_lost is None:
            self._fail(self.running, reason, 503)
            return
        log.warning("%s is lost (%s): its requests go on elsewhere", self.url, reason)
        self.alive, self.lost_at = False, time.monotonic()
        self._publish()   # what this server sampled reaches its clients before the jobs move
        with self._cond:
            moving = [job for job, _ in self.adopted] + list(self.waiting)
            self.adopted.clear()
            self.waiting.clear()
        keep = []
        for job in self.running:
            (keep if job.finish is not None or job.cancelled else moving).append(job)
        self.running = keep   # ended: freed (or found gone) by _retire
        for job in moving:
            self.release(job.blocks)
            job.seq, job.blocks, job.fed, job.pending, job.handoff = None, 0, 0, None, False
            job.feed, job.refused_since = job.resume_feed(), None
            if job.tokens:
                job.resumes += 1
        self._fail(self.on_lost(moving, self), reason, 503)   # those no other server can take

    def _fail(self, jobs, reason, status=500):
        for job in jobs:
            if job.finish is None:
                job.finish, job.error, job.error_status = "error", reason, status
                self.touched.append(job)

    def _publish(self):
        """Turn new tokens into text and hand each touched job its event."""
        with self._cond:
            aborts, self.aborts = self.aborts, []
        for job, reason, status in aborts:
            self._fail([job], reason, status)
        touched, self.touched = self.touched, []
        for job in touched:
            if job.done or job.cancelled:
                continue
            for token in job.tokens[job.published:]:
                if token[0] != self.eos and not job.stream.stopped:
                    job.text_tokens.append(token)
                    if job.stream.add(token[0]):
                        job.finish = "stop"
            job.published = len(job.tokens)
            final = job.finish is not None
            text = job.stream.take(final)
            n = job.stream.tokens_sent(final)
            ends = job.stream.ends
            event = Event(text, job.text_tokens[job.tokens_out:n],
                          [ends[i - 1] if i else 0 for i in range(job.tokens_out, n)])
            job.tokens_out = max(job.tokens_out, n)
            if final:
                event.finish, event.error, event.status = job.finish, job.error, job.error_status
                event.prompt_tokens, event.completion_tokens = len(job.prompt), len(job.tokens)
                job.done = True
            if event.text or event.tokens or final:
                job.sink(event)

    def _shutdown(self):
        with self._cond:
            left = list(self.waiting) + [job for job, _ in self.adopted]
            self.waiting.clear()
            self.adopted.clear()
        self._fail(self.running + left, "the server is shutting down", 503)
        self._publish()
        self._retire()
        self.client.close()
