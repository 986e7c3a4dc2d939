"""First run: download and quantization progress while the engine loads in a thread worker.

Only steps that happen are shown: a row appears with its first progress report.
"""

from __future__ import annotations

import time

from rich.markup import escape
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, Label, ProgressBar, Static

from parley.models.progress import Progress


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def human_duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}m {seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def error_hint(error: BaseException) -> str:
    """What the user can do about a load failure."""
    text = f"{type(error).__name__}: {error}".lower()
    if isinstance(error, MemoryError) or "out of memory" in text:
        return "Not enough memory: try a smaller model (--model) or INT4 weights (--quant awq)."
    if isinstance(error, FileNotFoundError) or "no such file" in text:
        return "The model path does not exist: check --model (a hub id, a local folder or a .gguf file)."
    if isinstance(error, ConnectionError | TimeoutError) or any(
        w in text for w in ("connection", "resolve", "offline", "timed out", "network", "http")
    ):
        return ("Could not reach the Hugging Face hub: check your connection, or set HF_HUB_OFFLINE=1 to use "
                "the local cache, or pass --model with a local folder or .gguf file.")
    return "Try again (r), or start with another model: parley chat --model ORG/NAME or a local path."


QUANTIZE_PASSES = {"layer": "pass 1 of 2: each layer in turn",
                   "step": "pass 2 of 2: distilling the whole model"}

class LoadingScreen(Screen[None]):
    """Shows `Progress` reports (marshalled here by the app) and, on failure, the error and a way out."""

    class Retry(Message):
        """Load again (after an error)."""

    BINDINGS = [Binding("r", "retry", "Retry"), Binding("q", "app.quit", "Quit")]

    def __init__(self, model_ref: str | None) -> None:
        super().__init__()
        self.model_ref = model_ref
        self._failed = False
        self._download_samples: list[tuple[float, float]] = []  # (monotonic time, bytes done)
        self._early: list[Progress | BaseException] | None = []  # reports that came before the mount

    def on_mount(self) -> None:
        self.call_after_refresh(self._replay)  # a screen's children are composed after its Mount

    def _replay(self) -> None:
        early, self._early = self._early or [], None
        for item in early:
            if isinstance(item, BaseException):
                self.show_error(item)
            else:
                self.show_progress(item)

    def compose(self) -> ComposeResult:
        with Vertical(id="loading-box"):
            yield Static(f"Preparing {self.model_ref or 'the default model'}", id="loading-title", markup=False)
            with Vertical(id="download-step", classes="loading--step"):
                yield Label("Download", classes="loading--stage")
                yield ProgressBar(id="download-bar", show_eta=False)
                yield Label("", id="download-detail", classes="loading--detail", markup=False)
            with Vertical(id="quantize-step", classes="loading--step"):
                yield Label("Quantize (AWQ INT4)", id="quantize-stage", classes="loading--stage")
                yield ProgressBar(id="quantize-bar", show_eta=False)
                yield Label("", id="quantize-detail", classes="loading--detail", markup=False)
            yield Label("", id="load-detail", classes="loading--detail", markup=False)
            yield Static("", id="loading-error")
        yield Footer()

    def show_progress(self, p: Progress) -> None:
        if self._early is not None:
            self._early.append(p)
            return
        if p.stage in ("download", "quantize"):
            self.query_one(f"#{p.stage}-step").display = True
        if p.stage == "download":
            self._show_download(p)
        elif p.stage == "quantize":
            bar = self.query_one("#quantize-bar", ProgressBar)
            bar.update(total=p.total or None, progress=p.done)
            # Two passes, each with its own count: say which, or "step 1 of 32" after "layer 30 of 30" puzzles.
            if p.total and p.unit in QUANTIZE_PASSES:
                self.query_one("#quantize-stage", Label).update(f"Quantize (AWQ INT4) · {QUANTIZE_PASSES[p.unit]}")
            if p.total and p.unit == "layer":
                detail = f"layer {int(p.done)} of {int(p.total)}"
                if p.eta_s is not None:
                    detail += f" · ETA {human_duration(p.eta_s)}"
            else:  # the distillation's steps, or a stage without a count: their own words, ETA included
                detail = p.detail or "working…"
            self.query_one("#quantize-detail", Label).update(detail)
        else:
            self.query_one("#load-detail", Label).update(p.detail or f"{p.stage}…")

    def _show_download(self, p: Progress) -> None:
        bar = self.query_one("#download-bar", ProgressBar)
        bar.update(total=p.total or None, progress=p.done)
        now = time.monotonic()
        self._download_samples = [s for s in self._download_samples if now - s[0] < 5.0] + [(now, p.done)]
        detail = human_bytes(p.done) + (f" / {human_bytes(p.total)}" if p.total else "")
        (t0, d0), (t1, d1) = self._download_samples[0], self._download_samples[-1]
        if t1 > t0 and d1 > d0:
            rate = (d1 - d0) / (t1 - t0)
            detail += f" · {human_bytes(rate)}/s"
            if p.total and p.eta_s is None:
                detail += f" · ETA {human_duration((p.total - p.done) / rate)}"
        if p.eta_s is not None:
            detail += f" · ETA {human_duration(p.eta_s)}"
        if p.detail:
            detail += f" · {p.detail}"
        self.query_one("#download-detail", Label).update(detail)

    def show_error(self, error: BaseException) -> None:
        if self._early is not None:
            self._early.append(error)
            return
        self._failed = True
        for bar in self.query(ProgressBar).results(ProgressBar):  # an unknown total animates: stop it
            if bar.total is None:
                bar.update(total=1, progress=0)
        self.query_one("#loading-error", Static).update(
            f"[b]Could not load the model[/b]\n{type(error).__name__}: {escape(str(error))}\n\n"
            f"{escape(error_hint(error))}\n"
            "Press r to retry or q to quit."
        )
        self.add_class("-failed")
        self.refresh_bindings()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "retry":
            return self._failed
        return True

    def action_retry(self) -> None:
        self._failed = False
        self.remove_class("-failed")
        self.query_one("#loading-error", Static).update("")
        self.refresh_bindings()
        self.post_message(self.Retry())  # bubbles up to the app, which owns the loading
