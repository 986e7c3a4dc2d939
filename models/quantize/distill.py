"""End-to-end distillation of the INT4 model into the fp model it was made from: its group scales and RMSNorm
weights are tuned, its integers and zero points stay.

Why: GPTQ and the scale refit minimise each linear's own output error on fp inputs, and what is left of
210 such errors still adds up along the residual stream. With the integers fixed the INT4 model is
differentiable in its fp16 group scales and norm weights (no straight-through rounding anywhere), so a few
dozen Adam steps on the KL divergence from the fp model's next-token distribution, on the calibration
tokens, pull the whole model back towards the fp one (EfficientQAT's end-to-end step, arXiv 2407.11062,
on scales, plus the norm tweaking of arXiv 2309.02784). The checkpoint keeps its layout: same integers,
other scales and norm weights.

Cost: one bf16 forward of the fp model for the targets, then `steps` forward and backward passes of
`batch` sequences, in bf16 where the CPU has native bf16 dot products (fp32 otherwise: ~4x slower).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...kernels.reference import dequantize
from ..progress import Progress, ProgressFn
from ..transformer import RMSNorm, SequenceCache
from .int4_linear import Int4Linear, decoder_linears

LOGITS_BUDGET = 1 << 26  # logits held at once for the backward pass (256 MiB in fp32): sequences in turn past it
# Logits a step scores, past which it scores evenly spaced positions of each sequence. Every position of the CPU
# calibration (4 x 256 tokens) up to a 262k vocabulary: Gemma 3 270M scoring a quarter of them measured +8.2% and
# +6.8% perplexity (two seeds), no better than no distillation, and every one +1.5% to +3.4%, at 1.4-1.8x the
# distillation's time (docs/quantization.md).
SCORED_LOGITS = 1 << 28


class _Positions(nn.Module):
    """The output head applied to some positions only: [B, T, D] -> [B, len(positions), V]."""

    def __init__(self, head: nn.Module, positions: Tensor) -> None:
        super().__init__()
        self.head, self.positions = head, positions

    def forward(self, x: Tensor) -> Tensor:
        return self.head(x[:, self.positions])


@dataclass
class DistillSettings:
    epochs: float = 2  # passes over the calibration sequences ...
    max_steps: int = 128  # ... up to this many steps
    batch: int = 4  # calibration sequences per step
    lr_scales: float = 2e-3  # Adam, relative to each scale (the parameter is s / s0 - 1)
    lr_norms: float = 3e-3
    warmup: int = 4  # steps of linearly rising rate before the cosine decay
    top_k: int = 64  # the fp model's distribution kept per position: its top k and the rest as one outcome
    seed: int = 0  # the order the calibration sequences are drawn in

    def steps(self, sequences: int) -> int:
        return min(self.max_steps, math.ceil(self.epochs * sequences / self.batch))


@dataclass
class Targets:
    """The fp model's next-token distribution on the calibration tokens, its top k per position."""

    logp: Tensor  # [N, T, k] fp32 log-probabilities
    index: Tensor  # [N, T, k] token ids

    def rest(self) -> Tensor:
        """log of the probability outside the top k: [N, T]."""
        return torch.log1p(-self.logp.exp().sum(-1).clamp(max=1 - 1e-6))


@dataclass
class DistillReport:
    steps: int
    kl_first: float  # the first step's batch
    kl_last: float  # the last step's batch (another batch: compare several runs, not these two)
    seconds: float
    dtype: str


def forward(model: nn.Module, tokens: Tensor) -> Tensor:
    """Logits [B, T, V] of whole sequences [B, T], without a KV cache."""
    t = tokens.shape[1]
    positions = torch.arange(t, device=tokens.device)[None].expand(tokens.shape[0], -1)
    return model(tokens, positions, SequenceCache(t))


@torch.no_grad()
def teacher_targets(model: nn.Module, tokens: Tensor, top_k: int, dtype: torch.dtype, chunk: int = 4) -> Targets:
    """The fp `model`'s top-k log-probabilities on `tokens` [N, T] (run before it is quantized)."""
    logps, indices = [], []
    for part in tokens.split(chunk):
        with torch.autocast(part.device.type, dtype=dtype, enabled=dtype != torch.float32):
            logits = forward(model, part)
        top = torch.log_softmax(logits.float(), -1).topk(top_k, dim=-1)
        logps.append(top.values)
        indices.append(top.indices)
    return Targets(torch.cat(logps), torch.cat(indices))


def kl_top_k(logits: Tensor, logp: Tensor, index: Tensor, rest: Tensor) -> Tensor:
    """Mean KL divergence from the target to the model over positions, both distributions read as the
    target's top k tokens plus one outcome for all the others: exact for that coarsening, and it needs
    k values per position instead of the vocabulary."""
    mine = torch.log_softmax(logits.float(), -1)
    mine_k = mine.gather(-1, index)
    mine_rest = torch.log1p(-torch.logsumexp(mine_k, -1).exp().clamp(max=1 - 1e-6))
    kl = (logp.exp() * (logp - mine_k)).sum(-1) + rest.exp() * (rest - mine_rest)
    return kl.mean()


