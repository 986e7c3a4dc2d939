"""What `Session.reply` yields: text as it is decided, figures, and why the reply ended."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal


@dataclass(frozen=True)
class TextDelta:
    text: str
    draft_chars: int = 0  # how many leading characters of `text` came from accepted draft tokens


@dataclass(frozen=True)
class Stats:
    new_tokens: int
    tokens_per_s: float  # decode rate: new tokens after the first over the time since the first
    accepted: int  # speculative tokens accepted
    proposed: int  # speculative tokens proposed
    tokens_per_target_pass: float  # new tokens per forward pass of the target while decoding
    ttft_s: float  # time from the call to the first token (prefill included)
    prompt_tokens: int = 0  # tokens prefilled for this reply (after prefix reuse)
    reused_tokens: int = 0  # prompt tokens whose KV came from the previous turn
    context_tokens: int = 0  # tokens in the context after this reply
    context_window: int = 0
    drafter: str = ""  # "prompt lookup", the draft model's name, or "" when not speculating

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    def to_json(self) -> dict:
        return {**asdict(self), "acceptance_rate": round(self.acceptance_rate, 4)}


@dataclass(frozen=True)
class Notice:
    """Something the user should know mid-reply (e.g. a live parameter was rejected and why)."""

    text: str


@dataclass(frozen=True)
class Prefill:
    """A long prompt is being read: `done` of `total` prompt tokens are in the cache (sent between chunks)."""

    done: int
    total: int


@dataclass(frozen=True)
class Done:
    reason: Literal["eos", "length", "cancelled", "error"]
    detail: str = ""


Event = TextDelta | Stats | Notice | Prefill | Done
