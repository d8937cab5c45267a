"""A sublayer's mHC entry in two kernels: the mixer's split products, then one kernel for the rest.

Done op by op, a sublayer's entry is four launches: the mixer's split products
(``mhc._hc_mix_kernel``), their sum and normalisation (``mhc._hc_mix_finish_kernel``), the
weights (gates and Sinkhorn) and the streams' collapse (``mhc._mhc_collapse_kernel``). All but
the first work on one token's few numbers (a [n, n] mix and n gates) and its streams; at decode
sizes each is a launch for a microsecond's work, in every sublayer of every step. Here one
program per token adds the splits, computes the gates and the Sinkhorn mix with the torch
reference's order of operations (``deepinfer.backends.mhc_ref``: softmax, + eps, column, then
``iters - 1`` times row and column, each divided by sum + eps), and (``COLLAPSE``) collapses the
token's streams with the new ``pre`` weights, as ``mhc._mhc_collapse_kernel`` does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from deepinfer_kernels_sm100.mhc import hc_mix_parts


@triton.jit(do_not_specialize=["rows", "splits", "dim", "iters"])
def _mhc_finish_kernel(  # noqa: PLR0917 (Triton kernels take positional arguments)
    part_ptr,  # [splits, rows, (2 + N) * N]: the mixer's partial products
    squares_ptr,  # [splits, rows]: partial sums of squares of the flattened streams
    base_ptr,
    scale_ptr,
    x_ptr,  # [rows, N, dim]: the streams (COLLAPSE)
    pre_ptr,
    post_ptr,  # [rows, N] fp32
    comb_ptr,  # [rows, N, N] fp32
    out_ptr,  # [rows, dim]: the collapsed streams, x's dtype (COLLAPSE)
    rows,
    splits,
    dim,
    iters,
    norm_eps,
    hc_eps,
    N: tl.constexpr,
    NP: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
    COLLAPSE: tl.constexpr,
):
    row = tl.program_id(0)
    width: tl.constexpr = (2 + N) * N
    s = tl.arange(0, BLOCK_S)
    i = tl.arange(0, NP)
    smask = s < splits
    k_dim = N * dim
    squares = tl.sum(tl.load(squares_ptr + s * rows + row, mask=smask, other=0.0), axis=0)
    norm = tl.rsqrt(squares / k_dim + norm_eps)
    parts = part_ptr + (s * rows + row) * width  # [BLOCK_S] this row's split rows
    vec = smask[:, None] & (i[None, :] < N)
    pre_l = tl.sum(tl.load(parts[:, None] + i[None, :], mask=vec, other=0.0), axis=0) * norm
    post_l = tl.sum(tl.load(parts[:, None] + N + i[None, :], mask=vec, other=0.0), axis=0) * norm
    ii = i[:, None]
    jj = i[None, :]
    inside = (ii < N) & (jj < N)
    cell = ii * N + jj
    mat = smask[:, None, None] & inside[None, :, :]
    logits = tl.load(parts[:, None, None] + 2 * N + cell[None, :, :], mask=mat, other=0.0)
    logits = tl.sum(logits, axis=0) * norm

    # the weights: gates, then the Sinkhorn mix in the reference's order
    b_pre = tl.load(base_ptr + i, mask=i < N, other=0.0)
    b_post = tl.load(base_ptr + N + i, mask=i < N, other=0.0)
    pre = tl.sigmoid(pre_l * tl.load(scale_ptr) + b_pre) + hc_eps
    post = 2.0 * tl.sigmoid(post_l * tl.load(scale_ptr + 1) + b_post)
    tl.store(pre_ptr + row * N + i, pre, mask=i < N)
    tl.store(post_ptr + row * N + i, post, mask=i < N)
    b_comb = tl.load(base_ptr + 2 * N + cell, mask=inside, other=0.0)
    logits = logits * tl.load(scale_ptr + 2) + b_comb
    logits = tl.where(jj < N, logits, float("-inf"))
    top = tl.max(logits, axis=1)
    e = tl.exp(logits - top[:, None])
    e = tl.where(inside, e, 0.0)
    comb = e / tl.sum(e, axis=1)[:, None] + hc_eps
    comb = tl.where(inside, comb, 0.0)
    comb = comb / (tl.sum(comb, axis=0)[None, :] + hc_eps)
    for _ in range(iters - 1):
        comb = comb / (tl.sum(comb, axis=1)[:, None] + hc_eps)
        comb = comb / (tl.sum(comb, axis=0)[None, :] + hc_eps)
    tl.store(comb_ptr + row * (N * N) + cell, comb, mask=inside)

    if COLLAPSE:  # sum_j pre[j] * X[j], fp32 sums, in the streams' dtype
        weights = tl.where(i < N, pre, 0.0)
        for d0 in range(0, dim, BLOCK_D):
            d = d0 + tl.arange(0, BLOCK_D)
            xmask = (i[:, None] < N) & (d < dim)[None, :]
            at = row * N * dim + i[:, None] * dim + d[None, :]
            x = tl.load(x_ptr + at, mask=xmask, other=0.0)
            out = tl.sum(weights[:, None] * x.to(tl.float32), axis=0)
            tl.store(out_ptr + row * dim + d, out.to(x.dtype), mask=d < dim)


def mhc_entry(  # noqa: PLR0917
    x: Tensor,
    fn: Tensor,
    base: Tensor,
    scale: Tensor,
    norm_eps: float,
    hc_eps: float,
    sinkhorn_iters: int,
    collapse: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """(pre [..., n], post [..., n], comb [..., n, n] fp32, and with ``collapse`` the streams
    ``x`` [..., n, d] collapsed by ``pre`` [..., d] in ``x``'s dtype, else None): the mixer,
    the reference's ``mhc_weights_from_mix`` (and ``mhc_collapse``) in two launches."""
    lead, (n, dim) = x.shape[:-2], x.shape[-2:]
    flat, parts, squares = hc_mix_parts(x, fn, norm_eps)
    rows, splits = flat.shape[0], parts.shape[0]
    pre = torch.empty(rows, n, dtype=torch.float32, device=x.device)
    post = torch.empty_like(pre)
    comb = torch.empty(rows, n, n, dtype=torch.float32, device=x.device)
    out = torch.empty(rows, dim, dtype=x.dtype, device=x.device) if collapse else None
    if rows:
        _mhc_finish_kernel[(rows,)](
            parts,
            squares,
            base.float().contiguous(),
            scale.float().contiguous(),
            flat,
            pre,
            post,
            comb,
            pre if out is None else out,
            rows,
            splits,
            dim,
            sinkhorn_iters,
            norm_eps,
            hc_eps,
            N=n,
            NP=triton.next_power_of_2(n),
            BLOCK_S=triton.next_power_of_2(splits),
            BLOCK_D=min(triton.next_power_of_2(dim), 512),
            COLLAPSE=collapse,
        )
    collapsed = None if out is None else out.view(*lead, dim)
    return pre.view(*lead, n), post.view(*lead, n), comb.view(*lead, n, n), collapsed
