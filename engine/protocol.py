"""The seam between the app and whatever makes tokens: the in-process engine or a remote server.

The app types its engine as `EngineLike` and never imports torch through it. Both `engine.engine.Engine`
and the OpenAI-compatible client (`engine.remote`) satisfy it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

from .events import Event
from .params import GenerationParams


@dataclass(frozen=True)
class Capabilities:
    """What a backend can honour, so the UI can grey out what it would ignore (with the reason)."""

    # GenerationParams field name -> None when honoured, else a one-line reason it is not.
    unsupported: dict[str, str] = field(default_factory=dict)
    live_params: bool = True  # a change made mid-reply applies to the following tokens
    live_params_note: str = ""  # why not, when live_params is False
    speculation: bool = True  # the backend drafts and reports acceptance


class SessionLike(Protocol):
    system_prompt: str | None

    def reply(self, messages: list[dict[str, str]], params: GenerationParams,
              cancel: threading.Event | None = None) -> Iterator[Event]:
        """Stream TextDelta / Stats / Notice events, ending with exactly one Done. The backend runs one
        reply at a time: a second call waits until the first has ended (a cancelled one winds down at its
        next round), so callers need no lock of their own."""
        ...


class EngineLike(Protocol):
    model_name: str
    quantization: str  # e.g. "awq-int4", "none", "remote"
    context_window: int

    def session(self, system_prompt: str | None = None, raw: bool = False) -> SessionLike: ...

    def count_tokens(self, text: str) -> int: ...

    @property
    def capabilities(self) -> Capabilities: ...
