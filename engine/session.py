"""A conversation's reply loop: prefix reuse, chunked prefill, then rounds of draft -> verify -> emit."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from . import sampling
from .events import Done, Event, Stats, TextDelta
from .params import GenerationParams
from .speculative import AdaptiveDraftLength, verify

if TYPE_CHECKING:
    from .engine import Engine


STATS_EVERY_S = 0.5  # how often a reply in flight reports its figures


class Session:
    """One conversation. Its KV state lives in the engine (one reply at a time); `Engine.cached_ids`
    says which tokens the cache holds, so any session can continue from the longest common prefix."""

    def __init__(self, engine: Engine, system_prompt: str | None = None) -> None:
        self.engine = engine
        self.system_prompt = system_prompt

    def reply(self, messages: list[dict[str, str]], params: GenerationParams,
              cancel: threading.Event | None = None) -> Iterator[Event]:
        """Stream the assistant's answer to `messages` (the whole visible conversation).

        `params` is read again at the start of every round, so a change applies to the next tokens.
        On cancellation the engine's cache holds exactly the prompt and the tokens already shown.
        """
        try:
            yield from self._reply(messages, params, cancel or threading.Event())
        except Exception as e:  # the engine must stay usable after anything a reply hits
            self.engine.reset_cache()
            yield Done("error", f"{type(e).__name__}: {e}")

    def _reply(self, messages: list[dict[str, str]], live: GenerationParams,
               cancel: threading.Event) -> Iterator[Event]:
        eng = self.engine
        t0 = time.perf_counter()
        params = live.snapshot()
        params.validate()
        if self.system_prompt and (not messages or messages[0]["role"] != "system"):
            messages = [{"role": "system", "content": self.system_prompt}, *messages]
        ids = eng.tokenizer.encode_chat(messages)
        window = eng.context_window
        if len(ids) >= window:
            yield Done("length", f"the conversation is {len(ids)} tokens; the context window holds {window}. "
                                 "Start a new chat or shorten the message.")
            return

        # Prefill everything but the last prompt token; that one is the first input of round one.
        reused = eng.prefill(ids[:-1])
        pending: int | None = ids[-1]
        generator = sampling.make_generator(params.seed)
        stream = eng.tokenizer.stream()
        stop_ids = eng.tokenizer.stop_ids
        adapt = AdaptiveDraftLength(params.draft_tokens)
        new_tokens = proposed = accepted = passes = 0
        t_first: float | None = None
        t_stats = t0
        reason, detail = "length", ""

        def stats() -> Stats:
            now = time.perf_counter()
            decode_s = now - t_first if t_first is not None else 0.0
            return Stats(
                new_tokens=new_tokens,
                tokens_per_s=(new_tokens - 1) / decode_s if new_tokens > 1 and decode_s > 0 else 0.0,
                accepted=accepted,
                proposed=proposed,
                tokens_per_target_pass=new_tokens / passes if passes else 0.0,
                ttft_s=(t_first or now) - t0,
                prompt_tokens=len(ids) - reused,
                reused_tokens=reused,
                context_tokens=len(eng.cached_ids) + (pending is not None),
                context_window=window,
            )

        while True:
            if cancel.is_set():
                reason = "cancelled"
                break
            params = live.snapshot()
            budget = params.max_new_tokens - new_tokens
            if budget <= 0:
                reason, detail = "length", f"max_new_tokens={params.max_new_tokens} reached"
                break
            room = window - len(eng.cached_ids) - 1  # slots left after the pending token
            if room < 0:
                reason, detail = "length", f"context window of {window} tokens is full"
                break
            drafter = eng.drafter(params.speculation)
            adapt.k_max = params.draft_tokens
            k = min(adapt.k, params.draft_tokens, room, budget - 1)
            draft, q = ([], None)
            if drafter and k > 0:
                draft, q = drafter.propose(eng.cached_ids + [pending], k, params, generator)
            draft, q = draft[:k], (q[: len(draft[:k])] if q is not None else None)

            logits = eng.forward([pending, *draft])
            passes += 1
            new = verify(sampling.probs(logits, params), draft, q, generator)
            proposed += len(draft)
            accepted += len(new) - 1
            adapt.update(len(draft), len(new) - 1)

            # Cut at a stop token and at the budget; what is left is shown and becomes the context.
            stop_at = next((i for i, t in enumerate(new) if t in stop_ids), None)
            shown = new[: stop_at if stop_at is not None else len(new)][:budget]
            eng.commit([pending, *shown[:-1]] if shown else [])
            if shown:
                pending = shown[-1]
                new_tokens += len(shown)
                if t_first is None:
                    t_first = time.perf_counter()
                text = "".join(stream.push(t) for t in shown)
                if text:
                    yield TextDelta(text)
                if time.perf_counter() - t_stats > STATS_EVERY_S:  # live figures for the status bar
                    t_stats = time.perf_counter()
                    yield stats()
            if stop_at is not None and stop_at < budget:
                # This pass computed the KV of the last shown token; the stop token is never cached.
                eng.commit([pending])
                pending = None
                reason = "eos"
                break
        tail = stream.flush()
        if tail:
            yield TextDelta(tail)

        yield stats()  # the final figures: the last Stats of a reply
        yield Done(reason, detail)  # type: ignore[arg-type]
