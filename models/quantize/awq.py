"""Activation-aware weight quantization (AWQ, Lin et al. 2023) to INT4, one decoder layer at a time.

Why it works: a few input channels carry much larger activations than the rest, and the rounding error of
the weights that multiply them dominates the output error. Scaling those weight columns up by s (and the
activations down by 1/s, folded into whatever produces them, so the fp model is unchanged) gives them
finer steps on the INT4 grid. The scale is s = mean|x|^alpha per input channel, alpha picked on a grid by
the output error of the block the linears feed; then each output group's clipping range is searched; then
the weights are rounded (asymmetric INT4, zero point, one scale per group of input channels).

Memory: the calibration activations of one layer live at a time; each layer's inputs are the fp outputs
of the layer before (as AutoAWQ does), so only the layer being quantized need be on the accelerator.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from copy import copy, deepcopy
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from ..progress import Progress, ProgressFn
from ..transformer import SequenceCache
from . import hadamard
from .distill import DistillReport, DistillSettings, Targets, distill, teacher_targets
from .gptq import gptq_round, refit_scales
from .int4_linear import Int4Linear, decoder_linears
from .pack import Bounds, _on_grid, clip, fake_quantize, group_params, quantize_int
from .rotate import rotatable, rotate_model

SUPPORTED_GROUP_SIZES = (128, 64, 32)


def group_size_for(in_features: int, preferred: int = 128) -> int:
    """The preferred group size if it divides `in_features`, else the largest supported one that does."""
    for g in (preferred, *(s for s in SUPPORTED_GROUP_SIZES if s < preferred)):
        if in_features % g == 0:
            return g
    raise ValueError(f"input size {in_features} is divisible by none of the group sizes "
                     f"{preferred} / {SUPPORTED_GROUP_SIZES}")


def model_group_size(model: nn.Module, preferred: int = 128) -> int:
    """One group size valid for every decoder linear of `model`.

    A checkpoint's quantization_config holds a single group_size, so when one layer's input size needs a
    fallback (SmolLM2's hidden size 576 needs 64) every layer uses it. Supported sizes are powers of two,
    so the smallest per-layer choice divides all input sizes.
    """
    return min(group_size_for(lin.in_features, preferred) for _, _, lin in decoder_linears(model))


@dataclass
class AWQSettings:
    """Knobs of the search. Measured on SmolLM2-135M's first 6 layers (output MSE on held-out text, g64,
    32 x 256 calibration tokens, CPU settings): RTN 0.475; these defaults 0.196; with AutoAWQ's symmetric
    clipping candidates only 0.203; duo_scaling 0.229 (symmetric clipping); no clipping 0.225;
    search_samples 32 instead of 8: 0.201 vs 0.203 (2.7x the time); quantized_inputs 0.199."""

    group_size: int = 128
    n_grid: int = 20  # alpha in 0, 1/n_grid, ..., (n_grid-1)/n_grid
    awq_scales: bool = True  # search AWQ's per-channel scales at all (off: QuaRot's recipe, clipping kept)
    alpha_grid: int | None = None  # the scale search's own grid (None: n_grid, which the clipping search keeps)
    duo_scaling: bool = False  # s = mean|x|^a / mean|w|^(1-a) (AutoAWQ's default) instead of mean|x|^a
    clip: bool = True
    # Clip q_proj and k_proj too. AutoAWQ does not (their own output error is a poor proxy through the
    # softmax); after rotation, GPTQ and refit it measured better or equal on both texts over four seeds.
    clip_qk: bool = False
    max_shrink: float = 0.5  # clipping range searched: 1.0 .. 1 - max_shrink of each group's max |w|
    chunk: int = 8  # calibration samples per forward, to bound attention memory
    # The scale search runs ~20 forwards of each block; on a CPU with bf16 matmuls (avx512_bf16 / AMX)
    # running them in bf16 is ~4x faster, and its rounding (~0.3%) is small against INT4's (~5%).
    search_dtype: torch.dtype | None = None  # None: the model's dtype
    # Calibration sequences the block-output searches (q/k/v through attention, gate/up through the MLP)
    # run on, evenly picked; None: all. Activation statistics and the exact single-linear and clipping
    # searches always use every token.
    search_samples: int | None = None
    # Feed each layer the outputs of the already-quantized layers before it (so its search sees the
    # activations the INT4 model will produce) instead of the fp outputs AutoAWQ uses.
    quantized_inputs: bool = False
    # Rotate the residual stream first (rotate.py; pre-norm RMSNorm architectures only, a no-op elsewhere).
    rotate: bool = False
    rotation_seed: int = 0
    # Round with GPTQ's error compensation (gptq.py) on the AWQ-scaled, clipped grid instead of to nearest.
    gptq: bool = False
    act_order: bool = False
    # After rounding, refit each row's group scales by least squares on the calibration Gram matrix
    # (gptq.refit_scales): same integers and zero points, lower output error.
    refit_scales: bool = False
    # Search an AWQ scale for down_proj's input (folded into up_proj's rows). Off, down_proj is clipped and
    # rounded on its own input: better on the quantization alone, neutral as the engine runs it; the first
    # run turns it off since it rotates down_proj's input (hadamard_down; docs/quantization.md).
    scale_down: bool = True
    # Also quantize down_proj on its input rotated by a block Hadamard matrix (hadamard.py; this many channels
    # a block, 0: not), kept beside the standard weights for a runtime that rotates (Parley's).
    hadamard_down: int = 0
    hadamard_seed: int = 0
    hadamard_group: int | None = None  # the rotated down_proj's group size (its own file); None: group_size
    # With hadamard_down, whether the standard down_proj (what other engines run; Parley runs the rotated one)
    # gets its own clipping search too, or is rounded on its plain range: a cheap tier's saving.
    clip_standard_down: bool = True
    # Finally tune the group scales and norm weights end to end towards the fp model's next-token
    # distribution (distill.py), in `distill_dtype` (None: the model's); None: not.
    distill: DistillSettings | None = None
    distill_dtype: torch.dtype | None = None


@dataclass
class LayerReport:
    layer: int
    alphas: dict[str, float]  # group name -> chosen alpha
    seconds: float


@dataclass
class AWQReport:
    group_size: int
    requested_group_size: int
    layers: list[LayerReport] = field(default_factory=list)
    seconds: float = 0.0
    rotated: bool = False
    # With AWQSettings.hadamard_down: each layer's down_proj quantized on rotated inputs, and the rotation.
    rotated_down: dict[int, Int4Linear] = field(default_factory=dict)
    down_diag: Tensor | None = None
    down_block: int = 0
    distill: DistillReport | None = None


class LayerRunner:
    """Runs one decoder layer (or a part of it) on calibration sequences [N, T, D], a few samples at a time."""

    def __init__(self, model: nn.Module, seq_len: int, device: torch.device, dtype: torch.dtype,
                 chunk: int) -> None:
        positions = torch.arange(seq_len, device=device)
        # Per attention window (0: global), its rotation and mask: Gemma 3's sliding layers have their own.
        self.rope, self.masks = {}, {}
        causal = torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).tril()
        for w in set(model.config.layer_windows):
            inv_freq = model.inv_freq_local if w and model.config.local_rope else model.inv_freq
            angles = positions[None, :, None].float() * inv_freq.to(device)  # [1, T, D/2]
            angles = torch.cat((angles, angles), dim=-1)[:, None]  # [1, 1, T, D], as Transformer.forward
            self.rope[w] = angles.cos().to(dtype), angles.sin().to(dtype)
            self.masks[w] = (causal.triu(1 - w) if w else causal)[None, None]
        self.pos, self.cache, self.chunk = positions, SequenceCache(), chunk

    @classmethod
    def like(cls, other: LayerRunner, dtype: torch.dtype) -> LayerRunner:
        run = copy(other)
        run.rope = {w: (cos.to(dtype), sin.to(dtype)) for w, (cos, sin) in other.rope.items()}
        return run

    def map(self, fn: Callable[[Tensor], Tensor], x: Tensor) -> Tensor:
        return torch.cat([fn(part) for part in x.split(self.chunk)])

    def block(self, block: nn.Module, x: Tensor) -> Tensor:
        w = block.self_attn.window
        return self.map(lambda p: block(p, *self.rope[w], self.masks[w], self.pos, self.cache), x)

    def attention(self, attn: nn.Module, x: Tensor) -> Tensor:
        w = attn.window
        return self.map(lambda p: attn(p, *self.rope[w], self.masks[w], self.pos, self.cache), x)


@dataclass
class ScaleGroup:
    """Linears sharing one input, the module producing that input, and the block output to preserve."""

    name: str
    prev: nn.Module  # RMSNorm (weight [in]) or nn.Linear (weight [in, *]) whose output is the input
    linears: list[nn.Linear]
    x: Tensor  # their calibration input [N, T, in]
    inspect: Callable[[Tensor], Tensor]  # input -> the output whose error the scale search minimises
    linear_output: bool = False  # one linear, and its own output is what the search minimises


def scale_groups(block: nn.Module, feats: dict[str, Tensor], run: LayerRunner,
                 scale_down: bool = True) -> list[ScaleGroup]:
    attn, mlp = block.self_attn, block.mlp
    groups = [ScaleGroup("qkv", block.input_layernorm, [attn.q_proj, attn.k_proj, attn.v_proj],
                         feats["qkv"], lambda x: run.attention(attn, x))]
    # o after v only when v's output is o's input channel for channel; with grouped-query attention v has
    # fewer outputs than o has inputs, and (as AutoAWQ) o is not scaled.
    if attn.v_proj.weight.shape == attn.o_proj.weight.shape:
        groups.append(ScaleGroup("o", attn.v_proj, [attn.o_proj], feats["o"], attn.o_proj, linear_output=True))
    groups.append(ScaleGroup("gate_up", block.mlp_norm, [mlp.gate_proj, mlp.up_proj],
                             feats["gate_up"], lambda x: run.map(mlp, x)))
    if scale_down:
        groups.append(ScaleGroup("down", mlp.up_proj, [mlp.down_proj], feats["down"], mlp.down_proj,
                                 linear_output=True))
    return groups


def capture_inputs(block: nn.Module, x: Tensor, run: LayerRunner) -> tuple[Tensor, dict[str, Tensor]]:
    """The layer's fp output on x, and the inputs of its linears (one per group sharing an input)."""
    taps = {"qkv": block.self_attn.q_proj, "o": block.self_attn.o_proj,
            "gate_up": block.mlp.gate_proj, "down": block.mlp.down_proj}
    parts: dict[str, list[Tensor]] = {k: [] for k in taps}
    hooks = [m.register_forward_hook(lambda _m, args, _out, k=k: parts[k].append(args[0].detach()))
             for k, m in taps.items()]
    try:
        out = run.block(block, x)
    finally:
        for h in hooks:
            h.remove()
    return out, {k: torch.cat(v) for k, v in parts.items()}


