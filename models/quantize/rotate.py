"""Rotate the residual stream by an orthogonal matrix folded into the weights (QuaRot, arXiv 2404.00456).

Why: a few residual channels carry outliers many times the others; every linear reading the stream
spreads its INT4 step over them. With x' = x Q (Q orthogonal, Hadamard-like) the outliers are smeared over
all channels, and the model computes the same function in full precision because

- RMSNorm commutes with Q once its per-channel weight is folded into the linears it feeds
  (rms(x Q) = rms(x), so norm(x Q) = norm(x) Q with unit norm weights);
- linears reading the stream take W Q (q, k, v, gate, up, the head), linears writing it take Q^T W
  (o, down), and the embedding rows become E Q.

The result is an ordinary llama-shaped checkpoint: unit norm weights, and an output head of its own
(E diag(w_final) Q is no longer the embedding, so a tied model is written untied).

Only for pre-norm models whose norms are plain RMSNorm on the residual stream (the families marked `rotatable`
in families.py); Gemma's sandwich norms and (1 + w) weights are not, and keep their stream as it is.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def rotatable(model: nn.Module) -> bool:
    """Whether the model's family reads and writes its residual stream only through plain RMSNorms and
    o_proj / down_proj (families.py), so a rotation folded into the weights is exact."""
    return model.config.family.rotatable


def _paley(q: int) -> Tensor:
    """A Hadamard matrix of order q + 1 (Paley construction I) for a prime q = 3 mod 4."""
    residues = {(i * i) % q for i in range(1, q)}
    chi = torch.tensor([0] + [1 if i in residues else -1 for i in range(1, q)], dtype=torch.float64)
    jac = torch.stack([chi.roll(i) for i in range(q)])  # jac[i, j] = chi(j - i)
    s = torch.zeros(q + 1, q + 1, dtype=torch.float64)
    s[0, 1:], s[1:, 0], s[1:, 1:] = 1, -1, jac
    return s + torch.eye(q + 1, dtype=torch.float64)


def _is_prime(n: int) -> bool:
    return n > 1 and all(n % d for d in range(2, math.isqrt(n) + 1))


def hadamard(n: int) -> Tensor | None:
    """An n x n matrix of +-1 with H H^T = n I (float64), from Sylvester doubling and Paley blocks; None
    when these constructions do not reach n (576 = 12 x 12 x 4 does; 9 x 2^k does not exist)."""
    if n == 1:
        return torch.ones(1, 1, dtype=torch.float64)
    if n % 2 == 0 and (n & (n - 1)) == 0:
        h = hadamard(n // 2)
        assert h is not None
        return torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)))
    for m in range(n, 3, -4):  # Paley orders m = q + 1: try the largest first, then recurse on n / m
        if n % m == 0 and _is_prime(m - 1) and (m - 1) % 4 == 3:
            rest = hadamard(n // m)
            if rest is not None:
                return torch.kron(_paley(m - 1), rest)
    return None


def hadamard_factors(n: int, largest: int = 64) -> list[Tensor] | None:
    """Small +-1 matrices whose Kronecker product is exactly `hadamard(n)` (Sylvester doublings grouped into
    factors of up to `largest`), or None where `hadamard` has no construction. Why: x @ H then costs
    n * sum(factor sizes) per row instead of n^2, which is what lets a 4096-wide model be rotated in
    seconds, layer by layer."""
    if n == 1:
        return []
    if n % 2 == 0 and (n & (n - 1)) == 0:
        size = min(n, largest)
        rest = hadamard_factors(n // size, largest)
        assert rest is not None
        h = hadamard(size)
        assert h is not None
        return [h, *rest]  # hadamard(2^k) doubles as [[h, h], [h, -h]] = H_2 (x) h, so any split is exact
    for m in range(n, 3, -4):  # as `hadamard`: the largest Paley order first, then recurse on n / m
        if n % m == 0 and _is_prime(m - 1) and (m - 1) % 4 == 3:
            rest = hadamard_factors(n // m, largest) if hadamard(n // m) is not None else None
            if rest is not None:
                return [_paley(m - 1), *rest]
    return None


def kron_matmul(x: Tensor, factors: list[Tensor]) -> Tensor:
    """x [..., n] @ (F1 (x) F2 (x) ... ) without forming the n x n product: one small contraction per factor."""
    shape = x.shape
    y = x.reshape(-1, *(f.shape[0] for f in factors))
    for axis, f in enumerate(factors, start=1):
        y = torch.movedim(torch.tensordot(y, f.to(y.dtype), dims=([axis], [0])), -1, axis)
    return y.reshape(shape)


class Rotation:
    """The orthogonal Q = H diag(signs) / sqrt(n) of `random_rotation`, applied without forming it where H has
    a Kronecker factorisation (a dense Q otherwise)."""

    def __init__(self, n: int, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.n = n
        self.factors = hadamard_factors(n)
        if self.factors is None:
            q, r = torch.linalg.qr(torch.randn(n, n, generator=gen, dtype=torch.float64))
            self.dense: Tensor | None = q * r.diagonal().sign()
        else:
            self.dense = None
            self.signs = torch.randint(0, 2, (n,), generator=gen, dtype=torch.float64) * 2 - 1

    def matrix(self) -> Tensor:
        return self.right(torch.eye(self.n, dtype=torch.float64))

    def right(self, w: Tensor) -> Tensor:
        """w [..., n] @ Q, in float64."""
        w = w.double()
        if self.dense is not None:
            return w @ self.dense.to(w.device)
        return kron_matmul(w, self.factors) * self.signs.to(w.device) / math.sqrt(self.n)

    def left_t(self, w: Tensor) -> Tensor:
        """Q^T @ w for w [n, ...] (a linear writing the stream), in float64."""
        return self.right(w.t()).t()


def random_rotation(n: int, seed: int = 0) -> Tensor:
    """An orthogonal n x n matrix (float64): a Hadamard matrix with random column signs, scaled by
    1/sqrt(n) (every entry has the same magnitude, which spreads outliers best), or a random orthogonal
    matrix where no Hadamard construction exists."""
    return Rotation(n, seed).matrix()


def _reads(block: nn.Module) -> list[tuple[nn.Module, list[nn.Linear]]]:
    """(norm, linears reading its output) of a block."""
    attn, mlp = block.self_attn, block.mlp
    return [(block.input_layernorm, [attn.q_proj, attn.k_proj, attn.v_proj]),
            (block.post_attention_layernorm, [mlp.gate_proj, mlp.up_proj])]


@torch.no_grad()
def _fold(norm: nn.Module, linears: list[nn.Linear]) -> None:
    w = norm.weight.double()
    for lin in linears:
        lin.weight.copy_(lin.weight.double() * w[None, :])
    norm.weight.fill_(1)


@torch.no_grad()
def fold_norms(model: nn.Module) -> None:
    """Move every RMSNorm weight into the linears it feeds (norm weights become 1); the output head gets
    its own copy of the (tied) embedding with the final norm folded in."""
    for block in model.layers:
        for norm, linears in _reads(block):
            _fold(norm, linears)
    untie_head(model)
    _fold(model.norm, [model.lm_head])


def untie_head(model: nn.Module) -> None:
    if model.config.tie_embeddings:
        head = nn.Linear(model.config.dim, model.config.vocab_size, bias=False,
                         device=model.embed_tokens.weight.device, dtype=model.embed_tokens.weight.dtype)
        head.weight.data.copy_(model.embed_tokens.weight.data)
        model.lm_head = head
        model.config.tie_embeddings = False


@torch.no_grad()
def rotate_block(block: nn.Module, q: Rotation) -> None:
    """Fold one layer's norms into its linears and rotate its reads (W Q) and writes (Q^T W) in place: the
    streaming quantizer rotates a layer as it reads it."""
    for norm, linears in _reads(block):
        _fold(norm, linears)
        for lin in linears:  # W x' = W Q^T ... with x' = x Q: the input side takes W Q
            lin.weight.copy_(q.right(lin.weight))
    for lin in (block.self_attn.o_proj, block.mlp.down_proj):  # its output lands on the rotated stream: Q^T W
        lin.weight.copy_(q.left_t(lin.weight))
        if lin.bias is not None:
            lin.bias.copy_(q.right(lin.bias))


@torch.no_grad()
def rotate_model(model: nn.Module, seed: int = 0) -> Tensor:
    """Fold the norms and rotate the residual stream of `model` in place (same function in exact
    arithmetic; float rounding aside); returns the rotation Q [dim, dim]."""
    if not rotatable(model):
        raise ValueError(f"{model.config.arch}: residual rotation needs plain pre-norm RMSNorm layers")
    q = Rotation(model.config.dim, seed)
    untie_head(model)
    _fold(model.norm, [model.lm_head])
    model.embed_tokens.weight.copy_(q.right(model.embed_tokens.weight))
    for block in model.layers:
        rotate_block(block, q)
    model.lm_head.weight.copy_(q.right(model.lm_head.weight))
    return q.matrix().to(model.embed_tokens.weight.device)


def rotated(x: Tensor, q: Tensor) -> Tensor:
    """Residual-stream activations x [..., dim] in the rotated basis."""
    return (x.double() @ q).to(x.dtype)
