"""A conversation that would overflow the context window ends with Done("length"), never a crash."""

from tiny import tiny_engine

from parley.engine.events import Done, TextDelta
from parley.engine.params import GenerationParams


def test_prompt_larger_than_window():
    eng = tiny_engine(context_window=64)
    events = list(eng.session().reply([{"role": "user", "content": "x" * 100}], GenerationParams()))
    assert events == [events[-1]] and events[-1].reason == "length"
    assert "64" in events[-1].detail and "100" not in events[-1].detail or "context window" in events[-1].detail


def test_generation_stops_at_window_and_engine_stays_usable():
    eng = tiny_engine(context_window=64)
    params = GenerationParams(temperature=1.0, top_p=1.0, max_new_tokens=500, seed=1, speculation="off")
    eng.tokenizer.stop_ids = frozenset()  # never stop early: run into the window
    events = list(eng.session().reply([{"role": "user", "content": "y" * 40}], params))
    done = events[-1]
    assert isinstance(done, Done) and done.reason == "length" and "context window" in done.detail
    assert len(eng.target.ids) <= 64
    again = list(eng.session().reply([{"role": "user", "content": "short"}], params))
    assert any(isinstance(e, TextDelta) for e in again)
