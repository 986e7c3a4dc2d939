"""Temperature 0 on the real model, the default INT4 engine and fp32: replies with speculation off,
prompt lookup, suffix match, suffix trees (several candidates per pass, verified as a tree whose kept path is
then moved into place), a draft model (a self-draft on the target's first 20 layers) and `auto` are
token-identical over 128 tokens, on pasted held-out documents, two texts of the bench's Debian suite, the
speculative bench's document (where suffix match drafts long runs) and chat prompts. No tie allowance: with
batch-invariant passes (a tree node's logits are bitwise the linear pass's over its path) a k+1-token
verification pass decides exactly what a 1-token pass decides, so any difference is a bug (issue 10; today's
torch path is not batch invariant, see the invariance test)."""

import itertools
from collections import Counter
from importlib import resources

import pytest
from real_engines import QUANTS, fresh, heldout

import parley.engine.scheduler as scheduler_module
from parley.engine.events import Done, Stats
from parley.engine.params import GenerationParams
from parley.engine.speculative import DraftModel, SuffixMatch

pytestmark = pytest.mark.slow
# 128 tokens on the default (INT4) engine; the fp32 engine reads 4x the bytes per token through the same
# native step (same arithmetic but for the weights' form), so it checks fewer tokens to keep CI short.
NEW_TOKENS_BY_QUANT = {"awq": 128, "none": 48}


def document(name: str, start: str, chars: int = 4000) -> str:
    text = heldout(name)
    i = text.index(start)
    return text[i : i + chars].rsplit("\n", 1)[0]


def suite_prompts() -> dict[str, str]:
    """Two documents of `parley bench speculative --documents`'s suite (Debian-shipped text the project never
    tuned on), where this machine has them."""
    from parley.bench import documents

    texts = {name: documents.read(source) for name, source in documents.SUITE if name in ("man tar", "GPL-3")}
    return {name: "Summarise the following document, quoting its key commands and terms.\n\n"
                  + text[:4000].rsplit("\n", 1)[0] for name, text in texts.items() if text}


PROMPTS = {
    "execution model": "Summarise the following document, quoting its key terms.\n\n"
                       + document("python_reference.txt", "Structure of a program"),
    "shlex source": "Explain what this module does and list its public functions.\n\n"
                    + document("python_stdlib.txt", "Lib/shlex.py"),
    "keepers' logs": "Summarise this essay in five bullet points.\n\n" + document("essays.txt", "The Lighthouse"),
    "bench document": "Write a detailed summary of the following document, section by section.\n\n"
                      + resources.files("parley").joinpath("assets/speculative/document.md").read_text()[:4000],
    **suite_prompts(),
    "chat: bread": "How do I keep a sourdough starter healthy through a hot summer?",
    "chat: code": "Write a Python function that merges two sorted lists, and explain how it works.",
}


def reply_ids(eng, prompt: str, speculation: str, new_tokens: int) -> tuple[list[int], Stats]:
    session = eng.session()
    params = GenerationParams(temperature=0, max_new_tokens=new_tokens, speculation=speculation, draft_tokens=8)
    events = list(session.reply([{"role": "user", "content": prompt}], params))
    assert isinstance(events[-1], Done) and events[-1].reason in ("eos", "length"), events[-1]
    return session.reply_ids, [e for e in events if isinstance(e, Stats)][-1]


@pytest.mark.parametrize("quant", QUANTS)
def test_greedy_speculation_is_token_identical(quant, monkeypatch):
    eng = fresh(quant, context_window=2048)
    eng.draft = DraftModel.self_draft(eng.model, 20, eng.tokenizer, min_confidence=0.0, max_len=2048)
    # trees: bushy ones (up to 4 nodes per token of depth, down to a running probability of 0.01), verified
    # whole (every round "costs" the same, so the cost model cuts nothing), so that many rounds verify several
    # candidates at once and some keep one other than the first (counted by `branches`)
    eng.suffix_tree = SuffixMatch(width=3, nodes=4.0, min_score=0.01)
    branches = kept_branches(eng)
    checked, failures = {"prompt-lookup": 0, "suffix": 0, "suffix-tree": 0, "draft": 0, "auto": 0}, []
    # fp32 (the same native step, at 4x the bytes per token): one pasted document and one chat prompt,
    # those where prompt lookup guesses most
    prompts = PROMPTS if quant == "awq" else {k: PROMPTS[k] for k in ("keepers' logs", "man tar", "chat: bread")
                                              if k in PROMPTS}
    for name, prompt in prompts.items():
        plain, _ = reply_ids(eng, prompt, "off", NEW_TOKENS_BY_QUANT[quant])
        for mode in checked:
            with monkeypatch.context() as m:  # the other modes keep the engine's own clock
                if mode == "suffix-tree":
                    m.setattr(scheduler_module, "round_clock", itertools.count().__next__)
                got, stats = reply_ids(eng, prompt, mode, NEW_TOKENS_BY_QUANT[quant])
            checked[mode] += stats.accepted
            if got != plain:
                first = next((i for i, (a, b) in enumerate(zip(plain, got, strict=False)) if a != b),
                             min(len(plain), len(got)))
                failures.append(f"{name!r} {mode}: differs from plain at token {first} of {len(plain)} "
                                f"({eng.tokenizer.decode(plain[first:first + 3])!r} vs "
                                f"{eng.tokenizer.decode(got[first:first + 3])!r})")
    print(f"{quant}: accepted guesses checked {checked}; tree rounds {branches}")
    assert not failures, f"{quant}: {len(failures)} replies differ:\n" + "\n".join(failures)
    # Much went through verification (measured on INT4 over the six prompts: 390 accepted by prompt lookup,
    # 335 by suffix match, 27 by the self-draft, which the reply loop pauses after misses).
    n = NEW_TOKENS_BY_QUANT[quant] * len(prompts) // len(PROMPTS)
    # Trees were verified (measured on INT4 over the six prompts: 11 to 59 tree passes, 0 to 16 of them keeping
    # another branch, depending on the quantization: a floor on the passes only; keeping a second candidate is
    # pinned by tests/test_speculative_tree_output_law.py, where it happens by construction).
    # On fp32 (two prompts, 48 tokens each) trees are rare (0 or 1 tree pass measured): counted on INT4 only.
    assert checked["suffix-tree"] >= n // 2, checked
    if quant == "awq":
        assert branches["tree passes"] >= 8, branches
    # The self-draft's count moves with the weights (27 on one quantization, 15 on another): a floor, not a figure.
    assert checked["prompt-lookup"] >= n // 2 and checked["suffix"] >= n // 2 and checked["draft"] >= n // 16, checked


def kept_branches(eng) -> Counter:
    """Counts, as replies run, the tree passes and those whose kept path left the first candidates' chain."""
    counts: Counter = Counter()
    commit_path = eng.target.commit_path

    def spy(nodes: list[int]) -> None:
        counts["tree passes"] += 1
        counts["kept another branch"] += any(m != d for d, m in enumerate(nodes))
        commit_path(nodes)

    eng.target.commit_path = spy
    return counts
