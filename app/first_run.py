"""First run without the wait: chat on the unquantized weights while AWQ INT4 is made in the background.

`load` starts the INT4 load on a thread. When the cache already has the model, that is all (a few
seconds). When it has to quantize, `load` returns the unquantized model instead, at once, and `upgrade`
later returns the INT4 engine, for the app to switch to between replies.

A .gguf whose weights already are 4-bit (`file_weights`, e.g. "Q4_1") starts on those weights on the INT4
kernels (`--quant gguf`: nothing quantized), and the first time, the app offers the choice (`offer`,
answered by `choose`): keep them, or make Parley's INT4 in the background and switch to it. The answer is
remembered (`choice`): "gguf" starts on the file's weights and never quantizes, "awq" as above.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from parley.engine.protocol import EngineLike
from parley.models.progress import Progress, ProgressFn

Load = Callable[[str, ProgressFn | None], EngineLike]  # (quant, progress) -> engine
CHOICE_KEY = "first_run_weights"  # settings: model ref -> "gguf" | "awq", the first-run choice remembered


def model_key(ref: str | None) -> str:
    return ref or "(default)"


def four_bit_gguf(ref: str | None) -> str | None:
    """The 4-bit types of a local .gguf model's decoder ("Q4_1"), or None (another model, or a default that
    is a hub download): read from the file's header, nothing dequantized."""
    from parley.models.errors import ModelLoadError
    from parley.models.gguf_weights import four_bit_types
    from parley.models.resolve import default_model_ref, embedded_model_path

    try:
        if ref is None:
            path = embedded_model_path() if default_model_ref() is None else None
        else:
            path = Path(ref).expanduser() if ref.endswith(".gguf") and Path(ref).expanduser().is_file() else None
        return four_bit_types(path) if path is not None else None
    except ModelLoadError:
        return None
Fits = Callable[[], str | None]  # None when the unquantized model fits beside the quantizer, else why not


class QuantizeInBackground:
    """The app's `load_engine` and `upgrade_engine` for `--quant awq`, over `load(quant, progress)`."""

    def __init__(self, load: Load, quant: str = "awq", file_weights: str | Callable[[], str | None] | None = None,
                 choice: str | None = None, stand_in: Fits | None = None) -> None:
        self._load = load
        self.quant = quant
        # the 4-bit types of a .gguf model's decoder ("Q4_1"), else None; a function is asked in `load`
        self.file_weights = file_weights
        self.choice = choice if choice in ("gguf", "awq") else None  # the remembered first-run answer
        self.offer: str | None = None  # the file's weights, while the first-run choice waits for `choose`
        self._chosen = threading.Event()
        self._started = False  # the INT4 load's thread is running (or has run)
        self._stand_in = stand_in
        self.waiting = False  # the unquantized model does not fit beside the quantizer: the first-run screen stays
        self.background = False  # True once the first engine is the stand-in and INT4 is still coming
        self._changed = threading.Event()  # the INT4 load finished or started to quantize
        self._quantizing = False
        self._engine: EngineLike | None = None
        self._error: BaseException | None = None
        self._finished = threading.Event()
        self._sink: ProgressFn | None = None  # where the INT4 load's progress goes now
        self._last: Progress | None = None

    def load(self, progress: ProgressFn | None) -> EngineLike:
        if self.quant != "awq":
            return self._load(self.quant, progress)
        if callable(self.file_weights):  # on the loading thread: it reads the file's header
            self.file_weights = self.file_weights()
        if self.file_weights and self.choice != "awq":
            engine = self._load("gguf", progress)  # at once: nothing to quantize
            if self.choice is None:  # the first run: the app asks, `upgrade` waits for the answer
                self.offer = self.file_weights
                self.background = True
            return engine
        self._start(progress)
        unfit = self._quantizing and self._stand_in is not None and not self.file_weights
        why = self._stand_in() if unfit else None
        if why is not None:  # no stand-in: the first-run screen shows the quantization, ETA and all, until it ends
            self.waiting = True
            if progress is not None:
                progress(Progress("quantize", 0, 0, "layer", f"{why}; the chat opens when INT4 is ready"))
                if self._last is not None:
                    progress(self._last)
            self._finished.wait()
        if not self._quantizing or self.waiting:  # finished (or failed): the cache had it, or we waited for it
            if self._error is not None:
                raise self._error
            assert self._engine is not None
            return self._engine
        self.background = True
        self._sink = None  # until `upgrade` asks for it: the chat opens while AWQ runs
        return self._load("gguf" if self.file_weights else "none", progress)  # the file's 4-bit weights, if any

    def choose(self, choice: str) -> None:
        """The first-run answer: "gguf" keeps the file's own weights (nothing quantized), "awq" makes
        Parley's INT4 in the background, for `upgrade` to return."""
        if choice not in ("gguf", "awq"):
            raise ValueError(f"choice {choice!r}: expected 'gguf' or 'awq'")
        self.choice, self.offer = choice, None  # the INT4 load starts on `upgrade`'s thread, not this one
        self._chosen.set()

    def upgrade(self, progress: ProgressFn | None) -> EngineLike | None:
        """The INT4 engine once it is ready (None when the first engine already was INT4, or the user keeps
        the file's own weights)."""
        if not self.background:
            return None
        if self.file_weights and self._engine is None and not self._finished.is_set() and not self._started:
            self._chosen.wait()  # the first-run choice, answered in the app
            if self.choice == "gguf":
                return None
            self._start(None)
        self._sink = progress
        if progress is not None and self._last is not None:
            progress(self._last)
        self._finished.wait()
        if self._error is not None:
            raise self._error
        return self._engine

    def _start(self, progress: ProgressFn | None) -> None:
        """The INT4 load on its thread; back once it has finished or started to quantize."""
        self._sink, self._started = progress, True
        # A daemon thread: quitting does not wait for a quantization (the cache is written atomically).
        threading.Thread(target=self._load_int4, name="parley-awq", daemon=True).start()
        self._changed.wait()

    def _load_int4(self) -> None:
        try:
            self._engine = self._load("awq", self._progress)
        except BaseException as error:  # handed to whoever waits: `load` or `upgrade`
            self._error = error
        finally:
            self._finished.set()
            self._changed.set()

    def _progress(self, p: Progress) -> None:
        self._last = p
        if p.stage == "quantize" and not self._quantizing:
            self._quantizing = True
            self._changed.set()
            return
        sink = self._sink
        if sink is not None and not (p.stage == "quantize" and not (self.background or self.waiting)):
            sink(p)


def stand_in_fits(files: object) -> str | None:
    """None when the model's unquantized weights (bf16 where this CPU multiplies bf16 natively, else fp32) fit in
    the memory available beside the quantizer's own (one fp32 layer several times over, and its calibration);
    otherwise a line saying what it needs."""
    from parley.models.loading import load_config
    from parley.models.quantize.methods import fast_cpu_bf16
    from parley.models.quantize.tiers import decoder_params
    from parley.models.weights_dtype import available_bytes

    config = load_config(files)
    per_weight = 2 if fast_cpu_bf16() else 4
    need = (decoder_params(config) + 2 * config.vocab_size * config.dim) * per_weight
    layer = decoder_params(config) / max(1, config.n_layers) * 4
    need += 8 * layer + (2 << 30)  # the quantizer: a layer in fp32 and its working copies, Gram matrices, activations
    free = available_bytes()
    if free is None or need <= free:
        return None
    return (f"the unquantized model needs {need / 2**30:.1f} GiB beside the quantizer and {free / 2**30:.1f} GiB "
            "is available")
