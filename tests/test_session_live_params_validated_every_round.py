"""Live params are validated at every round, not only the first: an invalid value set mid-reply keeps
the last valid settings for the rest of the reply (identical tokens to a reply left alone), is
reported once by a Notice naming the field, and never ends the reply in an error (a NaN or a
negative temperature used to reach the sampler)."""

import math

import pytest
from single_thread import single_thread  # noqa: F401
from tiny import tiny_engine

from parley.engine.events import Done, Notice, TextDelta
from parley.engine.params import GenerationParams

MESSAGES = [{"role": "user", "content": "tell me about tides"}]


def params() -> GenerationParams:
    return GenerationParams(temperature=0.9, top_p=0.9, max_new_tokens=30, speculation="prompt-lookup", seed=3)


def reply(eng, live, change=None):
    text, notices, n = "", [], 0
    for ev in eng.session().reply(MESSAGES, live):
        if isinstance(ev, TextDelta):
            text, n = text + ev.text, n + 1
            if n == 4 and change:
                setattr(live, *change)
        elif isinstance(ev, Notice):
            notices.append(ev.text)
        done = ev
    return text, notices, done


@pytest.mark.parametrize(("field", "value"), [
    ("top_p", 0.0), ("min_p", 1.5), ("temperature", -1.0), ("temperature", math.nan),
    ("temperature", math.inf), ("top_k", -3), ("max_new_tokens", 0), ("draft_tokens", 99),
])
def test_invalid_value_mid_reply_keeps_previous_settings(field, value):
    eng = tiny_engine(seed=5)
    eng.tokenizer.stop_ids = frozenset()
    want, notices, done = reply(eng, params())
    assert notices == [] and done == Done("length", "max_new_tokens=30 reached")
    eng.reset_cache()
    got, notices, done = reply(eng, params(), (field, value))
    assert done == Done("length", "max_new_tokens=30 reached")
    assert got == want
    assert len(notices) == 1 and notices[0].startswith(f"{field}=") and "keeping the previous" in notices[0]


def test_a_valid_value_after_an_invalid_one_applies():
    eng = tiny_engine(seed=5)
    eng.tokenizer.stop_ids = frozenset()
    live = params()
    n, notices = 0, []
    for ev in eng.session().reply(MESSAGES, live):
        if isinstance(ev, TextDelta):
            n += 1
            if n == 3:
                live.top_p = -1.0
            if n == 6:
                live.top_p, live.max_new_tokens = 0.9, 8
        elif isinstance(ev, Notice):
            notices.append(ev)
        done = ev
    assert len(notices) == 1 and done == Done("length", "max_new_tokens=8 reached")


def test_invalid_params_at_the_start_say_which():
    eng = tiny_engine()
    events = list(eng.session().reply(MESSAGES, GenerationParams(temperature=-1.0)))
    assert events == [Done("error", events[-1].detail)] and events[-1].detail.startswith("temperature=-1.0")
