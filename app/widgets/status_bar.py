"""One line of live figures: speed, latency, speculation, context; the model on the right.

Everything is said in words a newcomer reads without a glossary ("speculating: prompt lookup · 70% of
guesses kept · 2.8 tokens per step", "INT4 (AWQ)", "INT4 (the file's own Q4_1)"), and what matters most
survives a narrow terminal: the model on the right stays whole, background work next to it, the figures
give way first.
"""

from __future__ import annotations

import re

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from parley.engine.events import Stats

QUANTIZATION_WORDS = {"awq-int4": "INT4 (AWQ)", "none": "full precision", "remote": "on a server", "": ""}


SHORT_QUANTIZATION = {"awq-int4": "INT4", "none": "fp", "remote": "server"}


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


def sharing_words(batch: int, compact: int = 0) -> str:
    """'sharing the engine: 3 replies at once' while other replies (another tab, another client of the server) run
    in the same passes; shorter forms for narrow terminals; '' when the reply has the engine to itself."""
    if batch <= 1:
        return ""
    if compact >= 3:
        return f"×{batch}"
    return f"shared ×{batch}" if compact else f"sharing the engine: {batch} replies at once"


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


def short_background(text: str) -> str:
    """'INT4 12/30' for 'making INT4: layer 12 of 30': what is going on, in a few columns."""
    head, _, rest = text.partition(":")
    count = re.search(r"(\d+) of (\d+)", rest)
    head = head.rstrip("…").removeprefix("making ")
    if len(head) > 24:
        head = head[:23] + "…"
    return f"{head} {count.group(1)}/{count.group(2)}" if count else head


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
    expanded: reactive[bool] = reactive(False, layout=True)  # Ctrl+F: the details in full, under the line

    _details_shown = ""

    def figures(self, compact: int = 0) -> list[str]:
        """The figures, most important first; `compact` 1 shortens the speculation figure, 2 also leaves out
        the time to the first token, 3 keeps only the rate and short forms (for narrow terminals)."""
        s = self.stats
        parts = []
        if self.prefill is not None:
            done, total, left = self.prefill
            eta = f" · about {duration_words(left)} left" if left is not None else ""
            if compact < 3:
                parts.append(f"reading the prompt {done / max(total, 1):.0%}{eta} (Esc cancels)")
            else:
                parts.append(f"reading {done / max(total, 1):.0%}" + (f" · {duration_words(left)} left"
                                                                         if left is not None else ""))
        elif self.live is not None:
            tokens, rate, ttft = self.live
            if ttft is None:
                parts.append("reading the prompt…")
            else:
                parts.append(f"~{rate:.1f} tok/s")
                if compact < 2:
                    parts.append(f"ttft {ttft:.2f}s")
                if compact < 3:
                    parts.append(f"{tokens} tok")
        elif s is not None:
            parts.append(f"{s.tokens_per_s:.1f} tok/s")
            if compact < 2:
                parts.append(f"ttft {s.ttft_s:.2f}s")
        if s is not None and (shared := sharing_words(getattr(s, "batch", 1), compact)):
            parts.append(shared)
        # The context before the speculation figures: it matters more when the terminal is narrow.
        window = self.context_window or (s.context_window if s and s.context_window else 0)
        if window:
            parts.append(f"ctx {min(self.context_used, window):,}/{window:,}")
        if s is not None and s.proposed:
            if compact >= 3:
                parts.append("spec paused" if getattr(s, "speculation_note", "") else f"spec {s.acceptance_rate:.0%}")
            else:
                parts.append(speculation_words(s) if not compact else f"{s.acceptance_rate:.0%} of guesses kept")
        return parts

    def render(self) -> Text:
        """One line that fits the terminal, ever shorter forms before cutting (80 columns keep the rate, the
        context meter, the speculation figure and the model); `expanded` (Ctrl+F) adds the details in full."""
        width = self.content_size.width
        for compact in range(7):  # the figures shorten first, then the background work, then the model
            left, right = self._figures_text(min(compact, 3)), self._right_text(max(0, compact - 3))
            if left.cell_len + 2 + right.cell_len <= width:
                break
        if compact == 6:  # still too wide: the figures keep their short form, the model name gives way
            left.truncate(width, overflow="ellipsis")
            right.truncate(max(0, width - left.cell_len - 2), overflow="ellipsis")
        left.pad_right(max(0, width - left.cell_len - right.cell_len))
        line = left + right
        details = self.details()
        if details != self._details_shown:  # the same in a tooltip, for the mouse
            self._details_shown = self.tooltip = details
        if self.expanded:
            line.append("\n")
            line.append(self.details(), "dim")
        return line

    def details(self) -> str:
        """Everything the one line shortens, in full: the Ctrl+F panel and the status bar's tooltip."""
        lines = []
        figures = [p for p in self.figures(0) if not p.startswith("ctx ")]
        if figures:
            lines.append(" · ".join(figures))
        if self.context_figures()[0]:
            lines.append(context_words(*self.context_figures()))
        if self.background:
            lines.append(f"in the background: {self.background}")
        lines.append(f"model: {model_words(self.model, self.quantization)}")
        return "\n".join(lines)

    def _right_text(self, short: int) -> Text:
        """Background work and the model: `short` 1 shortens the background work, 2 the model's words,
        3 leaves the model alone while a background job runs (its quantization is in the details)."""
        right = Text(no_wrap=True)
        if self.background:
            right.append(self.background if short < 1 else short_background(self.background))
            right.append(" │ ", "dim")
        if short < 2:
            right.append(model_words(self.model, self.quantization), "italic")
        else:
            quantization = SHORT_QUANTIZATION.get(self.quantization,
                                                  quantization_words(self.quantization).split(" (")[0])
            model = self.model.split(" (")[0]
            right.append(model if short == 3 and self.background else model_words(model, quantization), "italic")
        return right

    def _figures_text(self, compact: int) -> Text:
        left = Text(no_wrap=True, overflow="ellipsis")
        if self.generating:
            left.append("● ", "bold")
        for i, part in enumerate(self.figures(compact)):
            if i:
                left.append(" │ ", "dim")
            if part.startswith("ctx "):  # the numbers are in the details (Ctrl+F, or the tooltip)
                left.append_text(context_meter(*self.context_figures(), cells=8 if compact < 3 else 5))
            else:
                left.append(part, "bold" if i == 0 and (self.stats or self.live or self.prefill) else "")
        return left

    def context_figures(self) -> tuple[int, int, int, int]:
        """(window, tokens used, of which documents, kept for the reply)."""
        s = self.stats
        window = self.context_window or (s.context_window if s and s.context_window else 0)
        return window, min(self.context_used, window), self.context_documents, self.reply_room

