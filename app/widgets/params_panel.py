"""The live sampling panel: every control writes straight into the shared `GenerationParams`.

The engine snapshots that object at the start of each round, so a change made while a reply streams
takes effect from the next round. The panel says so ("from token N") and flashes. A backend that cannot
honour a parameter greys its control out with the reason (`Capabilities.unsupported`).
"""

from __future__ import annotations

from dataclasses import dataclass

from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.message import Message
from textual.widgets import Input, Label, Select, Static

from parley.app.widgets.slider import Slider
from parley.engine.params import KV_CACHE_CHOICES, SPECULATION_MODES, TEMPERATURE_MAX, GenerationParams
from parley.engine.protocol import Capabilities

# Repetition control (llama.cpp / OpenAI semantics); read with these defaults until every engine has them.
REPETITION_DEFAULTS = {"repeat_penalty": 1.0, "repeat_last_n": 64, "frequency_penalty": 0.0, "presence_penalty": 0.0}


def param(params: GenerationParams, attr: str) -> object:
    return getattr(params, attr, REPETITION_DEFAULTS.get(attr))


@dataclass(frozen=True)
class SliderSpec:
    attr: str
    label: str
    minimum: float
    maximum: float
    step: float
    off_at: float | None = None  # the value meaning "off", shown as such


SLIDERS = (
    SliderSpec("temperature", "Temperature", 0.0, TEMPERATURE_MAX, 0.05),
    SliderSpec("top_p", "Top-p", 0.05, 1.0, 0.01, off_at=1.0),
    SliderSpec("top_k", "Top-k", 0, 100, 1, off_at=0),
    SliderSpec("min_p", "Min-p", 0.0, 0.5, 0.01, off_at=0.0),
    SliderSpec("repeat_penalty", "Repeat penalty", 1.0, 2.0, 0.05, off_at=1.0),
    SliderSpec("repeat_last_n", "Repeat window", 0, 1024, 16),
    SliderSpec("frequency_penalty", "Frequency penalty", 0.0, 2.0, 0.05, off_at=0.0),
    SliderSpec("presence_penalty", "Presence penalty", 0.0, 2.0, 0.05, off_at=0.0),
    SliderSpec("draft_tokens", "Draft length", 1, 16, 1),
)
SPECULATION_LABELS = {"off": "Off", "prompt-lookup": "Prompt lookup", "suffix": "Suffix match",
                      "suffix-tree": "Suffix tree", "draft": "Draft model", "auto": "Auto"}
# What each choice does, in one line (the answer is the same whichever is chosen: only the speed differs).
SPECULATION_HELP = {
    "off": "One token per pass of the model.",
    "prompt-lookup": "Guesses the next words by copying from the conversation; fast on code and quotes.",
    "suffix": "Guesses from everything said so far (your pastes and its own replies), ranked by how often it recurred.",
    "suffix-tree": "As suffix match, checking two or three candidates at once where the next word is in doubt.",
    "draft": "A small draft model guesses ahead; the model keeps the guesses it agrees with.",
    "auto": "Uses the draft model if one is loaded, else prompt lookup; turns itself off if it slows down.",
}
NO_DRAFT = "Draft model: none is loaded (start with --draft MODEL, e.g. --draft self)."


def format_value(spec: SliderSpec, value: float) -> str:
    if spec.off_at is not None and value == spec.off_at:
        return "off"
    return f"{value:.2f}" if isinstance(value, float) else str(value)


