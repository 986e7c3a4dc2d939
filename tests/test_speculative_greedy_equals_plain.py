"""Temperature 0: speculation (prompt lookup, a different draft model, a self-draft) emits exactly the
tokens of plain decoding, on the tiny model (the real-model check lives in its own module)."""

import pytest
from single_thread import single_thread  # noqa: F401
from spec_helpers import perturbed
from tiny import ByteTokenizer, tiny_engine

from parley.engine.events import Done, Stats, TextDelta
from parley.engine.params import GenerationParams
from parley.engine.speculative import DraftModel

PROMPTS = [
    "the cat sat on the mat. the cat sat on the mat. the cat",
    "Summarise: alpha beta gamma delta, alpha beta gamma delta, epsilon. Summary: alpha beta",
    "q",
]


def reply(eng, prompt: str, speculation: str) -> tuple[str, Stats, Done]:
    params = GenerationParams(temperature=0, max_new_tokens=60, speculation=speculation, draft_tokens=8)
    events = list(eng.session().reply([{"role": "user", "content": prompt}], params))
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    return text, [e for e in events if isinstance(e, Stats)][-1], events[-1]


@pytest.mark.parametrize("drafter", ["prompt-lookup", "suffix", "draft-model", "self-draft"])
def test_greedy_speculation_equals_plain(drafter):
    plain = tiny_engine(seed=3)
    plain.tokenizer.stop_ids = frozenset()
    model = plain.model
    if drafter == "draft-model":
        draft = DraftModel(perturbed(model), ByteTokenizer(), ByteTokenizer(), min_confidence=0.0)
    elif drafter == "self-draft":
        draft = DraftModel.self_draft(model, 1, ByteTokenizer(), min_confidence=0.0)
    else:
        draft = None
    spec = tiny_engine(seed=3, draft=draft)
    spec.tokenizer.stop_ids = frozenset()
    mode = drafter if draft is None else "draft"
    proposed = accepted = 0
    for prompt in PROMPTS:
        want, _, _ = reply(plain, prompt, "off")
        got, stats, done = reply(spec, prompt, mode)
        assert got == want, prompt
        assert done.reason == "length"
        proposed += stats.proposed
        accepted += stats.accepted
    assert proposed > accepted > 0  # both accepted and rejected rounds were exercised
