"""`parley bench speculative --documents` compares `auto` with the best fixed drafter twice: against the largest
of the fixed drafters' medians (`vs_best_fixed`), and held out (`vs_best_fixed_held_out`): in each repeat against
the drafter the other repeats pick, the two runs of that repeat side by side. The first is biased against `auto`
by the noise of the pick; the second is not, and still sees a drafter that is really slower."""

import random
import statistics

import pytest

from parley.bench.speculative import held_out_ratio


def noisy(rng: random.Random, speed: float, drift: list[float]) -> list[float]:
    """tok/s of one mode over the repeats: its speed, the load each repeat shares, and each run's own jitter."""
    return [speed * d * rng.uniform(0.9, 1.1) for d in drift]


@pytest.mark.parametrize("seed", range(6))
def test_identical_drafters_put_auto_level_with_the_best(seed):
    rng = random.Random(seed)
    ratios = {"max of medians": [], "held out": []}
    for _ in range(400):
        drift = [rng.uniform(0.7, 1.3) for _ in range(5)]  # the host's load, shared within a repeat
        fixed = {m: noisy(rng, 300.0, drift) for m in ("prompt_lookup", "suffix", "suffix_tree")}
        auto = noisy(rng, 300.0, drift)
        ratios["max of medians"].append(statistics.median(auto) / max(statistics.median(r) for r in fixed.values()))
        ratios["held out"].append(held_out_ratio(auto, fixed))
    biased, held = (statistics.median(v) for v in ratios.values())
    assert biased < 0.97, f"seed {seed}: the max of three medians should overstate the best ({biased:.3f})"
    assert 0.98 < held < 1.02, f"seed {seed}: held out, identical drafters are level ({held:.3f})"


@pytest.mark.parametrize("seed", range(6))
def test_a_slower_auto_is_seen_held_out(seed):
    rng = random.Random(100 + seed)
    held = []
    for _ in range(400):
        drift = [rng.uniform(0.7, 1.3) for _ in range(5)]
        fixed = {"prompt_lookup": noisy(rng, 300.0, drift), "suffix": noisy(rng, 250.0, drift),
                 "suffix_tree": noisy(rng, 240.0, drift)}
        held.append(held_out_ratio(noisy(rng, 270.0, drift), fixed))  # 0.9x the best
    assert 0.88 < statistics.median(held) < 0.92, f"seed {seed}: {statistics.median(held):.3f}"


def test_the_pick_leaves_its_own_repeat_out():
    fixed = {"prompt_lookup": [300.0, 100.0, 100.0], "suffix": [190.0, 190.0, 190.0]}
    # repeat 0: the others' medians are 100 and 190, so suffix: 200 / 190; repeats 1 and 2: 200 and 190, so
    # prompt lookup, which ran at 100 there: 2.0 each. A pick over every repeat would be suffix each time (1.05).
    assert held_out_ratio([200.0, 200.0, 200.0], fixed) == pytest.approx(2.0)


def test_one_repeat_is_the_plain_ratio():
    assert held_out_ratio([90.0], {"a": [100.0], "b": [80.0]}) == pytest.approx(0.9)
