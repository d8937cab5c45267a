"""What an attention program's walk over its keys shares with the other attention kernels:
adding a key tile's values to the output (:func:`pv_accumulate`), the merge of a query row's
key ranges (flash-decoding's second kernel) and the rotation of the output's rope channels back
to the query position (``attention``'s ``DEROTATE``)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from deepinfer_kernels_sm100.elementwise import rope_pairs, turn


@triton.jit
def pv_accumulate(acc, p, v, keep, PV_PARTS: tl.constexpr):
    """``acc`` [rows, cols] rescaled by ``keep`` [rows] plus ``p`` [rows, keys] (fp32
    probabilities) times ``v`` [keys, cols]. bf16 values (``PV_PARTS`` > 0) meet p as that many
    bf16 parts, p = p_1 + ... + p_n exactly, each part's products with the bf16 values exact in
    the tensor cores' fp32 sums; fp32 values (0) an IEEE fp32 dot."""
    if PV_PARTS > 0:
        acc = acc * keep[:, None]
        rest = p
        for _ in tl.static_range(PV_PARTS):
            p_part = rest.to(tl.bfloat16)
            acc = tl.dot(p_part, v, acc)
            rest = rest - p_part.to(tl.float32)
    else:
        acc = acc * keep[:, None] + tl.dot(p, v.to(tl.float32), input_precision="ieee")
    return acc


@triton.jit
def derotate(  # noqa: PLR0917 (Triton helpers take positional arguments)
    out_ptr, cos_ptr, sin_ptr, row, h, hmask, dv, heads, dim, rot_start, half
):
    """Rotate back the rope channels among columns ``dv`` of heads ``h`` of output row
    ``row``, stored just before by this program: reloaded and turned as
    ``elementwise._rope_kernel`` turns them (inverse), so the same bits."""
    tl.debug_barrier()  # every thread's stores are in before any is read back
    rotated, pair, is_odd, partner = rope_pairs(dv, rot_start)
    mask = hmask[:, None] & (rotated & (dv < dim))[None, :]
    base = out_ptr + row * heads * dim + h[:, None] * dim
    x = tl.load(base + dv[None, :], mask=mask, other=0.0)
    xp = tl.load(base + partner[None, :], mask=mask, other=0.0)
    y = turn(x, xp, cos_ptr, sin_ptr, row * half, pair, rotated, is_odd, -1.0)
    tl.store(base + dv[None, :], y, mask=mask)


@triton.jit(do_not_specialize=["splits"])
def _combine_kernel(  # noqa: PLR0917 (Triton kernels take positional arguments)
    part_ptr,
    stat_ptr,
    sink_ptr,
    out_ptr,
    cos_ptr,  # [B*S, half] fp32: the query rows' angles (DEROTATE)
    sin_ptr,
    heads,
    dim,
    splits,
    rot_start,
    half,
    DEROTATE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    """Softmax-merge the splits of one query row, in split order (a fixed summation order)."""
    row = tl.program_id(0)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    dv = tl.program_id(2) * BLOCK_DV + tl.arange(0, BLOCK_DV)
    hmask = h < heads
    mask = hmask[:, None] & (dv < dim)[None, :]
    sink = tl.load(sink_ptr + h, mask=hmask, other=0.0).to(tl.float32)
    top = sink  # every split's running max started at the sink, so top >= sink
    for s in range(splits):
        top = tl.maximum(top, tl.load(stat_ptr + (row * splits + s) * 2 * heads + h, hmask, 0.0))
    denom = tl.exp(sink - top)
    acc = tl.zeros((BLOCK_H, BLOCK_DV), dtype=tl.float32)
    for s in range(splits):
        part = row * splits + s
        weight = tl.exp(tl.load(stat_ptr + part * 2 * heads + h, hmask, 0.0) - top)
        denom += tl.load(stat_ptr + (part * 2 + 1) * heads + h, hmask, 0.0) * weight
        values = tl.load(part_ptr + (part * heads + h[:, None]) * dim + dv[None, :], mask, 0.0)
        acc += values * weight[:, None]
    tl.store(
        out_ptr + row * heads * dim + h[:, None] * dim + dv[None, :],
        (acc / denom[:, None]).to(out_ptr.dtype.element_ty),
        mask=mask,
    )
    if DEROTATE and tl.program_id(2) * BLOCK_DV + BLOCK_DV > rot_start:
        derotate(out_ptr, cos_ptr, sin_ptr, row, h, hmask, dv, heads, dim, rot_start, half)


def combine_splits(  # noqa: PLR0917
    part: Tensor,
    stat: Tensor,
    sinks: Tensor,
    out: Tensor,
    blocks: tuple[int, int, int],
    angles: tuple[Tensor, Tensor, int, int],
    *,
    derotate: bool,
    block_h: int,
    block_dv: int,
) -> None:
    """Merge each query row's key ranges (``part`` [rows, splits, H, D], ``stat``) into
    ``out`` over ``blocks`` (rows, head blocks, column blocks); with ``derotate`` the merged
    output rotated back at ``angles`` (cos, sin [rows, r/2] fp32, first rope channel, r/2)."""
    heads, dim, splits = out.shape[2], out.shape[3], part.shape[1]
    cos, sin, rot_start, half = angles
    _combine_kernel[blocks](
        part, stat, sinks, out, cos, sin, heads, dim, splits, rot_start, half,
        DEROTATE=derotate, BLOCK_H=block_h, BLOCK_DV=block_dv,
    )  # fmt: skip


def split_buffers(
    out: Tensor, rows: int, keys: int, splits: int, block_l: int
) -> tuple[int, int, Tensor, Tensor]:
    """A walk of ``keys`` keys per query row cut into ``splits`` ranges: (keys per range, a
    multiple of ``block_l``; the ranges, none left without keys; each range's unnormalised
    output [rows, ranges, H, D] and running max and denominator [rows, ranges, 2, H], fp32,
    for :func:`combine_splits`, or ``out`` twice, unread, where there is one range)."""
    heads, dim = out.shape[-2:]
    split_keys = triton.cdiv(triton.cdiv(max(keys, 1), splits), block_l) * block_l
    splits = triton.cdiv(max(keys, 1), split_keys)
    part = stat = out
    if splits > 1:
        part = torch.empty(rows, splits, heads, dim, dtype=torch.float32, device=out.device)
        stat = torch.empty(rows, splits, 2, heads, dtype=torch.float32, device=out.device)
    return split_keys, splits, part, stat


def rope_angles(
    angles: tuple[Tensor, Tensor] | None, b: int, s: int, dim: int, unread: Tensor
) -> tuple[Tensor, Tensor, int, int]:
    """(cos, sin [b * s, r/2] fp32, the first rope channel, r/2) of the query rows' ``angles``
    (cos, sin broadcastable to [b, s, r/2]) for a head of ``dim`` columns whose trailing r
    are rotated back; without angles ``unread`` twice and zeros."""
    if angles is None:
        return unread, unread, 0, 0
    half = angles[0].shape[-1]
    cos, sin = (a.expand(b, s, half).reshape(b * s, half).float().contiguous() for a in angles)
    return cos, sin, dim - 2 * half, half
