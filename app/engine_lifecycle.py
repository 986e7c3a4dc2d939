"""Loading and switching engines: the first load, its progress screen, and a better engine made later.

Loading (maybe downloading and quantizing) runs on a worker thread; progress is throttled and marshalled
to the UI thread. An upgrade (e.g. AWQ INT4 after a first run on the unquantized weights) is made in the
background and switched to between replies, never mid-reply.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable

from textual.app import App
from textual.message import Message
from textual.screen import Screen

from parley.app.first_run import CHOICE_KEY, QuantizeInBackground, model_key
from parley.app.screens.loading import LoadingScreen
from parley.app.screens.model_picker import RECENT_KEY, ModelPickerScreen, cached_models, remember
from parley.app.screens.weights_choice import WeightsChoiceScreen
from parley.app.settings import Settings
from parley.app.widgets.params_panel import ParamsPanel
from parley.app.widgets.status_bar import StatusBar, model_words
from parley.engine.protocol import EngineLike
from parley.models.progress import Progress, ProgressFn

EngineLoader = Callable[[ProgressFn | None], EngineLike]
# Another model, by reference (hub id, folder or .gguf), for a switch without restarting.
ModelLoader = Callable[[str, ProgressFn | None], EngineLike]
# A second, better engine made in the background (e.g. AWQ INT4 after a first run on the unquantized
# weights); None when there is nothing to upgrade to.
EngineUpgrade = Callable[[ProgressFn | None], EngineLike | None]

PROGRESS_INTERVAL_S = 0.1


def in_background(work: Callable[[], None], name: str) -> threading.Thread:
    """Run `work` on a daemon thread. Not a Textual thread worker: those run on asyncio's default executor,
    which `asyncio.run` joins when the app exits, so quitting would wait for a model load, a quantization or
    a prefill to finish (20 s and more). A daemon thread is dropped at exit; every cache write is atomic."""
    thread = threading.Thread(target=work, name=name, daemon=True)
    thread.start()
    return thread


def to_ui(app: App, callback: Callable[..., object], *args: object) -> None:
    """`app.call_from_thread`, a no-op once the app has gone (a background thread outlived it)."""
    with contextlib.suppress(RuntimeError):  # raised once the app is not running any more
        app.call_from_thread(callback, *args)


class ModelDefaults(Message):
    """An engine came in: its model's recommended sampling values, and where they come from (in words)."""

    def __init__(self, values: dict[str, float | int], source: str) -> None:
        super().__init__()
        self.values, self.source = values, source


class EngineReady(Message):
    """The first engine is in (or a retry's): back to the prompt, and measure what waited for it."""


