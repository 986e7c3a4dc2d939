"""On the real embedded model: after a reply is cancelled mid-stream, the next reply equals that of a
fresh engine given the same visible history (the cancelled text as the assistant's message)."""

import pytest
from replies import collect

from parley.engine.engine import Engine
from parley.engine.params import GenerationParams

pytestmark = pytest.mark.slow


def reply(engine, messages, params, cancel_after_deltas=None):
    cancel_when = None if cancel_after_deltas is None else (lambda _text, n: n >= cancel_after_deltas)
    return collect(engine, messages, params, cancel_when)


def test_cancelled_then_continued_equals_fresh_engine():
    params = GenerationParams(temperature=0, max_new_tokens=24, speculation="off")
    engine = Engine.load(None, quant="none", device="cpu")
    first = [{"role": "user", "content": "Write a short story about a lighthouse keeper."}]
    shown, done = reply(engine, first, params, cancel_after_deltas=6)
    assert done.reason == "cancelled" and shown

    visible = [*first, {"role": "assistant", "content": shown}, {"role": "user", "content": "Now give it a title."}]
    continued = reply(engine, visible, params)
    fresh = Engine(engine.model, engine.tokenizer, context_window=engine.context_window)  # same weights, empty cache
    assert continued == reply(fresh, visible, params)
    assert continued[0]
