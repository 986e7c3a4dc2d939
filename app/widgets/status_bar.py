"""One line of live figures: speed, latency, speculation, context, model."""

from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from parley.engine.events import Stats


class StatusBar(Widget):
    """Shows the latest `Stats` of the reply and what model is loaded. Owns no engine state."""

    stats: reactive[Stats | None] = reactive(None)
    model: reactive[str] = reactive("loading…")
    quantization: reactive[str] = reactive("")
    context_window: reactive[int] = reactive(0)
    generating: reactive[bool] = reactive(False)

    def render(self) -> Text:
        parts: list[tuple[str, str]] = []
        s = self.stats
        if s is not None:
            parts.append((f"{s.tokens_per_s:.1f} tok/s", "bold"))
            parts.append((f"ttft {s.ttft_s:.2f}s", ""))
            if s.proposed:
                parts.append((f"accept {s.acceptance_rate:.0%} · {s.tokens_per_target_pass:.1f}/pass", ""))
        window = (s.context_window if s and s.context_window else 0) or self.context_window
        used = s.context_tokens if s else 0
        if window:
            parts.append((f"ctx {used:,}/{window:,}", ""))
        model = self.model + (f" · {self.quantization}" if self.quantization else "")
        parts.append((model, "italic"))
        text = Text(no_wrap=True, overflow="ellipsis")
        if self.generating:
            text.append("● ", "bold")
        for i, (part, style) in enumerate(parts):
            if i:
                text.append(" │ ", "dim")
            text.append(part, style)
        return text
