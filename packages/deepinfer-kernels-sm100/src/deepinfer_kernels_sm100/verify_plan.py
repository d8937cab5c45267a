"""A verification pass's window plan of one ratio in one kernel.

The reference (:func:`~deepinfer.backends.compress_verify_ref.plan_windows`) derives each
row's candidate windows from its first position and real length with about twenty small index
ops, made once a pass for every ratio the model compresses at: each a kernel launch in the
captured pass, where here one program a row writes every field of the plan.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from deepinfer.backends.compress_verify_ref import VerifyPlan


@triton.jit
def _verify_plan_kernel(  # noqa: PLR0917
    pos_ptr,
    slot_ptr,
    len_ptr,
    phase_ptr,
    closes_ptr,
    entry_ptr,
    source_ptr,
    position_ptr,
    open_ptr,
    count_ptr,
    t,
    w,
    R: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_W: tl.constexpr,
):
    """Row ``program_id(0)``'s plan: the fields of :class:`VerifyPlan` (positions of real
    tokens are >= 0, so C's remainder is the floor remainder wherever it is taken of them)."""
    b = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_T)
    in_row = offs < t
    pos = tl.load(pos_ptr + b * t + offs, mask=in_row, other=0)
    slot = tl.load(slot_ptr + b * t + offs, mask=in_row, other=0)
    length = tl.load(len_ptr + b)
    start = tl.load(pos_ptr + b * t)
    tl.store(phase_ptr + b * t + offs, pos % R, mask=in_row)
    last = (offs < length) & (offs >= length - R)  # the window left open: one token a phase
    tl.store(open_ptr + b * t + offs, tl.where(last, slot, 0), mask=in_row)
    win = tl.arange(0, BLOCK_W)
    in_w = win < w
    ends = ((R - 1 - start) % R + R) % R + R * win  # each candidate window's last offset
    closes = (ends < length) & in_w
    tl.store(closes_ptr + b * w + win, closes, mask=in_w)
    tl.store(entry_ptr + b * w + win, (start + ends) // R, mask=in_w)
    tl.store(count_ptr + b, tl.sum(closes.to(tl.int64), axis=0))
    j = tl.arange(0, R)
    at = (start + ends)[:, None] - (R - 1) + j[None, :]  # each window row's position
    new = at - start  # its offset among the new tokens (< 0: before the step)
    source = tl.where(new >= 0, R + tl.minimum(new, t - 1), (at % R + R) % R)
    cells = (b * w + win[:, None]) * R + j[None, :]
    tl.store(source_ptr + cells, source, mask=in_w[:, None])
    tl.store(position_ptr + cells, at, mask=in_w[:, None])


def verify_plan(positions: Tensor, slots: Tensor, lengths: Tensor, ratio: int) -> VerifyPlan:
    """:meth:`~deepinfer.backends.base.Backend.verify_plan` in one launch (a power-of-two
    ``ratio``, as the models' are)."""
    if ratio & (ratio - 1):
        raise ValueError(f"a compression ratio of {ratio} is not a power of two")
    b, t = positions.shape
    w = -(-t // ratio)
    positions, slots, lengths = positions.contiguous(), slots.contiguous(), lengths.contiguous()
    long = {"dtype": torch.long, "device": positions.device}
    phase, open_slots = torch.empty(b, t, **long), torch.empty(b, t, **long)
    entry, count = torch.empty(b, w, **long), torch.empty(b, **long)
    source, position = torch.empty(b, w, ratio, **long), torch.empty(b, w, ratio, **long)
    closes = torch.empty(b, w, dtype=torch.bool, device=positions.device)
    if b:
        _verify_plan_kernel[(b,)](
            positions, slots, lengths, phase, closes, entry, source, position, open_slots,
            count, t, w, R=ratio, BLOCK_T=triton.next_power_of_2(t),
            BLOCK_W=triton.next_power_of_2(w),
        )  # fmt: skip
    return VerifyPlan(
        positions=positions,
        token_slots=slots,
        lengths=lengths,
        phase=phase,
        closes=closes,
        entry=entry,
        source=source,
        position=position,
        open_slots=open_slots,
        count=count,
    )
