"""The engine runs one reply at a time and makes its own choices between replies: a KV cache type chosen
mid-reply (the panel) applies from the next reply, never under the reply in flight (which holds the engine)."""

from __future__ import annotations

from tiny import tiny_engine

from parley.engine.events import consume
from parley.engine.params import GenerationParams

ASK = [{"role": "user", "content": "hello there"}]
PARAMS = GenerationParams(temperature=0, max_new_tokens=6, speculation="off")


def test_a_kv_cache_chosen_mid_reply_applies_from_the_next():
    engine = tiny_engine(kv_cache="fp")
    first = engine.session().reply(ASK, PARAMS)
    next(first)  # the reply is running: it holds the engine
    engine.set_kv_cache("int8")
    assert engine.kv_cache == "fp" and engine.target.cache.kind == "fp"  # not swapped under the reply
    rest = consume(first)
    assert rest.stats.kv_cache == "fp" and rest.done.reason == "length"
    second = consume(engine.session().reply(ASK, PARAMS))
    assert second.stats.kv_cache == "int8" and engine.target.cache.kind == "int8"
