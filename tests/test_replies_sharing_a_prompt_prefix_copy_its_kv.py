"""Replies whose prompts share a long prefix (one system prompt, four chats sent at once) read it once: the first
reply's pass reads it, the others wait that one pass and copy its K/V into their own slots (`KVPool.share_prefix`)
instead of computing it. Each reply is still bitwise the one it gets alone (greedy, seeded sampling, speculation),
and each slot holds, for its prompt, bitwise the K/V a solo run computes: every KV cache type, the default INT4
engine (the native step)."""

from __future__ import annotations

import random
import threading

import pytest
import torch
from real_engines import fresh, heldout

from parley.engine.events import Done, TextDelta
from parley.engine.kv_pool import SHARE_MIN
from parley.engine.params import GenerationParams
from parley.models.transformer import KV_CACHE_TYPES

pytestmark = pytest.mark.slow

QUESTIONS = ("Summarise the rules above in one sentence.", "Which rule matters most, and why?",
             "Write a short poem about these rules.", "List three words from the text above.")


def chats(seed: int) -> list[tuple[list[dict[str, str]], GenerationParams]]:
    rng = random.Random(seed)
    essay = heldout("essays.txt")
    start = rng.randrange(len(essay) - 1500)
    system = {"role": "system", "content": "Follow these notes:\n" + essay[start : start + 1200].split(" ", 1)[-1]}
    params = [GenerationParams(temperature=0, max_new_tokens=20, speculation="off"),
              GenerationParams(temperature=0.8, top_p=0.9, seed=seed, max_new_tokens=20, speculation="off"),
              GenerationParams(temperature=0, max_new_tokens=20, speculation="suffix"),
              GenerationParams(temperature=0.7, seed=seed + 1, max_new_tokens=20, speculation="prompt-lookup")]
    return [([system, {"role": "user", "content": q}], p) for q, p in zip(QUESTIONS, params, strict=True)]


def read(stream) -> tuple[str, object]:
    text, stats = "", None
    for ev in stream:
        if isinstance(ev, TextDelta):
            text += ev.text
        elif hasattr(ev, "reused_tokens"):
            stats = ev
        elif isinstance(ev, Done):
            assert ev.reason in ("length", "eos"), ev
    return text, stats


def prompt_kv(slot, n: int) -> dict[str, torch.Tensor]:
    return {name: buf[:, :, :n].clone() for name, buf in slot.cache.named_buffers()}


@pytest.mark.parametrize("kind", KV_CACHE_TYPES)
def test_one_prompt_prefix_is_read_once_and_copied(kind: str) -> None:
    seed = 7 + KV_CACHE_TYPES.index(kind)
    cases = chats(seed)
    alone = fresh("awq", parallel=1, kv_cache=kind)
    solo = []
    for messages, params in cases:
        stream = alone.session().start(messages, params)
        text, _ = read(stream)
        solo.append((text, prompt_kv(stream.job.slot, len(stream.job.ids))))

    shared = fresh("awq", parallel=4, kv_cache=kind)
    with shared.scheduler._cond:  # the scheduler admits all four at once, as four clients sending together
        streams = [shared.session().start(messages, params) for messages, params in cases]
    results: list = [None] * len(streams)
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, read(streams[i])), daemon=True)
               for i in range(len(streams))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
        assert not t.is_alive()

    copied = 0
    for i, ((text, stats), stream, (solo_text, solo_kv)) in enumerate(zip(results, streams, solo, strict=True)):
        where = f"seed {seed}, {kind}, client {i}"
        assert text == solo_text, where
        kv = prompt_kv(stream.job.slot, len(stream.job.ids))
        for name, t in kv.items():
            assert torch.equal(t, solo_kv[name]), f"{where}: {name} of the prompt differs from its solo run"
        copied += stats.reused_tokens >= SHARE_MIN
    assert copied == 3, f"seed {seed}, {kind}: {copied} of the 3 later replies copied the shared prefix"
