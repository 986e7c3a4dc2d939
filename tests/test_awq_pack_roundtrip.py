"""Packing into the AutoAWQ GEMM layout, checked against a dequantizer written here from the format's
description (plain Python over the int32 words), independent of pack.py and kernels/reference.py."""

import pytest
import torch

from parley.kernels.reference import dequantize as reference_dequantize
from parley.models.quantize.pack import group_params, pack_columns, quantize_int, quantize_weight

# nibble i of a word holds output column 8c + ORDER[i] (AutoAWQ's interleaving)
ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def unpack_words(packed: torch.Tensor) -> list[list[int]]:
    rows = []
    for word_row in packed.tolist():
        values = []
        for word in word_row:
            u = word & 0xFFFFFFFF  # the int32's bits, unsigned
            block = [0] * 8
            for i in range(8):
                block[ORDER[i]] = (u >> (4 * i)) & 0xF
            values += block
        rows.append(values)
    return rows


def dequantize_independent(qweight, qzeros, scales, group_size) -> torch.Tensor:
    """-> the weight as nn.Linear holds it, [out, in]."""
    q, z = unpack_words(qweight), unpack_words(qzeros)
    s = scales.float().tolist()
    n_in, n_out = len(q), len(q[0])
    w = [[(q[i][o] - z[i // group_size][o]) * s[i // group_size][o] for i in range(n_in)] for o in range(n_out)]
    return torch.tensor(w)


def test_known_word():
    # columns 0..7 holding the values 0..7 pack to 0x75316420, the order AutoAWQ writes
    assert pack_columns(torch.arange(8)[None]).item() == 0x75316420
    # the top nibble set makes a negative int32, which must still unpack
    assert unpack_words(pack_columns(torch.full((1, 8), 15)))[0] == [15] * 8


@pytest.mark.parametrize("out_f,in_f,group", [(8, 32, 32), (24, 96, 32), (40, 192, 64), (72, 384, 128)])
def test_roundtrip_odd_shapes(out_f, in_f, group):
    torch.manual_seed(out_f + in_f)
    w = torch.randn(out_f, in_f) * torch.rand(1, in_f) * 3
    qweight, qzeros, scales = quantize_weight(w, group)
    assert qweight.dtype == torch.int32 and qweight.shape == (in_f, out_f // 8)
    assert qzeros.dtype == torch.int32 and qzeros.shape == (in_f // group, out_f // 8)
    assert scales.dtype == torch.float16 and scales.shape == (in_f // group, out_f)

    # the packed integers are exactly the quantizer's integers
    s, z = group_params(w, group)
    q = quantize_int(w, s, z, group)
    assert unpack_words(qweight) == q.t().tolist()
    assert unpack_words(qzeros) == z.t().to(torch.int64).tolist()

    deq = dequantize_independent(qweight, qzeros, scales, group)
    # round to nearest on the group's grid: within half a step of the original weight
    step = scales.float().t().repeat_interleave(group, 1)
    assert ((deq - w).abs() <= step / 2 + 1e-6).all()
    # the kernels' reference reads the same layout the same way
    torch.testing.assert_close(reference_dequantize(qweight, qzeros, scales.float(), group).t(), deq)


def test_clipping_bounds_the_grid():
    torch.manual_seed(0)
    w = torch.randn(16, 64)
    bound = w.reshape(16, 2, 32).abs().amax(-1) * 0.5
    deq = dequantize_independent(*quantize_weight(w, 32, bound), 32)
    # the grid spans [-bound, bound], shifted by at most half a step by the integer zero point
    limit = bound.repeat_interleave(32, 1) * (1 + 1 / 15) + 1e-4
    assert (deq.abs() <= limit).all()
    assert deq.abs().amax() < w.abs().amax() * 0.6
