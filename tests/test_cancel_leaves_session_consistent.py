"""Cancelling mid-reply leaves an engine whose next reply equals a fresh engine's on the same history."""

from replies import collect
from tiny import tiny_engine

from parley.engine.events import Done, Stats, TextDelta
from parley.engine.params import GenerationParams


def run(eng, messages, params, cancel_after=None):
    cancel_when = None if cancel_after is None else (lambda text, _n: len(text) >= cancel_after)
    return collect(eng, messages, params, cancel_when)


def test_cancel_then_continue_equals_fresh_session():
    params = GenerationParams(temperature=0, max_new_tokens=40, speculation="off")
    q1 = [{"role": "user", "content": "tell me a story"}]
    eng = tiny_engine(seed=3)
    shown, done = run(eng, q1, params, cancel_after=5)
    assert done.reason == "cancelled"
    assert 5 <= len(shown) < 40
    # the cache holds the prompt and exactly the shown tokens (the last one's KV is computed next pass)
    prompt = eng.tokenizer.encode_chat(q1)
    assert eng.target.ids == prompt + eng.tokenizer.encode(shown)[:-1]

    visible = [*q1, {"role": "assistant", "content": shown}, {"role": "user", "content": "go on"}]
    assert run(eng, visible, params) == run(tiny_engine(seed=3), visible, params)


def test_stats_count_what_was_shown():
    params = GenerationParams(temperature=0, max_new_tokens=9, speculation="off")
    events = list(tiny_engine().session().reply([{"role": "user", "content": "hi"}], params))
    stats = [e for e in events if isinstance(e, Stats)][-1]
    shown = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert events[-1] == Done("length", "max_new_tokens=9 reached") or events[-1].reason == "eos"
    assert stats.new_tokens == len(shown) or events[-1].reason == "eos"
    assert stats.ttft_s > 0 and stats.tokens_per_target_pass == 1.0
