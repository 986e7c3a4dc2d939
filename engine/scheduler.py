"""Continuous batching: one scheduler per engine runs every reply's next tokens in one pass.

A reply is a generator (`Session`'s reply loop) that yields its events and what it needs from the engine, and
receives the answers:
  `Chunk(left)`    -> how many of its prompt's `left` unread tokens to read in the next pass;
  `Guesses(...)`   -> how many of its drafter's guesses to verify in the next pass;
  `Rows(tokens)`   -> the logits of those rows, once the pass has run;
  `SYNC`           -> nothing, once its client has taken every event sent so far.
The first two are questions only the scheduler can answer, since it sees every sequence; the reply then yields
its `Rows`. `SYNC` comes where the reply reads its cancel flag and live parameters (each round, each prompt
chunk): a client that cancels, or moves a slider, on seeing an event gets the same next round as when it drove
the reply itself, and a reply never runs more than a round ahead of what its client has taken. A client slow to
take its events only holds its own reply back (after a short grace, a pass goes without it).

Each step the scheduler admits waiting replies to free slots of the KV pool (a prompt prefix another slot holds
is copied into the new one; a reply sent together with one reading a prefix they share waits for it: see
`_prefix_coming`), answers the questions, runs ONE
pass over every sequence's rows (`forward_batch`: on the native step one call, each row attending its
own sequence's cache) and hands each reply its logits. A reply that ends gives its slot back at once; the next
waiting reply takes it at the next step. The batch of one is the same loop with one sequence in it.

Exact per client: a row's logits do not depend on the other rows of its pass (the native step's batch
invariance), a reply draws its samples from its own generator, and how many guesses a pass verifies never
changes which tokens a reply emits (`speculative.verify`). So each reply's text is the one it gets alone.

Scheduling: a prefill reads up to PREFILL_CHUNK tokens a pass while it runs alone; beside other sequences the
pass holds at most SHARED_CHUNK prompt tokens (the shortest prompts first), so no running stream waits longer
than one such chunk for its next token and a short prompt's first token does not wait for a long paste. Guesses
are shared out across the pass by expected tokens per second of the whole pass (`share_guesses`).
"""

from __future__ import annotations

import queue
import threading
import time
import weakref
from collections import Counter, deque
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass

from .cached_model import PREFILL_CHUNK, CachedModel, forward_batch
from .events import Done, Event
from .kv_pool import SHARE_MIN, KVPool
from .prefix import common_prefix
from .speculation_pay import PassCost

SHARED_CHUNK = 128  # prompt tokens per pass beside other sequences: ~0.1 s of the 135M model on 2 cores
round_clock = time.perf_counter  # times rounds and passes (a module name, so a test can drive it)
GRACE_S = 0.02  # how long a step waits for clients to take their events before a pass goes without their replies


class _Sync:
    def __repr__(self) -> str:
        return "SYNC"


SYNC = _Sync()  # see the module's docstring


@dataclass
class Rows:
    """A sequence's share of the next pass: `tokens` right after what its cache holds (a chain, or a tree when
    `parents` is given), logits wanted from row `wanted` on (a prefill chunk: len(tokens), none). Answered with
    those logits; `batch` then says how many sequences shared the pass. `ready`: for a decode round, the round
    clock's reading when its rows were ready (the pass starts when every sequence's are: the cost model's sample)."""

    tokens: list[int]
    parents: list[int] | None = None
    wanted: int = 0
    ready: float | None = None
    batch: int = 1


@dataclass
class Chunk:
    """A prefill asks how many of its `left` prompt tokens to read in the next pass (answered: 0 to left)."""

    left: int


@dataclass
class Guesses:
    """A round asks how many of its guesses to verify: `scores[i]` is the chance that the first i + 1 land
    (calibrated); `least`, how many it wants verified when its round is the only one in the pass; `rows`, the rows
    its round holds besides the guesses (the pending token, and the prompt's last tokens in a reply's first round)."""

    scores: list[float]
    least: int = 0
    rows: int = 1


Reply = Generator["Event | Rows | Chunk | Guesses | _Sync", object, None]


