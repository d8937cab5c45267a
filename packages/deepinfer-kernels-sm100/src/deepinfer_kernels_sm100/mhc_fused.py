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

The sublayer's RMSNorm of the collapsed row can come in the same program (``NORM``, and
``QUANT`` for an FP8 projection after it, as ``elementwise._rms_norm_kernel`` quantises): a
first pass over the row adds the squares of the collapsed values as the collapse would store
them, a second recomputes them (the same bits) and writes them normed. That is one launch a
sublayer less, in every layer of every step.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from deepinfer_kernels_sm100.elementwise import fp8_codes, normed, store_fp8
from deepinfer_kernels_sm100.fp8_quant import ACT_GROUP, EMULATE_CAST
from deepinfer_kernels_sm100.mhc import hc_mix_parts

_ACT_GROUP = tl.constexpr(ACT_GROUP)  # what a kernel can read of a global

# One program per row, its launch shape set by the hidden size alone: the same at every row
# count, so a row's bits do not depend on its batch (batch invariance). A row of up to
# FINISH_ROW_CELLS stream values (n * the hidden size rounded up to a power of two) is loaded
# whole at the program's start, on a warp per FINISH_CELLS_PER_WARP of them (at least two);
# wider rows are collapsed, and normed, in FINISH_BLOCK_D-column blocks on four warps, read
# twice where a norm needs the row's RMS first (benchmarks/mhc_entry_ab.py).
FINISH_ROW_CELLS = 16384
FINISH_CELLS_PER_WARP = 4096
FINISH_BLOCK_D = 512


@triton.jit
def _collapse(x, weights):
    """``sum_j weights[j] * x[j]`` over a [NP, BLOCK_D] tile of streams (fp32 sums), in the
    streams' dtype."""
    return tl.sum(weights[:, None] * x.to(tl.float32), axis=0).to(x.dtype)


@triton.jit
def _collapsed(x_ptr, weights, row, d, dim, i, N: tl.constexpr):  # noqa: PLR0917
    """Columns ``d`` of ``sum_j pre[j] * X[j]`` (fp32 sums) in the streams' dtype."""
    xmask = (i[:, None] < N) & (d < dim)[None, :]
    x = tl.load(x_ptr + row * N * dim + i[:, None] * dim + d[None, :], mask=xmask, other=0.0)
    return _collapse(x, weights)


@triton.jit
def _store_cols(  # noqa: PLR0917 (Triton helpers take positional arguments)
    u, inv_rms, row, d, first, dim, w_ptr, out_ptr, q_ptr, s_ptr,
    NORM: tl.constexpr, QUANT: tl.constexpr, EMULATE: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """Columns ``d`` of the collapsed row ``u`` stored (with ``NORM`` normed by ``inv_rms``
    and the weight, with ``QUANT`` also as e4m3 codes from group ``first`` on)."""
    if NORM:
        u = normed(u.to(tl.float32), inv_rms, w_ptr, d, d < dim, out_ptr, True, EMULATE)
        if QUANT:
            store_fp8(u.to(tl.float32), q_ptr, s_ptr, row.to(tl.int64), d, first, dim, EMULATE,
                      BLOCK_D)  # fmt: skip
    tl.store(out_ptr + row * dim + d, u, mask=d < dim)


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
    out_ptr,  # [rows, dim]: the collapsed streams, x's dtype (COLLAPSE; with NORM normed)
    w_ptr,  # [dim] fp32: the RMSNorm's weight (NORM)
    q_ptr,  # [rows, dim] e4m3 codes of the normed row (QUANT)
    s_ptr,  # [rows, dim / ACT_GROUP] fp32 scales (QUANT)
    rows,
    splits,
    dim,
    iters,
    norm_eps,
    hc_eps,
    out_eps,  # the RMSNorm's eps (NORM)
    N: tl.constexpr,
    NP: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
    COLLAPSE: tl.constexpr,
    NORM: tl.constexpr,
    QUANT: tl.constexpr,
    WHOLE: tl.constexpr,  # BLOCK_D covers the row: its streams are read once, loaded first
    EXACT: tl.constexpr,  # dim == BLOCK_D (WHOLE)
    EMULATE: tl.constexpr,  # the interpreter's casts truncate: round in fp32 first
):
    row = tl.program_id(0)
    width: tl.constexpr = (2 + N) * N
    s = tl.arange(0, BLOCK_S)
    i = tl.arange(0, NP)
    if COLLAPSE and WHOLE:  # issued before the weights, so its latency overlaps their math
        # dim is not specialised (the column blocks below ran slower for it, on an H100); a
        # row of exactly BLOCK_D columns is addressed by that constant instead, so its
        # accesses need no column mask and vectorise
        cols_n = dim
        if EXACT:
            cols_n = BLOCK_D
        cols = tl.arange(0, BLOCK_D)
        xmask = (i[:, None] < N) & (cols < cols_n)[None, :]
        x_offs = row * N * cols_n + i[:, None] * cols_n + cols[None, :]
        x_row = tl.load(x_ptr + x_offs, mask=xmask, other=0.0)
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

    weights = tl.where(i < N, pre, 0.0)
    if COLLAPSE and WHOLE:
        u = _collapse(x_row, weights)
        inv_rms = 1.0
        if NORM:
            inv_rms = tl.rsqrt(tl.sum(u.to(tl.float32) * u.to(tl.float32), axis=0) / cols_n
                               + out_eps)  # fmt: skip
        _store_cols(u, inv_rms, row, cols, 0, cols_n, w_ptr, out_ptr, q_ptr, s_ptr, NORM, QUANT,
                    EMULATE, BLOCK_D)  # fmt: skip
    elif COLLAPSE:  # sum_j pre[j] * X[j], fp32 sums, in the streams' dtype, by column blocks
        inv_rms = 1.0
        if NORM:  # the RMS of the collapsed row, as stored, then its normed values below
            sq = tl.zeros((BLOCK_D,), dtype=tl.float32)
            for d0 in range(0, dim, BLOCK_D):
                u = _collapsed(x_ptr, weights, row, d0 + tl.arange(0, BLOCK_D), dim, i, N)
                sq += u.to(tl.float32) * u.to(tl.float32)
            inv_rms = tl.rsqrt(tl.sum(sq, axis=0) / dim + out_eps)
        for d0 in range(0, dim, BLOCK_D):
            d = d0 + tl.arange(0, BLOCK_D)
            u = _collapsed(x_ptr, weights, row, d, dim, i, N)
            _store_cols(u, inv_rms, row, d, d0 // _ACT_GROUP, dim, w_ptr, out_ptr, q_ptr, s_ptr,
                        NORM, QUANT, EMULATE, BLOCK_D)  # fmt: skip


