"""A reply ended by a stop token leaves the cache holding the prompt and the shown tokens, never the
stop token: that token was sampled, not fed, so its slot holds no valid KV. The next turn, whose
template repeats the stop token as the end of the assistant's turn, must recompute it, and its
logits equal a fresh engine's (issue 10, mutant 3: the stop token's KV claimed at end of reply)."""

import torch
from single_thread import single_thread  # noqa: F401
from tiny import ASSISTANT, USER, ByteTokenizer, tiny_engine

from parley.engine.events import Done, TextDelta
from parley.engine.params import GenerationParams

GREEDY = GenerationParams(temperature=0, max_new_tokens=40, speculation="off")


class EndOfTurnTokenizer(ByteTokenizer):
    """Like real chat templates: the stop token is also what closes an assistant turn."""

    def __init__(self, stop: int) -> None:
        self.stop_ids = frozenset({stop})

    def encode_chat(self, messages: list[dict[str, str]], cancel=None) -> list[int]:
        (stop,) = self.stop_ids
        ids: list[int] = []
        for m in messages:
            end = stop if m["role"] == "assistant" else 256
            ids += [ASSISTANT if m["role"] == "assistant" else USER, *self.encode(m["content"]), end]
        return [*ids, ASSISTANT]


def engine(stop: int):
    eng = tiny_engine(seed=6)
    eng.tokenizer = EndOfTurnTokenizer(stop)
    return eng


def test_next_turn_after_a_stop_token_equals_fresh():
    first = [{"role": "user", "content": "name three birds"}]
    probe = tiny_engine(seed=6)
    probe.tokenizer.stop_ids = frozenset()
    free = "".join(e.text for e in probe.session().reply(first, GREEDY) if isinstance(e, TextDelta))
    stop = ord(next(c for i, c in enumerate(free) if i >= 3 and c not in free[:i]))

    eng = engine(stop)
    events = list(eng.session().reply(first, GREEDY))
    shown = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert events[-1] == Done("eos") and shown == free[: free.index(chr(stop))]
    assert eng.target.ids == eng.tokenizer.encode_chat(first)[:-1] + [ASSISTANT, *eng.tokenizer.encode(shown)]

    history = [*first, {"role": "assistant", "content": shown}, {"role": "user", "content": "and fish?"}]
    ids = eng.tokenizer.encode_chat(history)
    assert ids[len(eng.target.ids)] == stop  # the next turn needs the stop token's KV
    reused = eng.target.sync(ids[:-1])
    assert reused == len(eng.tokenizer.encode_chat(first)) + len(shown)
    fresh = engine(stop)
    fresh.target.sync(ids[:-1])
    torch.testing.assert_close(eng.target.forward(ids[-1:]), fresh.target.forward(ids[-1:]), atol=1e-5, rtol=1e-5)
