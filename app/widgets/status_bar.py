"""One line of live figures: speed, latency, speculation, context; the model on the right.

Everything is said in words a newcomer reads without a glossary ("speculating: prompt lookup · 70% of
guesses kept · 2.8 tokens per step", "INT4 (AWQ)", "INT4 (the file's own Q4_1)"), and what matters most
survives a narrow terminal: the model on the right stays whole, background work next to it, the figures
give way first.
"""

from __future__ import annotations

from rich.cells import cell_len
from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from parley.engine.events import Stats

QUANTIZATION_WORDS = {"awq-int4": "INT4 (AWQ)", "none": "full precision", "remote": "on a server", "": ""}


def quantization_words(quantization: str) -> str:
    """'INT4 (AWQ)' for 'awq-int4', 'full precision' for 'none': what the user sees of the engine's term."""
    if quantization in QUANTIZATION_WORDS:
        return QUANTIZATION_WORDS[quantization]
    if quantization.startswith("gguf-int4:"):  # --quant gguf: the .gguf file's own 4-bit weights
        return f"INT4 (the file's own {quantization.removeprefix('gguf-int4:')})"
    method, _, bits = quantization.rpartition("-")
    return f"{bits.upper()} ({method.upper()})" if method and bits.startswith("int") else quantization


def model_words(model: str, quantization: str) -> str:
    words = quantization_words(quantization)
    return f"{model} · {words}" if words else model


def speculation_words(stats: Stats) -> str:
    """'speculating: prompt lookup · 70% of guesses kept · 2.8 tokens per step'; '(paused)' after the drafter
    while `auto` has paused it (guesses too rarely right to pay; it may resume later in the reply)."""
    drafter = getattr(stats, "drafter", "") or "on"
    if getattr(stats, "speculation_note", ""):
        drafter += " (paused)"
    return (f"speculating: {drafter} · {stats.acceptance_rate:.0%} of guesses kept · "
            f"{stats.tokens_per_target_pass:.1f} tokens per step")


def context_meter(window: int, used: int, documents: int, reply: int, cells: int = 8) -> Text:
    """'ctx ▰▰▰▰▰▰▱▱ 76%': how full the window is, documents, then the chat, then the room kept for the reply
    (red when they do not all fit)."""
    meter = Text("ctx ")
    used, documents = min(used, window), min(documents, used)
    spans = [(documents, "magenta"), (used - documents, "cyan"), (min(reply, window - used), "yellow")]
    drawn = 0
    for tokens, style in spans:
        n = min(cells - drawn, round(tokens * cells / window))
        meter.append("▰" * n, style)
        drawn += n
    meter.append("▱" * (cells - drawn), "dim")
    meter.append(f" {used / window:.0%}", "bold red" if used + reply > window else "")
    return meter


def context_words(window: int, used: int, documents: int, reply: int) -> str:
    """The meter in full: 'context: 7,711 of 8,192 tokens · documents 7,639 · chat 72 · 512 kept for the reply'."""
    used, documents = min(used, window), min(documents, used)
    free = window - used - reply
    return (f"context: {used:,} of {window:,} tokens · documents {documents:,} · chat {used - documents:,} · "
            f"{reply:,} kept for the reply · " + (f"{free:,} free" if free >= 0 else f"{-free:,} over"))


def duration_words(seconds: float) -> str:
    seconds = max(0, round(seconds))
    return f"{seconds // 60} min {seconds % 60:02d} s" if seconds >= 60 else f"{seconds} s"


