"""A second turn that reuses the first turn's KV gives the same logits as a fresh prefill."""

import torch
from tiny import tiny_engine

from parley.engine.events import Done, TextDelta
from parley.engine.params import GenerationParams


def test_second_turn_logits_equal_fresh_prefill():
    eng = tiny_engine()
    params = GenerationParams(temperature=0, max_new_tokens=12, speculation="off")
    history = [{"role": "user", "content": "hello there"}]
    text = "".join(e.text for e in eng.session().reply(history, params) if isinstance(e, TextDelta))
    history += [{"role": "assistant", "content": text}, {"role": "user", "content": "and again"}]

    ids = eng.tokenizer.encode_chat(history)
    reused = eng.prefill(ids[:-1])
    assert reused > len(eng.tokenizer.encode_chat(history[:1])) - 1  # the first turn's KV was kept
    got = eng.forward(ids[-1:])

    fresh = tiny_engine()
    assert fresh.prefill(ids[:-1]) == 0
    want = fresh.forward(ids[-1:])
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_reply_after_reuse_equals_reply_of_fresh_engine():
    params = GenerationParams(temperature=0, max_new_tokens=10, speculation="off")
    first = [{"role": "user", "content": "abc"}]
    eng = tiny_engine()
    list(eng.session().reply(first, params))
    convo = [*first, {"role": "assistant", "content": "xyz"}, {"role": "user", "content": "def"}]
    a = [e for e in eng.session().reply(convo, params) if isinstance(e, TextDelta | Done)]
    b = [e for e in tiny_engine().session().reply(convo, params) if isinstance(e, TextDelta | Done)]
    assert "".join(e.text for e in a if isinstance(e, TextDelta)) == "".join(
        e.text for e in b if isinstance(e, TextDelta))
    assert a[-1] == b[-1]
