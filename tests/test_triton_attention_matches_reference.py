"""The Triton decode-attention kernel reads every KV cache layout right, and each row's result does not
depend on how many rows the pass has.

Without a GPU the kernel runs under TRITON_INTERPRET=1, which must be set before triton is imported, so
the interpreted cases run in one child process (this file run as a script) and each test reads its
result; with CUDA they also run natively. The reference is float64 attention over the cache dequantized
by the layout's own definition, so a wrong nibble, group, scale or GQA head mapping shows as an error.
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

KINDS = ["fp", "bf16", "int8", "k8v4"]
SEED = 1234
H, KVH, D, L = 4, 2, 64, 40
GEMMA = (4, 1, 256)  # Gemma 3 270M's global layers: 4 query heads on one KV head of 256 dims
POSITIONS = [0, 7, 31, 38, 39]  # one slot, partial blocks, several chunks of 16 slots, the last slot


def filled_cache(kind: str, device: str, KVH: int = KVH, D: int = D):
    from parley.kernels import triton_attention as ta

    gen = torch.Generator().manual_seed(SEED)
    k = torch.randn(KVH, L, D, generator=gen) * 2
    v = torch.randn(KVH, L, D, generator=gen)
    k[:, 3, 5] = 40.0  # an outlier channel: int8 keys must keep it, int4 values must not clip it
    v[-1, 9, :32] = 0.5  # a constant group: scale 0, every q 0, v = min exactly
    cache = ta.new_cache(kind, KVH, L, D, device)
    ta.write_kv(kind, cache, k.to(device), v.to(device), torch.arange(L, device=device))
    return cache


def reference(q: torch.Tensor, kind: str, cache: dict, positions: list[int], sm_scale: float) -> torch.Tensor:
    from parley.kernels import triton_attention as ta

    k, v = (t.double().cpu() for t in ta.dequantize_cache(kind, cache))
    H, KVH = q.shape[1], k.shape[0]
    out = torch.empty(q.shape, dtype=torch.float64)
    for t, pos in enumerate(positions):
        for h in range(H):
            scores = (k[h // (H // KVH), : pos + 1] @ q[t, h].double()) * sm_scale
            out[t, h] = scores.softmax(0) @ v[h // (H // KVH), : pos + 1]
    return out


def kind_results(kind: str, device: str, H: int = H, KVH: int = KVH, D: int = D, name: str = "") -> dict[str, float]:
    from parley.kernels import triton_attention as ta

    cache = filled_cache(kind, device, KVH, D)
    q = torch.randn(len(POSITIONS), H, D, generator=torch.Generator().manual_seed(SEED + 1)).to(device)
    positions = torch.tensor(POSITIONS, device=device)
    sm_scale = D**-0.5
    out = ta.decode_attention(q, kind, cache, positions, sm_scale, block_l=16, chunk=16)
    ref = reference(q.cpu(), kind, cache, POSITIONS, sm_scale)
    error = ((out.double().cpu() - ref).abs().max() / ref.abs().max()).item()
    alone = [ta.decode_attention(q[t : t + 1], kind, cache, positions[t : t + 1], sm_scale, block_l=16, chunk=16)
             for t in range(len(POSITIONS))]
    pair = ta.decode_attention(q[1:3], kind, cache, positions[1:3], sm_scale, block_l=16, chunk=16)
    same = all(torch.equal(a[0], out[t]) for t, a in enumerate(alone)) and torch.equal(pair, out[1:3])
    return {f"{name}{kind}:error": error, f"{name}{kind}:row_invariant": float(same)}


def quantizer_results() -> dict[str, float]:
    """The write-side layouts, checked on values whose quantized form is known by hand."""
    from parley.kernels import triton_attention as ta

    x = torch.tensor([[127.0, -63.5, 0.5, 1.5, 2.5] + [0.0] * 59])  # amax 127: scale 1, ties to even
    q, scale = ta.quantize_int8(x)
    int8_ok = scale.item() == 1.0 and q[0, :5].tolist() == [127, -64, 0, 2, 2]
    zero_q, zero_scale = ta.quantize_int8(torch.zeros(1, 64))
    int8_ok = int8_ok and zero_scale.item() == 0 and not zero_q.any()
    v = torch.zeros(1, 64)
    v[0, :32] = torch.arange(32) % 16  # group 0: min 0, max 15, scale 1, q = value
    v[0, 32] = 30.0  # group 1: min 0, max 30, scale 2
    packed, vs, vm = ta.quantize_int4(v)
    int4_ok = (vs.tolist() == [[1.0, 2.0]] and vm.tolist() == [[0.0, 0.0]]
               and packed[0, 0].item() == 0 | (15 << 4)  # d=0 low nibble, d=32 (q=15) high nibble
               and packed[0, 5].item() == 5
               and torch.equal(ta.dequantize_int4(packed, vs, vm), v))
    return {"quantize:int8_by_hand": float(int8_ok), "quantize:int4_by_hand": float(int4_ok)}


def all_results(device: str) -> dict[str, float]:
    # Interpreted, both products are exact fp32; on a GPU, Q.K of fp32 queries and P.V run in TF32.
    results = {"tolerance": 1e-5 if device == "cpu" else 5e-3, **quantizer_results()}
    for kind in KINDS:
        results.update(kind_results(kind, device))
        results.update(kind_results(kind, device, *GEMMA, name="gemma3:"))
    return results


@pytest.fixture(scope="module")
def interpreted() -> dict[str, float]:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module", params=["interpreted"] + (["cuda"] if torch.cuda.is_available() else []))
def results(request: pytest.FixtureRequest) -> dict[str, float]:
    if request.param == "cuda":
        return all_results("cuda")
    return request.getfixturevalue("interpreted")


# Errors relative to max|out|; the bf16 cache is compared against its own bf16 values, so every kind is
# held to the same tolerance.
@pytest.mark.parametrize("shape", ["", "gemma3:"])
@pytest.mark.parametrize("kind", KINDS)
def test_kernel_matches_float64_reference(kind: str, shape: str, results: dict[str, float]) -> None:
    error = results[f"{shape}{kind}:error"]
    assert error <= results["tolerance"], f"{shape}{kind}: relative error {error:.2e} (seed {SEED})"


@pytest.mark.parametrize("shape", ["", "gemma3:"])
@pytest.mark.parametrize("kind", KINDS)
def test_each_row_is_bitwise_independent_of_the_pass_length(kind: str, shape: str, results: dict[str, float]) -> None:
    assert results[f"{shape}{kind}:row_invariant"] == 1.0, f"{shape}{kind}: a row changed with T (seed {SEED})"


def test_quantizers_follow_the_layout(results: dict[str, float]) -> None:
    assert results["quantize:int8_by_hand"] == 1.0
    assert results["quantize:int4_by_hand"] == 1.0


if __name__ == "__main__":
    print(json.dumps(all_results("cpu")))
