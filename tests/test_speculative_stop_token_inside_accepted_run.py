"""A stop token inside a run of accepted guesses ends the reply there, as plain decoding would; the
tokens after it are neither shown nor counted (issue 10, mutant 2: the stop token checked only on
the last token of an accepted run). Also pins the figures a speculative reply reports: `Stats.accepted`
counts shown guesses only, `TextDelta.draft_chars` marks them, `Stats.drafter` names the drafter."""

import pytest
from single_thread import single_thread  # noqa: F401
from tiny import ByteTokenizer, tiny_engine

from parley.engine.events import Done, Stats, TextDelta
from parley.engine.params import GenerationParams
from parley.engine.speculative import DraftModel

MESSAGES = [{"role": "user", "content": "the cat sat on the mat"}]


def reply(eng, speculation: str, stop_ids: frozenset[int]):
    eng.tokenizer.stop_ids = stop_ids
    params = GenerationParams(temperature=0, max_new_tokens=60, speculation=speculation, draft_tokens=8)
    events = list(eng.session().reply(MESSAGES, params))
    deltas = [e for e in events if isinstance(e, TextDelta)]
    return "".join(e.text for e in deltas), deltas, [e for e in events if isinstance(e, Stats)][-1], events[-1]


def test_stop_token_inside_an_accepted_run_ends_the_reply():
    plain = tiny_engine(seed=3)
    free, _, _, _ = reply(plain, "off", frozenset())
    # Stop at a character plain decoding emits well inside the reply (not in the first round's few tokens).
    stop_char = next(c for i, c in enumerate(free) if i >= 10 and c not in free[:i])
    stop_ids = frozenset({ord(stop_char)})
    want, _, plain_stats, done = reply(plain, "off", stop_ids)
    assert done == Done("eos") and want == free[: free.index(stop_char)]
    # A self-draft with all the target's layers guesses what the target decides: every guess is
    # accepted, so the stop token arrives in the middle of an accepted run.
    spec = tiny_engine(seed=3)
    spec.draft = DraftModel.self_draft(spec.model, spec.model.config.n_layers, ByteTokenizer(), min_confidence=0.0)
    got, deltas, stats, done = reply(spec, "draft", stop_ids)
    assert done == Done("eos")
    assert got == want
    assert stats.new_tokens == plain_stats.new_tokens == len(want)
    assert 0 < stats.accepted < stats.new_tokens  # guesses after the stop token are not counted
    assert sum(e.draft_chars for e in deltas) == stats.accepted  # one character per byte token
    assert stats.drafter == "self:2"


@pytest.mark.parametrize(("mode", "name"),
                         [("off", ""), ("prompt-lookup", "prompt lookup"), ("suffix", "suffix match")])
def test_stats_name_the_drafter(mode, name):
    _, deltas, stats, _ = reply(tiny_engine(seed=3), mode, frozenset())
    assert stats.drafter == name
    assert sum(e.draft_chars for e in deltas) == stats.accepted
