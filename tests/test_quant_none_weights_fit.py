"""`--quant none` on a CPU holds the weights as the checkpoint stores them where that fits (a bf16 checkpoint
in bf16, which the native step widens as it multiplies; fp32 and dequantized GGUF weights in fp32), rounds them
to bf16 where fp32 does not fit, and otherwise refuses in one line with the size it needs and what to do,
before reading any weight (an 8B model in fp32 is 32 GB: more than a 24 GiB machine has)."""

import subprocess
import sys

import pytest
import torch

from parley.bench.random_weights import shape_config
from parley.models.errors import ModelLoadError
from parley.models.weights_dtype import cpu_weights_dtype, int4_bytes, parameter_count

GB = 10**9


def test_parameter_counts_are_the_real_models():
    counts = {s: parameter_count(shape_config(s)) / 1e9 for s in ("llama-3.2-1b", "qwen2.5-1.5b", "llama-3.1-8b")}
    assert counts == pytest.approx({"llama-3.2-1b": 1.236, "qwen2.5-1.5b": 1.544, "llama-3.1-8b": 8.030}, abs=2e-3)


def test_bf16_checkpoints_stay_bf16_fp32_where_it_fits_else_bf16_else_one_line():
    config = shape_config("llama-3.1-8b")  # 32.1 GB in fp32, 16.1 GB in bf16
    assert cpu_weights_dtype(config, "m", stored=torch.bfloat16, available=40 * GB) == torch.bfloat16
    assert cpu_weights_dtype(config, "m", stored=torch.float32, available=40 * GB) == torch.float32
    assert cpu_weights_dtype(config, "m", stored=None, available=20 * GB) == torch.bfloat16
    with pytest.raises(ModelLoadError) as e:
        cpu_weights_dtype(config, "/models/8b", stored=torch.bfloat16, available=12 * GB)
    message = str(e.value)
    assert "\n" not in message and message.startswith("/models/8b: ")
    assert "16.1 GB" in message and "12.0 GB" in message and "--quant awq" in message
    assert f"{int4_bytes(config) / GB:.1f} GB" in message
    small = shape_config("llama-3.2-1b")  # 4.9 GB of fp32, 2.5 GB of bf16 and a 1 GB margin
    assert cpu_weights_dtype(small, "m", stored=None, available=6 * GB) == torch.float32
    assert cpu_weights_dtype(small, "m", stored=None, available=5 * GB) == torch.bfloat16
    with pytest.raises(ModelLoadError):
        cpu_weights_dtype(small, "m", stored=None, available=3 * GB)


def test_the_stored_dtype_is_read_from_the_checkpoint():
    from parley.bench import random_weights as rw
    from parley.models.resolve import ModelFiles, resolve
    from parley.models.weights_dtype import stored_dtype

    folder = rw.checkpoint("small")
    assert stored_dtype(ModelFiles(ref=str(folder), kind="dir", path=folder)) == torch.bfloat16
    assert stored_dtype(resolve(None)) is None  # the embedded GGUF: dequantized blocks, held in fp32


def test_a_bf16_checkpoint_runs_bf16_on_the_native_step_with_fp32_arithmetic():
    """The bf16 weights are held as stored (no fp32 copy) and the native step's logits are those of the same
    bf16 values widened to fp32: the fp32 model built from the rounded weights gives the same logits."""
    from parley.bench import random_weights as rw
    from parley.engine.engine import Engine
    from parley.models.device_prep import prepare_for_device
    from parley.models.loading import load_model
    from parley.models.resolve import ModelFiles

    folder = rw.checkpoint("small")
    engine = Engine.load(str(folder), quant="none", device="cpu", context_window=256)
    assert engine.step_kind == "native"
    assert {p.dtype for n, p in engine.model.named_parameters() if "proj" in n} == {torch.bfloat16}
    model = load_model(ModelFiles(ref=str(folder), kind="dir", path=folder), dtype=torch.float32)
    fp32 = Engine(model, engine.tokenizer, context_window=256, native=prepare_for_device(model))
    assert fp32.step_kind == "native"
    ids = list(range(5, 60))
    la, lb = engine.forward(ids), fp32.forward(ids)
    assert torch.equal(la, lb), (la - lb).abs().max()
    assert engine.native.weight_bytes < 0.51 * fp32.native.weight_bytes  # half the bytes (norms stay fp32)


def test_a_model_that_cannot_fit_is_refused_in_one_line_before_loading(tmp_path, monkeypatch):
    from parley.bench import random_weights as rw

    folder = rw.checkpoint("small")
    code = ("import sys; import parley.models.weights_dtype as w; w.available_bytes = lambda: 10**6; "
            "from parley.app.cli import main; sys.exit(main(sys.argv[1:]))")
    out = subprocess.run([sys.executable, "-c", code, "generate", "--model", str(folder), "--quant", "none",
                          "--max-new-tokens", "2", "hello"], capture_output=True, text=True, timeout=300)
    assert out.returncode != 0
    lines = [line for line in out.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and "--quant none needs" in lines[0] and "use --quant awq" in lines[0], out.stderr
    assert "Traceback" not in out.stderr