def mse(a: Tensor, b: Tensor) -> float:
    return (a.float() - b.float()).pow(2).mean().item()


def gram(x: Tensor) -> Tensor:
    """X^T X / T of inputs x [..., in] in fp32: [in, in] (each input group's own: `group_blocks`).

    The mean squared output error of a linear whose weight is off by D [out, in] is sum((D @ C) * D) / out
    with C = X^T X / T: exact, over every calibration token, without running the linear on them.
    """
    x = x.reshape(-1, x.shape[-1])
    total = None
    for part in x.split(4096):  # accumulate in fp32 from any activation dtype, a bounded slice at a time
        p = part.float()
        c = p.t() @ p
        total = c if total is None else total + c
    return total / x.shape[0]


def group_blocks(h: Tensor, group_size: int) -> Tensor:
    """The diagonal blocks [in/group, group, group] of a Gram matrix h [in, in]: each input group's own."""
    n = h.shape[0] // group_size
    return h.reshape(n, group_size, n, group_size).diagonal(dim1=0, dim2=2).permute(2, 0, 1)


def weight_error(d: Tensor, c: Tensor) -> float:
    """Mean squared output error of weight error d [out, in] on inputs with Gram matrix c [in, in] (the
    product in c's dtype, the sum in fp32)."""
    return ((d.to(c.dtype) @ c).float() * d).sum().item() / d.shape[0]


