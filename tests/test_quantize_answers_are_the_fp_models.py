"""The distillation's targets come out of the layer-by-layer walk (the activations after the last layer are
the fp model's), not from a whole fp model held in memory: they equal `teacher_targets` of the whole fp model
on the same tokens, for the rows AWQ calibrates on and for the others the walk only carries."""

import torch
from awq_tiny import outlier_model, write_hf_dir

from parley.models.loading import load_config, load_model
from parley.models.quantize import methods, stream
from parley.models.quantize.distill import teacher_targets
from parley.models.resolve import resolve


def test_walk_answers_equal_the_whole_fp_models(tmp_path, monkeypatch):
    monkeypatch.setenv("PARLEY_CACHE_DIR", str(tmp_path / "cache"))
    model = outlier_model(layers=2)
    with torch.no_grad():  # a final norm that is not all ones: folding it into the head must show
        model.norm.weight.copy_(1 + 0.5 * torch.randn(model.config.dim, generator=torch.Generator().manual_seed(1)))
    source = resolve(str(write_hf_dir(model, tmp_path / "tiny")))
    config = load_config(source)
    gen = torch.Generator().manual_seed(5)
    tokens = torch.randint(0, config.vocab_size, (6, 24), generator=gen)
    rows = torch.tensor([0, 2, 4])  # AWQ's share; rows 1, 3, 5 are only carried through the fp layers
    awq = methods.tier_settings("full", 32, torch.device("cpu"))
    awq.search_dtype = None  # fp32 throughout: the comparison is of the walk, not of bf16 rounding
    walk = stream.quantize_layers(source, config, {"k": 1}, tmp_path / "work", awq, tokens, rows,
                                  torch.device("cpu"), torch.float32, top_k=8)
    want = teacher_targets(load_model(source), tokens, 8, torch.float32)
    assert torch.equal(walk.targets.index, want.index)
    torch.testing.assert_close(walk.targets.logp, want.logp, atol=2e-4, rtol=0)
