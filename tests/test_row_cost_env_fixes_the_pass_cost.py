"""`PARLEY_ROW_COST=X` prices each extra verified row at X one-row passes whatever the clock says, so a run
verifies the same guesses on any machine; unset, the engine measures the cost as replies run; a value that is
not a cost is refused in one line that names the variable and what it expects."""

import pytest
from tiny import tiny_engine

from parley.engine.speculation_pay import ModelledPassCost, PassCost, pass_cost_from_env


def test_unset_means_measured(monkeypatch):
    monkeypatch.delenv("PARLEY_ROW_COST", raising=False)
    cost = pass_cost_from_env()
    assert type(cost) is PassCost
    cost.add(1, 1.0)
    cost.add(5, 3.0)
    assert cost.ratio(5) == pytest.approx(3.0)  # the clock moves it


def test_set_means_fixed_whatever_the_clock(monkeypatch):
    monkeypatch.setenv("PARLEY_ROW_COST", "0.25")
    cost = pass_cost_from_env()
    assert isinstance(cost, ModelledPassCost)
    for tokens, seconds in [(1, 1.0), (5, 9.0), (9, 0.5), (1, 7.0)]:
        cost.add(tokens, seconds)
    assert cost.ratio(1) == 1 and cost.ratio(5) == pytest.approx(2.0) and cost.ratio(9) == pytest.approx(3.0)


def test_the_engine_takes_it(monkeypatch):
    monkeypatch.setenv("PARLEY_ROW_COST", "0")
    eng = tiny_engine(seed=0)
    assert eng.pass_cost.ratio(17) == 1  # rows free: every guess the drafter has is worth verifying


@pytest.mark.parametrize("value", ["fast", "-0.1", "inf", "nan"])
def test_a_value_that_is_not_a_cost_is_refused(monkeypatch, value):
    monkeypatch.setenv("PARLEY_ROW_COST", value)
    with pytest.raises(ValueError, match=r"PARLEY_ROW_COST=.*number >= 0.*unset it"):
        pass_cost_from_env()
