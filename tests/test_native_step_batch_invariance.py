"""The native CPU step is batch invariant, reads every KV cache type, and computes the model's function.

Batch invariance is what makes speculative greedy decoding equal plain greedy decoding without tie
allowances: a position's logits must not depend on how many positions share its pass, nor on how the
earlier positions' keys and values were computed. Checked bitwise, for INT4 and fp32 weights and every
cache type, on a small random model with real head sizes (64) and grouped-query attention.
"""

from __future__ import annotations

import random

import pytest
import torch
from native_models import logits_in_chunks

from parley.models import native_forward
from parley.models.config import ModelConfig
from parley.models.native_step import NativeStep
from parley.models.quantize.int4_linear import Int4Linear, decoder_linears
from parley.models.transformer import KV_CACHE_TYPES, Transformer

pytestmark = pytest.mark.skipif(native_forward.library() is None,
                                reason=f"native step unavailable: {native_forward.why_unavailable()}")


def small_model(int4: bool, seed: int = 0, qkv_bias: bool = False) -> Transformer:
    torch.manual_seed(seed)
    cfg = ModelConfig(arch="qwen2" if qkv_bias else "llama", vocab_size=300, dim=128, n_layers=2, n_heads=6,
                      n_kv_heads=2, head_dim=64, intermediate_size=256, max_seq_len=600, qkv_bias=qkv_bias)
    model = Transformer(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.08)
        for block in model.layers:
            block.input_layernorm.weight.fill_(1.0)
            block.post_attention_layernorm.weight.fill_(1.0)
        model.norm.weight.fill_(1.0)
    if int4:
        for parent, name, lin in decoder_linears(model):
            setattr(parent, name, Int4Linear.from_linear(lin, 64))
    return model


@pytest.mark.parametrize("kind", KV_CACHE_TYPES)
@pytest.mark.parametrize("int4", [True, False])
def test_logits_do_not_depend_on_pass_lengths(kind: str, int4: bool) -> None:
    seed = 11 + int4
    rng = random.Random(seed)
    model = small_model(int4, seed)
    step = NativeStep.for_model(model, head_bits=8 if int4 else 32)
    ids = [rng.randrange(300) for _ in range(300)]  # crosses the 256-slot bucket edge
    whole = logits_in_chunks(model, ids, [300], kind, step)
    ones = logits_in_chunks(model, ids, [1] * 300, kind, step)
    sizes: list[int] = []
    while sum(sizes) < 300:
        sizes.append(min(rng.randint(1, 17), 300 - sum(sizes)))
    mixed = logits_in_chunks(model, ids, sizes, kind, step)
    assert torch.equal(whole, ones), f"seed={seed}: 1-token passes differ from one 300-token pass"
    assert torch.equal(whole, mixed), f"seed={seed}: passes of {sizes} differ from one pass"


def test_rollback_then_recompute_is_bitwise_the_same() -> None:
    """Rejected speculative positions are overwritten: recomputing after a rollback gives the same logits."""
    model = small_model(True, 5)
    step = NativeStep.for_model(model)
    for kind in KV_CACHE_TYPES:
        cache = model.new_cache(600, kind=kind)
        with torch.inference_mode():
            step(torch.tensor([list(range(40))]), torch.arange(40)[None], cache)
            bad = step(torch.tensor([[7, 8, 9, 10]]), torch.arange(40, 44)[None], cache)  # "rejected"
            cache.truncate(40)
            good = step(torch.tensor([[11, 12]]), torch.arange(40, 42)[None], cache)[0]
        fresh = logits_in_chunks(model, list(range(40)) + [11, 12], [42], kind, step)[-2:]
        assert torch.equal(good, fresh), kind
        assert not torch.equal(bad[0, :2], good)


@pytest.mark.parametrize("qkv_bias", [False, True])
def test_fp32_native_step_equals_the_pytorch_forward(qkv_bias: bool) -> None:
    model = small_model(False, 3, qkv_bias)
    ids = list(range(1, 70))
    ref = logits_in_chunks(model, ids, [69], "fp")
    step = NativeStep.for_model(model, head_bits=32)
    got = logits_in_chunks(model, ids, [30, 39], "fp", step)
    assert (got - ref).abs().max().item() < 1e-4 * ref.abs().max().item()


def test_int4_native_step_is_close_to_the_pytorch_forward() -> None:
    """The native INT4 step also quantizes activations to 8 bits; the function stays the model's."""
    model = small_model(True, 4)
    ids = list(range(1, 70))
    ref = logits_in_chunks(model, ids, [69], "fp")
    step = NativeStep.for_model(model, head_bits=8)
    got = logits_in_chunks(model, ids, [69], "fp", step)
    rel = ((got - ref).norm() / ref.norm()).item()
    assert rel < 0.05, rel


