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
        # Gemma 3 270M: dim 640, fused qkv of 4 + 2 heads of 256, attention output 1,024, MLP 2,048
        (1, 640, 1536, 64, "bfloat16"),
        (33, 1024, 640, 64, "float16"),
        (9, 2048, 640, 64, "bfloat16"),
    ]
)
# The interpreter runs every program in Python, so on CPU only a subset: M = 1 (skinny) and 33 (GEMM) of
# the layer shapes plus the pairwise cover up to K = 1536 (K = 4096 adds more split-K blocks of the same
# kind, minutes in the interpreter). M = 2..16 share M = 1's arithmetic bit for bit (checked by
# test_rows_are_bitwise_the_same_for_every_m_up_to_16), so their errors are M = 1's.
INTERPRETED_CASES = [c for c in CASES[:20] if c[0] in (1, 33)] + [c for c in CASES[20:] if c[1] <= 1536]
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
    """The skinny kernel must leave its split-K tickets zeroed for the next call."""
    from parley.kernels.triton_int4 import _workspaces

    tickets = [pair[1] for (dev, _), pair in _workspaces.items() if dev.type == device]
    assert tickets, "no split-K workspace was used"
    return max(t.abs().max().item() for t in tickets)


def all_errors(device: str) -> dict[str, float]:
    cases = INTERPRETED_CASES if device == "cpu" else CASES
    errors = {case_id(case): case_error(case, device) for case in cases}
    errors[PREPARE_CASE] = prepare_error(device)
    errors[SCRATCH_CASE] = scratch_left(device)
    errors.update(interpreted_config_errors())
    return errors


@pytest.fixture(scope="module")
def interpreted_errors() -> dict[str, float]:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


DEVICES = ["interpreted"] + (["cuda"] if torch.cuda.is_available() else [])


def measured_error(request: pytest.FixtureRequest, device: str, key: str, compute) -> float:
    """Run natively on CUDA; otherwise read the interpreted child's result."""
    if device == "cuda":
        return compute()
    results = request.getfixturevalue("interpreted_errors")
    if key not in results:
        pytest.skip("the interpreter runs a subset of the cases (see INTERPRETED_CASES); CUDA runs them all")
    return results[key]


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
def test_split_k_leaves_its_tickets_zeroed(device: str, request: pytest.FixtureRequest) -> None:
    if device == "cuda":
        for case in CASES:
            case_error(case, "cuda")
    assert measured_error(request, device, SCRATCH_CASE, lambda: scratch_left("cuda")) == 0


def config_errors(device: str) -> dict[str, float]:
    """Each skinny tile at split-K 1 and 16 (16 leaves some splits with no K block at all), plus the
    fused SiLU*mul epilogue; N = 592 (and N/2) is not a multiple of any BLOCK_N."""
    from parley.kernels import reference, triton_int4

    K, N, group_size = 576, 592, 64
    qweight, qzeros, scales = awq_weight(K, N, group_size, torch.float16, device, seed=3)
    x = torch.randn(9, K, generator=torch.Generator().manual_seed(9)).half().to(device)
    ref = reference.int4_linear(x.float(), qweight, qzeros, scales.float(), group_size)
    errors = {}
    for block_n, block_k, warps, stages in triton_int4.SKINNY_TILES:
        for split in (1, 16):
            config = {"BLOCK_N": block_n, "BLOCK_K": block_k, "SPLIT_K": split, "num_warps": warps,
                      "num_stages": stages}
            out = triton_int4._launch_skinny(x, qweight, qzeros, scales, group_size, gated=False, config=config)
            errors[f"config:{block_n}x{block_k}/split{split}"] = relative_error(out, ref)
    gate, up = ref[:, : N // 2], ref[:, N // 2 :]
    fused = triton_int4.triton_int4_silu_mul(x, qweight, qzeros, scales, group_size)
    errors["config:silu_mul"] = relative_error(fused, torch.nn.functional.silu(gate) * up)
    return errors


def row_invariance(device: str) -> dict[str, float]:
    """Row m of an M-row pass equals row m of every other pass with M <= 16, bit for bit: decode (M = 1)
    and speculative verification (M = k + 1) must compute the same logits."""
    from parley.kernels.triton_int4 import int4_mm, triton_int4_silu_mul

    result = {}
    for dtype_name, dtype in DTYPES.items():
        # K = 512 still splits into 8 shares; N = 288 leaves a partial 256-column tile
        qweight, qzeros, scales = awq_weight(512, 288, 128, dtype, device, seed=5)
        x = torch.randn(16, 512, generator=torch.Generator().manual_seed(16)).to(dtype).to(device)
        full = int4_mm(x, qweight, qzeros, scales, 128)
        gated = triton_int4_silu_mul(x, qweight, qzeros, scales, 128)
        same = all(torch.equal(int4_mm(x[:m], qweight, qzeros, scales, 128), full[:m])
                   and torch.equal(triton_int4_silu_mul(x[:m], qweight, qzeros, scales, 128), gated[:m])
                   for m in (1, 2, 5, 9))
        result[f"invariant:{dtype_name}"] = float(same)
    return result


def interpreted_config_errors() -> dict[str, float]:
    return {**config_errors("cpu"), **row_invariance("cpu")}


def test_skinny_configs_and_fused_epilogue_match_reference(interpreted_errors: dict[str, float]) -> None:
    configs = {k: v for k, v in interpreted_errors.items() if k.startswith("config:")}
    assert len(configs) >= 5, "the child checked no configs"
    for name, error in configs.items():
        assert error <= TOLERANCE["float16"], f"{name}: {error:.2e}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_rows_are_bitwise_the_same_for_every_m_up_to_16(device: str, dtype_name: str,
                                                        request: pytest.FixtureRequest) -> None:
    key = f"invariant:{dtype_name}"
    value = measured_error(request, device, key, lambda: row_invariance("cuda")[key])
    assert value == 1.0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="native launches: CUDA only")
def test_every_skinny_config_matches_reference_on_cuda() -> None:
    for name, error in config_errors("cuda").items():
        assert error <= TOLERANCE["float16"], f"{name}: {error:.2e}"


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET") == "1", "run through pytest, or set TRITON_INTERPRET=1"
    print(json.dumps(all_errors("cpu")))
