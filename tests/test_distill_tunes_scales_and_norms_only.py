"""The distillation step of the first-run method (`AWQSettings.distill`) changes what it may and nothing else:
the group scales and RMSNorm weights move, the INT4 integers and zero points of every linear are those of
the same quantization without it, and the divergence from the fp model on the calibration tokens falls.
It tunes the model as Parley runs it: the rotated down_proj's scales (the side file's) move, the standard
folder's down_proj is left as AWQ made it, and the model ends with its standard down_proj back in place."""

import torch
from awq_tiny import outlier_model

from parley.kernels.reference import dequantize
from parley.models.quantize.awq import AWQSettings, awq_quantize
from parley.models.quantize.distill import DistillSettings, ScaledInt4, forward, kl_top_k, teacher_targets
from parley.models.quantize.int4_linear import Int4Linear, decoder_linears
from parley.models.transformer import RMSNorm

SEED = 5


def settings(distill: bool) -> AWQSettings:
    return AWQSettings(group_size=32, rotate=True, gptq=True, refit_scales=True, scale_down=False,
                       hadamard_down=128, distill=DistillSettings(epochs=6, lr_scales=3e-3, lr_norms=3e-3)
                       if distill else None)


def quantized(distill: bool, tokens: torch.Tensor):
    model = outlier_model(seed=SEED, intermediate=256)
    teacher = outlier_model(seed=SEED, intermediate=256)
    report = awq_quantize(model, tokens, settings(distill))
    return model, teacher, report


def divergence(model, teacher, tokens) -> float:
    with torch.no_grad():
        t = teacher_targets(teacher, tokens, 16, torch.float32)
        return kl_top_k(forward(model, tokens), t.logp, t.index, t.rest()).item()


def test_only_scales_and_norms_move_and_the_divergence_falls():
    tokens = torch.randint(0, 256, (8, 48), generator=torch.Generator().manual_seed(SEED))
    plain, teacher, plain_report = quantized(False, tokens)
    tuned, _, report = quantized(True, tokens)
    assert report.distill is not None and report.distill.steps == 12, f"seed {SEED}"
    moved = 0
    for (_, name, a), (_, _, b) in zip(decoder_linears(plain), decoder_linears(tuned), strict=True):
        assert isinstance(b, Int4Linear), (SEED, name)
        assert torch.equal(a.qweight, b.qweight) and torch.equal(a.qzeros, b.qzeros), (SEED, name)
        if name == "down_proj":  # the standard folder's: not what Parley runs, left as AWQ made it
            assert torch.equal(a.scales, b.scales), f"seed {SEED}"
        else:
            moved += not torch.equal(a.scales, b.scales)
    assert moved == 12, f"seed {SEED}: {moved} of 12 linears' scales moved"
    for i, lin in report.rotated_down.items():
        before = plain_report.rotated_down[i]
        assert torch.equal(lin.qweight, before.qweight) and torch.equal(lin.qzeros, before.qzeros), (SEED, i)
        assert not torch.equal(lin.scales, before.scales), (SEED, i)
        assert tuned.layers[i].mlp.down_diag is None and tuned.layers[i].mlp.down_proj is not lin, (SEED, i)
    norms = [(a.weight, b.weight) for a, b in zip(plain.modules(), tuned.modules(), strict=True)
             if isinstance(a, RMSNorm)]
    assert all(not torch.equal(a, b) for a, b in norms), f"seed {SEED}"
    assert not any(p.grad is not None for p in tuned.parameters()), f"seed {SEED}"

    def as_run(model, rep):  # the rotated down_proj in place, as Parley's loader installs it
        from parley.models.quantize import hadamard
        hadamard.install(model, rep.rotated_down, rep.down_diag, rep.down_block)
        return model

    before = divergence(as_run(plain, plain_report), teacher, tokens)
    after = divergence(as_run(tuned, report), teacher, tokens)
    assert after < 0.8 * before, f"seed {SEED}: KL {before:.4f} -> {after:.4f}"


def test_the_differentiable_view_computes_the_int4_linear():
    seed = 6
    g = torch.Generator().manual_seed(seed)
    dense = torch.nn.Linear(64, 32, bias=False)
    with torch.no_grad():
        dense.weight.copy_(torch.randn(32, 64, generator=g))
    lin = Int4Linear.from_linear(dense, 32)
    x = torch.randn(5, 64, generator=g)
    view = ScaledInt4(lin, torch.float32)
    exact = x @ dequantize(lin.qweight, lin.qzeros, lin.scales.float(), 32)  # the reference kernel's weight
    torch.testing.assert_close(view(x), exact, atol=1e-5, rtol=1e-5, msg=f"seed {seed}")
    scales = lin.scales.clone()
    view.store()  # theta = 0: the scales come back bitwise
    assert torch.equal(lin.scales, scales), f"seed {seed}"
    with torch.no_grad():
        view.theta.fill_(0.5)
    view.store()
    torch.testing.assert_close(lin.scales.float(), scales.float() * 1.5, atol=1e-3, rtol=1e-3, msg=f"seed {seed}")


def test_a_large_vocabulary_scores_some_positions_and_still_learns(monkeypatch):
    """With a vocabulary too large to score every position (Gemma 3's 262k), a step scores evenly spaced
    positions: the divergence still falls, and the model keeps its own head."""
    from parley.models.quantize import distill as distill_module

    monkeypatch.setattr(distill_module, "SCORED_LOGITS", 4 * 259 * 12)  # 12 of 48 positions a step
    tokens = torch.randint(0, 256, (8, 48), generator=torch.Generator().manual_seed(SEED))
    plain, teacher, plain_report = quantized(False, tokens)
    tuned, _, report = quantized(True, tokens)
    assert tuned.lm_head is tuned.embed_tokens or isinstance(tuned.lm_head, torch.nn.Linear), f"seed {SEED}"
    before, after = divergence(plain, teacher, tokens), divergence(tuned, teacher, tokens)
    assert after < 0.9 * before, f"seed {SEED}: KL {before:.4f} -> {after:.4f}"


def test_sequences_taken_in_turn_tune_what_they_tune_together(monkeypatch):
    """Past LOGITS_BUDGET a step's sequences go through the model one after another (a 262k vocabulary's logits
    for four sequences would be 1 GiB): their gradients add up to the step's, so the scales and norms end where
    the step taking them at once leaves them, up to the float order of the sums."""
    from parley.models.quantize import distill as distill_module

    tokens = torch.randint(0, 256, (8, 48), generator=torch.Generator().manual_seed(SEED))
    together, _, _ = quantized(True, tokens)
    monkeypatch.setattr(distill_module, "LOGITS_BUDGET", 48 * 259)  # one sequence's logits at a time
    in_turn, _, _ = quantized(True, tokens)
    pairs = [(a.scales.float(), b.scales.float()) for (_, _, a), (_, _, b) in
             zip(decoder_linears(together), decoder_linears(in_turn), strict=True)]
    pairs += [(a.weight, b.weight) for a, b in zip(together.modules(), in_turn.modules(), strict=True)
              if isinstance(a, RMSNorm)]
    moved = [(b - a).abs().max().item() for a, b in pairs]
    assert max(moved) < 1e-4, f"seed {SEED}: the largest difference {max(moved):.2e}"
