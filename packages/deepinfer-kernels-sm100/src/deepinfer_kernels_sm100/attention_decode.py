"""Decode attention over paged keys with the key rows as the tensor cores' long side.

A decode row has one query of ``H`` heads. :mod:`.attention`'s kernel puts the heads on the
dots' M side: with 16 heads (config A) that is an M = 16 dot, below Hopper's 64-row warpgroup
MMA (``wgmma``), so Triton falls back to warp-level MMAs whose operands pass through registers.
A 64 x 512 key tile and a 16 x 512 accumulator then fill the register file (255 registers a
thread with spills, one program an SM), the head is walked in 64-column slices whose gathered
loads wait one after the other, and the values are gathered a second time.

Here the roles turn round, as in the transposed formulation of small-head decode kernels:

* logits^T [L, H] = K [L, D] . q^T [D, H]: a block of key rows against the whole head, one
  K = D dot;
* out^T [D, H] += K^T [D, L] . p^T [L, H]: the head's columns are the M side (``wgmma``
  tiles), and the same key tile, read transposed from shared memory, is the values' operand,
  so each key row is gathered once.

The key tile is a dot operand in shared memory, so Triton's pipeliner fetches the next block's
rows while this one's dots run, and with a register cap two programs share an SM. The softmax
runs down the columns (per head); the probabilities are cut into :data:`.attention.PV_PARTS`
bf16 parts as there (each part's products exact, summed in fp32). The running
maximum and denominator start at the sink (the sink joins the denominator once), and a split
of the keys writes the same partial results as :mod:`.attention`'s, merged by
:func:`.attention_combine.combine_splits`.

It pays with many rows (:data:`MIN_ROWS`): its walk over one key block takes longer than the
other program's, which a few rows, their keys split over many programs, feel. The output's
bits differ from :mod:`.attention`'s kernel's in the last places (another sum order in the
tensor cores), so a row's bits depend on whether its batch reaches :data:`MIN_ROWS`, as they
already did on the key splits a small batch takes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from deepinfer_kernels_sm100.attention_combine import (
    combine_splits,
    derotate,
    rope_angles,
    split_buffers,
)
from deepinfer_kernels_sm100.attention_paged import KeyPool, key_tile, paged_rows


@triton.jit(do_not_specialize=["keys", "split_keys", "splits", "keys_a", "n_pages", "n_pages2"])
def _decode_t_kernel(  # noqa: PLR0917 (Triton kernels take positional arguments)
    q_ptr,  # [B, H, D]
    kv_ptr,  # pool a, [rows, D]
    kv2_ptr,  # pool b, [rows, D]
    select_ptr,  # [B, keys_a] entries of pool a, -1 = none
    select2_ptr,  # [B, keys - keys_a] entries of pool b
    pages_ptr,  # [B, n_pages] pool a's page of each block of per_page entries
    pages2_ptr,
    sink_ptr,
    out_ptr,
    part_ptr,  # [B, splits, H, D] fp32: each split's unnormalised output (SPLIT)
    stat_ptr,  # [B, splits, 2, H] fp32: each split's running max and denominator (SPLIT)
    cos_ptr,  # [B, half] fp32: the query rows' angles (DEROTATE)
    sin_ptr,
    heads,
    keys,
    dim,
    scale,
    split_keys,
    splits,
    keys_a,
    n_pages,
    n_pages2,
    per_page,
    per_page2,
    rot_start,
    half,
    POOLS: tl.constexpr,
    SPLIT: tl.constexpr,
    DEROTATE: tl.constexpr,
    NATIVE: tl.constexpr,  # bf16 dots as they are (False: upcast, Triton's interpreter)
    PV_PARTS: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_L: tl.constexpr,
    BLOCK_D: tl.constexpr,  # the whole head, a power of two
):
    row = tl.program_id(0)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    split = tl.program_id(2)
    d = tl.arange(0, BLOCK_D)
    hmask = h < heads
    dmask = d < dim
    q_t = tl.load(
        q_ptr + row * heads * dim + h[None, :] * dim + d[:, None],
        mask=dmask[:, None] & hmask[None, :],
        other=0.0,
    )  # [D, H]
    if not NATIVE:
        q_t = q_t.to(tl.float32)
    top = tl.load(sink_ptr + h, mask=hmask, other=0.0).to(tl.float32)
    denom = tl.full((BLOCK_H,), 0.0 if SPLIT else 1.0, dtype=tl.float32)
    acc = tl.zeros((BLOCK_D, BLOCK_H), dtype=tl.float32)  # out^T
    first = split * split_keys
    for l0 in range(first, first + split_keys, BLOCK_L):
        lk = l0 + tl.arange(0, BLOCK_L)
        lmask = lk < keys
        key_row, visible, in_a = paged_rows(
            select_ptr, select2_ptr, pages_ptr, pages2_ptr, row, lk, lmask, keys_a,
            keys - keys_a, n_pages, n_pages2, per_page, per_page2,
        )  # fmt: skip
        k = key_tile(kv_ptr, kv2_ptr, key_row, d, lmask & visible, dmask, in_a, dim, POOLS)
        # [L, H]; the interpreter's bf16 dots are wrong, so there fp32 ones
        logits = tl.dot(k, q_t) if NATIVE else tl.dot(k.to(tl.float32), q_t, input_precision="ieee")
        logits = tl.where(visible[:, None], logits * scale, float("-inf"))
        new_top = tl.maximum(top, tl.max(logits, axis=0))
        p = tl.exp(logits - new_top[None, :])
        keep = tl.exp(top - new_top)
        denom = denom * keep + tl.sum(p, axis=0)
        acc = acc * keep[None, :]
        if NATIVE:
            rest = p
            for _ in tl.static_range(PV_PARTS):
                p_part = rest.to(tl.bfloat16)
                acc = tl.dot(tl.trans(k), p_part, acc)
                rest = rest - p_part.to(tl.float32)
        else:
            acc = tl.dot(tl.trans(k.to(tl.float32)), p, acc, input_precision="ieee")
        top = new_top
    if SPLIT:
        part = row * splits + split
        tl.store(
            part_ptr + (part * heads + h[None, :]) * dim + d[:, None],
            acc,
            mask=dmask[:, None] & hmask[None, :],
        )
        tl.store(stat_ptr + part * 2 * heads + h, top, mask=hmask)
        tl.store(stat_ptr + (part * 2 + 1) * heads + h, denom, mask=hmask)
    else:
        tl.store(
            out_ptr + row * heads * dim + h[None, :] * dim + d[:, None],
            (acc / denom[None, :]).to(out_ptr.dtype.element_ty),
            mask=dmask[:, None] & hmask[None, :],
        )
        if DEROTATE:
            derotate(out_ptr, cos_ptr, sin_ptr, row, h, hmask, d, heads, dim, rot_start, half)


#: Whether paged decode rows of few heads take this kernel (a knob for A/B runs).
ENABLED = True
#: Keys a program takes at a time, warps and pipeline stages of a program, and its register
#: cap (two programs an SM; None: ptxas's choice). Picked from launch shapes timed at config
#: A's decode rows (``benchmarks/prefill_attention.py --decode-kernels``).
BLOCK_L, NUM_WARPS, NUM_STAGES, MAXNREG = 32, 8, 2, 128
#: Heads a program may take: its accumulator holds the whole head for each (D x H fp32).
MAX_HEADS = 16
#: Rows a launch needs to come here: below, :mod:`.attention`'s program (a few rows split
#: their keys over many programs, and its shorter walk per key block wins there).
MIN_ROWS = 128
#: Programs a launch should have before its rows' keys are split into ranges (None: never).
TARGET_PROGRAMS: int | None = None


def fits(q: Tensor, one: KeyPool, two: KeyPool) -> bool:
    """Whether a paged decode launch of ``q`` [B, 1, H, D] over pools ``one`` and ``two``
    comes to this kernel: :data:`MIN_ROWS` rows or more, bf16 queries and keys (tensor-core
    dots) in pools of one dtype (an fp32 second pool needs a second load and select), and at
    most :data:`MAX_HEADS` heads, the launches that run in M = 16 dots otherwise."""
    return (
        ENABLED
        and q.shape[0] >= MIN_ROWS
        and q.dtype == one.rows.dtype == two.rows.dtype == torch.bfloat16
        and q.shape[2] <= MAX_HEADS
    )


def decode_attention(  # noqa: PLR0917
    q: Tensor,
    one: KeyPool,
    two: KeyPool,
    sinks: Tensor,
    scale: float,
    angles: tuple[Tensor, Tensor] | None,
    splits: int | None,
    native: bool,
    pv_parts: int,
) -> Tensor:
    """Attention output [B, 1, H, D] of decode rows ``q`` over pools ``one`` then ``two``
    (``paged_mqa_sink_attention``'s contract), each row's keys cut into ``splits`` ranges
    merged after (None: enough for :data:`TARGET_PROGRAMS`); ``native``: bf16 dots as they
    are, ``pv_parts``: see the module."""
    b, _, h, dim = q.shape
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if b * h == 0:
        return out
    block_h = max(16, triton.next_power_of_2(h))
    block_d = triton.next_power_of_2(dim)
    keys = one.entries.shape[-1] + two.entries.shape[-1]
    if splits is None:
        wanted = triton.cdiv(TARGET_PROGRAMS, b) if TARGET_PROGRAMS else 1
        splits = max(1, min(wanted, triton.cdiv(keys, BLOCK_L)))
    split_keys, splits, part, stat = split_buffers(out, b, keys, splits, BLOCK_L)
    cos, sin, rot_start, half = rope_angles(angles, b, 1, dim, sinks)
    sinks = sinks.float().contiguous()
    blocks = (b, triton.cdiv(h, block_h), splits)
    _decode_t_kernel[blocks](
        q.contiguous(), one.rows, two.rows, one.entries, two.entries, one.pages, two.pages,
        sinks, out, part, stat, cos, sin, h, keys, dim, scale, split_keys, splits,
        one.entries.shape[-1], one.pages.shape[1], two.pages.shape[1], one.per_page,
        two.per_page, rot_start, half,
        POOLS=1, SPLIT=splits > 1, DEROTATE=angles is not None, NATIVE=native,
        PV_PARTS=pv_parts, BLOCK_H=block_h, BLOCK_L=BLOCK_L, BLOCK_D=block_d,
        num_warps=NUM_WARPS, num_stages=NUM_STAGES, maxnreg=MAXNREG,
    )  # fmt: skip
    if splits > 1:
        combine_splits(
            part, stat, sinks, out.view(b, 1, h, dim), (b, blocks[1], 1),
            (cos, sin, rot_start, half), derotate=angles is not None, block_h=block_h,
            block_dv=block_d,
        )  # fmt: skip
    return out
