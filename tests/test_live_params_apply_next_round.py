"""A change to the live GenerationParams during a reply applies from the next round on."""

from tiny import tiny_engine

from parley.engine.events import Done, TextDelta
from parley.engine.params import GenerationParams


def test_lowering_max_new_tokens_mid_reply_stops_it():
    eng = tiny_engine()
    eng.tokenizer.stop_ids = frozenset()
    live = GenerationParams(temperature=0, max_new_tokens=200, speculation="off")
    n = 0
    for ev in eng.session().reply([{"role": "user", "content": "count"}], live):
        if isinstance(ev, TextDelta):
            n += 1
            if n == 5:
                live.max_new_tokens = 8
        last = ev
    assert isinstance(last, Done) and last.reason == "length" and "max_new_tokens=8" in last.detail


def test_temperature_change_switches_from_greedy_to_sampling():
    eng = tiny_engine()
    eng.tokenizer.stop_ids = frozenset()
    greedy = GenerationParams(temperature=0, max_new_tokens=30, speculation="off")
    want = [e.text for e in eng.session().reply([{"role": "user", "content": "q"}], greedy)
            if isinstance(e, TextDelta)]
    eng.reset_cache()
    live = GenerationParams(temperature=0, max_new_tokens=30, seed=7, speculation="off")
    got = []
    for ev in eng.session().reply([{"role": "user", "content": "q"}], live):
        if isinstance(ev, TextDelta):
            got.append(ev.text)
            if len(got) == 3:
                live.temperature, live.top_p = 2.0, 1.0  # the top of the range (TEMPERATURE_MAX)
    assert "".join(got[:3]) == "".join(want)[: len("".join(got[:3]))]
    assert "".join(got) != "".join(want)
