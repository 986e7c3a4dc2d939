"""A GGUF matrix is dequantized a block of rows at a time into its fp32 result (gguf's decoders make
temporaries the size of their input): the result equals gguf's dequantization of the whole tensor, for row
counts on, past and short of a block boundary, and for a row-less (1-D) tensor."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from parley.models import gguf_weights
from parley.models.gguf_weights import GGUFTensor, dequantize

T = gguf.GGMLQuantizationType
SEED = 11


@pytest.mark.parametrize("rows", [1, 16, 17, 50])
@pytest.mark.parametrize("kind", [T.Q8_0, T.Q4_0, T.F16])
def test_row_blocks_equal_the_whole_tensor(monkeypatch: pytest.MonkeyPatch, kind: T, rows: int) -> None:
    monkeypatch.setattr(gguf_weights, "DEQUANT_ROWS", 16)
    w = np.random.default_rng(SEED + rows).standard_normal((rows, 256)).astype(np.float32)
    data = gguf.quants.quantize(w, kind)
    got = dequantize(GGUFTensor("t", (rows, 256), kind, data), "t.gguf")
    want = torch.from_numpy(np.asarray(gguf.quants.dequantize(data, kind), dtype=np.float32))
    assert got.dtype == torch.float32 and got.shape == (rows, 256)
    assert torch.equal(got, want), f"seed={SEED + rows}"


def test_a_vector_is_dequantized_whole() -> None:
    v = np.arange(64, dtype=np.float32)
    got = dequantize(GGUFTensor("v", (64,), T.F32, v), "t.gguf")
    assert torch.equal(got, torch.from_numpy(v)) and got.data_ptr() != v.ctypes.data  # a copy, not the file's
