"""The embedded model (SmolLM2-135M, a Q4_1 GGUF) under --quant gguf runs the file's own weights.

Every decoder linear imported equals the file's dequantized weight bitwise (Q4_1 is exact: scale d, zero 0,
minimum m per group of 32; q/k rows un-permuted as the fp load does), the engine says which weights run,
and the native CPU step runs it: its logits follow the fp model's (the step quantizes activations to int8,
so agreement is measured, not exact: `parley bench quality` reports the greedy agreement)."""

from __future__ import annotations

import pytest
import torch

from parley.engine.engine import Engine
from parley.models.loading import load_model
from parley.models.quantize.int4_linear import Int4Linear, decoder_linears
from parley.models.resolve import resolve
from parley.models.transformer import KVCache

PROMPT = [{"role": "user", "content": "The capital of France is Paris. What is the capital of Italy?"}]


@pytest.fixture(scope="module")
def engines() -> tuple[Engine, torch.nn.Module]:
    engine = Engine.load(None, quant="gguf", device="cpu")
    return engine, load_model(resolve(None))


def test_every_linear_is_the_files_own_weight(engines) -> None:
    from parley.kernels.reference import dequantize

    engine, fp = engines
    pairs = list(zip(decoder_linears(engine.model), decoder_linears(fp), strict=True))
    assert len(pairs) == 7 * engine.model.config.n_layers
    for (_, name, lin4), (_, _, lin) in pairs:
        assert isinstance(lin4, Int4Linear) and lin4.group_size == 32 and lin4.mins is not None
        w = dequantize(lin4.qweight, lin4.qzeros, lin4.scales.float(), 32, lin4.mins).t()
        assert torch.equal(w, lin.weight), name


def test_the_engine_says_which_weights_run(engines) -> None:
    engine, _ = engines
    assert engine.quantization == "gguf-int4:Q4_1"


def test_the_native_step_follows_the_fp_model(engines) -> None:
    engine, fp = engines
    if engine.native is None:
        pytest.skip("the native step is unavailable here")
    ids = engine.tokenizer.encode_chat(PROMPT)
    toks, pos = torch.tensor([ids]), torch.arange(len(ids))[None]
    with torch.no_grad():
        want = fp(toks, pos, KVCache(fp.config, 128))[0]
        got = engine.native(toks, pos, KVCache(fp.config, 128))[0]
    agree = (want.argmax(-1) == got.argmax(-1)).float().mean().item()
    err = (got - want).abs().max().item() / want.abs().max().item()
    # A dropped or misplaced minimum, or a group read from the wrong half of a chunk, is garbage here.
    assert agree >= 0.9 and err < 0.1, f"top-1 agreement {agree:.2f}, max error {err:.3f} of max|logit|"
