"""The INT4 folder Parley writes (rotated residual stream, untied head, GPTQ-rounded AutoAWQ GEMM tensors,
scales refit) is read by an independent reader -- the format's description unpacked in plain Python here -- into
transformers' own LlamaForCausalLM (strict state dict: every tensor present under its HF name, none left
over), whose logits equal Parley's on the same folder (its INT4 weights dequantized once: the CPU kernels
quantize activations to int8, which transformers does not)."""

import json

import pytest
import torch
from awq_tiny import logits, outlier_model
from safetensors.torch import load_file
from test_awq_checkpoint_loads import tokenizer_files
from test_awq_pack_roundtrip import dequantize_independent

from parley.bench.quality import dequantized
from parley.models.loading import load_model
from parley.models.quantize.awq import AWQSettings, awq_quantize
from parley.models.quantize.checkpoint import save_awq
from parley.models.resolve import resolve

transformers = pytest.importorskip("transformers")


def transformers_model(folder):
    cfg = json.loads((folder / "config.json").read_text())
    q = cfg.pop("quantization_config")
    assert q["quant_method"] == "awq" and q["version"] == "gemm" and q["bits"] == 4, q
    group = q["group_size"]
    ref = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**cfg),
                                                        attn_implementation="eager", torch_dtype=torch.float32).eval()
    tensors = load_file(str(folder / "model.safetensors"))
    state = {}
    for name in {n.rsplit(".", 1)[0] for n in tensors if n.endswith(".qweight")}:
        state[f"{name}.weight"] = dequantize_independent(tensors.pop(f"{name}.qweight"), tensors.pop(f"{name}.qzeros"),
                                                         tensors.pop(f"{name}.scales"), group)
    state.update({n: t.float() for n, t in tensors.items()})
    if cfg["tie_word_embeddings"]:  # a tied checkpoint stores the head once, as the embedding
        assert "lm_head.weight" not in state
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    ref.load_state_dict(state, strict=True)
    return ref


@pytest.mark.parametrize("rotate", [True, False])
@torch.no_grad()
def test_transformers_reads_the_folder(tmp_path, rotate):
    seed = 5
    model = outlier_model(seed=seed, n_kv_heads=4)
    model.config.tie_embeddings = True  # as SmolLM2: the rotated model must be written untied
    model.lm_head.weight = model.embed_tokens.weight
    tokens = torch.randint(0, 256, (3, 40), generator=torch.Generator().manual_seed(seed))
    report = awq_quantize(model, tokens, AWQSettings(group_size=32, rotate=rotate, gptq=True, refit_scales=True))
    assert report.rotated == rotate
    out = save_awq(model, model.config, tokenizer_files(tmp_path), tmp_path / "awq")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["tie_word_embeddings"] is not rotate

    ours = dequantized(load_model(resolve(str(out))))
    ref = transformers_model(out)
    for row in tokens:
        want = logits(ours, row[None])[0]
        got = ref(row[None]).logits[0]
        torch.testing.assert_close(got, want, atol=2e-4, rtol=2e-4, msg=f"seed {seed}")
    if rotate:
        assert ours.lm_head.weight.data_ptr() != ours.embed_tokens.weight.data_ptr()
        assert torch.equal(ref.model.norm.weight, torch.ones_like(ref.model.norm.weight))
