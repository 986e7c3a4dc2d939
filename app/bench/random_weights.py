"""Random weights of real shapes, for speed figures where no real model of that size can be brought."""

from __future__ import annotations

RANDOM_SHAPES = {
    "7b": dict(dim=4096, n_layers=32, n_heads=32, n_kv_heads=32, intermediate_size=11008),
    "smollm2-135m": dict(dim=576, n_layers=30, n_heads=9, n_kv_heads=3, intermediate_size=1536),  # the default's
    "small": dict(dim=256, n_layers=2, n_heads=4, n_kv_heads=2, intermediate_size=512),  # for tests
}


def random_engine(shape: str, quant: str, device: str | None, kv_cache: str = "auto", native: bool = True):
    """An engine over random weights of a named shape, with the embedded model's tokenizer. `awq` here is
    round-to-nearest INT4 of the random weights: the same layout, kernels and bytes as a real AWQ model."""
    import torch

    from ...engine.engine import Engine, default_device
    from ...models.config import ModelConfig
    from ...models.device_prep import prepare_for_device
    from ...models.quantize.int4_linear import Int4Linear, decoder_linears
    from ...models.resolve import resolve
    from ...models.tokenizer import load_tokenizer
    from ...models.transformer import Transformer

    dev = torch.device(device) if device else default_device()
    tokenizer = load_tokenizer(resolve(None))
    config = ModelConfig(arch="llama", vocab_size=tokenizer.vocab_size, max_seq_len=4096, **RANDOM_SHAPES[shape])
    with torch.device(dev):
        model = Transformer(config).to(torch.bfloat16 if dev.type == "cuda" else torch.float32).eval()
    if quant == "awq":
        for parent, name, linear in decoder_linears(model):
            group = 128 if linear.in_features % 128 == 0 else 64  # as AWQ falls back on the 576-wide model
            setattr(parent, name, Int4Linear.from_linear(linear, group))
    step = prepare_for_device(model, native=native)
    return Engine(model, tokenizer, name=f"random-{shape}", quantization="rtn-int4" if quant == "awq" else "none",
                  context_window=4096, kv_cache=kv_cache, native=step)
