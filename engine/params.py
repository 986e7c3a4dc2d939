"""The knobs of generation. The UI owns one live object; the engine snapshots it every round."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

# The KV cache type is the engine's (Engine.set_kv_cache, between replies), not a live parameter.
KV_CACHE_CHOICES = ("auto", "fp", "bf16", "int8", "k8v4")
SPECULATION_MODES = ("off", "prompt-lookup", "suffix", "suffix-tree", "draft", "auto")


# One range everywhere (command line, API, panel): OpenAI's. Above 2 the text is noise on every model we run.
TEMPERATURE_MAX = 2.0


@dataclass
class GenerationParams:
    temperature: float = 0.7
    top_p: float = 0.95
    top_k: int = 0  # 0: off
    min_p: float = 0.0  # 0: off
    # Repetition control over the last `repeat_last_n` tokens of the context (prompt and reply):
    # llama.cpp's repeat penalty (divide a positive logit, multiply a negative one; 1: off) and
    # OpenAI's frequency / presence penalties (logit -= count * frequency + (count > 0) * presence).
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64  # 0: off, -1: the whole context
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    max_new_tokens: int = 512
    seed: int | None = None
    speculation: str = "auto"  # off | prompt-lookup | suffix | suffix-tree | draft | auto
    draft_tokens: int = 16  # upper bound of the draft length (suffix match's chains are cut by the cost model)

    def problems(self) -> list[tuple[str, str]]:
        """(field, message) for every field out of range; empty when all are valid."""
        checks = [
            ("temperature", _number(self.temperature, 0.0, TEMPERATURE_MAX),
             f"a number between 0 and {TEMPERATURE_MAX:g} (0 = greedy)"),
            ("top_p", _number(self.top_p, 0.0, 1.0) and self.top_p > 0, "a number in (0, 1] (1 = off)"),
            ("top_k", _integer(self.top_k, 0), "0 (off) or a positive integer"),
            ("min_p", _number(self.min_p, 0.0, 1.0) and self.min_p < 1, "a number in [0, 1) (0 = off)"),
            ("repeat_penalty", _number(self.repeat_penalty, 0.0, 10.0) and self.repeat_penalty > 0,
             "a number in (0, 10] (1 = off; above 1 discourages repeats)"),
            ("repeat_last_n", _integer(self.repeat_last_n, -1), "0 (off), -1 (whole context) or a positive integer"),
            ("frequency_penalty", _number(self.frequency_penalty, -2.0, 2.0), "a number between -2 and 2 (0 = off)"),
            ("presence_penalty", _number(self.presence_penalty, -2.0, 2.0), "a number between -2 and 2 (0 = off)"),
            ("max_new_tokens", _integer(self.max_new_tokens, 1), "a positive integer"),
            ("seed", self.seed is None or _integer(self.seed, -2**63, 2**64 - 1), "none (random) or a 64-bit integer"),
            ("speculation", self.speculation in SPECULATION_MODES, "one of " + ", ".join(SPECULATION_MODES)),
            ("draft_tokens", _integer(self.draft_tokens, 1, 16), "an integer between 1 and 16"),
        ]
        return [(name, f"{name}={getattr(self, name)!r} is out of range: expected {expected}")
                for name, ok, expected in checks if not ok]

    def validate(self) -> None:
        """Raise ValueError naming the parameter, its value and the accepted range."""
        bad = self.problems()
        if bad:
            raise ValueError("; ".join(message for _, message in bad))

    def snapshot(self) -> GenerationParams:
        """A copy taken at the start of a round: the live object may change while the round runs."""
        return copy.copy(self)


def checked(live: GenerationParams, previous: GenerationParams) -> tuple[GenerationParams, str | None]:
    """This round's parameters: a snapshot of `live` in which every invalid field keeps its value from
    `previous` (the last round's, which must be valid), and why, for the stream to report (None when
    all are valid).

    A value set mid-reply through the API is never trusted: `top_p = 0` would otherwise end the reply
    with NaN probabilities, `temperature = -1` would silently invert the distribution.
    """
    params = live.snapshot()
    bad = params.problems()
    if not bad:
        return params, None
    for name, _ in bad:
        setattr(params, name, getattr(previous, name))
    why = "; ".join(f"{message}; keeping the previous {name}={getattr(previous, name)!r}" for name, message in bad)
    return params, why


def _number(value: object, lo: float, hi: float) -> bool:
    """A finite real number in [lo, hi] (bools are not numbers here)."""
    return (isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
            and lo <= value <= hi)


def _integer(value: object, lo: int, hi: int | None = None) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= lo and (hi is None or value <= hi)
