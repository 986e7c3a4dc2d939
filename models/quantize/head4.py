"""The 4-bit output head, rounded by GPTQ against the model's own final hidden states.

Why: where the head is most of the bytes a token reads (Gemma 3 270M: 262,144 x 640, 168 MB as int8 rows
against ~56 MB for every INT4 layer), INT4 groups of 64 read ~0.55 bytes per weight instead of ~1. Rounded to
nearest they cost Gemma 3 +8.7% perplexity (the head alone, fp final hidden states of the held-out texts);
the head's inputs are far from isotropic (the Gram matrix's largest diagonal entry is ~180x its median), so
GPTQ, which pushes each column's rounding error onto the columns not yet rounded through that matrix, keeps
the products it is actually used for: +0.9% there, at the same bits. As the engine runs it (INT4 layers,
`bench quality --kernels auto`) it is +3.5% over the int8 head (round to nearest: +9.8%), so it stays opt-in
(PARLEY_HEAD_BITS=4; docs/quantization.md, "The output head"). The Gram matrix comes from running the quantized model
itself over the built-in calibration corpus (not the held-out texts), once: the packed head is cached with
the native layout (models/native_cache.py).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ..transformer import Transformer
from .gptq import gptq_round

CALIBRATION = (16, 256)  # samples x tokens of the built-in corpus for the Gram matrix (4,096 tokens)
ROWS = 32768  # output rows rounded at a time (GPTQ treats rows independently): bounded temporaries


def head_calibration(tokenizer) -> Tensor:
    """Token ids [n, T] of the built-in calibration corpus (offline, and not the benches' held-out texts)."""
    from .calibration import load_calibration

    return load_calibration(tokenizer.encode, *CALIBRATION, "builtin").tokens


@torch.inference_mode()
def final_hidden_gram(model: Transformer, tokens: Tensor) -> Tensor:
    """X^T X [dim, dim] (float64) of the head's inputs, the final-norm outputs, over `tokens` [n, T]."""
    seen: list[Tensor] = []
    hook = model.layers[-1].register_forward_hook(lambda mod, args, out: seen.append(out[0]))
    try:
        gram = torch.zeros(model.config.dim, model.config.dim, dtype=torch.float64)
        for row in tokens:
            model(row[None], torch.arange(row.numel())[None], model.new_cache(row.numel()), last_only=True)
            x = model.norm(seen.pop()).double()  # last_only: the head ran on one row, the norm here on all
            gram += x.t() @ x
    finally:
        hook.remove()
        for m in model.modules():  # the PyTorch kernels' repacked copies, made for these passes only
            if hasattr(m, "_prepared"):
                m._prepared = None
    return gram


def gptq_head(weight: Tensor, gram: Tensor, group: int,
              progress: Callable[[int, int], None] | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """weight [N, K] -> (q [K, N] in 0..15, zeros [K/group, N], scales [K/group, N] fp16-exact), the layout
    `kernels.native.pack_q4` takes, W ~ (q - zeros) * scales."""
    parts = []
    for i, rows in enumerate(weight.detach().float().split(ROWS)):
        if progress is not None:
            progress(i * ROWS, weight.shape[0])
        q, scales, zeros = gptq_round(rows, gram.float(), group)
        parts.append((q.t(), zeros.t(), scales.t()))
    return tuple(torch.cat([p[j] for p in parts], dim=1).contiguous() for j in range(3))  # type: ignore[return-value]
