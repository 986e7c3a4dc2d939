"""How many CPU threads decoding uses: one place sets it, and the engine adapts when the machine is busy.

On a 2-core machine with another busy process, two threads that meet at a barrier several hundred times
per token wait for whichever is descheduled (measured: 0.55 tok/s with 2 threads vs 57 with 1 under one
busy loop). So the count is a choice the engine keeps revisiting: `ThreadTuner` times decode steps at the
current count and, every so often, a few at the other candidate, and keeps the faster.
"""

from __future__ import annotations

import os
import time

import torch

_requested: int | None = None


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def configure_threads(threads: int | None = None) -> int:
    """Set torch's and the native step's thread count: `threads`, else PARLEY_THREADS, else all cores.

    Returns the count in force. 0 or None means automatic: all cores, adapted at run time by ThreadTuner.
    """
    global _requested
    env = os.environ.get("PARLEY_THREADS", "").strip()
    if threads is None and env:
        try:
            threads = int(env)
        except ValueError:
            raise ValueError(f"PARLEY_THREADS={env!r}: expected a positive integer (or 0 for automatic)") from None
    if threads is not None and threads < 0:
        raise ValueError(f"--threads {threads}: expected a positive integer (or 0 for automatic)")
    _requested = threads or None
    n = threads or available_cores()
    set_threads(n)
    return n


def fixed() -> bool:
    """True when the user chose a count (flag or PARLEY_THREADS): then nothing adapts it."""
    return _requested is not None


def set_threads(n: int) -> None:
    torch.set_num_threads(n)
    from ..models import native_forward

    lib = native_forward.library() if native_forward.library_path().exists() else None
    if lib is not None:
        lib.parley_threads(n)


class ThreadTuner:
    """Keeps the faster thread count for decode steps, re-checking the alternatives every `period_s`.

    Steps are timed per token; a probe runs `probe_steps` steps at each other candidate and switches when
    one is faster by `margin`. The first probe round starts at the first step (a busy machine at two
    threads is ~100x slower, so waiting a period first would cost seconds); later ones every `period_s`.
    Cheap: a probe is a few steps every few seconds.
    """

    def __init__(self, candidates: list[int] | None = None, period_s: float = 2.0, probe_steps: int = 4,
                 margin: float = 0.9, clock=time.perf_counter, start: int | None = None) -> None:
        cores = available_cores()
        self.candidates = candidates or sorted({1, cores})
        self.current = start if start in self.candidates else max(self.candidates)
        self.period_s, self.probe_steps, self.margin, self.clock = period_s, probe_steps, margin, clock
        self._last_probe = -float("inf")
        self._probe: list[int] = []  # candidates still to probe in this round
        self._times: dict[int, list[float]] = {}

    @property
    def enabled(self) -> bool:
        return not fixed() and len(self.candidates) > 1

    def before_step(self) -> int:
        """The thread count for the next step (sets it)."""
        if not self.enabled:
            return self.current
        if not self._probe and self.clock() - self._last_probe > self.period_s:
            self._probe = [c for c in self.candidates if c != self.current] + [self.current]
            self._times = {}
        n = self._probe[0] if self._probe else self.current
        self._use(n)
        return n

    def bulk(self) -> None:
        """Prefill and other long passes run at the count decode steps found faster (never probed: a
        long pass is not a fair sample), so a busy machine's prefill does not spin two threads either."""
        if self.enabled:
            self._use(self.current)

    @staticmethod
    def _use(n: int) -> None:
        if n != torch.get_num_threads():  # what is in force, whoever set it last
            set_threads(n)

    def after_step(self, n: int, seconds: float, tokens: int) -> None:
        if not self.enabled or not self._probe or tokens <= 0:
            return
        times = self._times.setdefault(n, [])
        times.append(seconds / tokens)
        if len(times) >= self.probe_steps:
            self._probe.pop(0)
            if not self._probe:  # round done: keep the fastest (median per token)
                med = {c: sorted(t)[len(t) // 2] for c, t in self._times.items()}
                best = min(med, key=med.get)
                if best != self.current and med[best] < self.margin * med.get(self.current, float("inf")):
                    self.current = best
                self._last_probe = self.clock()


_shared: ThreadTuner | None = None


def shared_tuner() -> ThreadTuner:
    """The process's tuner: whether the machine is busy does not depend on which engine asks, so every
    engine (and each fresh one a test or a model switch builds) starts from what earlier steps learnt."""
    global _shared
    if _shared is None:
        _shared = ThreadTuner(start=start_count(available_cores()))
    return _shared


def start_count(cores: int, load: float | None = None) -> int:
    """Threads for the first passes, before any step was timed: the cores other processes leave free (the
    1-minute load average), at least one. The first prompt is read before decode steps can be timed, and on
    a 2-core machine with one busy process a 2-thread prefill of a short prompt took 1.8 s against 0.035 s on
    one thread; the tuner's first probe, at the first decode step, still tries every count."""
    if load is None:
        try:
            load = os.getloadavg()[0]
        except (AttributeError, OSError):  # not available on this platform
            return cores
    return max(1, min(cores, cores - int(load + 0.5)))
