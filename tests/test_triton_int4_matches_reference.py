"""The Triton INT4 kernels agree with the plain dequantize-then-matmul reference.

Without a GPU the kernels run under TRITON_INTERPRET=1. That variable must be set before triton is
imported and must not leak into other tests, so the interpreted cases run in one child process (this file
run as a script) and each test reads its result. With CUDA the same cases also run natively, in-process.

The grid: every M x dtype on two layer shapes, plus a pairwise cover of K x N x group size (576 is not a
multiple of 128, so that pair cannot exist). Errors are relative to max|y| against an fp32 reference;
the bf16 tolerance also covers the interpreter, which truncates fp32 -> bf16 where GPUs round to nearest.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

HAS_TRITON = importlib.util.find_spec("triton") is not None
pytestmark = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}
TOLERANCE = {"float16": 3e-3, "bfloat16": 1.5e-2}  # ~ a few ulps of the output dtype, relative to max|y|

Case = tuple[int, int, int, int, str]  # M, K, N, group size, dtype
CASES: list[Case] = (
    [(m, 576, 192, 64, dt) for m in (1, 2, 5, 9, 33) for dt in DTYPES]
    + [(m, 1536, 576, 32, dt) for m in (1, 2, 5, 9, 33) for dt in DTYPES]
    + [
        (2, 576, 576, 64, "float16"),
        (9, 576, 1536, 64, "bfloat16"),
        (5, 1536, 192, 64, "bfloat16"),
        (33, 1536, 1536, 128, "float16"),
        (1, 1536, 576, 128, "bfloat16"),
        (9, 4096, 192, 128, "float16"),
        (1, 4096, 576, 32, "bfloat16"),
        (2, 4096, 1536, 128, "float16"),
        (33, 4096, 192, 64, "bfloat16"),
    ]
)
PREPARE_CASE = "prepare_fp32_3d"  # the fp32 [B, T, K] -> [B, T, N] wrapper around the kernels
SCRATCH_CASE = "split_k_scratch"  # what the split-K workspaces hold after every case has run


def case_id(case: Case) -> str:
    return "M{}-K{}-N{}-g{}-{}".format(*case)


def awq_weight(K: int, N: int, group_size: int, dtype: torch.dtype, device: str, seed: int):
    """Random AWQ tensors: every bit pattern of qweight/qzeros is a valid weight."""
    gen = torch.Generator().manual_seed(seed)
    qweight = torch.randint(-(2**31), 2**31 - 1, (K, N // 8), dtype=torch.int32, generator=gen)
    qzeros = torch.randint(-(2**31), 2**31 - 1, (K // group_size, N // 8), dtype=torch.int32, generator=gen)
    scales = torch.rand(K // group_size, N, generator=gen) * 0.02 + 0.001
    return qweight.to(device), qzeros.to(device), scales.to(dtype).to(device)


def relative_error(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.float() - ref).abs().max() / ref.abs().max()).item()


def case_error(case: Case, device: str) -> float:
    from parley.kernels import reference
    from parley.kernels.triton_int4 import int4_mm

    M, K, N, group_size, dtype_name = case
    dtype = DTYPES[dtype_name]
    qweight, qzeros, scales = awq_weight(K, N, group_size, dtype, device, seed=M * 7919 + K + N + group_size)
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(M + K)).to(dtype).to(device)
    y = int4_mm(x, qweight, qzeros, scales, group_size)
    assert y.dtype == dtype and y.shape == (M, N)
    ref = reference.int4_linear(x.float(), qweight, qzeros, scales.float(), group_size)
    return relative_error(y, ref)


def prepare_error(device: str) -> float:
    from parley.kernels import TritonInt4Linear, reference

    qweight, qzeros, scales = awq_weight(192, 208, 32, torch.float16, device, seed=1)
    x = torch.randn(2, 3, 192, device=device)
    y = TritonInt4Linear(qweight, qzeros, scales, 32).matmul(x)
    assert y.dtype == torch.float32 and y.shape == (2, 3, 208)
    ref = reference.int4_linear(x, qweight, qzeros, scales.float(), 32)
    return relative_error(y, ref)


def scratch_left(device: str) -> float:
    """The GEMV kernel must leave its shared split-K workspace and tickets zeroed for the next call."""
    from parley.kernels.triton_int4 import _workspaces

    scratch = [t for (dev, _), pair in _workspaces.items() if dev.type == device for t in pair]
    assert scratch, "no split-K workspace was used"
    return max(t.abs().max().item() for t in scratch)


def all_errors(device: str) -> dict[str, float]:
    errors = {case_id(case): case_error(case, device) for case in CASES}
    errors[PREPARE_CASE] = prepare_error(device)
    errors[SCRATCH_CASE] = scratch_left(device)
    errors.update(interpreted_config_errors())
    return errors


@pytest.fixture(scope="module")
def interpreted_errors() -> dict[str, float]:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


DEVICES = ["interpreted"] + (["cuda"] if torch.cuda.is_available() else [])


def measured_error(request: pytest.FixtureRequest, device: str, key: str, compute) -> float:
    """Run natively on CUDA; otherwise read the interpreted child's result."""
    if device == "cuda":
        return compute()
    return request.getfixturevalue("interpreted_errors")[key]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_kernel_matches_reference(case: Case, device: str, request: pytest.FixtureRequest) -> None:
    error = measured_error(request, device, case_id(case), lambda: case_error(case, "cuda"))
    assert error <= TOLERANCE[case[4]], f"relative error {error:.2e}"


