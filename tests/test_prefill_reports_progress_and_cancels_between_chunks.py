"""A prompt longer than one prefill chunk reports its progress (`Prefill`: tokens read of those to read) before
each chunk, and a cancel stops between chunks: the reply ends at once with nothing shown, the cache holds a
prefix of the prompt, and the next reply equals a fresh engine's."""

from __future__ import annotations

import threading

from replies import collect
from tiny import ByteTokenizer, tiny_model

from parley.engine.cached_model import PREFILL_CHUNK
from parley.engine.engine import Engine
from parley.engine.events import Done, Prefill, TextDelta
from parley.engine.params import GenerationParams

PARAMS = GenerationParams(temperature=0, max_new_tokens=8, speculation="off")
LONG = [{"role": "user", "content": "the quick brown fox jumps over the lazy dog " * 30}]  # ~1,350 tokens


def engine() -> Engine:
    return Engine(tiny_model(seed=5, max_len=2048), ByteTokenizer(), name="tiny")


def test_a_long_prompt_reports_each_chunk():
    eng = engine()
    events = list(eng.session().reply(LONG, PARAMS))
    to_read = len(eng.tokenizer.encode_chat(LONG)) - 1  # the last prompt token is round one's input
    assert [e for e in events if isinstance(e, Prefill)] == [
        Prefill(done, to_read) for done in range(0, to_read, PREFILL_CHUNK)]
    assert isinstance(events[-1], Done) and events[-1].reason != "error"


def test_a_short_prompt_reports_nothing():
    events = list(engine().session().reply([{"role": "user", "content": "hi"}], PARAMS))
    assert not any(isinstance(e, Prefill) for e in events)


def test_cancel_during_prefill_stops_between_chunks_and_the_engine_stays_usable():
    eng = engine()
    cancel, seen = threading.Event(), []
    for event in eng.session().reply(LONG, PARAMS, cancel):
        seen.append(event)
        if isinstance(event, Prefill) and event.done > 0:
            cancel.set()  # Esc while the second chunk is read
    assert seen[-1] == Done("cancelled")
    assert not any(isinstance(e, TextDelta) for e in seen)
    prompt = eng.tokenizer.encode_chat(LONG)
    assert len(eng.target.ids) == 2 * PREFILL_CHUNK and eng.target.ids == prompt[: 2 * PREFILL_CHUNK]
    assert collect(eng, LONG, PARAMS) == collect(engine(), LONG, PARAMS)
