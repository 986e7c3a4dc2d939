"""`parley bench faults --only cancel` counts what it claims, on the real model (fp32, the engine the
other real-model tests already loaded): no mismatch on a correct engine, and mismatches once the reply loop's
prefix reuse takes one token more than the common prefix. A cancelled reply's slot holds exactly what its client
was shown, so the next turn's prompt extends it and the stale token comes from the point before's conversation
(the first token past the shared system prompt): it changes the next greedy reply at some points only, so the
broken engine gets 10 points (4 mismatches with this seed)."""

from real_engines import fresh

from parley.bench.faults import cancel_check
from parley.engine import session

SEED, BROKEN_SEED = 1, 3


def test_the_cancel_check_passes_a_correct_engine_and_catches_a_stale_cache(monkeypatch):
    result = cancel_check(fresh("none", 512), 4, seed=SEED, say=lambda _: None)
    assert result["points"] == 4 and result["cancelled"] > 0 and result["mismatches"] == 0, (SEED, result)

    real = session.common_prefix  # the reply loop's prefix reuse (a slot's cache)
    monkeypatch.setattr(session, "common_prefix", lambda a, b: min(real(a, b) + 1, len(a), len(b)))
    broken = cancel_check(fresh("none", 512), 10, seed=BROKEN_SEED, say=lambda _: None)
    assert broken["mismatches"] > 0, (BROKEN_SEED, broken)
