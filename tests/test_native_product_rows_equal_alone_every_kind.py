"""Every row of a long product equals the same row computed alone, bit for bit, for every kind of product.

A 1-row pass runs the VNNI (or AVX2, or portable) loop of one position; a pass of 16 positions or more runs the
position tiles, and on a CPU with AMX the tile multiplies (kernels/cpu/products.h, "AMX"). Each must form the
same exact int32 sum per activation block and meet its scale in the same float operations, so the rows must be
equal, not close: INT4 in blocks of 64 (groups of 64 and 128, with a bias), INT4 in blocks of 32 (the down
projection), GGUF's groups of 32 with and without minimums, and the int8 head. Pass lengths cross the 16-position
tile and the 64-position work item; 44 columns leave a lone last column block after a pair.
"""

from __future__ import annotations

import ctypes
import subprocess
import sys

import pytest
import torch

from parley.kernels import native
from parley.models import native_forward

lib = native_forward.library()
pytestmark = pytest.mark.skipif(lib is None, reason=f"native step unavailable: {native_forward.why_unavailable()}")

K, N = 256, 44
LENGTHS = [16, 17, 33, 64, 81]


def run(L: native.Lin, x: torch.Tensor) -> torch.Tensor:
    y = torch.empty(x.shape[0], L.N)
    assert lib.parley_linear(ctypes.byref(L), x.shape[0], x.contiguous().data_ptr(), y.data_ptr()) == 0
    return y


def q4(g: torch.Generator, group: int, act_block: int, bias: bool) -> tuple[native.Lin, dict]:
    packed = native.pack_q4(torch.randint(0, 16, (K, N), generator=g),
                            torch.randint(0, 16, (K // group, N), generator=g).float(),
                            (torch.rand(K // group, N, generator=g) * 0.02 + 0.001).half().float(), group)
    b = torch.randn(N, generator=g) if bias else None
    return native.lin(native.W_Q4, N, K, group, q=packed["q"], s16=packed["s16"], z=packed["z"], bias=b,
                      act_block=act_block), {**packed, "bias": b}


def gguf32(g: torch.Generator, with_mins: bool) -> tuple[native.Lin, dict]:
    """Groups of 32 with a float minimum each (Q4_1, Q4_K) or with a zero point each (Q4_0's is always 8: random
    here, so that a product reading one half's zero point for the other's fails)."""
    group = 32
    zeros = torch.zeros(K // group, N) if with_mins else torch.randint(0, 16, (K // group, N), generator=g).float()
    packed = native.pack_q4(torch.randint(0, 16, (K, N), generator=g), zeros,
                            (torch.rand(K // group, N, generator=g) * 0.02 + 0.001).half().float(), group,
                            mins=(torch.randn(K // group, N, generator=g) * 0.05).half().float() if with_mins else None)
    return native.lin(native.W_Q4, N, K, group, q=packed["q"], s16=packed["s16"], z=packed["z"],
                      m16=packed.get("m16"), act_block=32), packed


def head(g: torch.Generator) -> tuple[native.Lin, dict]:
    h = native.pack_q8(torch.randn(N, K, generator=g))
    return native.lin(native.W_Q8, N, K, 0, q=h["q"], s=h["s"]), h


KINDS = {
    "int4 g64 blocks of 64": lambda g: q4(g, 64, 64, False),
    "int4 g128 blocks of 64, bias": lambda g: q4(g, 128, 64, True),
    "int4 g128 blocks of 32 (down)": lambda g: q4(g, 128, 32, False),
    "int4 g64 blocks of 32, bias": lambda g: q4(g, 64, 32, True),
    "gguf groups of 32": lambda g: gguf32(g, False),
    "gguf groups of 32 with minimums": lambda g: gguf32(g, True),
    "int8 head": head,
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_each_row_of_a_long_pass_equals_the_row_alone(kind: str) -> None:
    seed = 11 + list(KINDS).index(kind)
    g = torch.Generator().manual_seed(seed)
    L, keep = KINDS[kind](g)
    x = torch.randn(max(LENGTHS), K, generator=g) * 2
    x[3, 70] = 30.0  # an outlier: one block with a coarse scale
    alone = torch.cat([run(L, x[i : i + 1]) for i in range(x.shape[0])])
    for M in LENGTHS:
        y = run(L, x[:M])
        differ = [i for i in range(M) if not torch.equal(y[i], alone[i])]
        assert not differ, f"seed={seed} {kind}: a pass of {M} rows differs from the rows alone at {differ}"
    del keep


def test_a_torch_matmul_between_two_products_leaves_them_working() -> None:
    """torch's CPU matmuls run oneDNN, which on an AMX CPU ends its kernels by releasing the tile registers; a
    product that trusted tile shapes it had loaded before would then die on an illegal instruction. In a child
    process, so that such a death fails this test rather than the test run."""
    script = """
import ctypes, torch
from parley.kernels import native
from parley.models import native_forward
lib = native_forward.library()
torch.set_num_threads(1)
g = torch.Generator().manual_seed(5)
K, N, group = 256, 64, 128
z = torch.randint(0, 16, (K // group, N), generator=g).float()
s = (torch.rand(K // group, N, generator=g) * 0.02 + 0.001).half().float()
p = native.pack_q4(torch.randint(0, 16, (K, N), generator=g), z, s, group)
L = native.lin(native.W_Q4, N, K, group, q=p["q"], s16=p["s16"], z=p["z"], act_block=64)
x = torch.randn(32, K, generator=g)
ys = []
for _ in range(3):
    y = torch.empty(32, N)
    assert lib.parley_linear(ctypes.byref(L), 32, x.data_ptr(), y.data_ptr()) == 0
    ys.append(y)
    a = torch.randn(256, 512, generator=g).bfloat16()
    (a @ a.t()).sum()  # oneDNN's bf16 kernels (AMX where the CPU has it)
    torch.nn.functional.linear(a, a).sum()
assert torch.equal(ys[0], ys[1]) and torch.equal(ys[1], ys[2])
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"exit {r.returncode}: {r.stderr[-2000:]}"
