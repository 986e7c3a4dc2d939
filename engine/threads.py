"""How many CPU threads decoding uses: one place sets it, and the engine adapts when the machine is busy.

On a 2-core machine with another busy process, two threads that meet at a barrier several hundred times
per token wait for whichever is descheduled (measured: 0.55 tok/s with 2 threads vs 57 with 1 under one
busy loop). So the count is a choice the engine keeps revisiting: `ThreadTuner` times decode steps at the
current count and, every so often, a few at the other candidate, and keeps the faster.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from statistics import median

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

    A probe runs `probe_steps` steps at each other candidate and switches when one is faster by `margin`, each
    step set against the current count's recent steps (its last 5) of as many rows (`_decide`). The first
    probe round starts at the first step (a busy machine at two threads is ~100x slower, so waiting a period
    first would cost seconds). A candidate whose first step takes more than `hopeless` times what the current
    count's recent steps of as many rows took is dropped without its other steps: beside one busy core a
    2-thread step took 4x a 1-thread one, so a whole 4-step probe every 2 s cost ~50 ms, ~20% of a reply it
    landed in.
    """

    def __init__(self, candidates: list[int] | None = None, period_s: float = 2.0, probe_steps: int = 4,
                 margin: float = 0.9, clock=time.perf_counter, start: int | None = None,
                 hopeless: float = 2.5) -> None:
        cores = available_cores()
        self.candidates = candidates or sorted({1, cores})
        self.current = start if start in self.candidates else max(self.candidates)
        self.period_s, self.probe_steps, self.margin, self.clock = period_s, probe_steps, margin, clock
        self.hopeless = hopeless
        self._last_probe = -float("inf")
        self._probe: list[int] = []  # candidates still to probe in this round
        self._steps: dict[int, list[tuple[int, float]]] = {}  # this round's steps by count: (rows, seconds)
        self._recent: dict[tuple[int, int], deque[float]] = {}  # (threads, rows) -> seconds of recent steps

    @property
    def enabled(self) -> bool:
        return not fixed() and len(self.candidates) > 1

    def before_step(self) -> int:
        """The thread count for the next step (sets it)."""
        if not self.enabled:
            return self.current
        if not self._probe and self.clock() - self._last_probe > self.period_s:
            self._probe = [c for c in self.candidates if c != self.current] + [self.current]
            self._steps = {}
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
        if not self.enabled or tokens <= 0:
            return
        if n == self.current:
            self._recent.setdefault((n, tokens), deque(maxlen=5)).append(seconds)
        if not self._probe:
            return
        steps = self._steps.setdefault(n, [])
        steps.append((tokens, seconds))
        usual = self._usual(tokens, least=3)
        hopeless = n != self.current and usual is not None and seconds > self.hopeless * usual
        if hopeless or len(steps) >= self.probe_steps:  # a hopeless count's one step stands for its probe
            self._probe.pop(0)
            if not self._probe:
                self._decide()

    def _usual(self, rows: int, least: int = 1) -> float | None:
        """The median time of the current count's recent steps of `rows` rows (None: fewer than `least`)."""
        recent = self._recent.get((self.current, rows))
        return median(recent) if recent is not None and len(recent) >= least else None

    def _decide(self) -> None:
        """A probe round is done: switch to the count whose steps ran fastest against the current count's recent
        steps of as many rows (a pass's time is not proportional to its rows: a 5-row verification pass is no
        5 decode steps, so per token a probe's long passes would beat the current count's short ones), by at
        least `margin`; where fewer than half of its steps have such a match, by the median time per token."""
        current, faster = self.current, {}
        per_token = {c: median(s / r for r, s in steps) for c, steps in self._steps.items()}
        for c, steps in self._steps.items():
            if c == current:
                continue
            rel = [s / usual for r, s in steps if (usual := self._usual(r)) is not None]
            if 2 * len(rel) >= len(steps):
                faster[c] = median(rel)
            elif current in per_token:
                faster[c] = per_token[c] / per_token[current]
        best = min(faster, key=faster.__getitem__, default=current)
        if best != current and faster[best] < self.margin:
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
    """Threads for the first passes, before any step was timed: the cores other processes leave free, at least
    one. The first prompt is read before decode steps can be timed, and on a 2-core machine with one busy
    process a 2-thread prefill of a short prompt took 1.8 s against 0.035 s on one thread; the tuner's first
    probe, at the first decode step, still tries every count.

    `load`: how many cores others keep busy; by default what they used while this process started
    (`others_busy`), else the 1-minute load average. That average lags by a minute: right after another
    program ended it still reads ~1.5 on an idle machine, and the first prompt (a benchmark's prefill) then
    ran on one thread at half speed."""
    if load is None:
        load = others_busy()
    if load is None:
        try:
            load = os.getloadavg()[0]
        except (AttributeError, OSError):  # not available on this platform
            return cores
    return max(1, min(cores, cores - int(load + 0.5)))


def cpu_ticks(stat: str, cpus: set[int]) -> tuple[int, int]:
    """(busy, all) clock ticks of the CPUs `cpus` in a /proc/stat text. Busy: user, nice, system, irq, softirq
    and steal (a hypervisor running someone else on the CPU); idle and iowait are not."""
    busy = total = 0
    for line in stat.splitlines():
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or not name[3:].isdigit() or int(name[3:]) not in cpus:
            continue
        f = [int(x) for x in rest.split()[:8]]
        f += [0] * (8 - len(f))
        busy += f[0] + f[1] + f[2] + f[5] + f[6] + f[7]
        total += sum(f)
    return busy, total


@dataclass
class Mark:
    """The machine's and this process's CPU time at one moment (`mark`)."""

    wall: float
    ticks: tuple[int, int]
    own: float  # this process's user + system seconds


def mark(read: Callable[[], str] | None = None) -> Mark | None:
    """Now, for `others_busy`; None where /proc/stat cannot be read (not Linux)."""
    try:
        stat = (read or _read_stat)()
        cpus = os.sched_getaffinity(0)
    except (OSError, AttributeError):
        return None
    t = os.times()
    return Mark(time.monotonic(), cpu_ticks(stat, cpus), t.user + t.system)


def _read_stat() -> str:
    with open("/proc/stat") as f:
        return f.read()


_window_start = mark()  # as the engine's modules are imported, and again as `Engine.load` begins (`start_window`)


def start_window() -> None:
    """Start the window `others_busy` reads from now (a model about to load), unless the first passes' count is
    already set: an app that waited minutes in a screen before loading judges by the load, not by those minutes."""
    global _window_start
    if _shared is None:
        _window_start = mark()


def others_busy(since: Mark | None = None, now: Mark | None = None, hz: int | None = None) -> float | None:
    """How many of this process's cores other processes kept busy between `since` (default: `start_window`'s
    mark, else this module's import) and `now`: the CPUs' busy ticks less this process's own CPU time, over the
    wall time. None where that cannot be read or the window is under 0.2 s (a few 10 ms ticks say nothing)."""
    since = since or _window_start
    now = now or mark()
    if since is None or now is None or now.wall - since.wall < 0.2:
        return None
    hz = hz or os.sysconf("SC_CLK_TCK")
    busy = (now.ticks[0] - since.ticks[0]) / hz - (now.own - since.own)
    return max(0.0, busy / (now.wall - since.wall))
