"""A head's RMSNorm and its RoPE in one kernel.

Attention normalises each query head (unweighted) and the kv row (weighted) and then rotates
their rope channels; the compressors do the same to every entry they pool, and V4.1's candidate
indexer to its keys. Separately that is two launches where one reads the row once: in a decode
step, about three launches a layer. The norm's output is rounded to the model dtype before it
is rotated, as the two separate kernels do.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from deepinfer_kernels_sm100.elementwise import normed, rope_pairs, rope_rows, turn
from deepinfer_kernels_sm100.fp8_quant import EMULATE_CAST


@triton.jit
def _norm_rope_kernel(  # noqa: PLR0917 (Triton kernels take positional arguments)
    x_ptr,  # [rows, heads, dim], heads contiguous, rows ``x_stride`` apart
    w_ptr,  # [dim] fp32 (HAS_WEIGHT)
    cos_ptr,
    sin_ptr,  # [rows, half]
    out_ptr,  # [rows, heads, dim], contiguous; OUT_ROWS: [pool rows, heads, dim]
    dest_ptr,  # [rows] int64: each row's row of out (OUT_ROWS)
    heads,
    dim,
    rot_start,
    half,
    x_stride,
    eps,
    HAS_WEIGHT: tl.constexpr,
    OUT_ROWS: tl.constexpr,
    EMULATE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Each head's RMSNorm as ``_rms_norm_kernel`` computes it, rounded to the output dtype,
    then rotated as ``_rope_kernel`` rotates it: a rotated channel's partner is normed from
    its own input, with the head's statistics."""
    row = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    mask = (h[:, None] < heads) & (d[None, :] < dim)
    base = x_ptr + row * x_stride + h[:, None] * dim
    x = tl.load(base + d[None, :], mask=mask, other=0.0).to(tl.float32)
    inv = tl.rsqrt(tl.sum(x * x, axis=1) / dim + eps)[:, None]
    rotated, pair, is_odd, partner = rope_pairs(d, rot_start)
    pmask = mask & rotated[None, :]
    xp = tl.load(base + partner[None, :], mask=pmask, other=0.0).to(tl.float32)
    y = normed(x, inv, w_ptr, d[None, :], mask, out_ptr, HAS_WEIGHT, EMULATE)
    yp = normed(xp, inv, w_ptr, partner[None, :], pmask, out_ptr, HAS_WEIGHT, EMULATE)
    y = turn(y, yp, cos_ptr, sin_ptr, row * half, pair, rotated, is_odd, 1.0)
    dest = tl.load(dest_ptr + row).to(tl.int64) if OUT_ROWS else row
    tl.store(out_ptr + (dest * heads + h[:, None]) * dim + d[None, :], y, mask=mask)


def rms_norm_rope(x: Tensor, weight: Tensor | None, eps: float, cos: Tensor, sin: Tensor) -> Tensor:
    """:func:`rms_norm` over each head of ``x`` [..., S, H, D], then :func:`rope` on the
    result, in one launch (two in torch's order of the separate kernels; the same roundings,
    with the head's sum of squares in this kernel's order)."""
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _launch(x, weight, eps, cos, sin, out, None)
    return out


def rms_norm_rope_into(  # noqa: PLR0917
    x: Tensor,
    weight: Tensor | None,
    eps: float,
    cos: Tensor,
    sin: Tensor,
    pool: Tensor,
    rows: Tensor,
) -> None:
    """:func:`rms_norm_rope` of ``x`` [B, 1, 1, D], row b stored at row ``rows[b]`` of
    ``pool`` [R, D] (contiguous, ``x``'s dtype): the same values, no indexed write after."""
    _launch(x, weight, eps, cos, sin, pool, rows.to(torch.int64).contiguous())


def _launch(  # noqa: PLR0917
    x: Tensor,
    weight: Tensor | None,
    eps: float,
    cos: Tensor,
    sin: Tensor,
    out: Tensor,
    dest: Tensor | None,
) -> None:
    flat, c, s = rope_rows(x, cos, sin)
    rows, heads, dim = flat.shape
    half = c.shape[-1]
    if rows:
        block_h = min(triton.next_power_of_2(heads), 16)
        _norm_rope_kernel[(rows, triton.cdiv(heads, block_h))](
            flat,
            weight.contiguous() if weight is not None else flat,  # unread without a weight
            c,
            s,
            out,
            flat if dest is None else dest,  # unread without OUT_ROWS
            heads,
            dim,
            dim - 2 * half,
            half,
            flat.stride(0),
            eps,
            HAS_WEIGHT=weight is not None,
            OUT_ROWS=dest is not None,
            EMULATE=EMULATE_CAST,
            BLOCK_H=block_h,
            BLOCK_D=triton.next_power_of_2(dim),
        )
