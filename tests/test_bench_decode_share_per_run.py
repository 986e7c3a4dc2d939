"""`bench decode` sets each decode run beside the bandwidth probed just before and just after it.

The host's read bandwidth swings from minute to minute; a share computed against a probe taken at another
time (the run's start, or the best of the run) reads high or low. A fake engine and a probe that counts its
calls pin the order (probe, run, probe) and the pairing (each run against the mean of its own two probes).
"""

from __future__ import annotations

import torch

from parley.bench.decode import decode_runs


class FakeEngine:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    def reset_cache(self) -> None:
        pass

    def prefill(self, ids: list[int]) -> int:
        return len(ids)

    def forward(self, tokens: list[int]) -> torch.Tensor:
        self.log.append("forward")
        return torch.zeros(1, 8)

    def commit(self, tokens: list[int]) -> None:
        pass


def test_each_run_is_paired_with_the_probes_around_it() -> None:
    log: list[str] = []
    readings = iter([10.0, 20.0, 40.0, 80.0, 160.0, 320.0])

    def probe() -> float:
        log.append("probe")
        return next(readings)

    runs = decode_runs(FakeEngine(log), [1, 2, 3], 0, new_tokens=2, repeats=3, probe=probe)
    # the warm-up run is not probed; then each run has a probe of its own before and after it
    assert log == ["forward"] * 2 + ["probe", "forward", "forward", "probe"] * 3, log
    assert [bw for _, bw in runs] == [15.0, 60.0, 240.0]
    assert all(rate > 0 for rate, _ in runs)


def test_without_a_probe_the_runs_carry_no_bandwidth() -> None:
    runs = decode_runs(FakeEngine([]), [1, 2, 3], 0, new_tokens=2, repeats=2)
    assert len(runs) == 2 and all(bw is None for _, bw in runs)
