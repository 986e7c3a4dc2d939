"""What `Session.reply` yields: text as it is decided, figures, and why the reply ended."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
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
    reused_tokens: int = 0  # prompt tokens whose KV a slot held already (an earlier turn) or copied (another slot)
    context_tokens: int = 0  # tokens in the context after this reply
    context_window: int = 0
    drafter: str = ""  # which drafter ran: "prompt lookup", "suffix match", the draft model's name; "" if none
    speculation_note: str = ""  # "" normally; in plain words why `auto` turned speculation off
    kv_cache: str = ""  # the KV cache storage the reply ran on: fp | bf16 | int8 | k8v4
    step: str = ""  # what the target's passes ran on: native | torch | compiled | graphed
    batch: int = 1  # sequences (replies) that shared the latest pass: more than 1 while others use the engine

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


@dataclass
class Reply:
    """What a reply's events add up to."""

    text: str = ""
    deltas: int = 0  # TextDelta events seen
    stats: Stats | None = None  # the last figures (a reply's last Stats are its final ones)
    notices: list[str] = field(default_factory=list)
    done: Done | None = None


def consume(events: Iterable[Event], on_event: Callable[[Event, Reply], None] | None = None) -> Reply:
    """Run a reply's events to the end, adding them up; `on_event(event, so_far)` sees each one after it is
    counted (to stream text, or to cancel once enough was shown). The one loop over events the headless
    callers share: the CLI, the server's whole answers and the benches."""
    reply = Reply()
    for ev in events:
        if isinstance(ev, TextDelta):
            reply.text += ev.text
            reply.deltas += 1
        elif isinstance(ev, Stats):
            reply.stats = ev
        elif isinstance(ev, Notice):
            reply.notices.append(ev.text)
        elif isinstance(ev, Done):
            reply.done = ev
        if on_event is not None:
            on_event(ev, reply)
    return reply