class ParamsPanel(VerticalScroll):
    """Sliders and inputs bound to one live `GenerationParams` object."""

    class Changed(Message):
        """The user changed a parameter (the app keeps it for the next start)."""

        def __init__(self, attr: str, value: object) -> None:
            super().__init__()
            self.attr = attr
            self.value = value

    def __init__(self, params: GenerationParams, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.params = params
        # Tokens of the streaming reply (None between replies), so the panel can say where a change lands.
        self.live_tokens: int | None = None
        self.live_params = True  # False: the backend reads parameters once per reply
        self.has_draft: bool | None = None  # None: unknown (a remote server decides)
        self._pending: tuple[str, object, int] | None = None  # a change made mid-reply, not yet seen applied
        self._ready = False

    def compose(self) -> ComposeResult:
        yield Static("Sampling · live", id="panel-title", classes="panel--title")
        recommended = Static("", id="recommended", classes="param--help")
        recommended.display = False  # until a model recommends values
        yield recommended
        for spec in SLIDERS:
            value = param(self.params, spec.attr)
            yield Label(self._label_text(spec, value), id=f"label-{spec.attr}", classes="param--label")
            yield Slider(value, minimum=spec.minimum, maximum=spec.maximum, step=spec.step,
                         id=f"slider-{spec.attr}")
        yield Label("Speculation", classes="param--label")
        yield Select(self._speculation_options(), value=self.params.speculation,
                     allow_blank=False, id="speculation", compact=True)
        yield Static(self._speculation_help(), id="speculation-help", classes="param--help")
        yield Label("KV cache (next reply)", classes="param--label")
        yield Select([(k, k) for k in KV_CACHE_CHOICES], value="auto", allow_blank=False,
                     id="kv-cache", compact=True)
        yield Label("Seed", classes="param--label")
        yield Input("" if self.params.seed is None else str(self.params.seed), placeholder="random",
                    type="integer", id="seed", compact=True)
        yield Label("Max tokens", classes="param--label")
        yield Input(str(self.params.max_new_tokens), type="integer", id="max-tokens", compact=True)
        yield Static("", id="applied")

    def on_mount(self) -> None:
        # Widgets post Changed for their initial values; only react to the user's changes.
        self.call_after_refresh(self._set_ready)

    def _set_ready(self) -> None:
        self._ready = True

    def _speculation_options(self) -> list[tuple[str, str]]:
        """Every mode, but "Draft model" only when a draft model is there to run."""
        return [(SPECULATION_LABELS[m], m) for m in SPECULATION_MODES if m != "draft" or self.has_draft is not False]

    def _speculation_help(self) -> str:
        line = SPECULATION_HELP.get(self.params.speculation, "")
        return f"{line}\n{NO_DRAFT}" if self.has_draft is False else line

    def set_draft_model(self, loaded: bool | None) -> None:
        """Offer "Draft model" only with one loaded; say why not otherwise. A saved choice of it falls back to
        auto (which would run the same drafter: prompt lookup) rather than running silently without one."""
        self.has_draft = loaded
        select = self.query_one("#speculation", Select)
        if loaded is False and self.params.speculation == "draft":
            self.params.speculation = "auto"
        select.set_options(self._speculation_options())
        select.value = self.params.speculation
        self.query_one("#speculation-help", Static).update(self._speculation_help())

    def show_recommended(self, values: dict[str, float | int], source: str) -> None:
        """'temperature 0.2 · top-p 0.9 · from SmolLM2's model card': the model's values in use, and whence."""
        labels = {s.attr: s.label.lower() for s in SLIDERS}
        words = [f"{labels.get(k, k)} {v:g}" for k, v in values.items()]
        line = f"{' · '.join(words)} · {source}" if words and source else ""
        self.query_one("#recommended", Static).update(line)
        self.query_one("#recommended", Static).display = bool(line)

    @staticmethod
    def _label_text(spec: SliderSpec, value: float) -> str:
        return f"{spec.label}  {format_value(spec, value)}"

    def set_capabilities(self, capabilities: Capabilities) -> None:
        """Grey out what the backend ignores, with its reason; say when changes wait for the next reply."""
        for spec in SLIDERS:
            reason = capabilities.unsupported.get(spec.attr)
            slider = self.query_one(f"#slider-{spec.attr}", Slider)
            label = self.query_one(f"#label-{spec.attr}", Label)
            slider.disabled = reason is not None
            slider.tooltip = reason
            label.tooltip = reason
            text = self._label_text(spec, param(self.params, spec.attr))
            label.update(f"{spec.label}  n/a: {reason}" if reason else text)
        for attr, widget_id in (("speculation", "#speculation"), ("kv_cache", "#kv-cache"), ("seed", "#seed"),
                                ("max_new_tokens", "#max-tokens")):
            reason = capabilities.unsupported.get(attr)
            widget = self.query_one(widget_id)
            widget.disabled = reason is not None
            widget.tooltip = reason
        self.live_params = capabilities.live_params
        title = "Sampling · live" if self.live_params else "Sampling · from the next reply"
        self.query_one("#panel-title", Static).update(title)
        if not self.live_params and capabilities.live_params_note:
            self.query_one("#panel-title", Static).tooltip = capabilities.live_params_note

    def show_values(self) -> None:
        """Show the live object's values (after a reset or a conversation's own values were loaded).

        The controls then post Changed with values the object already holds, which `_apply` ignores.
        """
        for spec in SLIDERS:
            value = param(self.params, spec.attr)
            slider = self.query_one(f"#slider-{spec.attr}", Slider)
            slider.value = value
            if not slider.disabled:  # a greyed-out one keeps saying why
                self.query_one(f"#label-{spec.attr}", Label).update(self._label_text(spec, value))
        if self.has_draft is False and self.params.speculation == "draft":
            self.params.speculation = "auto"
        self.query_one("#speculation", Select).value = self.params.speculation
        self.query_one("#speculation-help", Static).update(self._speculation_help())
        self._pending = None
        self.query_one("#applied", Static).update("")  # a note about the values just replaced is stale
        self.query_one("#seed", Input).value = "" if self.params.seed is None else str(self.params.seed)
        self.query_one("#max-tokens", Input).value = str(self.params.max_new_tokens)

    def on_slider_changed(self, event: Slider.Changed) -> None:
        event.stop()
        spec = next(s for s in SLIDERS if f"slider-{s.attr}" == event.slider.id)
        self.query_one(f"#label-{spec.attr}", Label).update(self._label_text(spec, event.value))
        self._apply(spec.attr, event.value)

    def on_select_changed(self, event: Select.Changed) -> None:
        event.stop()
        if event.select.id == "kv-cache":
            engine = getattr(self.app, "engine", None)
            if self._ready and event.value in KV_CACHE_CHOICES and hasattr(engine, "set_kv_cache"):
                engine.set_kv_cache(event.value)  # the engine's choice, not a live parameter: from the next reply
        elif event.value in SPECULATION_MODES:
            self._apply("speculation", event.value)
            self.query_one("#speculation-help", Static).update(self._speculation_help())

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        text = event.value.strip()
        if event.input.id == "seed":
            self._apply("seed", int(text) if text.lstrip("-").isdigit() else None)
        elif event.input.id == "max-tokens" and text.isdigit() and int(text) >= 1:
            self._apply("max_new_tokens", int(text))

    def _apply(self, attr: str, value: object) -> None:
        """Write into the live object now; the engine reads it at its next round."""
        if param(self.params, attr) == value:
            return
        setattr(self.params, attr, value)
        if not self._ready:
            return
        at = self.live_tokens
        if at is None:
            self._pending = None
            self._show(f"{attr} = {value} · applies to the next reply")
        elif not self.live_params:
            self._pending = None
            self._show(f"{attr} = {value} · applies from the next reply (this backend reads it once a reply)")
        else:
            self._pending = (attr, value, at)
            self._show(f"{attr} = {value} · next round (after token {at})")
        self.post_message(self.Changed(attr, value))

    def _show(self, text: str) -> None:
        self.query_one("#applied", Static).update(text)
        self.add_class("-flash")
        self.set_timer(0.6, lambda: self.remove_class("-flash"))

    def reply_progress(self, tokens: int | None) -> None:
        """Called by the app as a reply advances (None when it ends); confirms a mid-reply change."""
        self.live_tokens = tokens
        if self._pending is None:
            return
        attr, value, at = self._pending
        if tokens is not None and tokens > at:
            # The engine snapshots the params at each round, so the tokens after `at` come from rounds
            # that read the new value (all but the round that was already running).
            self._pending = None
            self._show(f"{attr} = {value} · applied after token {at}")
        elif tokens is None:
            self._pending = None