@torch.no_grad()
def search_scale(group: ScaleGroup, masters: list[Tensor], settings: AWQSettings,
                 group_size: int) -> tuple[Tensor, float]:
    """The per-input-channel scale s (and its alpha) minimising the error of the group's block output when
    its linears compute with Q(W * s) / s.

    `masters` are the full-precision weights to quantize; `group` may be a lower-precision working copy of
    the block, whose linears get the quantized-then-unscaled masters and are restored afterwards. A group
    of one linear whose own output is what counts is scored exactly from its inputs' Gram matrix;
    otherwise the block runs on (a subset of) the calibration sequences for every alpha.
    """
    x = group.x
    x_mean = x.abs().reshape(-1, x.shape[-1]).float().mean(0)
    if settings.duo_scaling:
        w = torch.cat(masters).float()
        w = w.abs().reshape(w.shape[0], -1, group_size)
        w_mean = (w / (w.amax(-1, keepdim=True) + 1e-6)).reshape(w.shape[0], -1).mean(0)
    exact = group.linear_output
    if exact:
        c = gram(x).to(settings.search_dtype or torch.float32)
        w0 = masters[0].float()
    else:
        if settings.search_samples and x.shape[0] > settings.search_samples:
            x = x[torch.linspace(0, x.shape[0] - 1, settings.search_samples).round().long()]
        reference = group.inspect(x)
    originals = [lin.weight.data for lin in group.linears]
    best_loss, best_alpha, best_s = float("inf"), 0.0, torch.ones_like(x_mean)
    n_alpha = settings.alpha_grid or settings.n_grid
    for i in range(n_alpha):
        alpha = i / n_alpha
        if settings.duo_scaling:
            s = (x_mean.pow(alpha) / (w_mean.pow(1 - alpha) + 1e-4)).clamp(min=1e-4)
        else:
            s = x_mean.pow(alpha).clamp(min=1e-4)
        s = s / (s.max() * s.min()).sqrt()  # centre the scales around 1 so neither end under/overflows
        s[~torch.isfinite(s)] = 1
        if exact:
            loss = weight_error(fake_quantize(w0 * s, group_size) / s - w0, c)
        else:
            for lin, m in zip(group.linears, masters, strict=True):
                sw = s.to(m.dtype)
                lin.weight.data = (fake_quantize(m * sw, group_size) / sw).to(lin.weight.dtype)
            loss = mse(group.inspect(x), reference)
        if loss < best_loss:
            best_loss, best_alpha, best_s = loss, alpha, s.clone()
    for lin, w_orig in zip(group.linears, originals, strict=True):
        lin.weight.data = w_orig
    return best_s, best_alpha


