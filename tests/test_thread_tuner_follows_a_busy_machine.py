"""The thread tuner keeps the thread count whose decode steps are faster, re-checks it after its period,
and prefill follows its choice (a busy machine should not spin two threads through a prefill either).
Step times are given, not measured: a fake clock drives the period."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from parley.engine import threads


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    seen: list[int] = []
    before = torch.get_num_threads()

    def set_threads(n: int) -> None:  # torch's count is what the tuner compares against
        seen.append(n)
        torch.set_num_threads(n)

    monkeypatch.setattr(threads, "set_threads", set_threads)
    monkeypatch.setattr(threads, "_requested", None)  # automatic, as by default
    yield seen
    torch.set_num_threads(before)


def until_a_probe_of(tuner: threads.ThreadTuner, clock: list[float], ms: dict[int, float], n: int) -> None:
    """Step until the tuner probes `n` threads (so the count in force is not its choice)."""
    for _ in range(1000):
        used = tuner.before_step()
        if used == n and n != tuner.current:
            return
        clock[0] += ms[used] / 1e3
        tuner.after_step(used, ms[used] / 1e3, 1)
    raise AssertionError(f"no probe of {n} threads")


def run_steps(tuner: threads.ThreadTuner, clock: list[float], ms: dict[int, float], steps: int) -> list[int]:
    used = []
    for _ in range(steps):
        n = tuner.before_step()
        used.append(n)
        clock[0] += ms[n] / 1e3
        tuner.after_step(n, ms[n] / 1e3, 1)
    return used


def test_switches_to_the_faster_count_and_prefill_follows(calls: list[int]) -> None:
    clock = [0.0]
    tuner = threads.ThreadTuner([1, 2], period_s=0.1, probe_steps=4, clock=lambda: clock[0])
    assert tuner.current == 2
    busy = {1: 5.0, 2: 40.0}  # another process holds a core: one thread is 8x faster
    used = run_steps(tuner, clock, busy, 60)
    assert tuner.current == 1
    assert used.count(1) > 40  # it left two threads after one probe round (later probes are short)
    until_a_probe_of(tuner, clock, busy, 2)
    tuner.bulk()
    assert calls[-1] == 1  # a prefill runs at the tuner's choice, not at the count a probe left


def test_keeps_two_threads_when_they_are_faster_and_comes_back_when_the_load_goes(calls: list[int]) -> None:
    clock = [0.0]
    tuner = threads.ThreadTuner([1, 2], period_s=0.1, probe_steps=4, clock=lambda: clock[0])
    run_steps(tuner, clock, {1: 6.0, 2: 3.5}, 40)
    assert tuner.current == 2
    run_steps(tuner, clock, {1: 5.0, 2: 40.0}, 60)
    assert tuner.current == 1
    run_steps(tuner, clock, {1: 6.0, 2: 3.5}, 60)  # the other process ended
    assert tuner.current == 2
    until_a_probe_of(tuner, clock, {1: 6.0, 2: 3.5}, 1)
    tuner.bulk()
    assert calls[-1] == 2


def test_a_count_the_user_chose_is_never_changed(calls: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(threads, "_requested", 2)
    clock = [0.0]
    tuner = threads.ThreadTuner([1, 2], period_s=0.1, probe_steps=4, clock=lambda: clock[0])
    assert set(run_steps(tuner, clock, {1: 5.0, 2: 40.0}, 60)) == {2}
    tuner.bulk()
    assert calls == []


def test_the_first_steps_probe_and_every_engine_shares_what_was_learnt(calls: list[int]) -> None:
    from tiny import tiny_engine

    clock = [0.0]
    tuner = threads.ThreadTuner([1, 2], period_s=100.0, probe_steps=4, clock=lambda: clock[0])
    used = run_steps(tuner, clock, {1: 5.0, 2: 40.0}, 8)
    assert used == [1] * 4 + [2] * 4 and tuner.current == 1  # no period of slow steps before the first probe
    assert tiny_engine().target.tuner is tiny_engine(seed=1).target.tuner  # one machine, one tuner


def test_first_passes_leave_the_busy_cores_to_others():
    """Before any step is timed, the count is the cores other processes leave free (at least one)."""
    assert [threads.start_count(2, load) for load in (0.0, 0.4, 0.6, 1.2, 3.0)] == [2, 2, 1, 1, 1]
    assert threads.start_count(8, 2.0) == 6
    assert threads.ThreadTuner(candidates=[1, 2], start=1).current == 1
    assert threads.ThreadTuner(candidates=[1, 2], start=None).current == 2


STAT = """cpu  900 0 300 5000 40 0 0 0 0 0
cpu0 {u0} 0 {s0} 2500 20 {i0} 0 {st0} 0 0
cpu1 {u1} 0 100 2500 {w1} 0 0 0 0 0
cpu7 100000 0 0 0 0 0 0 0 0 0
intr 12345 0 0
"""


def stat(u0=0, s0=0, i0=0, st0=0, u1=0, w1=0) -> str:
    return STAT.format(u0=u0, s0=s0, i0=i0, st0=st0, u1=u1, w1=w1)


def test_busy_ticks_count_the_process_cpus_only_and_not_idle_or_iowait():
    busy, total = threads.cpu_ticks(stat(u0=10, s0=5, i0=2, st0=3, u1=7, w1=50), {0, 1})
    assert busy == 10 + 5 + 2 + 3 + 7 + 100  # cpu1's system time too; iowait and idle are not busy
    assert total == busy + 2500 + 20 + 2500 + 50
    assert threads.cpu_ticks(stat(), {0})[0] == 0  # cpu7 (outside the set) and the summary line are not read


def test_first_passes_follow_what_others_used_while_this_process_started_not_the_lagging_average():
    """The 1-minute load average still reads ~1.5 a minute after another program ended; what other processes
    used while this one imported and loaded says whether they still run."""
    hz = 100
    before = threads.Mark(wall=10.0, ticks=threads.cpu_ticks(stat(), {0, 1}), own=1.0)
    # 2 s later: this process used 1.5 s of CPU (150 ticks), another process 2 s (a core, all along)
    mine_only = threads.Mark(wall=12.0, ticks=threads.cpu_ticks(stat(u0=150), {0, 1}), own=2.5)
    with_other = threads.Mark(wall=12.0, ticks=threads.cpu_ticks(stat(u0=150, u1=200), {0, 1}), own=2.5)
    assert threads.others_busy(before, mine_only, hz) == pytest.approx(0.0)
    assert threads.others_busy(before, with_other, hz) == pytest.approx(1.0)
    too_soon = threads.Mark(wall=10.1, ticks=with_other.ticks, own=2.5)
    assert threads.others_busy(before, too_soon, hz) is None  # a few ticks say nothing: the average decides
    assert threads.start_count(2, threads.others_busy(before, mine_only, hz)) == 2
    assert threads.start_count(2, threads.others_busy(before, with_other, hz)) == 1
    assert threads.mark(read=lambda: (_ for _ in ()).throw(OSError("no /proc"))) is None


def probe_runs(used: list[int], current: int) -> list[int]:
    """The lengths of the runs of steps at a count other than `current` (each run: one probe)."""
    runs, n = [], 0
    for c in used:
        if c != current:
            n += 1
        elif n:
            runs.append(n)
            n = 0
    return runs


def test_a_hopeless_probe_ends_after_one_step(calls: list[int]) -> None:
    """Beside a busy core a 2-thread step costs several 1-thread ones: once the current count's steps are
    timed, a probe whose first step takes more than twice theirs is dropped without its other steps."""
    clock = [0.0]
    tuner = threads.ThreadTuner([1, 2], period_s=0.1, probe_steps=4, clock=lambda: clock[0], start=1)
    used = run_steps(tuner, clock, {1: 5.0, 2: 40.0}, 400)
    runs = probe_runs(used, 1)
    assert runs[0] == 4  # the first probe, at the first step: nothing timed yet to compare with
    assert len(runs) >= 3 and set(runs[1:]) == {1}, runs
    assert tuner.current == 1
    # a candidate only a little slower runs its whole probe (one slow step is no verdict on a close call)
    tuner = threads.ThreadTuner([1, 2], period_s=0.1, probe_steps=4, clock=lambda: clock[0], start=1)
    runs = probe_runs(run_steps(tuner, clock, {1: 5.0, 2: 7.0}, 400), 1)
    assert len(runs) >= 3 and set(runs) == {4}, runs


def test_a_probe_is_judged_against_steps_of_as_many_rows(calls: list[int]) -> None:
    """A pass's time is not proportional to its rows: two threads 1.5x slower at every row count must not win
    because their probe happened to run 5-row verification passes while the current count ran 1-row steps
    (per token, 9 / 5 ms against 4 ms)."""
    clock = [0.0]
    tuner = threads.ThreadTuner([1, 2], period_s=0.1, probe_steps=4, clock=lambda: clock[0], start=1)
    cycle = [1, 5]
    for i in range(600):
        used = tuner.before_step()
        rows = 5 if used != tuner.current else cycle[i % 2]
        ms = (4.0 + 0.5 * (rows - 1)) * (1.5 if used == 2 else 1.0)
        clock[0] += ms / 1e3
        tuner.after_step(used, ms / 1e3, rows)
        if i > 10:  # past the first probe (nothing timed at one thread to compare with yet)
            assert tuner.current == 1, i


def test_a_load_that_begins_between_replies_is_seen_by_the_next_probe(calls: list[int]) -> None:
    """A user pauses, a build starts, the next reply begins: the first probe compares one thread with two
    threads' steps as they are now, not as they were before the pause (a 1-thread step of 8 ms is more than
    twice the 3.5 ms two threads took on the quiet machine, and a fifth of the 40 ms they take now)."""
    clock = [0.0]
    tuner = threads.ThreadTuner([1, 2], period_s=0.1, probe_steps=4, clock=lambda: clock[0])
    run_steps(tuner, clock, {1: 6.0, 2: 3.5}, 200)
    assert tuner.current == 2
    clock[0] += 1.0  # the pause: the next step probes
    used = run_steps(tuner, clock, {1: 8.0, 2: 40.0}, 9)
    assert used == [1] * 4 + [2] * 4 + [1] and tuner.current == 1


def test_loading_a_model_starts_the_window_unless_the_count_is_already_set(monkeypatch: pytest.MonkeyPatch):
    """An app that sat minutes in a screen judges the machine by what runs while the model loads; once the
    process's tuner exists (a second engine), its count stands and the window is not moved."""
    old = threads.Mark(wall=0.0, ticks=(0, 0), own=0.0)
    monkeypatch.setattr(threads, "_window_start", old)
    monkeypatch.setattr(threads, "_shared", threads.ThreadTuner([1, 2]))
    threads.start_window()
    assert threads._window_start is old
    monkeypatch.setattr(threads, "_shared", None)
    threads.start_window()
    if threads.mark() is not None:  # Linux
        assert threads._window_start is not old and threads._window_start.wall > 0.0
