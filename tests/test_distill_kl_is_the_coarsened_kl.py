"""The distillation's loss is the KL divergence from the fp model's distribution to the INT4 model's, both
read as the fp model's top k tokens plus one outcome for the rest: checked against that KL written out
term by term, zero for identical logits, and the targets are the teacher's own top k."""

import torch
from awq_tiny import outlier_model

from parley.models.quantize.distill import Targets, forward, kl_top_k, teacher_targets


def coarsened(logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    p = torch.softmax(logits.double(), -1)
    top = p.gather(-1, index)
    return torch.cat((top, 1 - top.sum(-1, keepdim=True)), -1)  # [..., k + 1]


def test_loss_is_the_kl_of_the_coarsened_distributions():
    seed = 11
    g = torch.Generator().manual_seed(seed)
    teacher, student = torch.randn(2, 5, 50, generator=g) * 3, torch.randn(2, 5, 50, generator=g) * 3
    top = torch.log_softmax(teacher, -1).topk(8, dim=-1)
    targets = Targets(top.values, top.indices)
    p, q = coarsened(teacher, top.indices), coarsened(student, top.indices)
    expected = (p * (p.log() - q.log())).sum(-1).mean()
    got = kl_top_k(student, targets.logp, targets.index, targets.rest())
    torch.testing.assert_close(got.double(), expected, atol=1e-5, rtol=1e-4, msg=f"seed {seed}")
    assert got > 0.1, f"seed {seed}"
    same = kl_top_k(teacher, targets.logp, targets.index, targets.rest())
    assert abs(same.item()) < 1e-5, f"seed {seed}: {same.item()}"
    # the rest outcome counts: a student that moves mass only outside the top k is still penalised
    shifted = teacher.clone()
    outside = torch.ones_like(teacher, dtype=torch.bool).scatter(-1, top.indices, False)
    shifted[outside] += 2.0
    assert kl_top_k(shifted, targets.logp, targets.index, targets.rest()) > 1e-3, f"seed {seed}"


@torch.no_grad()
def test_targets_are_the_teachers_top_k():
    seed = 12
    model = outlier_model(seed=seed)
    tokens = torch.randint(0, 256, (3, 24), generator=torch.Generator().manual_seed(seed))
    targets = teacher_targets(model, tokens, 6, torch.float32, chunk=2)
    logp = torch.log_softmax(forward(model, tokens).float(), -1)
    top = logp.topk(6, dim=-1)
    torch.testing.assert_close(targets.logp, top.values, atol=1e-5, rtol=1e-5, msg=f"seed {seed}")
    assert torch.equal(targets.index, top.indices), f"seed {seed}"