class EngineLifecycle:
    """Owns the engine in use, the loading screen while one shows, and the engine waiting to be switched to.

    It draws on the status bar and the sampling panel it is mounted on, and says what happened by posting
    `EngineReady` to the screen it is mounted on."""

    def __init__(self, load_engine: EngineLoader, upgrade_engine: EngineUpgrade | None,
                 load_model: ModelLoader | None, *, settings: Settings, model_ref: str | None,
                 busy: Callable[[], bool], first_run: QuantizeInBackground | None = None) -> None:
        self.load_model = load_model
        self.settings = settings
        self.model_ref = model_ref
        self.busy = busy  # a reply is streaming: a new engine waits for its end
        self._load_engine = load_engine
        self._upgrade_engine = upgrade_engine
        self.first_run = first_run  # its `offer`: the choice of weights a 4-bit .gguf's first run asks for
        self.engine: EngineLike | None = None
        self.failed_load: BaseException | None = None  # the last load's error, while no engine is in
        self.loading: LoadingScreen | None = None  # shown only for real work: a download, a quantization
        self.next_engine: EngineLike | None = None  # ready in the background, switched to between replies
        self._attempt = 0  # a retry supersedes a load still running: only the latest attempt's result counts
        self._model = 0  # bumped by a switch of model: an INT4 upgrade of the model before it is dropped
        self.screen: Screen
        self.status: StatusBar
        self.panel: ParamsPanel

    @property
    def ui(self) -> App:
        """Textual's services that only the App has: pushing screens, calls from other threads."""
        return self.screen.app

    def mount(self, screen: Screen, status: StatusBar, panel: ParamsPanel) -> threading.Thread:
        """Post to `screen` and show on `status` and `panel` from now on, and start the first load."""
        self.screen, self.status, self.panel = screen, status, panel
        return self.load()

    def close(self) -> None:
        """The screen is going: loads and switches still running are dropped when they end."""
        self._attempt += 1
        self._model += 1

    def load(self) -> threading.Thread:
        """Load on a background thread; a new load (a retry) replaces one still running."""
        self._attempt += 1
        attempt = self._attempt
        ui = self.ui  # read here: a widget finds its app only on the UI thread
        return in_background(lambda: self._load(attempt, ui), "parley-load")

    def _load(self, attempt: int, ui: App) -> None:
        try:
            engine = self._load_engine(self._throttled(self._show_progress, ui))
        except Exception as error:  # shown to the user with what to do
            to_ui(ui, self._load_failed, attempt, error)
        else:
            to_ui(ui, self._engine_ready, attempt, engine)

    @staticmethod
    def _throttled(show: Callable[[Progress], None], ui: App) -> ProgressFn:
        """Progress from a worker thread, at most ~10 a second but never dropping a new stage, a new count (the
        quantizer's second pass counts steps after its layers) or an end."""
        last, last_kind = 0.0, ("", "")

        def progress(p: Progress) -> None:
            nonlocal last, last_kind
            now = time.monotonic()
            finished = bool(p.total) and p.done >= p.total
            if now - last >= PROGRESS_INTERVAL_S or finished or (p.stage, p.unit) != last_kind:
                last, last_kind = now, (p.stage, p.unit)
                to_ui(ui, show, p)

        return progress

    def _show_progress(self, p: Progress) -> None:
        # The progress screen appears only for real work (a download, a quantization), not a plain load.
        if self.loading is None and p.stage in ("download", "quantize") and self.engine is None:
            self.loading = LoadingScreen(self.model_ref)
            self.ui.push_screen(self.loading)
            self.screen.refresh_bindings()
        if self.loading is not None:
            self.loading.show_progress(p)
        elif p.detail:
            self.status.model = f"loading: {p.detail}"

    def _load_failed(self, attempt: int, error: BaseException) -> None:
        if attempt != self._attempt:
            return
        self.failed_load = error  # the exit status says the model did not load
        if self.loading is None:
            self.loading = LoadingScreen(self.model_ref)
            self.ui.push_screen(self.loading)
        self.loading.show_error(error)

    def _engine_ready(self, attempt: int, engine: EngineLike) -> None:
        if attempt != self._attempt:
            return
        self.failed_load = None
        self._use_engine(engine)
        if self.loading is not None and self.loading.is_current:
            self.ui.pop_screen()
        self.loading = None
        self.screen.post_message(EngineReady())
        if engine.quantization.startswith("gguf-int4:"):  # say which weights run: the file's own, not Parley's
            self.status.notify(f"Running {model_words(engine.model_name, engine.quantization)}: the file's own "
                               "4-bit weights on the INT4 kernels, nothing quantized", timeout=10, markup=False)
        if self.first_run is not None and self.first_run.offer:
            self.ui.push_screen(WeightsChoiceScreen(engine.model_name, self.first_run.offer), self._chosen)
        if self._upgrade_engine is not None:
            self._upgrade()

    def _chosen(self, choice: str | None) -> None:
        """The first-run answer: remembered for this model, and told to the loader (`upgrade` waits on it)."""
        assert self.first_run is not None
        choice = choice or "gguf"
        choices = self.settings.get(CHOICE_KEY, {})
        self.settings.set(CHOICE_KEY, {**(choices if isinstance(choices, dict) else {}),
                                       model_key(self.model_ref): choice})
        self.first_run.choose(choice)
        if choice == "awq":
            self.status.background = "making INT4: starting"

    def _use_engine(self, engine: EngineLike) -> None:
        self.engine = engine  # a session knows the engine it was made with: the next reply makes a new one
        self.screen.refresh_bindings()
        self.status.model = engine.model_name
        self.status.quantization = engine.quantization
        self.status.context_window = engine.context_window
        self.panel.set_capabilities(engine.capabilities)
        values, source = getattr(engine, "sampling_defaults", None) or ({}, "")
        self.screen.post_message(ModelDefaults(dict(values), source))
        # A local engine says whether it has a draft model; a remote one (no such attribute) decides itself.
        self.panel.set_draft_model(getattr(engine, "draft", None) is not None if hasattr(engine, "draft") else None)

    def _upgrade(self) -> None:
        """Make the better engine in the background; switch to it between replies."""
        ui = self.ui
        in_background(lambda: self._make_upgrade(ui), "parley-upgrade")

    def _make_upgrade(self, ui: App) -> None:
        assert self._upgrade_engine is not None
        model = self._model
        try:
            engine = self._upgrade_engine(self._throttled(self._show_upgrade_progress, ui))
        except Exception as error:
            to_ui(ui, self._upgrade_failed, error)
            return
        if engine is not None and model == self._model:
            to_ui(ui, self._upgrade_ready, engine)

    def _show_upgrade_progress(self, p: Progress) -> None:
        if self._model:  # another model was switched to: this upgrade no longer matters
            return
        if p.stage == "quantize" and p.total:
            self.status.background = f"making INT4: layer {int(p.done)} of {int(p.total)}"
        else:
            self.status.background = f"making INT4: {p.detail or p.stage}"

    def _upgrade_failed(self, error: BaseException) -> None:
        self.status.background = ""
        self.status.notify(f"INT4 quantization failed, staying on the unquantized model: {type(error).__name__}: "
                           f"{error}", severity="warning", timeout=15, markup=False)

    def _upgrade_ready(self, engine: EngineLike) -> None:
        self.next_engine = engine
        self.status.background = "INT4 ready: switching after this reply" if self.busy() else ""
        if not self.busy():
            self.switch_pending()

    def pick_model(self) -> None:
        """The model picker; the model picked is loaded in the background and switched to between replies."""
        if self.load_model is None:
            self.status.notify("Switching models works with the local engine, not with --server", severity="warning")
            return
        recent = self.settings.get(RECENT_KEY, [])
        recent = [r for r in recent if isinstance(r, str)] if isinstance(recent, list) else []

        def chosen(ref: str | None) -> None:
            if ref:
                self.switch_model(ref)

        self.ui.push_screen(ModelPickerScreen(self.status.model, recent, cached_models()), chosen)

    def switch_model(self, ref: str) -> None:
        """Load `ref` in the background while the chat goes on; switch to it between replies."""
        assert self.load_model is not None
        self._model += 1
        model, status, ui = self._model, self.status, self.ui
        status.background = f"loading {ref}…"

        def show(p: Progress) -> None:
            if model == self._model:
                done = f" {int(p.done)} of {int(p.total)}" if p.total and p.unit == "layer" else ""
                status.background = f"loading {ref}: {p.detail or p.stage}{done}"

        def load() -> None:
            try:
                engine = self.load_model(ref, self._throttled(show, ui))
            except Exception as error:  # the chat stays on the model it has
                to_ui(ui, self._switch_failed, model, ref, error)
            else:
                to_ui(ui, self._switch_ready, model, ref, engine)

        in_background(load, "parley-switch")

    def _switch_failed(self, model: int, ref: str, error: BaseException) -> None:
        if model == self._model:
            self.status.background = ""
            self.status.notify(f"Could not load {ref}: {type(error).__name__}: {error}. Staying on "
                               f"{self.status.model}.", severity="error", timeout=15, markup=False)

    def _switch_ready(self, model: int, ref: str, engine: EngineLike) -> None:
        if model != self._model:
            return
        self.model_ref = ref
        self.settings.set(RECENT_KEY, remember(self.settings.get(RECENT_KEY, []), ref))  # offered next time
        self.next_engine = engine
        self.status.background = f"{engine.model_name} ready: switching after this reply" if self.busy() else ""
        if not self.busy():
            self.switch_pending()

    def switch_pending(self) -> None:
        """Switch to the engine made in the background, if one is waiting: call only between replies."""
        engine, self.next_engine = self.next_engine, None
        if engine is None:
            return
        self.status.background = ""
        self._use_engine(engine)
        self.status.notify(f"Switched to {model_words(engine.model_name, engine.quantization)}: the next reply uses it")
