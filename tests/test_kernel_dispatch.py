"""`parley.kernels` picks its path by device, and PARLEY_KERNELS=reference forces the reference."""

from __future__ import annotations

import pytest
import torch

from parley import kernels
from parley.kernels import reference


def awq_weight(K: int = 128, N: int = 32, group_size: int = 64):
    gen = torch.Generator().manual_seed(0)
    qweight = torch.randint(-(2**31), 2**31 - 1, (K, N // 8), dtype=torch.int32, generator=gen)
    qzeros = torch.randint(-(2**31), 2**31 - 1, (K // group_size, N // 8), dtype=torch.int32, generator=gen)
    scales = torch.rand(K // group_size, N, generator=gen) * 0.02
    return qweight, qzeros, scales, group_size


def test_reference_is_forced_by_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARLEY_KERNELS", "reference")
    weight = awq_weight()
    x = torch.randn(3, 128)
    assert kernels.backend("cpu") == "reference"
    assert isinstance(kernels.prepare(*weight), kernels.ReferenceInt4Linear)
    assert torch.equal(kernels.int4_linear(x, *weight), reference.int4_linear(x, *weight))
    assert isinstance(kernels.prepare_head(torch.randn(64, 128)), kernels.DenseHead)


def test_cpu_weights_take_the_cpu_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PARLEY_KERNELS", raising=False)
    assert kernels.backend("cpu") == "cpu"
    assert isinstance(kernels.prepare(*awq_weight()), kernels.CpuInt4Linear)
    assert isinstance(kernels.prepare_head(torch.randn(64, 128)), kernels.CpuInt8Linear)


def test_cuda_weights_take_the_triton_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PARLEY_KERNELS", raising=False)
    assert kernels.backend("cuda") == "triton"
    if torch.cuda.is_available():
        weight = [t.cuda() if isinstance(t, torch.Tensor) else t for t in awq_weight()]
        assert isinstance(kernels.prepare(*weight), kernels.TritonInt4Linear)


def test_cpu_group_size_without_a_fast_path_falls_back_to_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PARLEY_KERNELS", raising=False)
    weight = awq_weight(group_size=16)
    assert isinstance(kernels.prepare(*weight), kernels.ReferenceInt4Linear)


def test_unknown_setting_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARLEY_KERNELS", "fast")
    with pytest.raises(ValueError, match="PARLEY_KERNELS"):
        kernels.backend("cpu")
