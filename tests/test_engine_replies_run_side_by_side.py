"""Replies share the engine: a second reply runs beside one in flight (each in its own KV slot, decoded in the
same passes) instead of waiting for it, and a reader that stops reading holds back only its own reply;
engine-wide choices wait for no reply to run: a KV cache type chosen mid-reply (the panel) never swaps the cache
under a running reply, and applies to the replies after it."""

from __future__ import annotations

import threading

from tiny import tiny_engine

from parley.engine.events import consume
from parley.engine.params import GenerationParams

ASK = [{"role": "user", "content": "hello there"}]
OTHER = [{"role": "user", "content": "something else entirely"}]
LONG = GenerationParams(temperature=0, max_new_tokens=120, speculation="off")
SHORT = GenerationParams(temperature=0, max_new_tokens=6, speculation="off")


def test_a_second_reply_runs_beside_the_first():
    engine = tiny_engine(parallel=2)
    engine.tokenizer.stop_ids = frozenset()
    first = engine.session().start(ASK, LONG)
    events = iter(first)
    next(events)  # the first reply holds a slot and decodes (while its reader reads)
    rest: dict = {}
    reader = threading.Thread(target=lambda: rest.update(reply=consume(events)))
    reader.start()
    second = consume(engine.session().reply(OTHER, SHORT))
    assert second.done.reason == "length" and second.stats.new_tokens == 6
    assert not first.job.finished.is_set(), "the second reply waited for the first to end"
    reader.join()
    assert rest["reply"].done.reason == "length"
    assert engine.scheduler.pass_sizes[2] > 0  # the two shared passes
    assert engine.pool.busy == 0 and len(engine.pool.slots) == 2


def test_a_reader_that_stops_reading_holds_back_its_own_reply_only():
    engine = tiny_engine(parallel=2)
    engine.tokenizer.stop_ids = frozenset()
    stalled = iter(engine.session().start(ASK, LONG))
    next(stalled)  # then not read: the reply waits for its reader, at most a round ahead of it
    second = consume(engine.session().reply(OTHER, SHORT))
    assert second.done.reason == "length" and second.stats.new_tokens == 6
    rest = consume(stalled)
    assert rest.done.reason == "length" and rest.text


def test_a_kv_cache_chosen_mid_reply_applies_once_no_reply_runs():
    engine = tiny_engine(kv_cache="fp", parallel=2)
    first = engine.session().reply(ASK, SHORT)
    next(first)  # the reply is running: it holds a slot
    engine.set_kv_cache("int8")
    assert engine.kv_cache == "fp" and engine.target.cache.kind == "fp"  # not swapped under the reply
    rest = consume(first)
    assert rest.stats.kv_cache == "fp" and rest.done.reason == "length"
    second = consume(engine.session().reply(ASK, SHORT))
    assert second.stats.kv_cache == "int8" and engine.target.cache.kind == "int8"
    assert all(slot.cache.kind == "int8" for slot in engine.pool.slots)