class Normed(NamedTuple):
    """The RMSNorm a sublayer applies to its collapsed input, done in the mHC entry's kernel."""

    weight: Tensor  # [d] fp32
    eps: float
    quant: bool  # also e4m3 codes and scales per ACT_GROUP, for an FP8 projection


def mhc_entry(  # noqa: PLR0917
    x: Tensor,
    fn: Tensor,
    base: Tensor,
    scale: Tensor,
    norm_eps: float,
    hc_eps: float,
    sinkhorn_iters: int,
    collapse: bool,
    norm: Normed | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None, tuple[Tensor, Tensor] | None]:
    """(pre [..., n], post [..., n], comb [..., n, n] fp32; with ``collapse`` the streams
    ``x`` [..., n, d] collapsed by ``pre`` [..., d] in ``x``'s dtype, else None; with ``norm``
    that row RMSNormed instead, and with ``norm.quant`` its e4m3 codes [..., d] and scales
    [..., d / ACT_GROUP]): the mixer, the reference's ``mhc_weights_from_mix`` (and
    ``mhc_collapse``, and ``rms_norm`` or ``rms_norm_fp8``) in two launches."""
    lead, (n, dim) = x.shape[:-2], x.shape[-2:]
    flat, parts, squares = hc_mix_parts(x, fn, norm_eps)
    rows, splits = flat.shape[0], parts.shape[0]
    pre = torch.empty(rows, n, dtype=torch.float32, device=x.device)
    post = torch.empty_like(pre)
    comb = torch.empty(rows, n, n, dtype=torch.float32, device=x.device)
    out = torch.empty(rows, dim, dtype=x.dtype, device=x.device) if collapse else None
    codes = None
    if norm is not None and norm.quant:
        if dim % ACT_GROUP:
            raise ValueError(f"mhc_entry: the hidden size ({dim}) is not a multiple of {ACT_GROUP}")
        codes = fp8_codes(flat[:, :dim])
    padded = triton.next_power_of_2(dim)
    cells = triton.next_power_of_2(n) * padded
    whole = cells <= FINISH_ROW_CELLS
    block = padded if whole else min(padded, FINISH_BLOCK_D)
    warps = max(2, cells // FINISH_CELLS_PER_WARP) if whole else 4
    if rows:
        stored = pre if out is None else out  # unread without COLLAPSE
        q, s = codes if codes is not None else (stored, stored)  # unread without QUANT
        _mhc_finish_kernel[(rows,)](
            parts,
            squares,
            base.float().contiguous(),
            scale.float().contiguous(),
            flat,
            pre,
            post,
            comb,
            stored,
            norm.weight.float().contiguous() if norm is not None else stored,
            q,
            s,
            rows,
            splits,
            dim,
            sinkhorn_iters,
            norm_eps,
            hc_eps,
            norm.eps if norm is not None else 0.0,
            N=n,
            NP=triton.next_power_of_2(n),
            BLOCK_S=triton.next_power_of_2(splits),
            BLOCK_D=block,
            COLLAPSE=collapse,
            NORM=norm is not None,
            QUANT=codes is not None,
            WHOLE=whole,
            EXACT=dim == block,
            EMULATE=EMULATE_CAST,
            num_warps=warps,
        )
    collapsed = None if out is None else out.view(*lead, dim)
    if codes is not None:
        codes = (codes[0].view(*lead, dim), codes[1].view(*lead, dim // ACT_GROUP))
    return pre.view(*lead, n), post.view(*lead, n), comb.view(*lead, n, n), collapsed, codes