@torch.no_grad()
def fold_scale(group: ScaleGroup, s: Tensor) -> None:
    """Multiply the linears' input columns by s and divide what produces their input by s: the fp function
    is unchanged, up to float rounding."""
    prev = group.prev
    s_prev = s.to(prev.weight.dtype)
    if isinstance(prev, nn.Linear):  # its output rows are our input channels
        prev.weight.div_(s_prev[:, None])
        if prev.bias is not None:
            prev.bias.div_(s_prev)
    else:  # RMSNorm: one weight per channel
        prev.weight.div_(s_prev)
    for lin in group.linears:
        lin.weight.mul_(s.to(lin.weight.dtype)[None, :])
    group.x = group.x / s.to(group.x.dtype)  # the input the clipping search will see


# Rows of a weight the clipping search takes at a time: each candidate range is a dozen passes over them, so
# they should stay in cache (about 2 MB of fp32: 256 rows of 2,048 inputs measured ~2x faster than 4,096 rows
# on a 1B layer; every row's result is its own, whatever the slice).
CLIP_BYTES = 2 << 20


@torch.no_grad()
def search_clip(w: Tensor, h: Tensor, group_size: int, settings: AWQSettings) -> tuple[Tensor, Tensor]:
    """Per (output row, input group) the clipping range that minimises the mean squared error of that
    group's contribution to the output over all calibration tokens -> (low, high), each [out, in/group].

    Candidates: AutoAWQ's symmetric [-m, m] with m = max|w| * (1 - i/n_grid), and the group's own
    [min, max] shrunk by the same factors (better for groups whose min and max differ in size). The error
    of row o, group g is d C_g d^T with d the row's weight error in that group and C_g the group's input
    Gram matrix (the diagonal blocks of the inputs' Gram matrix h [in, in]: `gram`), so no per-token partial
    outputs are materialised.
    """
    out_f, in_f = w.shape
    n_groups = in_f // group_size
    c = group_blocks(h.float(), group_size)  # [G, g, g]
    lows, highs = [], []
    for rows in w.float().split(max(16, CLIP_BYTES // (4 * in_f))):
        wg = rows.reshape(rows.shape[0], n_groups, group_size)
        w_min, w_max = wg.amin(-1), wg.amax(-1)  # [rows, G]
        w_abs = torch.maximum(w_max, -w_min)
        best_err = torch.full_like(w_abs, float("inf"))
        best_low, best_high = w_min.clone(), w_max.clone()
        for i in range(int(settings.max_shrink * settings.n_grid)):
            r = 1 - i / settings.n_grid
            for low, high in ((-w_abs * r, w_abs * r), (w_min * r, w_max * r)):
                q, scales, zeros = _on_grid(rows, group_size, (low, high))
                d = q.sub_(zeros[..., None]).mul_(scales[..., None]).sub_(wg).transpose(0, 1)  # [G, rows, g]
                err = torch.bmm(d, c).mul_(d).sum(-1).t()  # [rows, G]
                better = err < best_err
                best_err = torch.where(better, err, best_err)
                best_low, best_high = torch.where(better, low, best_low), torch.where(better, high, best_high)
        lows.append(best_low)
        highs.append(best_high)
    return torch.cat(lows).to(w.dtype), torch.cat(highs).to(w.dtype)


@torch.no_grad()
def awq_layer(block: nn.Module, x: Tensor, run: LayerRunner, settings: AWQSettings, group_size: int,
              quantize: bool = True, down_rotation: tuple[Tensor, int] | None = None
              ) -> tuple[Tensor, dict[str, float], Int4Linear | None]:
    """Scale, clip and quantize one decoder layer in place; return its fp output on x (the next layer's
    input), the chosen alphas, and with `down_rotation` (diag, block) its down_proj quantized on the rotated
    input as well (hadamard.py). quantize=False stops after folding the scales (weights stay fp)."""
    out, feats = capture_inputs(block, x, run)
    groups = scale_groups(block, feats, run, settings.scale_down)
    search_dtype = settings.search_dtype or x.dtype
    if search_dtype != x.dtype and settings.awq_scales:  # search on a copy in search_dtype, fold into the real one
        work = deepcopy(block).to(search_dtype)
        search_run = LayerRunner.like(run, search_dtype)
        search_groups = scale_groups(work, {k: v.to(search_dtype) for k, v in feats.items()}, search_run,
                                     settings.scale_down)
    else:
        search_groups = groups
    # o_proj has no scale group when v_proj's output is narrower (grouped-query attention): it is still
    # quantized, with clipping searched on its own input, rather than left in floating point (it would be
    # a third of the decode step's bytes on the embedded model). So is down_proj without its scale.
    grouped = {lin for g in groups for lin in g.linears}
    loose = [(lin, feats[k]) for k, lin in (("o", block.self_attn.o_proj), ("down", block.mlp.down_proj))
             if lin not in grouped]
    del feats
    alphas = {}
    for group, search_group in zip(groups, search_groups, strict=True):
        if not settings.awq_scales:  # the linears keep their input scale; clipping, GPTQ and the rest still run
            continue
        masters = [lin.weight.data for lin in group.linears]
        s, alphas[group.name] = search_scale(search_group, masters, settings, group_size)
        fold_scale(group, s)
    del search_groups
    if not quantize:
        return out, alphas, None
    rotated_down = None
    if down_rotation is not None:  # from down_proj's scaled weight and input, before they are quantized
        down_x = next((g.x for g in groups if g.name == "down"), None)
        if down_x is None:
            down_x = next(x_in for lin, x_in in loose if lin is block.mlp.down_proj)
        down_gram = gram(down_x)
        rotated_down = quantize_rotated(block.mlp.down_proj.weight.data, down_gram, *down_rotation,
                                        settings.hadamard_group or group_size, settings)
    for group in groups:
        # one Gram matrix per shared input: the clipping search, GPTQ and the refit read it
        h = down_gram if group.name == "down" and rotated_down is not None else gram(group.x)
        for lin in group.linears:
            # q and k feed a softmax: the error of their own outputs is a poor proxy, so AutoAWQ does not clip
            # them (clip_qk: Parley's first run does).
            qk = lin in (block.self_attn.q_proj, block.self_attn.k_proj)
            clipped = settings.clip and (settings.clip_qk or not qk)
            bound = search_clip(lin.weight.data, h, group_size, settings) if clipped else None
            replace_module(block, lin, quantize_linear(lin, h, group_size, bound, settings))
        group.x = torch.empty(0)
    for lin, x_in in loose:
        standard_down = lin is block.mlp.down_proj and rotated_down is not None
        h = down_gram if standard_down else gram(x_in)
        clipped = settings.clip and (settings.clip_standard_down or not standard_down)
        bound = search_clip(lin.weight.data, h, group_size, settings) if clipped else None
        replace_module(block, lin, quantize_linear(lin, h, group_size, bound, settings))
    return out, alphas, rotated_down


def quantize_rotated(w: Tensor, h: Tensor, diag: Tensor, block: int, group_size: int,
                     settings: AWQSettings) -> Int4Linear:
    """down_proj's weight w on inputs whose Gram matrix is h, both rotated (hadamard.py), clipped and rounded as
    a lone linear."""
    lin = nn.Linear(w.shape[1], w.shape[0], bias=False, device=w.device, dtype=w.dtype)
    lin.weight.data = hadamard.rotate_weight(w, diag, block).to(w.dtype)
    h = hadamard.rotate_gram(h, diag.to(h.device), block)
    bound = search_clip(lin.weight.data, h, group_size, settings) if settings.clip else None
    return quantize_linear(lin, h, group_size, bound, settings)


def quantize_linear(lin: nn.Linear, h: Tensor | None, group_size: int, bound: Bounds | None,
                    settings: AWQSettings) -> Int4Linear:
    """The INT4 module of a scaled linear: GPTQ-rounded on inputs with Gram matrix h, or rounded to nearest;
    its scales then refit on h when the settings say so."""
    if h is None or not (settings.gptq or settings.refit_scales):
        return Int4Linear.from_linear(lin, group_size, bound)
    w = lin.weight.data
    if settings.gptq:
        q, scales, zeros = gptq_round(w, h, group_size, bound, act_order=settings.act_order)
    else:
        scales, zeros = group_params(w, group_size, bound)
        q = quantize_int(clip(w, bound, group_size), scales, zeros, group_size)
    if settings.refit_scales:
        scales = refit_scales(w, q, scales, zeros, h, group_size)
    return Int4Linear.from_int(q, scales, zeros, group_size, lin.bias)


def replace_module(root: nn.Module, old: nn.Module, new: nn.Module) -> None:
    for parent in root.modules():
        for name, child in parent.named_children():
            if child is old:
                setattr(parent, name, new)
                return
    raise KeyError("module not found")


@torch.no_grad()
def awq_quantize(model: nn.Module, tokens: Tensor, settings: AWQSettings | None = None, *,
                 progress: ProgressFn | None = None, device: torch.device | str | None = None,
                 quantize: bool = True, distill_tokens: Tensor | None = None) -> AWQReport:
    """Quantize `model`'s decoder linears in place with AWQ, calibrated on `tokens` [N, T].

    Each layer is moved to `device` (default: where the model is) while it is worked on, then back; the
    distillation (settings.distill), which needs the whole model at once, moves it there for its own steps.
    It draws from `distill_tokens` [M, T] (default: `tokens`). quantize=False folds the searched scales but
    leaves the weights in floating point (for testing that folding preserves the model).
    """
    settings = settings or AWQSettings()
    group_size = model_group_size(model, settings.group_size)
    report = AWQReport(group_size=group_size, requested_group_size=settings.group_size)
    home = model.norm.weight.device
    device = torch.device(device) if device is not None else home
    dtype = model.norm.weight.dtype
    targets = None
    if settings.distill and quantize:  # the fp model's answers, before anything changes it
        if progress:
            progress(Progress("quantize", 0, 0, "layer", "the fp model's answers on the calibration text"))
        distill_tokens = (tokens if distill_tokens is None else distill_tokens).to(device)
        targets = teacher_targets(model.to(device), distill_tokens, settings.distill.top_k,
                                  settings.distill_dtype or dtype)
        model.to(home)
    if settings.rotate and rotatable(model):
        rotate_model(model, settings.rotation_seed)
        report.rotated = True
    down_rotation = None
    if settings.hadamard_down and quantize:
        inter = model.config.intermediate_size
        block = hadamard.block_size(inter, settings.hadamard_down)
        if block > 1:
            report.down_diag = hadamard.rotation_diag(inter, block, settings.hadamard_seed)
            report.down_block = block
            down_rotation = (report.down_diag.to(device), block)
    run = LayerRunner(model, tokens.shape[1], device, dtype, settings.chunk)
    x = model.embed(tokens.to(home)).to(device)
    start = time.monotonic()
    n = len(model.layers)
    for i, block in enumerate(model.layers):
        t0 = time.monotonic()
        block.to(device)
        x_in = x
        x, alphas, rotated_down = awq_layer(block, x, run, settings, group_size, quantize, down_rotation)
        if rotated_down is not None:
            report.rotated_down[i] = rotated_down.to(home)
        if settings.quantized_inputs and quantize:
            x = run.block(block, x_in)
        del x_in
        block.to(home)
        report.layers.append(LayerReport(i, alphas, time.monotonic() - t0))
        if progress:
            elapsed = time.monotonic() - start
            eta = elapsed / (i + 1) * (n - i - 1)
            progress(Progress("quantize", i + 1, n, "layer", f"layer {i + 1}/{n}, ETA {eta:.0f}s", eta))
    del x
    if targets is not None and settings.distill:
        with torch.enable_grad():
            report.distill = distill_model(model, report, distill_tokens, targets, settings, device, progress)
    report.seconds = time.monotonic() - start
    return report


def distill_model(model: nn.Module, report: AWQReport, tokens: Tensor, targets: Targets,
                  settings: AWQSettings, device: torch.device, progress: ProgressFn | None) -> DistillReport:
    """Distill the quantized model as Parley runs it: with its rotated down_proj in place when there is one
    (the standard folder's down_proj keeps its refit scales; the norms tuned here serve both)."""
    home = model.norm.weight.device
    standard = {i: model.layers[i].mlp.down_proj for i in report.rotated_down}
    if report.rotated_down:
        hadamard.install(model, report.rotated_down, report.down_diag, report.down_block)
    try:
        model.to(device)
        return distill(model, tokens, targets, settings.distill, settings.distill_dtype or model.norm.weight.dtype,
                       progress)
    finally:
        model.to(home)
        for i, lin in standard.items():
            mlp = model.layers[i].mlp
            mlp.down_proj, mlp.down_diag, mlp.down_hadamard = lin, None, None
        for lin in report.rotated_down.values():
            lin.to(home)


@torch.no_grad()
def rtn_quantize(model: nn.Module, group_size: int) -> int:
    """Round-to-nearest INT4 baseline (no scaling, no clipping), in place; returns the group size used."""
    g = model_group_size(model, group_size)
    for parent, name, lin in decoder_linears(model):
        setattr(parent, name, Int4Linear.from_linear(lin, g))
    return g
