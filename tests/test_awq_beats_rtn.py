"""AWQ's output error on calibration data is lower than round-to-nearest at the same group size, on a
tiny model with outlier channels and on the real embedded model (its first layers, to keep this fast)."""

import copy

import pytest
import torch
from awq_tiny import embedded_model, outlier_model

from parley.models.quantize.awq import AWQSettings, LayerRunner, awq_quantize, model_group_size, rtn_quantize
from parley.models.quantize.calibration import load_calibration
from parley.models.quantize.methods import fast_cpu_bf16


@torch.no_grad()
def hidden(model, tokens: torch.Tensor) -> torch.Tensor:
    """The last decoder layer's output on tokens [N, T] (before the final norm and head)."""
    run = LayerRunner(model, tokens.shape[1], torch.device("cpu"), torch.float32, chunk=8)
    x = model.embed_tokens(tokens)
    for block in model.layers:
        x = run.block(block, x)
    return x


def output_mse(fp, tokens, settings: AWQSettings) -> tuple[float, float, dict]:
    reference = hidden(fp, tokens)
    rtn = copy.deepcopy(fp)
    group = rtn_quantize(rtn, settings.group_size)
    awq = copy.deepcopy(fp)
    report = awq_quantize(awq, tokens, settings)
    assert report.group_size == group
    mse = lambda m: (hidden(m, tokens) - reference).pow(2).mean().item()
    return mse(awq), mse(rtn), {"group": group, "alphas": [layer.alphas for layer in report.layers]}


def test_tiny_model():
    model = outlier_model(layers=3)
    tokens = torch.randint(0, 256, (8, 64), generator=torch.Generator().manual_seed(0))
    awq, rtn, info = output_mse(model, tokens, AWQSettings(group_size=32))
    assert awq < 0.8 * rtn, (awq, rtn, info)


@pytest.mark.slow
def test_embedded_model_first_layers():
    model, tok = embedded_model(2)
    assert model_group_size(model, 128) == 64  # hidden size 576 is not a multiple of 128
    tokens = load_calibration(tok.encode, 8, 128, "builtin").tokens
    # the CPU settings `parley quantize` uses
    settings = AWQSettings(group_size=128, search_samples=4,
                           search_dtype=torch.bfloat16 if fast_cpu_bf16() else None)
    awq, rtn, info = output_mse(model, tokens, settings)
    print(f"embedded model, 2 layers, g{info['group']}: AWQ MSE {awq:.4g} vs RTN {rtn:.4g}; alphas {info['alphas']}")
    assert awq < 0.8 * rtn, (awq, rtn, info)
