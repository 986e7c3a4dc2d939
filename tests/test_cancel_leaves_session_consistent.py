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
    eng = tiny_engine()
    eng.tokenizer.stop_ids = frozenset()  # the reply runs to its budget
    params = GenerationParams(temperature=0, max_new_tokens=9, speculation="off")
    events = list(eng.session().reply([{"role": "user", "content": "hi"}], params))
    stats = [e for e in events if isinstance(e, Stats)][-1]
    shown = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert events[-1] == Done("length", "max_new_tokens=9 reached")
    assert stats.new_tokens == len(shown) == 9
    assert stats.ttft_s > 0 and stats.tokens_per_target_pass == 1.0


def test_stats_of_a_reply_ended_by_a_stop_token_count_what_was_shown():
    eng = tiny_engine()
    eng.tokenizer.stop_ids = frozenset()
    params = GenerationParams(temperature=0, max_new_tokens=20, speculation="off")
    free, _ = run(eng, [{"role": "user", "content": "hi"}], params)
    stop = next(c for i, c in enumerate(free) if i >= 3 and c not in free[:i])
    eng.tokenizer.stop_ids = frozenset({ord(stop)})
    events = list(eng.session().reply([{"role": "user", "content": "hi"}], params))
    stats = [e for e in events if isinstance(e, Stats)][-1]
    shown = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert events[-1] == Done("eos") and shown == free[: free.index(stop)]
    assert stats.new_tokens == len(shown)  # the stop token is not counted
