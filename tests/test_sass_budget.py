"""The Triton kernels, compiled for sm_90 without a GPU (Triton ships ptxas), do not spill registers,
and the skinny INT4 kernel's main loop stays within its SASS-per-weight budget.

The budget is what the kernels reach today (~6.6 SASS instructions per weight for M <= 16, from ~9.8),
not the issue's target of 3: that needs lop3/prmt dequantisation in inline PTX, which the CPU
interpreter cannot run. A change that makes the loop costlier, or that spills, fails here.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

SKINNY_BUDGET = 7.0  # SASS per weight, the 64-deep tile (the one every group-128 model uses)
SKINNY_SMALL_K_BUDGET = 9.0  # the 32-deep tiles (group 32, and the fused gate/up epilogue)


def _can_compile_sm90() -> str | None:
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed"
    try:
        from triton.backends.compiler import GPUTarget  # noqa: F401
        from triton.compiler import ASTSource  # noqa: F401

        from parley.bench.kernels import _triton_bin

        if not all(os.path.exists(_triton_bin(tool)) for tool in ("ptxas", "nvdisasm", "cuobjdump")):
            return "this Triton ships no ptxas/nvdisasm/cuobjdump: cannot compile for sm_90 offline"
    except ImportError as error:
        return f"this Triton cannot compile offline ({error})"
    return None


REASON = _can_compile_sm90()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")


@pytest.fixture(scope="module")
def configs() -> list[dict]:
    from parley.bench.kernels import sass_report

    return sass_report("sm_90")["configs"]


def test_every_config_compiles_without_spills(configs: list[dict]) -> None:
    assert len(configs) >= 20
    for c in configs:
        assert c["spills"] == 0, c
        assert c["registers"] <= 255, c


def test_skinny_kernel_stays_within_its_instruction_budget(configs: list[dict]) -> None:
    skinny = [c for c in configs if c["name"].startswith("skinny_")]
    assert skinny
    for c in skinny:
        assert c["loop_instructions"] > 0, f"no main loop found in {c['name']}"
        budget = SKINNY_BUDGET if "_k64_" in c["name"] and "silu" not in c["name"] else SKINNY_SMALL_K_BUDGET
        assert c["sass_per_weight"] <= budget, c