class StatusBar(Widget):
    """Shows the latest `Stats` of the reply and what model is loaded. Owns no engine state."""

    stats: reactive[Stats | None] = reactive(None)
    model: reactive[str] = reactive("loading the model…")
    quantization: reactive[str] = reactive("")
    context_window: reactive[int] = reactive(0)
    # Tokens in the context: the engine's cached tokens after the last reply (or counted after a resume).
    context_used: reactive[int] = reactive(0)
    context_documents: reactive[int] = reactive(0)  # of which the documents the model still sees
    reply_room: reactive[int] = reactive(0)  # kept back for the reply
    generating: reactive[bool] = reactive(False)
    # While a reply streams and before its Stats arrive: (tokens, tokens/s, ttft) measured by the UI.
    live: reactive[tuple[int, float, float | None] | None] = reactive(None)
    # A long prefill: (tokens done, tokens in all, seconds left or None while unknown).
    prefill: reactive[tuple[int, int, float | None] | None] = reactive(None)
    # Work going on behind the chat, e.g. "INT4 in the background: layer 12 of 30".
    background: reactive[str] = reactive("")

    def figures(self, compact: int = 0) -> list[str]:
        """The figures, most important first; `compact` 1 shortens the speculation figure, 2 also leaves out
        the time to the first token (for narrow terminals)."""
        s = self.stats
        parts = []
        if self.prefill is not None:
            done, total, left = self.prefill
            eta = f" · about {duration_words(left)} left" if left is not None else ""
            parts.append(f"reading the prompt {done / max(total, 1):.0%}{eta} (Esc cancels)")
        elif self.live is not None:
            tokens, rate, ttft = self.live
            if ttft is None:
                parts.append("reading the prompt…")
            else:
                parts.append(f"~{rate:.1f} tok/s")
                if compact < 2:
                    parts.append(f"ttft {ttft:.2f}s")
                parts.append(f"{tokens} tok")
        elif s is not None:
            parts.append(f"{s.tokens_per_s:.1f} tok/s")
            if compact < 2:
                parts.append(f"ttft {s.ttft_s:.2f}s")
        # The context before the speculation figures: it matters more when the terminal is narrow.
        window = self.context_window or (s.context_window if s and s.context_window else 0)
        if window:
            parts.append(f"ctx {min(self.context_used, window):,}/{window:,}")
        if s is not None and s.proposed:
            parts.append(speculation_words(s) if not compact else f"{s.acceptance_rate:.0%} of guesses kept")
        return parts

    def render(self) -> Text:
        right = Text(no_wrap=True)
        if self.background:
            right.append(self.background)
            right.append(" │ ", "dim")
        right.append(model_words(self.model, self.quantization), "italic")
        width = self.content_size.width
        if right.cell_len > width:  # background work gives way only once the figures have gone
            right.truncate(width, overflow="ellipsis")
        room = max(0, width - right.cell_len - 2)
        for compact in range(3):  # shorter forms before cutting
            left = self._figures_text(compact)
            if left.cell_len <= room:
                break
        left.truncate(room, overflow="ellipsis")
        left.pad_right(max(0, width - left.cell_len - cell_len(right.plain)))
        return left + right

    def _figures_text(self, compact: int) -> Text:
        left = Text(no_wrap=True, overflow="ellipsis")
        if self.generating:
            left.append("● ", "bold")
        for i, part in enumerate(self.figures(compact)):
            if i:
                left.append(" │ ", "dim")
            if part.startswith("ctx "):  # the numbers are in the details (F7, or the tooltip)
                left.append_text(context_meter(*self.context_figures()))
            else:
                left.append(part, "bold" if i == 0 and (self.stats or self.live or self.prefill) else "")
        return left

    def context_figures(self) -> tuple[int, int, int, int]:
        """(window, tokens used, of which documents, kept for the reply)."""
        s = self.stats
        window = self.context_window or (s.context_window if s and s.context_window else 0)
        return window, min(self.context_used, window), self.context_documents, self.reply_room

    def watch_context_used(self) -> None:
        self._show_context_tooltip()

    def watch_context_documents(self) -> None:
        self._show_context_tooltip()

    def watch_reply_room(self) -> None:
        self._show_context_tooltip()

    def _show_context_tooltip(self) -> None:
        window = self.context_figures()[0]
        self.tooltip = context_words(*self.context_figures()) if window else None
