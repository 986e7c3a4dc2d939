"""Without its AWQ scale (`AWQSettings.scale_down=False`: measured in issue 21, not the first-run default),
down_proj is still clipped and rounded to INT4 on its own input, up_proj's output rows are left as they were
(only the gate/up group's column scale touches up_proj), and the fp function is unchanged by the folds."""

import torch
from awq_tiny import logits, outlier_model

from parley.models.quantize.awq import AWQSettings, awq_quantize
from parley.models.quantize.int4_linear import Int4Linear


@torch.no_grad()
def test_down_proj_unscaled_but_quantized():
    seed = 3
    model = outlier_model(seed=seed)
    tokens = torch.randint(0, 256, (6, 48), generator=torch.Generator().manual_seed(seed))
    before = logits(model, tokens)
    ups = [b.mlp.up_proj.weight.clone() for b in model.layers]
    report = awq_quantize(model, tokens, AWQSettings(group_size=32, scale_down=False), quantize=False)
    torch.testing.assert_close(logits(model, tokens), before, atol=1e-4, rtol=1e-4, msg=f"seed {seed}")
    for i, (up, block) in enumerate(zip(ups, model.layers, strict=True)):
        assert "down" not in report.layers[i].alphas and report.layers[i].alphas["gate_up"] > 0, (seed, i)
        ratio = block.mlp.up_proj.weight / up  # the gate/up scale: one factor per input column, every row alike
        torch.testing.assert_close(ratio, ratio[:1].expand_as(ratio), atol=1e-5, rtol=1e-5, msg=f"seed {seed}")

    model = outlier_model(seed=seed)
    awq_quantize(model, tokens, AWQSettings(group_size=32, scale_down=False, gptq=True, refit_scales=True))
    assert all(isinstance(b.mlp.down_proj, Int4Linear) for b in model.layers), f"seed {seed}"
