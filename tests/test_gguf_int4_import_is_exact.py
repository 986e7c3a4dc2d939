"""A GGUF's 4-bit blocks imported as Int4Linear (--quant gguf) compute the file's own weights.

Q4_0 and Q4_1 are group-32 scale (and minimum) formats: imported, the INT4 weight equals the GGUF's own
dequantized weight bitwise. Q4_K's scales d * sc and minimums dmin * mn are rounded to fp16 (the INT4
layout's scale type): the weight equals that rounded formula bitwise and the GGUF's weight within the
rounding. Every kernel path carries the float minimum: the reference and torch's CPU op in the weight,
the Triton path as `WithMins`' added term (its kernels at group 32 are test_triton_int4_matches_reference's,
the native step's are test_native_linear_reads_gguf_groups'). A tiny model written as llama.cpp would (q/k
rows permuted) loads to the same weights and the same greedy tokens as its dequantized load.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from tiny_models import reference_model, tiny_config, write_gguf

from parley import kernels
from parley.kernels import reference
from parley.models.errors import ModelLoadError
from parley.models.gguf_int4 import Imported, int4_tensors, q4_groups
from parley.models.loading import load_model
from parley.models.quantize.int4_linear import Int4Linear, decoder_linears
from parley.models.quantize.pack import quantize_weight
from parley.models.resolve import resolve
from parley.models.transformer import KVCache

T = gguf.GGMLQuantizationType


def weight_of(t: dict[str, torch.Tensor]) -> torch.Tensor:
    """The imported tensors' weight [out, in] as the reference kernel computes with it (fp32)."""
    return reference.dequantize(t["qweight"], t["qzeros"], t["scales"].float(), 32, t.get("mins")).t()


@pytest.mark.parametrize("kind", [T.Q4_0, T.Q4_1])
def test_q4_0_and_q4_1_import_bitwise(kind: T) -> None:
    seed = 11 + kind.value
    w = np.random.default_rng(seed).standard_normal((48, 256)).astype(np.float32)
    w[3, :32] *= 40  # one group far wider than the rest
    data = gguf.quants.quantize(w, kind)
    got = weight_of(int4_tensors(kind, data, None))
    want = torch.from_numpy(gguf.quants.dequantize(data, kind))
    assert torch.equal(got, want), f"seed={seed}: max difference {(got - want).abs().max()}"


def q4_k_blocks(seed: int, rows: int, super_blocks: int) -> np.ndarray:
    """Q4_K rows from a seeded generator: random 6-bit scales/minimums and nibbles, fp16 d and dmin."""
    rng = np.random.default_rng(seed)
    b = rng.integers(0, 256, size=(rows, super_blocks, 144), dtype=np.uint8)
    for off in (0, 2):  # d, dmin
        b[..., off:off + 2] = rng.uniform(1e-4, 3e-3, (rows, super_blocks, 1)).astype(np.float16).view(np.uint8)
    return b.reshape(rows, -1)


def test_q4_k_imports_its_fp16_rounded_scales_and_minimums() -> None:
    seed = 23
    data = q4_k_blocks(seed, 16, 2)
    got = weight_of(int4_tensors(T.Q4_K, data, None))
    want = torch.from_numpy(gguf.quants.dequantize(data, T.Q4_K))
    q, s, z, m = q4_groups(T.Q4_K, data)
    assert torch.equal(z, torch.zeros_like(z))
    exact = q.float() * s.repeat_interleave(32, 1) + m.repeat_interleave(32, 1)
    assert torch.equal(got, exact), f"seed={seed}"
    # fp16 rounding of each group's scale and minimum: at most 2^-11 of each, times |q| <= 15 for the scale
    bound = (2.0 ** -11) * (15 * s.abs() + m.abs()).repeat_interleave(32, 1) * 1.001
    err = (got - want).abs()
    assert bool((err <= bound).all()), f"seed={seed}: max error {err.max()} over the fp16 rounding"
    assert err.max() > 0  # the data does exercise the rounding


def int4_linear(kind: T, seed: int, N: int = 64, K: int = 128) -> tuple[Int4Linear, torch.Tensor]:
    if kind == T.Q4_K:
        data = q4_k_blocks(seed, N, K // 256 or 1)
    else:
        data = gguf.quants.quantize(np.random.default_rng(seed).standard_normal((N, K)).astype(np.float32), kind)
    t = int4_tensors(kind, data, None)
    lin = Int4Linear(t["qweight"].shape[0], t["scales"].shape[1], 32, mins="mins" in t, dtype=torch.float32)
    lin.load_state_dict(t)
    return lin, weight_of(t)


@pytest.mark.parametrize("kind", [T.Q4_0, T.Q4_1, T.Q4_K])
def test_every_cpu_kernel_path_computes_the_imported_weight(kind: T, monkeypatch: pytest.MonkeyPatch) -> None:
    seed = 31 + kind.value
    lin, w = int4_linear(kind, seed, K=256)
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(seed))
    want = x.double() @ w.double().t()
    monkeypatch.setenv("PARLEY_KERNELS", "reference")
    ref = lin(x)
    assert (ref.double() - want).abs().max() < 1e-5 * want.abs().max(), f"seed={seed}"
    monkeypatch.setenv("PARLEY_KERNELS", "auto")
    lin._prepared = None
    fast = lin(x)  # torch's CPU op: bf16 activations and bf16 scale / offset pairs
    assert (fast.double() - want).abs().max() < 3e-2 * want.abs().max(), f"seed={seed}"


