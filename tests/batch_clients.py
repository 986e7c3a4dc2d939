"""Several clients of one engine at once, each in its own thread, joining and leaving at points set by the
others' progress (never by the clock), for the continuous-batching tests; and the same clients run alone."""

from __future__ import annotations

import copy
import threading
from dataclasses import dataclass, field, fields

from parley.engine.events import Done, TextDelta
from parley.engine.params import GenerationParams

WAIT_S = 600.0  # a bound on waiting for another client's progress (a busy 2-core machine), never a delay


@dataclass
class RoundParams(GenerationParams):
    """Live parameters that change at given rounds of the reply (`changes`: round -> {field: value}; the engine
    reads them once a round): a slider moved mid-reply, at a point that does not depend on how fast anyone
    reads the events, so the same change lands on the same tokens alone and beside other clients."""

    changes: dict = field(default_factory=dict)
    reads: int = 0

    def snapshot(self) -> GenerationParams:
        for name, value in self.changes.get(self.reads, {}).items():
            setattr(self, name, value)
        self.reads += 1
        return GenerationParams(**{f.name: getattr(self, f.name) for f in fields(GenerationParams)})


@dataclass
class Client:
    messages: list[dict[str, str]]
    params: GenerationParams
    after: tuple[int, int] | None = None  # start once client i has seen n text deltas (or ended)
    cancel_after: int | None = None  # cancel once this client has seen this many text deltas


@dataclass
class Result:
    text: str = ""
    ids: list[int] = field(default_factory=list)
    done: Done | None = None
    stats: object = None
    kept: list[int] = field(default_factory=list)  # what its slot held when it ended
    batches: list[int] = field(default_factory=list)  # Stats.batch as it came


def params_for_run(client: Client) -> GenerationParams:
    return copy.deepcopy(client.params)  # each run from the client's pristine parameters (round 0 again)


def run_client(engine, client: Client, cancel: threading.Event | None = None, on_delta=None) -> Result:
    cancel = cancel or threading.Event()
    session = engine.session()
    out = Result()
    stream = session.start(client.messages, params_for_run(client), cancel)
    deltas = 0
    for ev in stream:
        if isinstance(ev, TextDelta):
            out.text += ev.text
            deltas += 1
            if client.cancel_after is not None and deltas >= client.cancel_after:
                cancel.set()
            if on_delta is not None:
                on_delta(deltas)
        elif isinstance(ev, Done):
            out.done = ev
        elif hasattr(ev, "batch"):
            out.stats = ev
            out.batches.append(ev.batch)
    out.ids, out.kept = list(session.reply_ids), stream.job.kept if stream.job else []
    return out


def run_alone(engine, clients: list[Client]) -> list[Result]:
    """Each client on its own, one after another (no cancelling: a cancelled client's text is a prefix)."""
    return [run_client(engine, Client(c.messages, c.params)) for c in clients]


def run_together(engine, clients: list[Client]) -> list[Result]:
    """Every client in its own thread; each starts when its `after` condition holds."""
    cond = threading.Condition()
    progress = [0] * len(clients)
    ended = [False] * len(clients)
    results: list[Result | BaseException | None] = [None] * len(clients)

    def client_thread(i: int) -> None:
        try:
            c = clients[i]
            if c.after is not None:
                j, n = c.after
                with cond:
                    if not cond.wait_for(lambda: progress[j] >= n or ended[j], timeout=WAIT_S):
                        raise AssertionError(f"client {j} made no progress for client {i} to start")

            def seen(deltas: int) -> None:
                with cond:
                    progress[i] = deltas
                    cond.notify_all()

            results[i] = run_client(engine, c, on_delta=seen)
        except BaseException as e:  # noqa: BLE001 - reported by the caller
            results[i] = e
        finally:
            with cond:
                ended[i] = True
                cond.notify_all()

    threads = [threading.Thread(target=client_thread, args=(i,), daemon=True) for i in range(len(clients))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=WAIT_S)
        assert not t.is_alive(), "a client never finished"
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results  # type: ignore[return-value]