class Job:
    """One reply waiting for a slot or running in one: `start(slot)` makes its generator; its events go to
    `events` in order (the last one a Done)."""

    def __init__(self, ids: list[int], start: Callable[[CachedModel], Reply], cancel: threading.Event) -> None:
        self.ids, self.start, self.cancel = ids, start, cancel
        self.events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self.admitted = threading.Event()  # it holds a slot
        self.slot: CachedModel | None = None  # the slot it holds (or held)
        self.kept: list[int] = []  # the tokens its slot held when it ended
        self.finished = threading.Event()  # its generator ended and its slot is free again
        self._on_end: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        self.sent = self.taken = 0  # events handed to the client; of those, the ones it is done with
        self.detached = False  # the client stopped reading (closed its stream): nothing to wait for
        self.wake: Callable[[], None] = lambda: None  # tells the scheduler the client caught up

    def send(self, events: list[Event]) -> None:
        with self._lock:
            self.sent += len(events)
        for ev in events:
            self.events.put(ev)

    def took(self) -> None:
        """The client is done with one more event (it asks for the next)."""
        with self._lock:
            self.taken += 1
            caught_up = self.taken >= self.sent
        if caught_up:
            self.wake()

    def detach(self) -> None:
        self.detached = True
        self.wake()

    @property
    def caught_up(self) -> bool:
        return self.detached or self.taken >= self.sent

    def on_end(self, callback: Callable[[], None]) -> None:
        """Call `callback` once the reply has ended and given its slot back (at once if it has)."""
        with self._lock:
            if not self.finished.is_set():
                self._on_end.append(callback)
                return
        callback()

    def end(self) -> None:
        with self._lock:
            self.finished.set()
            callbacks, self._on_end = self._on_end, []
        for callback in callbacks:
            callback()


class _Seq:
    def __init__(self, job: Job, slot: CachedModel, gen: Reply) -> None:
        self.job, self.slot, self.gen = job, slot, gen
        self.item: Rows | Chunk | Guesses | _Sync | None = None  # what it waits for; None once it ended
        self.outbox: list[Event] = []  # events of this step, handed to the client just before the next pass
        self.slow = False  # its client missed the last grace: passes do not wait for it until it catches up

    def flush(self) -> None:
        if self.outbox:
            self.job.send(self.outbox)
            self.outbox = []


