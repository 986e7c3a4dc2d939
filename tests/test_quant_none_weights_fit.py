"""`--quant none` on a CPU holds bf16 weights where the CPU has bf16 dot products, fp32 only where that fits in
the memory available, and otherwise refuses in one line with the size it needs and what to do, before reading
any weight (an 8B model in fp32 is 32 GB: more than a 24 GiB machine has)."""

import subprocess
import sys

import pytest
import torch

from parley.app.bench.random_weights import shape_config
from parley.models.errors import ModelLoadError
from parley.models.weights_dtype import cpu_weights_dtype, int4_bytes, parameter_count

GB = 10**9


def test_parameter_counts_are_the_real_models():
    counts = {s: parameter_count(shape_config(s)) / 1e9 for s in ("llama-3.2-1b", "qwen2.5-1.5b", "llama-3.1-8b")}
    assert counts == pytest.approx({"llama-3.2-1b": 1.236, "qwen2.5-1.5b": 1.544, "llama-3.1-8b": 8.030}, abs=2e-3)


def test_bf16_where_the_cpu_has_bf16_dot_products_fp32_where_it_fits_else_one_line():
    config = shape_config("llama-3.1-8b")
    assert cpu_weights_dtype(config, "m", bf16_dot=True, available=8 * GB) == torch.bfloat16
    assert cpu_weights_dtype(config, "m", bf16_dot=False, available=40 * GB) == torch.float32
    with pytest.raises(ModelLoadError) as e:
        cpu_weights_dtype(config, "/models/8b", bf16_dot=False, available=20 * GB)
    message = str(e.value)
    assert "\n" not in message and message.startswith("/models/8b: ")
    assert "32.1 GB" in message and "20.0 GB" in message and "--quant awq" in message
    assert f"{int4_bytes(config) / GB:.1f} GB" in message
    small = shape_config("llama-3.2-1b")  # 4.9 GB of fp32 and a 1 GB margin
    assert cpu_weights_dtype(small, "m", bf16_dot=False, available=6 * GB) == torch.float32
    with pytest.raises(ModelLoadError):
        cpu_weights_dtype(small, "m", bf16_dot=False, available=5 * GB)


def test_the_engine_loads_bf16_weights_when_the_cpu_has_bf16_dot_products(monkeypatch):
    from parley.engine.engine import Engine
    from parley.models.quantize import cache

    monkeypatch.setattr(cache, "fast_cpu_bf16", lambda: True)
    engine = Engine.load(None, quant="none", device="cpu")
    assert {p.dtype for p in engine.model.parameters()} == {torch.bfloat16}
    ids = engine.tokenizer.encode("The capital of France is")
    engine.prefill(ids[:-1])
    assert engine.forward(ids[-1:]).shape[-1] == engine.model.config.vocab_size


def test_a_model_that_cannot_fit_is_refused_in_one_line_before_loading(tmp_path, monkeypatch):
    from parley.app.bench import random_weights as rw

    folder = rw.checkpoint("small")
    code = ("import sys; import parley.models.weights_dtype as w; w.available_bytes = lambda: 10**6; "
            "import parley.models.quantize.cache as c; c.fast_cpu_bf16 = lambda: False; "
            "from parley.app.cli import main; sys.exit(main(sys.argv[1:]))")
    out = subprocess.run([sys.executable, "-c", code, "generate", "--model", str(folder), "--quant", "none",
                          "--max-new-tokens", "2", "hello"], capture_output=True, text=True, timeout=300)
    assert out.returncode != 0
    lines = [line for line in out.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and "--quant none needs" in lines[0] and "use --quant awq" in lines[0], out.stderr
    assert "Traceback" not in out.stderr
