"""GPTQ error compensation (Frantar et al. 2022, arXiv 2210.17323) on a fixed INT4 group grid.

Why: rounding each weight to its nearest grid point ignores that the inputs are correlated. GPTQ rounds
the columns (input channels) one at a time and pushes each column's rounding error onto the columns not yet
rounded, weighted by the inverse of the calibration Gram matrix H = X^T X, which minimises the layer's
output error over the calibration tokens rather than the weight error.

The grid (scale and zero point of every group) is fixed before the loop, from the AWQ-scaled weights and
their searched clipping range: the "static groups" variant, so act-order (the columns with the largest
H diagonal first) only changes the order of rounding, never which columns share a group, and the result
stays an ordinary AutoAWQ checkpoint with contiguous groups.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .pack import MAX_INT, Bounds, group_params


@torch.no_grad()
def gptq_round(w: Tensor, h: Tensor, group_size: int, bounds: Bounds | None = None, *, act_order: bool = False,
               damp: float = 0.01, block: int = 32) -> tuple[Tensor, Tensor, Tensor]:
    """Integer weights q int32 [out, in] in [0, 15] with their group (scales, zeros) [out, in/group] for
    weight w [out, in] on inputs with Gram matrix h [in, in] (any positive scale)."""
    w = w.float().clone()
    out_f, in_f = w.shape
    scales, zeros = group_params(w, group_size, bounds)
    col_scale = scales.repeat_interleave(group_size, 1)  # [out, in]
    col_zero = zeros.repeat_interleave(group_size, 1)
    h = h.float().clone()
    dead = h.diagonal() == 0  # channels never active: any value is exact, round them as they are
    h[dead, dead] = 1
    order = torch.argsort(h.diagonal(), descending=True) if act_order else torch.arange(in_f)
    w, h = w[:, order], h[order][:, order]
    col_scale, col_zero = col_scale[:, order], col_zero[:, order]
    h.diagonal().add_(damp * h.diagonal().mean())
    hinv = upper_cholesky_of_inverse(h)  # row j: how column j's error spreads over the later columns
    q = torch.empty_like(w)
    # Columns a small block at a time: inside a block each column's error updates the block's later columns (a
    # rank-1 update in place), and the block's errors reach every later column in one product. 32 rather than
    # the reference's 128: on a CPU the in-block updates are elementwise work, the product is not. The block's
    # columns are the rows of transposed copies, each step writing in place into views made once a block:
    # ~10 small ops a column where views and temporaries made ~20 (the loop 1.3-1.5x faster on the embedded
    # model's linears). The rank-1 update is a product, then a subtraction: `addr_` fuses the two in its scalar
    # tail only, so its bits depend on the layout.
    for b0 in range(0, in_f, block):
        b1 = min(b0 + block, in_f)
        wb, qb, err = w[:, b0:b1].T.contiguous(), torch.empty(b1 - b0, out_f), torch.empty(b1 - b0, out_f)
        hb = hinv[b0:b1, b0:b1]
        scale, zero = col_scale[:, b0:b1].T.contiguous(), col_zero[:, b0:b1].T.contiguous()
        for j, (col, qc, e, s, z) in enumerate(zip(wb, qb, err, scale, zero, strict=True)):
            torch.div(col, s, out=qc).round_().add_(z).clamp_(0, MAX_INT)
            torch.sub(qc, z, out=e).mul_(s)
            torch.sub(col, e, out=e).div_(hb[j, j])
            wb[j:].sub_(torch.outer(hb[j, j:], e))
        q[:, b0:b1] = qb.T
        w[:, b1:] -= err.T @ hinv[b0:b1, b1:]
    inverse = torch.argsort(order)
    return q[:, inverse].to(torch.int32), scales, zeros


def upper_cholesky_of_inverse(h: Tensor) -> Tensor:
    """U upper triangular with H^-1 = U^T U, from one Cholesky factorisation and one triangular inverse (the
    reference's Cholesky, inverse and second Cholesky cost about twice as much: 25 s for an 8192-wide H on a
    CPU): with J the reversal, J H J = L L^T gives H^-1 = (J L^-T J)(J L^-1 J), and J L^-1 J is upper."""
    flipped = torch.linalg.cholesky(h.flip(0, 1))
    eye = torch.eye(h.shape[0], dtype=h.dtype, device=h.device)
    return torch.linalg.solve_triangular(flipped, eye, upper=False).flip(0, 1)


@torch.no_grad()
def refit_scales(w: Tensor, q: Tensor, scales: Tensor, zeros: Tensor, h: Tensor, group_size: int,
                 damp: float = 0.01) -> Tensor:
    """The group scales [out, in/group] that minimise the output error of weight w [out, in] on inputs with
    Gram matrix h, the integers q and zero points kept: a least-squares fit per output row.

    Why: the grid was chosen before rounding (by the clipping search, for round-to-nearest); once the
    integers are fixed, each row's output is linear in its group scales, so the best scales are the
    solution of a small (in/group)^2 system per row. The layout is unchanged (same integers and zeros, fp16
    scales), and the calibration error cannot rise above the old scales' but for fp16 rounding (a scale fitted
    non-positive keeps its old value).
    """
    out_f, in_f = w.shape
    n_groups = in_f // group_size
    h = h.float()
    u = q.float() - zeros.repeat_interleave(group_size, 1)  # w_hat = u * scale of its group
    a = torch.empty(out_f, n_groups, n_groups, device=w.device)
    for g in range(n_groups):
        cols = slice(g * group_size, (g + 1) * group_size)
        p = u[:, cols] @ h[cols, :]  # [out, in]: group g's contribution, through h, to every input channel
        a[:, :, g] = (u * p).reshape(out_f, n_groups, group_size).sum(-1)
    b = (u * (w.float() @ h)).reshape(out_f, n_groups, group_size).sum(-1)
    # A ridge towards the old scales keeps groups whose integers are all at the zero point (a zero row of a)
    # and near-degenerate systems where they were.
    ridge = damp * a.diagonal(dim1=1, dim2=2).mean(-1, keepdim=True).clamp(min=1e-12)  # [out, 1]
    a = a + torch.diag_embed(ridge.expand(out_f, n_groups))
    fitted = torch.linalg.solve(a, (b + ridge * scales)[..., None])[..., 0]
    fitted = torch.where(torch.isfinite(fitted) & (fitted > 0), fitted, scales)
    return fitted.half().float()
