"""Every client's reply is, token for token, the one it gets alone on an idle engine, whatever else runs beside it.

Five clients on the default INT4 engine (the native step) with three KV slots: greedy and seeded sampling (with a
repeat penalty, and a temperature moved mid-reply at a fixed round of a reply without guesses), speculation off,
prompt lookup, suffix match, suffix trees and `auto`, mixed reply lengths and a pasted document read in chunks
between the others' decode steps. They start at points set by each other's progress, so some join mid-reply and two
wait for a slot that a finishing (or cancelled) reply frees; one is cancelled mid-stream and must have shown a
prefix of its solo reply, with its slot holding exactly the prompt and what was shown. Every KV cache type. Checked
bitwise (text and token ids): batch invariance of the native pass, a generator per reply and verification that
draws as plain decoding does leave no room for a difference.
"""

from __future__ import annotations

import random

import pytest
from batch_clients import Client, RoundParams, run_alone, run_together
from real_engines import fresh, heldout, snippet

from parley.engine.params import GenerationParams
from parley.models.transformer import KV_CACHE_TYPES

pytestmark = pytest.mark.slow


def ask(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def clients(seed: int) -> list[Client]:
    rng = random.Random(seed)
    essay = heldout("essays.txt")
    start = rng.randrange(len(essay) - 3000)
    paste = essay[start : start + 2400].split(" ", 1)[-1]
    return [
        # a slider moved mid-reply: without guesses every round decides one token, alone or beside others, so the
        # change lands on the same token (with speculation, which token depends on the guesses a round verified,
        # which the scheduler shares out by the batch: the change still applies at the next round)
        Client(ask("Explain this briefly: " + snippet(rng)),
               RoundParams(temperature=0, seed=seed + 3, max_new_tokens=48, speculation="off",
                           changes={6: {"temperature": 0.8}})),
        Client(ask("Continue the story: " + snippet(rng)),
               GenerationParams(temperature=0.9, top_p=0.95, repeat_penalty=1.1, seed=seed, max_new_tokens=40,
                                speculation="suffix"), after=(0, 3)),
        Client(ask("Summarise this, quoting it:\n\n" + paste),  # ~500 tokens: read in chunks beside the others
               GenerationParams(temperature=0, max_new_tokens=36, speculation="suffix-tree"), after=(1, 2)),
        Client(ask("Write a short poem about " + snippet(rng, 10, 40)),
               GenerationParams(temperature=0, seed=seed + 1, max_new_tokens=56,
                                speculation="auto")),  # waits for a slot, joins when one frees
        Client(ask("List some facts about " + snippet(rng, 10, 60)),
               GenerationParams(temperature=0.7, seed=seed + 2, max_new_tokens=64, speculation="prompt-lookup"),
               after=(0, 1), cancel_after=5),
    ]


@pytest.mark.parametrize("kind", KV_CACHE_TYPES)
def test_each_client_gets_its_solo_reply(kind: str) -> None:
    seed = 100 + KV_CACHE_TYPES.index(kind)
    cs = clients(seed)
    alone = fresh("awq", parallel=1, kv_cache=kind)
    solo = run_alone(alone, cs)
    shared = fresh("awq", parallel=3, kv_cache=kind)
    together = run_together(shared, cs)

    assert max(max(r.batches, default=1) for r in together) > 1, f"seed={seed}: no pass was shared"
    assert len(shared.pool.slots) == 3 and shared.pool.busy == 0, f"seed={seed}: slots {shared.pool.slots}"
    for i, (c, want, got) in enumerate(zip(cs, solo, together, strict=True)):
        assert want.done is not None and got.done is not None
        assert got.stats.kv_cache == kind, f"seed={seed}: client {i} ran on {got.stats.kv_cache}"
        if c.cancel_after is None:
            assert got.ids == want.ids, f"seed={seed} kv={kind}: client {i}'s tokens differ from its solo reply"
            assert got.text == want.text and got.done == want.done, f"seed={seed} kv={kind}: client {i}"
        else:
            assert got.done.reason == "cancelled", f"seed={seed}: client {i} was not cancelled: {got.done}"
            assert got.ids == want.ids[: len(got.ids)] and len(got.ids) >= c.cancel_after, \
                f"seed={seed} kv={kind}: the cancelled client {i} showed {got.ids}, not a prefix of {want.ids}"
            prompt = shared.tokenizer.encode_chat(c.messages)
            assert got.kept[: len(prompt)] == prompt and got.kept[len(prompt) :] == got.ids[:-1], \
                f"seed={seed}: the cancelled client's slot does not hold exactly its prompt and what it showed"