class Scheduler:
    """Owns the KV pool and the running sequences; a thread runs the steps while there is work."""

    def __init__(self, pool: KVPool, cost: Callable[[], PassCost]) -> None:
        self.pool = pool
        self._cost = cost  # the engine's pass-cost model (looked up per pass: a test may swap it)
        self._cond = threading.Condition()
        self._waiting: deque[Job] = deque()
        self._running: list[_Seq] = []
        self._thread: threading.Thread | None = None
        self._idle_work: list[Callable[[], None]] = []
        self._deferred = 0  # waiting replies the last admission left for a prefix another one is reading
        self.pass_sizes: Counter[int] = Counter()  # passes run, by how many replies shared them

    @property
    def waiting(self) -> int:
        """Replies waiting for a slot."""
        return len(self._waiting)

    @property
    def running(self) -> int:
        """Replies holding a slot."""
        return len(self._running)

    @property
    def busy(self) -> bool:
        return bool(self._running or self._waiting or self._thread)

    def submit(self, job: Job) -> None:
        with self._cond:
            self._waiting.append(job)
            if self._thread is None:
                # Not a daemon: a daemon thread still unwinding from a native pass as the interpreter exits
                # aborts the process; at exit every reply is cancelled instead, and the thread ends a pass later.
                self._thread = threading.Thread(target=self._loop, name="parley-scheduler", daemon=not _AT_EXIT)
                self._thread.start()
                _schedulers.add(self)
            self._cond.notify_all()

    def cancel_all(self) -> None:
        """Cancel every waiting and running reply (each ends at its next round)."""
        with self._cond:
            for job in [*self._waiting, *(s.job for s in self._running)]:
                job.cancel.set()

    def when_idle(self, work: Callable[[], None]) -> None:
        """Run `work` now if no reply runs or waits, else as soon as none does (before the next is admitted)."""
        with self._cond:
            if not self.busy:
                work()
            else:
                self._idle_work.append(work)

    def _loop(self) -> None:
        while True:
            with self._cond:
                admitted = self._admit()
                if not self._running:
                    self._thread = None
                    for work in self._idle_work:
                        work()
                    self._idle_work.clear()
                    return
            for seq in admitted:
                self._advance(seq, None)
            try:
                ran = self._step()
            except Exception as e:  # a bug of the scheduler's own: end every reply with it, never hang them
                for seq in list(self._running):
                    self._fail(seq, e)
                continue
            if not ran:
                with self._cond:  # every reply waits for its client: sleep until one catches up or one arrives
                    if not any(s.job.caught_up for s in self._running if s.item is SYNC) and not (
                            len(self._waiting) > self._deferred and self.pool.free):
                        self._cond.wait(0.1)

    def _admit(self) -> list[_Seq]:
        """Waiting replies into free slots, first come first served; a cancelled one leaves the queue at once."""
        for job in [j for j in self._waiting if j.cancel.is_set()]:
            self._waiting.remove(job)
            job.events.put(Done("cancelled"))
            job.end()
        admitted: list[_Seq] = []
        self._deferred = 0
        for job in list(self._waiting):
            if self._idle_work and self._running:
                break
            if self._idle_work:  # an engine-wide change waits for no reply to run
                for work in self._idle_work:
                    work()
                self._idle_work.clear()
            if not self.pool.free:
                break
            if self._prefix_coming(job):
                self._deferred += 1
                continue
            slot = self.pool.take(job.ids)
            if slot is None:
                break
            self._waiting.remove(job)
            self.pool.share_prefix(slot, job.ids)
            job.slot = slot
            job.wake = self._wake
            seq = _Seq(job, slot, job.start(slot))
            self._running.append(seq)
            job.admitted.set()
            admitted.append(seq)
        return admitted

    def _prefix_coming(self, job: Job) -> bool:
        """Whether `job` waits for a running reply that is reading a prompt prefix they share, at least SHARE_MIN
        tokens more than any slot holds, to copy it (`KVPool.share_prefix`) instead of computing it beside that
        reply: where the reading it waits for (that reply's passes up to the prefix's end, in PREFILL_CHUNKs) is at
        most twice the reading it saves. Four chats with one system prompt sent at once: one reads it, three copy
        it; a chat does not wait behind a long paste for the few tokens of a system prompt they share. Never
        for a reply whose client is slow to take its events (its passes wait for that client)."""
        held = self.pool.held_prefix(job.ids)
        for seq in self._running:
            shared = common_prefix(seq.job.ids, job.ids)
            saved, have = shared - held, len(seq.slot.ids)
            if saved < SHARE_MIN or seq.slow or seq.slot.native is None:
                continue
            unread = len(seq.job.ids) - have
            waited = min(unread, -(-(shared - have) // PREFILL_CHUNK) * PREFILL_CHUNK)
            if waited <= 2 * saved:
                return True
        return False

    def _advance(self, seq: _Seq, answer: object) -> None:
        """Run a reply until it asks something (or ends), passing its events on."""
        try:
            while True:
                item = seq.gen.send(answer)
                answer = None
                if item is SYNC:
                    seq.flush()
                    if seq.job.caught_up:
                        continue
                if isinstance(item, (Rows, Chunk, Guesses, _Sync)):
                    seq.item = item
                    return
                seq.outbox.append(item)
        except StopIteration:
            self._end(seq)
        except Exception as e:  # the engine must stay usable after anything a reply hits
            self._fail(seq, e)

    def _fail(self, seq: _Seq, error: BaseException) -> None:
        seq.gen.close()
        seq.slot.rollback(0)  # its cache is in an unknown state: forget it
        seq.outbox.append(Done("error", f"{type(error).__name__}: {error}"))
        self._end(seq)

    def _end(self, seq: _Seq) -> None:
        """The reply is over: its slot goes back to the pool (once, whatever called this first)."""
        seq.item = None
        seq.flush()
        with self._cond:
            if seq not in self._running:
                return
            seq.job.kept = list(seq.slot.ids)
            self._running.remove(seq)
            self.pool.give_back(seq.slot)
        seq.job.end()

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _resume(self) -> None:
        """Replies waiting for their clients go on once those have caught up: a step waits up to GRACE_S for the
        clients that kept up last time; a slow one's reply sits the pass out (and is not waited for again until
        its client has caught up)."""
        parked = [s for s in self._running if s.item is SYNC]
        if not parked:
            return
        with self._cond:
            deadline = time.monotonic() + GRACE_S
            while True:
                awaited = [s for s in parked if not s.job.caught_up and not s.slow]
                left = deadline - time.monotonic()
                if not awaited or left <= 0:
                    break
                self._cond.wait(left)
        for seq in parked:
            seq.slow = not seq.job.caught_up
            if not seq.slow:
                self._advance(seq, None)

    def _step(self) -> bool:
        """Answer every question, then run one pass over every sequence's rows; False when no reply could go on."""
        self._resume()
        running = list(self._running)
        asks = [s for s in running if isinstance(s.item, (Chunk, Guesses))]
        if asks:
            for seq, answer in zip(asks, self._plan(running), strict=True):
                self._advance(seq, answer)
        ready = [s for s in running if isinstance(s.item, Rows)]
        if not ready:
            for seq in running:
                seq.flush()
            return bool(asks)
        parts = [(s.slot, s.item.tokens, s.item.parents, s.item.wanted) for s in ready]
        for seq in running:  # the clients read this step's events while the pass runs (it releases the GIL)
            seq.flush()
        try:
            logits = forward_batch(parts)
        except Exception as e:
            for seq in ready:
                self._fail(seq, e)
            return True
        self.pass_sizes[len(ready)] += 1
        if all(s.item.ready is not None for s in ready):  # decode and verification rows only: the cost model's
            started = max(s.item.ready for s in ready)
            self._cost().add(sum(len(p[1]) for p in parts), round_clock() - started)
        for seq, out in zip(ready, logits, strict=True):
            seq.item.batch = len(ready)
            self._advance(seq, out)
        return True

    def _plan(self, running: list[_Seq]) -> list[int]:
        """Answers to the running sequences' questions, in the order they ask: prompt tokens for each `Chunk`
        (the shortest prompts first, within the pass's budget), guesses for each `Guesses`."""
        asks = [s.item for s in running if isinstance(s.item, (Chunk, Guesses))]
        decoding = [s for s in running if isinstance(s.item, Guesses) or (
            isinstance(s.item, Rows) and s.item.wanted < len(s.item.tokens))]
        alone = len(running) == 1 and not self._waiting
        budget = PREFILL_CHUNK if alone else SHARED_CHUNK
        answers: dict[int, int] = {}
        rows = sum(len(s.item.tokens) for s in running if isinstance(s.item, Rows))
        for i in sorted((i for i, a in enumerate(asks) if isinstance(a, Chunk)), key=lambda i: asks[i].left):
            answers[i] = min(asks[i].left, budget)
            budget -= answers[i]
            rows += answers[i]
        rounds = [i for i, a in enumerate(asks) if isinstance(a, Guesses)]
        guesses = [asks[i] for i in rounds]
        if len(decoding) > 1:  # a guess verified only to measure is a luxury beside other sequences
            guesses = [Guesses(g.scores, 0, g.rows) for g in guesses]
        tokens = len(decoding)  # every decoding sequence decides at least one token
        rows += sum(g.rows for g in guesses)
        for i, n in zip(rounds, share_guesses(guesses, rows, tokens, self._cost()), strict=True):
            answers[i] = n
        return [answers[i] for i in range(len(asks))]


_schedulers: weakref.WeakSet[Scheduler] = weakref.WeakSet()


def _cancel_everything() -> None:
    for scheduler in list(_schedulers):
        scheduler.cancel_all()


try:  # run as the interpreter exits, before it waits for the scheduler threads (as concurrent.futures does)
    threading._register_atexit(_cancel_everything)  # type: ignore[attr-defined]
    _AT_EXIT = True
except AttributeError:
    _AT_EXIT = False


def share_guesses(asks: list[Guesses], rows: int, tokens: float, cost: PassCost) -> list[int]:
    """How many guesses each round verifies, in a pass already holding `rows` rows that decide `tokens` tokens:
    guesses join best first (the likeliest to land, whichever sequence made them) while each raises the pass's
    expected tokens per unit of cost (`cost.ratio` by rows). Each sequence's guesses join in order (a prefix).
    Alone in a pass this is `best_length`: the length maximising (1 + expected accepted) / cost(1 + n)."""
    take = [min(a.least, len(a.scores)) for a in asks]
    rows += sum(take)
    tokens += sum(sum(a.scores[:n]) for a, n in zip(asks, take, strict=True))
    candidates = sorted((-s, j, i) for i, a in enumerate(asks) for j, s in enumerate(a.scores) if j >= take[i])
    now = cost.ratio(rows)
    for neg, j, i in candidates:
        if j != take[i]:  # its sequence's earlier guess did not join
            continue
        more = cost.ratio(rows + 1)
        if (tokens - neg) / more <= tokens / now:
            break
        take[i] += 1
        rows += 1
        tokens -= neg
        now = more
    return take


class ReplyStream:
    """A submitted reply seen from its caller: its events in order, ending with one Done. Closing it early
    cancels the reply and waits for it to end (so its slot holds exactly what was shown)."""

    def __init__(self, job: Job | None, events: list[Event] | None = None) -> None:
        self.job = job
        self._early = list(events or [])  # what the caller's thread said before the reply was submitted

    @property
    def admitted(self) -> threading.Event:
        """Set once the reply holds a slot (at once for a reply that ended before it was submitted)."""
        if self.job is None:
            done = threading.Event()
            done.set()
            return done
        return self.job.admitted

    def __iter__(self) -> Iterator[Event]:
        yield from self._early
        if self.job is None:
            return
        ended = False
        try:
            while True:
                ev = self.job.events.get()
                yield ev
                if isinstance(ev, Done):
                    ended = True
                    return
                self.job.took()  # the caller is done with it (it asks for the next)
        finally:
            if not ended:
                self.job.cancel.set()
                self.job.detach()
                self.job.finished.wait()
