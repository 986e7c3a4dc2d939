"""`parley bench faults --only cancel` counts what it claims, on the real model (fp32, the engine the
other real-model tests already loaded): no mismatch on a correct engine, and mismatches once the cache
reuses a token it should not (one more than the common prefix)."""

from real_engines import fresh

from parley.app.bench.faults import cancel_check
from parley.engine import cached_model

SEED = 1


def test_the_cancel_check_passes_a_correct_engine_and_catches_a_stale_cache(monkeypatch):
    result = cancel_check(fresh("none", 512), 4, seed=SEED, say=lambda _: None)
    assert result["points"] == 4 and result["cancelled"] > 0 and result["mismatches"] == 0, (SEED, result)

    real = cached_model.common_prefix
    monkeypatch.setattr(cached_model, "common_prefix", lambda a, b: min(real(a, b) + 1, len(a), len(b)))
    broken = cancel_check(fresh("none", 512), 4, seed=SEED, say=lambda _: None)
    assert broken["mismatches"] > 0, (SEED, broken)
