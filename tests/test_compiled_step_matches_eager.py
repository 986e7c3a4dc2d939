"""The torch.compile'd decode/verify step gives the same tokens and logits as the eager model."""

import torch
from tiny import tiny_engine

from parley.engine.events import TextDelta
from parley.engine.params import GenerationParams


def test_compiled_engine_replies_like_eager():
    eager, compiled = tiny_engine(context_window=512), tiny_engine(context_window=512, compile=True)
    for e in (eager, compiled):
        e.tokenizer.stop_ids = frozenset()
    # prompt lookup makes the verify step run with several draft lengths and the window grow past a bucket
    params = GenerationParams(temperature=0, max_new_tokens=300, speculation="prompt-lookup")
    msgs = [{"role": "user", "content": "abc abc abc hello world hello world"}]
    a, b = ("".join(ev.text for ev in e.session().reply(msgs, params) if isinstance(ev, TextDelta))
            for e in (eager, compiled))
    assert len(a) == 300 and a == b

    for e in (eager, compiled):
        e.reset_cache()
        e.prefill(list(range(40, 80)))
    torch.testing.assert_close(compiled.forward([7, 8, 9]), eager.forward([7, 8, 9]), atol=1e-5, rtol=1e-5)
