"""A scripted stand-in for `parley.engine.engine.Engine` (an `EngineLike`): known tokens, controlled rate.

Every `reply` call is recorded with the messages it got and the params snapshot of each round, so a
test can check what the UI sent and when a slider change reached the engine.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field

from parley.engine.events import Done, Notice, Prefill, Stats, TextDelta
from parley.engine.params import GenerationParams
from parley.engine.protocol import Capabilities
from parley.models.progress import Progress, ProgressFn

DEFAULT_REPLY = (
    "Here is a function that adds two numbers:\n\n"
    "```python\ndef add(a: int, b: int) -> int:\n    return a + b\n```\n\n"
    "It returns the **sum** of `a` and `b`."
)


def split_tokens(text: str) -> list[str]:
    """Word-ish pieces that join back to `text` exactly."""
    return re.findall(r"\s*\S+|\s+", text)


@dataclass
class ReplyCall:
    system_prompt: str | None
    messages: list[dict[str, str]]
    snapshots: list[GenerationParams] = field(default_factory=list)  # one per round
    shown: str = ""  # the text yielded
    reason: str = ""


class FakeSession:
    def __init__(self, engine: FakeEngine, system_prompt: str | None) -> None:
        self.engine = engine
        self.system_prompt = system_prompt

    def reply(self, messages, params: GenerationParams, cancel: threading.Event | None = None):
        with self.engine.turn:  # one reply at a time, as Engine.turn (the app relies on it)
            yield from self._reply(messages, params, cancel)

    def _reply(self, messages, params: GenerationParams, cancel: threading.Event | None = None):
        engine = self.engine
        call = ReplyCall(self.system_prompt, [dict(m) for m in messages])
        engine.calls.append(call)
        tokens = split_tokens(engine.replies[min(len(engine.calls) - 1, len(engine.replies) - 1)])
        cancel = cancel or threading.Event()
        prompt_tokens = sum(engine.count_tokens(m["content"]) for m in messages)
        hold_at = engine.hold_at if len(engine.calls) == 1 else None
        for done in range(0, engine.prefill_tokens, 512):  # a long prompt, read chunk by chunk
            yield Prefill(done, engine.prefill_tokens)
            if done == 512 and len(engine.calls) == 1:
                engine.holding.set()  # a test looks at the progress for as long as it needs
                while not engine.release.wait(0.01) and not cancel.is_set():
                    pass
            if cancel.wait(engine.delay) or cancel.is_set():
                call.reason = "cancelled"
                yield Done("cancelled")
                return
        for i, token in enumerate(tokens):
            call.snapshots.append(params.snapshot())
            if i == engine.fail_at:
                raise RuntimeError("scripted failure")
            if i == hold_at:  # a test looks at the reply mid-stream, for as long as it needs
                engine.holding.set()
                while not engine.release.wait(0.01) and not cancel.is_set():
                    pass
            # Waiting on the cancel event keeps the rate controlled and the stop prompt.
            if cancel.wait(engine.delay) or cancel.is_set():
                call.reason = "cancelled"
                yield Done("cancelled")
                return
            call.shown += token
            if i in engine.notices:
                yield Notice(engine.notices[i])
            # Every other token "came from an accepted draft" when speculating, so the view can be checked.
            drafted = len(token) if engine.drafted and params.speculation != "off" and i % 2 else 0
            yield TextDelta(token, draft_chars=drafted)
            if engine.stop_at_window and prompt_tokens + i + 1 >= engine.context_window:
                call.reason = "length"
                yield self._stats(i + 1, prompt_tokens, params)
                yield Done("length", f"the context window ({engine.context_window:,} tokens) is full")
                return
            if (engine.stats_every and (i + 1) % engine.stats_every == 0) or i + 1 == len(tokens):
                yield self._stats(i + 1, prompt_tokens, params)
            if i + 1 >= params.max_new_tokens:
                call.reason = "length"
                yield Done("length")
                return
        call.reason = "eos"
        yield Done("eos")

    def _stats(self, n: int, prompt_tokens: int, params: GenerationParams) -> Stats:
        speculating = params.speculation != "off"
        return Stats(
            new_tokens=n,
            tokens_per_s=42.5,
            accepted=3 * n // 4 if speculating else 0,
            proposed=n if speculating else 0,
            tokens_per_target_pass=2.4 if speculating else 1.0,
            ttft_s=0.12,
            prompt_tokens=prompt_tokens,
            context_tokens=prompt_tokens + n,
            context_window=self.engine.context_window,
            drafter=("prompt lookup" if speculating else ""),
        )


class FakeEngine:
    model_name = "fake-smol-135m"
    quantization = "awq-int4"

    def __init__(self, replies: list[str] | None = None, *, delay: float = 0.0, context_window: int = 4096,
                 fail_at: int | None = None, stats_every: int | None = 8, model_name: str | None = None,
                 quantization: str | None = None, capabilities: Capabilities | None = None,
                 notices: dict[int, str] | None = None, drafted: bool = False,
                 stop_at_window: bool = False, hold_at: int | None = None, prefill_tokens: int = 0) -> None:
        self.replies = replies or [DEFAULT_REPLY]
        self.delay = delay
        self.context_window = context_window
        self.fail_at = fail_at
        self.stats_every = stats_every  # None: Stats only at the end
        if model_name is not None:
            self.model_name = model_name
        if quantization is not None:
            self.quantization = quantization
        self.capabilities = capabilities or Capabilities()
        self.notices = notices or {}  # token index -> a Notice yielded before that token
        self.drafted = drafted  # mark every other token as from an accepted draft
        self.stop_at_window = stop_at_window  # end with Done("length") when the window is full
        # Hold the first reply before its token `hold_at` (that round's params already read) until
        # `release` is set; `holding` says it got there. Only the first reply holds.
        self.hold_at = hold_at
        # Report reading a prompt of this many tokens (Prefill events, 512 a chunk) before the first token;
        # the first reply holds at the second chunk like `hold_at`.
        self.prefill_tokens = prefill_tokens
        self.holding = threading.Event()
        self.release = threading.Event()
        self.calls: list[ReplyCall] = []
        self.turn = threading.Lock()
        self.sessions: list[FakeSession] = []

    def count_tokens(self, text: str) -> int:
        """Deterministic: one token per word-ish piece."""
        return len(split_tokens(text))

    def session(self, system_prompt: str | None = None) -> FakeSession:
        session = FakeSession(self, system_prompt)
        self.sessions.append(session)
        return session


def loader(engine: FakeEngine, progress_script: list[Progress] | None = None,
           block: threading.Event | None = None, error: BaseException | None = None):
    """An `EngineLoader` for the app: reports the scripted progress, optionally waits or fails."""

    def load(progress: ProgressFn | None) -> FakeEngine:
        for p in progress_script or []:
            if progress is not None:
                progress(p)
        if block is not None:
            block.wait(timeout=10)  # never outlive a failed test
        if error is not None:
            raise error
        return engine

    return load
