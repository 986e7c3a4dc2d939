"""A conversation that would overflow the context window ends with Done("length"), never a crash."""

from tiny import tiny_engine

from parley.engine.events import Done, TextDelta
from parley.engine.params import GenerationParams


def test_prompt_larger_than_window():
    eng = tiny_engine(context_window=64)
    messages = [{"role": "user", "content": "x" * 100}]
    prompt_tokens = len(eng.tokenizer.encode_chat(messages))
    events = list(eng.session().reply(messages, GenerationParams()))
    assert len(events) == 1 and isinstance(events[0], Done) and events[0].reason == "length"
    detail = events[0].detail
    # each fact on its own: how long the conversation is, what the window holds, and what to do
    assert str(prompt_tokens) in detail, detail
    assert "context window" in detail and "64" in detail, detail
    assert "new chat" in detail.lower() or "shorten" in detail.lower(), detail


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
