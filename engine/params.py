"""The knobs of generation. The UI owns one live object; the engine snapshots it every round."""

from __future__ import annotations

import copy
from dataclasses import dataclass

SPECULATION_MODES = ("off", "prompt-lookup", "draft", "auto")


@dataclass
class GenerationParams:
    temperature: float = 0.7
    top_p: float = 0.95
    top_k: int = 0  # 0: off
    min_p: float = 0.0  # 0: off
    max_new_tokens: int = 512
    seed: int | None = None
    speculation: str = "auto"  # off | prompt-lookup | draft | auto
    draft_tokens: int = 8  # upper bound of the adaptive draft length

    def validate(self) -> None:
        """Raise ValueError naming the parameter, its value and the accepted range."""
        checks = [
            ("temperature", 0.0 <= self.temperature <= 10.0, "between 0 and 10 (0 = greedy)"),
            ("top_p", 0.0 < self.top_p <= 1.0, "in (0, 1] (1 = off)"),
            ("top_k", self.top_k >= 0, "0 (off) or a positive integer"),
            ("min_p", 0.0 <= self.min_p < 1.0, "in [0, 1) (0 = off)"),
            ("max_new_tokens", self.max_new_tokens >= 1, "a positive integer"),
            ("speculation", self.speculation in SPECULATION_MODES, "one of " + ", ".join(SPECULATION_MODES)),
            ("draft_tokens", 1 <= self.draft_tokens <= 16, "between 1 and 16"),
        ]
        for name, ok, expected in checks:
            if not ok:
                raise ValueError(f"{name}={getattr(self, name)!r} is out of range: expected {expected}")

    def snapshot(self) -> GenerationParams:
        """A copy taken at the start of a round: the live object may change while the round runs."""
        return copy.copy(self)