@pytest.mark.parametrize("device", DEVICES)
def test_prepared_weight_takes_fp32_and_any_leading_shape(device: str, request: pytest.FixtureRequest) -> None:
    error = measured_error(request, device, PREPARE_CASE, lambda: prepare_error("cuda"))
    assert error <= TOLERANCE["float16"], f"relative error {error:.2e}"


@pytest.mark.parametrize("device", DEVICES)
def test_split_k_leaves_its_workspace_zeroed(device: str, request: pytest.FixtureRequest) -> None:
    if device == "cuda":
        for case in CASES:
            case_error(case, "cuda")
    assert measured_error(request, device, SCRATCH_CASE, lambda: scratch_left("cuda")) == 0


def config_errors(device: str, rows: int, configs: list | None = None) -> dict[str, float]:
    """The error of each given autotune config (default: all of them), launched directly, untuned.

    K = 576 with group 64 is not a multiple of the larger BLOCK_Ks (masking, per-row groups) and
    N = 584 not a multiple of any BLOCK_N; SPLIT_K = 32 leaves some splits with no K at all.
    """
    import triton

    from parley.kernels import reference, triton_int4

    K, N, group_size = 576, 584, 64
    qweight, qzeros, scales = awq_weight(K, N, group_size, torch.float16, device, seed=rows)
    x = torch.randn(rows, K, generator=torch.Generator().manual_seed(rows)).half().to(device)
    ref = reference.int4_linear(x.float(), qweight, qzeros, scales.float(), group_size)
    workspace, tickets = triton_int4.gemv_workspace(x.device, N)
    gemv = rows <= triton_int4.GEMV_MAX_ROWS
    errors = {}
    for config in configs or (triton_int4.GEMV_CONFIGS if gemv else triton_int4.GEMM_CONFIGS):
        meta = {**config.kwargs, "num_warps": config.num_warps, "num_stages": config.num_stages}
        out = torch.empty(rows, N, device=device, dtype=torch.float16)
        if gemv:
            grid = (triton.cdiv(N, meta["BLOCK_N"]), meta["SPLIT_K"])
            triton_int4._int4_gemv_kernel.fn[grid](
                x, qweight, qzeros, scales, out, workspace, tickets, rows, N, K, x.stride(0),
                GROUP_SIZE=group_size, BLOCK_M=1 if rows == 1 else 16, UPCAST=False, **meta)
        else:
            grid = (triton.cdiv(rows, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)
            triton_int4._int4_gemm_kernel.fn[grid](
                x, qweight, qzeros, scales, out, rows, N, K, x.stride(0), rows,
                GROUP_SIZE=group_size, UPCAST=False, **meta)
        errors[str(config)] = relative_error(out, ref)
    errors["scratch"] = max(workspace.abs().max().item(), tickets.abs().max().item())
    return errors


def interpreted_config_errors() -> dict[str, float]:
    """On CPU only the GEMV configs whose split-K differs from the grid's: no split and 32 splits."""
    from parley.kernels import triton_int4

    configs = [c for c in triton_int4.GEMV_CONFIGS if c.kwargs["SPLIT_K"] in (1, 32)]
    return {f"rows{rows}:{name}": error for rows in (1, 9)
            for name, error in config_errors("cpu", rows, configs).items()}


def test_split_k_extremes_match_reference_interpreted(interpreted_errors: dict[str, float]) -> None:
    configs = {k: v for k, v in interpreted_errors.items() if k.startswith("rows")}
    assert configs, "the child checked no configs"
    for name, error in configs.items():
        assert error <= (0 if name.endswith("scratch") else TOLERANCE["float16"]), name


@pytest.mark.skipif(not torch.cuda.is_available(), reason="compiles every autotune config: CUDA only")
@pytest.mark.parametrize("rows", [1, 9, 33])
def test_every_autotune_config_matches_reference(rows: int) -> None:
    """Autotuning may pick any config for some shape, so each one is checked, not just the winner."""
    for name, error in config_errors("cuda", rows).items():
        assert error <= (0 if name == "scratch" else TOLERANCE["float16"]), f"{name}: {error:.2e}"


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET") == "1", "run through pytest, or set TRITON_INTERPRET=1"
    print(json.dumps(all_errors("cpu")))