class ScaledInt4(nn.Module):
    """An Int4Linear made differentiable in its group scales: weight = (q - z) * s0 * (1 + theta)."""

    def __init__(self, lin: Int4Linear, dtype: torch.dtype) -> None:
        super().__init__()
        self.lin, self.group_size = lin, lin.group_size
        ones = torch.ones_like(lin.scales, dtype=torch.float32)
        q = dequantize(lin.qweight, lin.qzeros, ones, lin.group_size).t()  # q - z: small integers, exact in bf16
        self.register_buffer("q", q.to(dtype).reshape(lin.out_features, -1, lin.group_size))
        self.register_buffer("s0", lin.scales.float().t().contiguous())  # [out, groups]
        self.theta = nn.Parameter(torch.zeros_like(self.s0))

    def scales(self) -> Tensor:
        return self.s0 * (1 + self.theta)

    def forward(self, x: Tensor) -> Tensor:
        w = (self.q * self.scales().to(self.q.dtype)[:, :, None]).flatten(1)
        y = F.linear(x.to(w.dtype), w)
        return y if self.lin.bias is None else y + self.lin.bias.to(y.dtype)

    @torch.no_grad()
    def store(self) -> None:
        """Write the tuned scales back into the Int4Linear, in its fp16."""
        self.lin.scales.copy_(self.scales().t().to(self.lin.scales.dtype))
        self.lin._prepared = None


def _lr_factor(step: int, steps: int, warmup: int) -> float:
    if step < warmup:
        return (step + 1) / warmup
    return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))


def distill(model: nn.Module, tokens: Tensor, targets: Targets, settings: DistillSettings,
            dtype: torch.dtype = torch.float32, progress: ProgressFn | None = None) -> DistillReport:
    """Tune `model`'s INT4 group scales and RMSNorm weights in place towards `targets` on `tokens` [N, T]."""
    start = time.monotonic()
    swapped = []
    for parent, name, lin in decoder_linears(model):
        if isinstance(lin, Int4Linear):
            tuned = ScaledInt4(lin, dtype)
            setattr(parent, name, tuned)
            swapped.append((parent, name, tuned))
    norm_modules = [m for m in model.modules() if isinstance(m, RMSNorm)]
    norm_dtypes = [m.weight.dtype for m in norm_modules]
    for m in norm_modules:  # Adam on fp32 weights, whatever the model's dtype (fp16 on a GPU)
        m.float()
    norms = [m.weight for m in norm_modules]
    frozen = [p for p in model.parameters() if p.requires_grad]
    for p in frozen:
        p.requires_grad_(False)
    thetas = [t.theta for _, _, t in swapped]
    for p in (*thetas, *norms):
        p.requires_grad_(True)
    opt = torch.optim.Adam([{"params": thetas, "lr": settings.lr_scales},
                            {"params": norms, "lr": settings.lr_norms}])
    base = [g["lr"] for g in opt.param_groups]
    rest = targets.rest()
    n = tokens.shape[0]
    steps = settings.steps(n)
    vocab, t = model.config.vocab_size, tokens.shape[1]
    scored = max(1, min(t, SCORED_LOGITS // (settings.batch * vocab)))
    positions = torch.linspace(0, t - 1, scored, device=tokens.device).round().long()
    micro = max(1, min(settings.batch, LOGITS_BUDGET // (scored * vocab)))
    head = model.lm_head
    if scored < t:
        model.lm_head = _Positions(head, positions)
    gen = torch.Generator().manual_seed(settings.seed)
    order = torch.cat([torch.randperm(n, generator=gen)
                       for _ in range(max(1, math.ceil(steps * settings.batch / n)))])
    kls = []
    try:
        for step in range(steps):
            idx = order[step * settings.batch:(step + 1) * settings.batch]
            for group, lr in zip(opt.param_groups, base, strict=True):
                group["lr"] = lr * _lr_factor(step, steps, settings.warmup)
            opt.zero_grad(set_to_none=True)
            kl = 0.0
            for part in idx.split(micro):  # the logits of `micro` sequences at a time: a 262k vocabulary is large
                with torch.autocast(tokens.device.type, dtype=dtype, enabled=dtype != torch.float32):
                    logits = forward(model, tokens[part])
                at = (part[:, None], positions[None, :])
                loss = kl_top_k(logits, targets.logp[at], targets.index[at], rest[at]) * (len(part) / len(idx))
                loss.backward()
                kl += loss.item()
                del logits, loss
            opt.step()
            kls.append(kl)
            if progress:
                elapsed = time.monotonic() - start
                eta = elapsed / (step + 1) * (steps - step - 1)
                progress(Progress("quantize", step + 1, steps, "step",
                                  f"distilling the scales, step {step + 1} of {steps}, ETA {eta:.0f}s", eta))
    finally:
        model.lm_head = head
        for parent, name, tuned in swapped:
            tuned.store()
            setattr(parent, name, tuned.lin)
        for p in norms:
            p.requires_grad_(False)
            p.grad = None
        for m, dt in zip(norm_modules, norm_dtypes, strict=True):
            m.to(dt)
        for p in frozen:
            p.requires_grad_(True)
    return DistillReport(steps, kls[0] if kls else math.nan, kls[-1] if kls else math.nan,
                         time.monotonic() - start, str(dtype).removeprefix("torch."))
