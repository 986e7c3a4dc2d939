"""One line of live figures: speed, latency, speculation, context; the model on the right."""

from __future__ import annotations

from rich.cells import cell_len
from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from parley.engine.events import Stats


class StatusBar(Widget):
    """Shows the latest `Stats` of the reply and what model is loaded. Owns no engine state."""

    stats: reactive[Stats | None] = reactive(None)
    model: reactive[str] = reactive("loading the model…")
    quantization: reactive[str] = reactive("")
    context_window: reactive[int] = reactive(0)
    # Tokens in the context: the engine's cached tokens after the last reply (or counted after a resume).
    context_used: reactive[int] = reactive(0)
    generating: reactive[bool] = reactive(False)
    # While a reply streams and before its Stats arrive: (tokens, tokens/s, ttft) measured by the UI.
    live: reactive[tuple[int, float, float | None] | None] = reactive(None)
    # Work going on behind the chat, e.g. "AWQ INT4 in the background: layer 12/30".
    background: reactive[str] = reactive("")

    def figures(self) -> list[str]:
        s = self.stats
        parts = []
        if self.live is not None:
            tokens, rate, ttft = self.live
            if ttft is None:
                parts.append("prefilling…")
            else:
                parts.append(f"~{rate:.1f} tok/s")
                parts.append(f"ttft {ttft:.2f}s")
                parts.append(f"{tokens} tok")
        elif s is not None:
            parts.append(f"{s.tokens_per_s:.1f} tok/s")
            parts.append(f"ttft {s.ttft_s:.2f}s")
        # The context before the speculation figures: it matters more when the terminal is narrow.
        window = self.context_window or (s.context_window if s and s.context_window else 0)
        if window:
            parts.append(f"ctx {min(self.context_used, window):,}/{window:,}")
        if s is not None and s.proposed:
            drafter = f" {s.drafter}" if s.drafter else ""
            parts.append(f"acc{drafter} {s.acceptance_rate:.0%} {s.tokens_per_target_pass:.1f}/pass")
        if self.background:
            parts.append(self.background)
        return parts

    def render(self) -> Text:
        model = self.model + (f" · {self.quantization}" if self.quantization else "")
        left = Text(no_wrap=True, overflow="ellipsis")
        if self.generating:
            left.append("● ", "bold")
        for i, part in enumerate(self.figures()):
            if i:
                left.append(" │ ", "dim")
            left.append(part, "bold" if i == 0 and (self.stats or self.live) else "")
        # The model stays whole on the right; the figures give way first in a narrow terminal.
        width = self.content_size.width
        room = max(0, width - cell_len(model) - 2)
        left.truncate(room, overflow="ellipsis")
        left.pad_right(max(0, width - left.cell_len - cell_len(model)))
        left.append(model, "italic")
        return left