def test_the_minimum_term_is_what_triton_paths_add() -> None:
    """`WithMins` (the Triton kernels read (q - z) s only) adds x summed per group times the minimums; the
    reference kernel without minimums stands in for Triton's here."""
    seed = 41
    lin, w = int4_linear(T.Q4_1, seed)
    x = torch.randn(3, 128, generator=torch.Generator().manual_seed(seed))
    no_min = kernels.ReferenceInt4Linear(lin.qweight, lin.qzeros, lin.scales.float(), 32)
    got = kernels.WithMins(no_min, lin.mins, 32).matmul(x)
    assert (got.double() - x.double() @ w.double().t()).abs().max() < 1e-4, f"seed={seed}"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple:
    config = tiny_config()
    config["intermediate_size"] = 128  # every linear's inputs a multiple of 32
    ref = reference_model(config, seed=5)
    path = write_gguf(tmp_path_factory.mktemp("g") / "tiny-q4_1.gguf", ref, config, linears_as=T.Q4_1)
    return resolve(str(path)), config


def test_a_tiny_q4_1_model_loads_to_its_own_weights_and_greedy_tokens(tiny) -> None:
    files, _ = tiny
    imported = Imported()
    m4 = load_model(files, gguf_int4=imported)
    fp = load_model(files)
    assert imported.own == {"Q4_1": 14} and not imported.rounded
    for (_, name, lin4), (_, _, lin) in zip(decoder_linears(m4), decoder_linears(fp), strict=True):
        assert isinstance(lin4, Int4Linear) and lin4.mins is not None
        w = reference.dequantize(lin4.qweight, lin4.qzeros, lin4.scales.float(), 32, lin4.mins).t()
        assert torch.equal(w, lin.weight), f"{name}: the imported weight is not the file's"  # q/k un-permuted too
    ids = [5, 17, 99, 3]
    outs = []
    for model in (m4, fp):
        cache, toks = KVCache(model.config, 32), list(ids)
        with torch.no_grad():
            logits = model(torch.tensor([toks]), torch.arange(len(toks))[None], cache)
            for _ in range(12):
                nxt = int(logits[0, -1].argmax())
                logits = model(torch.tensor([[nxt]]), torch.tensor([[len(toks)]]), cache)
                toks.append(nxt)
        outs.append(toks)
    assert outs[0] == outs[1]


@pytest.mark.parametrize("on_use", [False, True])
def test_a_linear_of_another_type_is_its_fp_weight_rounded(tmp_path, on_use: bool) -> None:
    """A linear that is not 4-bit in the file (Q8_0 k_proj, Q5_0 up_proj beside Q4_1) is rounded to INT4 at
    group 32 from its weight as the plain load reads it (dequantized, q/k rows un-permuted): bitwise what
    `quantize_weight` makes of that weight, whether imported eagerly or read as rows on use."""
    config = tiny_config()
    config["intermediate_size"] = 128
    path = write_gguf(tmp_path / "tiny-mixed.gguf", reference_model(config, seed=6), config, linears_as=T.Q4_1,
                      linear_kinds={"k_proj": T.Q8_0, "up_proj": T.Q5_0})
    files, imported = resolve(str(path)), Imported()
    m4, fp = load_model(files, gguf_int4=imported, int4_on_use=on_use), load_model(files)
    assert imported.rounded == {"Q8_0": 2, "Q5_0": 2}
    for (_, name, lin4), (_, _, lin) in zip(decoder_linears(m4), decoder_linears(fp), strict=True):
        if not name.endswith(("k_proj", "up_proj")):
            continue
        qweight, qzeros, scales = quantize_weight(lin.weight, 32)
        if on_use:  # what the native step packs: the rows, unpacked from the reference's AWQ words
            q, zeros, s, mins = lin4.q4_rows()
            want = reference.dequantize(qweight, qzeros, scales.float(), 32).t()
            got = (q.float() - zeros.float().repeat_interleave(32, 1)) * s.float().repeat_interleave(32, 1)
            assert mins is None and torch.equal(got, want), name
        else:
            assert torch.equal(lin4.qweight, qweight) and torch.equal(lin4.qzeros, qzeros), name
            assert torch.equal(lin4.scales, scales), name


def test_a_gguf_without_4_bit_weights_is_refused(tmp_path) -> None:
    config = tiny_config()
    path = write_gguf(tmp_path / "tiny-f32.gguf", reference_model(config, seed=1), config)
    with pytest.raises(ModelLoadError, match="--quant awq"):
        load_model(resolve(str(path)), gguf_int4=Imported())
