"""First run without the wait: chat on the unquantized weights while AWQ INT4 is made in the background.

`load` starts the INT4 load on a thread. When the cache already has the model, that is all (a few
seconds). When it has to quantize, `load` returns a stand-in instead, at once, and `upgrade` later returns
the INT4 engine, for the app to switch to between replies. The stand-in is the unquantized model, or, with
`file_int4_first` and a .gguf whose weights already are 4-bit, those weights on the INT4 kernels
(`--quant gguf`: no quantization, INT4 speed from the first reply); the status bar says which runs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from parley.engine.protocol import EngineLike
from parley.models.progress import Progress, ProgressFn

Load = Callable[[str, ProgressFn | None], EngineLike]  # (quant, progress) -> engine


class QuantizeInBackground:
    """The app's `load_engine` and `upgrade_engine` for `--quant awq`, over `load(quant, progress)`."""

    def __init__(self, load: Load, quant: str = "awq", file_int4_first: bool = False) -> None:
        self._load = load
        self.quant = quant
        self.file_int4_first = file_int4_first
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
        self._sink = progress
        # A daemon thread: quitting does not wait for a quantization (the cache is written atomically).
        threading.Thread(target=self._load_int4, name="parley-awq", daemon=True).start()
        self._changed.wait()
        if not self._quantizing:  # finished (or failed) without quantizing: the cache had it
            if self._error is not None:
                raise self._error
            assert self._engine is not None
            return self._engine
        self.background = True
        self._sink = None  # until `upgrade` asks for it: the chat opens while AWQ runs
        if self.file_int4_first:
            from parley.models.errors import ModelLoadError

            try:
                return self._load("gguf", progress)
            except ModelLoadError:  # not a .gguf, or none of its weights is 4-bit: the unquantized model
                pass
        return self._load("none", progress)

    def upgrade(self, progress: ProgressFn | None) -> EngineLike | None:
        """The INT4 engine once it is ready (None when the first engine already was INT4)."""
        if not self.background:
            return None
        self._sink = progress
        if progress is not None and self._last is not None:
            progress(self._last)
        self._finished.wait()
        if self._error is not None:
            raise self._error
        return self._engine

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
        if sink is not None and not (p.stage == "quantize" and not self.background):
            sink(p)
