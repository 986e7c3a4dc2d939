"""Prepare a loaded model for the device it runs on: the one place that decides a model's fast path.

The target, every kind of draft model and the benches call `prepare_for_device`, so a model decodes the
same way whichever of them loaded it. On the CPU that is the native step (one call per pass); where the
native step cannot run, the PyTorch path gets the int8 head over INT4 models (FastHead) and, for fp32
models on the CPU, linears stored [in, out] (TransposedLinear). The model definition is never changed
for the native step: it is returned, and `CachedModel` runs it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from torch import Tensor, nn

from . import native_cache
from .native_step import NativeStep, NativeUnavailable
from .progress import ProgressFn
from .quantize.int4_linear import Int4Linear
from .transformer import Transformer

log = logging.getLogger(__name__)


def is_int4(model: nn.Module) -> bool:
    return any(isinstance(m, Int4Linear) for m in model.modules())


def prepare_for_device(model: Transformer, *, native: bool = True, place: native_cache.Place | None = None,
                       progress: ProgressFn | None = None,
                       calibration: Callable[[], Tensor] | None = None) -> NativeStep | None:
    """Make `model` fast on its device; returns the native step when it runs on one (else None).

    Idempotent: a model sharing already prepared modules (a self-draft's layers) is left as it is.
    `native=False` keeps the PyTorch path (e.g. a bench that must run the modules themselves).
    `place`: where the native step's repacked weights are cached (`native_cache.place_of`).
    `calibration`: token ids [n, T] of real text, asked for only when a 4-bit head is packed (GPTQ rounds it
    against the model's hidden states on them, else it is rounded to nearest). The head of an INT4 model is
    int8 rows; PARLEY_HEAD_BITS=4 opts into the 4-bit head (docs/quantization.md, "The output head").
    """
    weight = model.norm.weight
    int4 = is_int4(model)
    if native and weight.device.type == "cpu":
        head_bits = 8 if int4 else 32
        if int4 and os.environ.get("PARLEY_HEAD_BITS") == "4":
            head_bits = 4
        gram = None
        if head_bits == 4 and calibration is not None:
            from .quantize.head4 import final_hidden_gram

            def gram() -> Tensor:
                return final_hidden_gram(model, calibration())
        try:
            return NativeStep.for_model(model, head_bits=head_bits, place=place,
                                        progress=progress, head_gram=gram)
        except NativeUnavailable as e:
            log.info("the native CPU step is off for this model (%s): the PyTorch path runs", e)
    if int4 and isinstance(model.lm_head, nn.Linear):  # an nn.Linear, or one read on use
        from .quantize.head import FastHead

        model.lm_head = FastHead(model.lm_head.weight)
    elif not int4 and weight.device.type == "cpu":
        from .transposed_linear import transpose_linears

        transpose_linears(model)
    return None