@pytest.mark.parametrize("kind", ["bf16", "int8", "k8v4"])
def test_quantized_caches_hold_what_the_pytorch_path_would_store(kind: str) -> None:
    """Native writes and the PyTorch path's writes of the same keys/values agree to their storage precision,
    and attention over them gives nearly the fp cache's logits."""
    model = small_model(False, 6)
    ids = list(range(1, 50))
    ref_cache = model.new_cache(600, kind=kind)
    with torch.inference_mode():
        ref = model(torch.tensor([ids]), torch.arange(49)[None], ref_cache)[0]
    step = NativeStep.for_model(model, head_bits=32)
    cache = model.new_cache(600, kind=kind)
    with torch.inference_mode():
        got = step(torch.tensor([ids]), torch.arange(49)[None], cache)[0]
    k_ref, k = ref_cache.k[..., :49, :], cache.k[..., :49, :]
    v_ref, v = ref_cache.v[..., :49, :], cache.v[..., :49, :]
    step = {"bf16": 0.01, "int8": 0.02, "k8v4": 0.15}[kind]  # a storage step of these magnitudes, and some
    assert (k - k_ref).abs().max() < step * k_ref.abs().max()
    assert (v - v_ref).abs().max() < step * v_ref.abs().max()
    assert ((got - ref).norm() / ref.norm()).item() < 0.05


@pytest.mark.parametrize("kind", KV_CACHE_TYPES)
def test_attention_over_many_key_blocks_matches_the_pytorch_path(kind: str) -> None:
    """590 positions span three of the native step's 256-key attention blocks (merged per position);
    int8 keys meet a query quantized to int16, int8 values weights quantized to int16: close to the PyTorch
    path's float attention over the same stored cache."""
    model = small_model(False, 8)
    rng = random.Random(8)
    ids = [rng.randrange(300) for _ in range(590)]
    ref = logits_in_chunks(model, ids, [590], kind)
    step = NativeStep.for_model(model, head_bits=32)
    got = logits_in_chunks(model, ids, [500, 90], kind, step)
    tol = {"fp": 1e-5, "bf16": 1e-3}.get(kind, 2e-3)
    for lo, hi in [(0, 256), (256, 512), (512, 590)]:
        err = ((got[lo:hi] - ref[lo:hi]).norm() / ref[lo:hi].norm()).item()
        assert err < tol, f"seed=8 kind={kind} positions {lo}..{hi}: relative error {err}"


@pytest.mark.parametrize("kind", KV_CACHE_TYPES)
def test_logits_do_not_depend_on_the_thread_count(kind: str) -> None:
    """The suite runs its workers at one thread each; the 2- and 3-thread runs here keep the threaded
    schedule (rows split between threads, attention blocks taken dynamically) under test."""
    rng = random.Random(21)
    ids = [rng.randrange(300) for _ in range(300)]
    model = small_model(True, 21)
    step = NativeStep.for_model(model, head_bits=8)
    lib = native_forward.library()
    before = lib.parley_threads(-1)  # the count in force (-1 only asks)
    try:
        runs = {}
        for n in (1, 2, 3):
            lib.parley_threads(n)
            runs[n] = (logits_in_chunks(model, ids, [300], kind, step),
                       logits_in_chunks(model, ids, [280, 1, 19], kind, step))
    finally:
        lib.parley_threads(before)
    for n in (2, 3):
        same = torch.equal(runs[n][0], runs[1][0]) and torch.equal(runs[n][1], runs[1][1])
        assert same, f"seed 21, {kind}: {n} threads differ from 1"


@pytest.mark.parametrize("kind", KV_CACHE_TYPES)
def test_every_pass_length_up_to_33_gives_the_same_logits(kind: str) -> None:
    """Each pass length T = 1..33 (every product tile shape: 1..8 positions, several tiles, a 33rd position in
    its own attention group), starting inside a key block and straddling the 255|256 block edge, recomputes
    positions whose logits must equal one whole pass's bitwise (the slots it overwrites get the same bytes)."""
    seed = 33 + KV_CACHE_TYPES.index(kind)
    rng = random.Random(seed)
    model = small_model(True, seed)
    step = NativeStep.for_model(model, head_bits=8)
    ids = [rng.randrange(300) for _ in range(300)]
    cache = model.new_cache(600, kind=kind)
    with torch.inference_mode():
        whole = step(torch.tensor([ids]), torch.arange(300)[None], cache)[0]
        for T in range(1, 34):
            for start in (37, 256 - T // 2 - 1):  # inside block 0; across the edge of blocks 0 and 1
                got = step(torch.tensor([ids[start : start + T]]), torch.arange(start, start + T)[None], cache)[0]
                assert torch.equal(got, whole[start : start + T]), (
                    f"seed={seed} kind={kind}: a {T}-token pass at {start} differs from the whole pass")
