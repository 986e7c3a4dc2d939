"""The output projection of a quantized model, through the kernels' fast head.

AWQ leaves the head in floating point, but on this model it is a 49,152 x 576 matrix read once per token:
in fp32 it costs as much as a third of a 4-bit decode step. A weight-only int8 copy (per-row scales) is
several times faster on CPU and moves perplexity by < 0.1% (`parley bench kernels --head-accuracy`).
"""

from __future__ import annotations

from torch import Tensor, nn

from ... import kernels


class FastHead(nn.Module):
    def __init__(self, weight: Tensor, bits: int = 8) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.bits = bits
        self.prepared = kernels.prepare_head(weight, bits)

    def forward(self, x: Tensor) -> Tensor:
        return self.prepared.matmul(x)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, bits={self.bits}"
