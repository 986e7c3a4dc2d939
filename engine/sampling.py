"""The distribution a token is drawn from. Plain sampling and speculative verification both use
`probs`, so the verifier compares the draft against exactly what plain decoding would sample from.

The order of the transforms is Hugging Face transformers' and vLLM's: repetition penalties on the raw
logits, then temperature, then top-k, top-p and min-p on the tempered distribution. So "temperature
0.7, top-p 0.9" keeps the nucleus of the distribution actually sampled, and min-p is measured against
its top probability. (llama.cpp's default chain applies temperature last, after top-p and min-p: the
same settings there keep a different set of tokens.)
"""

from __future__ import annotations

import torch
from torch import Tensor

from .params import GenerationParams


def probs(logits: Tensor, params: GenerationParams, history: list[int] | None = None,
          drafted: list[int] | None = None) -> Tensor:
    """logits [T, V] (or [V]) -> fp32 probabilities after penalties, temperature, top-k, top-p, min-p.

    Row i is the distribution after `history + drafted[:i]`: `history` is every token the first row's
    logits condition on (prompt, reply so far, the pending token), `drafted` the draft tokens whose
    positions the rows after it predict from. Verifying k drafted tokens thus penalises each position
    with exactly the context plain decoding would have had there.

    Temperature 0 returns the one-hot of the (penalised) argmax: greedy decoding is then the same code
    path as sampling, and verification against a one-hot p accepts a draft exactly when it is the argmax.
    """
    logits = penalize(logits.float(), params, history or [], drafted or [])
    if params.temperature == 0:
        return torch.zeros_like(logits).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    logits = logits / params.temperature
    if 0 < params.top_k < logits.shape[-1]:
        # Ties with the k-th logit stay in, as in transformers' TopKLogitsWarper.
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    p = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        p = nucleus(p, params.top_p)
    if params.min_p > 0.0:
        # Against the tempered maximum; top-p never drops the maximum, and renormalising would not
        # move the ratio, so this is also min-p of the nucleus.
        p = p.masked_fill(p < params.min_p * p.amax(-1, keepdim=True), 0.0)
    # Each row's total on its own: with several threads a [T, V] sum and a [1, V] sum split a row
    # differently, and a verification row would differ in its last bits from plain decoding's.
    total = torch.stack([row.sum() for row in p.reshape(-1, p.shape[-1])])
    return p / total.reshape(*p.shape[:-1], 1)


def nucleus(p: Tensor, top_p: float) -> Tensor:
    """p [..., V] with the tokens outside the top-p nucleus zeroed (not renormalised).

    A token stays when the tokens strictly more probable than it cover less than top_p, so the most
    probable token always stays and tokens of equal probability stay or go together: the result never
    depends on how a sort orders ties, and a row gives the same nucleus in a 1-row and a 17-row batch.
    Only the head of the distribution is sorted (topk of 64, then 1024, then all of V when a flat row
    needs it): sorting all 49,152 probabilities of 17 rows costs ~60 ms on one CPU core, topk(64) ~1 ms.
    """
    v = p.shape[-1]
    for m in (64, 1024, v):
        top = torch.topk(p, min(m, v), dim=-1).values  # descending
        covered = top.double().cumsum(-1)  # fp64: an fp32 sum of thousands of terms is off by ~1e-4
        if m >= v or bool((covered[..., -1] >= top_p).all()):
            break  # every token past the head has at least `covered` above it: all are dropped
    before = torch.cat([torch.zeros_like(covered[..., :1]), covered[..., :-1]], dim=-1)
    kept = (before < top_p).sum(-1, keepdim=True)  # a prefix of the head, at least 1 long
    # A threshold on the value of the last kept token also keeps the tokens tied with it.
    return p.masked_fill(p < top.gather(-1, kept - 1), 0.0)


def penalize(logits: Tensor, params: GenerationParams, history: list[int], drafted: list[int]) -> Tensor:
    """Apply the repeat, frequency and presence penalties to logits [T, V] (or [V]); row i counts the
    tokens in the last `repeat_last_n` of `history + drafted[:i]`.

    Only the columns of tokens in the window are touched (at most T x window elements), so the cost
    does not grow with the vocabulary.
    """
    n = params.repeat_last_n
    off = params.repeat_penalty == 1.0 and params.frequency_penalty == 0.0 and params.presence_penalty == 0.0
    if n == 0 or off or not (history or drafted):
        return logits
    rows = logits[None] if logits.dim() == 1 else logits
    t = rows.shape[0]
    if len(drafted) < t - 1:
        raise ValueError(f"penalties over {t} rows need the {t - 1} drafted tokens they follow, got {len(drafted)}")
    window = history[-n:] if n > 0 else history
    tokens = window + drafted[: t - 1]
    # Row i covers tokens[start_i : end_i], end_i = len(window) + i, start_i = max(0, end_i - n).
    device = rows.device
    pos = torch.arange(len(tokens), device=device)
    end = len(window) + torch.arange(t, device=device)
    start = (end - n).clamp_min(0) if n > 0 else torch.zeros_like(end)
    inside = (pos >= start[:, None]) & (pos < end[:, None])  # [T, L]
    seen, slot = torch.unique(torch.tensor(tokens, device=device), return_inverse=True)
    counts = torch.zeros(t, len(seen), device=device).index_add_(1, slot, inside.float())  # [T, U]
    old = rows[:, seen]
    new = torch.where(old > 0, old / params.repeat_penalty, old * params.repeat_penalty)
    new = new - counts * params.frequency_penalty - (counts > 0) * params.presence_penalty
    rows = rows.clone()
    rows[:, seen] = torch.where(counts > 0, new, old)
    return rows[0] if logits.dim() == 1 else rows


def greedy(logits: Tensor, params: GenerationParams, history: list[int] | None = None,
           drafted: list[int] | None = None) -> list[int]:
    """Each row's token at temperature 0: the argmax after the penalties, as `probs` rows are one-hot there and
    `sample` draws their one token. Without the one-hot and `sample`'s cumulative sum over the vocabulary: two
    full-vocabulary passes per token that cost a batched server a fifth of its scheduler's time. On a CPU through
    numpy, whose argmax keeps the same rule (the first of equal maxima, a NaN first of all) at a tenth of the time
    of torch's over a 49k vocabulary (2.7 against 28 us a row)."""
    rows = penalize(logits.float(), params, history or [], drafted or [])
    if rows.device.type == "cpu":
        return rows.numpy().argmax(-1).tolist()
    return rows.argmax(-1).tolist()


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator:
    """A private RNG: a fixed seed gives the same reply whatever else the process draws."""
    g = torch.Generator(device=device)
    if seed is None:
        g.seed()
    else:
        g.manual_seed(seed)
    return g


def sample(p: Tensor, generator: torch.Generator) -> int:
    """Draw one token id from a distribution [V] by inverting its cumulative sum (in float64) at one uniform
    draw. torch.multinomial costs ~2 ms for a 49k vocabulary on a CPU core, longer than a decode step of
    the embedded model; this ~0.1 ms. A zero-probability token owns an empty interval: never drawn."""
    cdf = torch.cumsum(p.double(), dim=0)
    u = uniform(generator).to(p.device) * cdf[-1]
    return min(int(torch.searchsorted(cdf, u, right=True)), p.shape[0] - 1)


def uniform(generator: torch.Generator) -> Tensor:
    """The one uniform draw `sample` makes: a greedy token skips `sample` but still makes it, so a seeded reply
    whose temperature is raised mid-reply draws what it would have."""
    return torch.rand((), generator=generator, dtype=torch.float64, device=generator.device)
