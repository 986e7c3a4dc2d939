"""Temperature 0 on the real embedded model (fp32): replies with prompt lookup and with a self-draft
(the target's first 15 layers) equal plain decoding token for token, on prompts that include
summarising a ~1,900-token pasted document. A divergence is allowed only where plain decoding itself
was at a numeric tie (top-2 logit margin < 1e-3 at that position): a k+1-token verification pass
and a one-token step may round differently, and then either token is a correct greedy choice."""

from importlib import resources

import pytest
from single_thread import single_thread  # noqa: F401  (a 2-core machine shared by several jobs)

from parley.engine import session as session_module
from parley.engine.events import Stats
from parley.engine.params import GenerationParams
from parley.engine.speculative import AdaptiveDraftLength, DraftModel

pytestmark = pytest.mark.slow
NEW_TOKENS = 64
TIE = 1e-3
DOCUMENT = resources.files("parley").joinpath("assets/speculative/document.md").read_text()
PROMPTS = {
    "summarise": [{"role": "user", "content": "Summarise the following document.\n\n" + DOCUMENT}],
    "free-chat": [{"role": "user", "content": "Give me three tips for keeping a sourdough starter healthy."}],
}


@pytest.fixture(scope="module")
def engine():
    from parley.engine.engine import Engine

    eng = Engine.load(None, quant="none", device="cpu")
    eng.draft = DraftModel.self_draft(eng.model, 15, eng.tokenizer, min_confidence=0.0)
    return eng


def greedy_reply(eng, messages, speculation: str) -> tuple[list[int], list[float], Stats]:
    """The reply's token ids, the top-2 logit margin behind each decision of a pass (for plain decoding:
    each emitted token, then the stop token if one ended the reply), and the reply's stats."""
    ids: list[int] = []
    margins: list[float] = []
    make_stream, forward = eng.tokenizer.stream, eng.forward

    class Recorder:
        def __init__(self) -> None:
            self.inner = make_stream()

        def push(self, t: int) -> str:
            ids.append(t)
            return self.inner.push(t)

        def flush(self) -> str:
            return self.inner.flush()

    def recording_forward(tokens, last_only=False):
        logits = forward(tokens, last_only)
        if last_only:  # a prefill chunk
            return logits
        top2 = logits[-1].topk(2).values
        margins.append(float(top2[0] - top2[1]))
        return logits

    eng.tokenizer.stream, eng.forward = Recorder, recording_forward
    try:
        params = GenerationParams(temperature=0, max_new_tokens=NEW_TOKENS, speculation=speculation)
        events = list(eng.session().reply(messages, params))
    finally:
        eng.tokenizer.stream, eng.forward = make_stream, forward
    assert events[-1].reason in ("eos", "length"), events[-1]
    return ids, margins, [e for e in events if isinstance(e, Stats)][-1]


class NeverPause(AdaptiveDraftLength):
    """The self-draft rarely guesses right, and the reply loop would soon pause it; here it must keep
    drafting, so that many of its guesses go through verification."""

    def __init__(self, k_max: int) -> None:
        super().__init__(k_max, patience=10**9)


@pytest.mark.parametrize("prompt", list(PROMPTS))
def test_greedy_speculation_equals_plain_on_real_model(engine, prompt, monkeypatch):
    monkeypatch.setattr(session_module, "AdaptiveDraftLength", NeverPause)
    engine.reset_cache()  # every run prefills the same way, so the prompt KV is identical
    plain, margins, _ = greedy_reply(engine, PROMPTS[prompt], "off")
    assert len(margins) - len(plain) in (0, 1)  # one pass per token, and one more for a stop token
    for mode in ("prompt-lookup", "draft"):
        engine.reset_cache()
        got, _, stats = greedy_reply(engine, PROMPTS[prompt], mode)
        if prompt == "summarise" and mode == "prompt-lookup":
            assert stats.accepted > NEW_TOKENS // 4  # the document's phrases were copied, so this checked much
        print(f"{prompt} {mode}: accepted {stats.accepted}/{stats.proposed}, "
              f"{stats.tokens_per_target_pass:.2f} tokens per target pass")
        if got == plain:
            continue
        # Never accepted silently: the first difference must sit on a genuine tie of plain decoding.
        first = next((i for i, (a, b) in enumerate(zip(plain, got, strict=False)) if a != b), min(len(plain), len(got)))
        assert first < len(margins) and margins[first] < TIE, (mode, first, margins[first:first + 1])
        print(f"{prompt} {mode}: diverged at token {first} on a tie (margin {margins[first]:.2e})")
    if prompt == "summarise":
        assert len(plain) == NEW_TOKENS
