"""A verification pass's compressor windows over the shared slot buffers, as one kernel.

A verification row feeds up to T tokens (its last token and its drafts). In torch ops one
compressor's pass is about twenty launches (the position bias, history-ring and open-window
writes, the candidate windows' gathers, the stored previous half, the pooling), in every
compressor of every verification pass. Here one program takes one row's block of entry channels
and does all of it: each candidate window that closes within the row's real tokens is read (its
rows before the pass from the open window, the rest from the new projections) and pooled with
:func:`~deepinfer_kernels_sm100.compress.pool_window`, as the decode step's kernel pools it,
with the same tiles and FMA contraction off, so a window pooled here and one pooled a token at a
time get the same bits. A window that does not close is not read: its row of the result is
zeros, a provisional entry that goes to the padding slot. Then the row's real tokens go to the
history ring, its last ``ratio`` to the open window, and the first halves of its last closing
window to the stored previous half.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl
from torch import Tensor

from deepinfer_kernels_sm100.compress import NO_FMA, pool_tiles, pool_window, slot_buffers
from deepinfer_kernels_sm100.fp8_quant import EMULATE_CAST
from deepinfer_kernels_sm100.fp8_split import store_rounded

if TYPE_CHECKING:
    from deepinfer.backends.compress_ref import WindowBuffers
    from deepinfer.backends.compress_verify_ref import VerifyPlan


@triton.jit
def _window_rows(  # noqa: PLR0917
    kv_ptr,
    score_ptr,
    bias_ptr,
    kv_buf_ptr,
    score_buf_ptr,
    row_in,
    slot,
    start,
    end,
    last_t,
    r,
    width,
    stride_t,
    j,
    ch,
    mask,
    HAS_BIAS: tl.constexpr,
):
    """Rows ``j`` [R] of the window that ends ``end`` positions after the row's first,
    channels ``ch`` [C]: a row before the pass from the slot's open window (biased when it was
    written), the others from the new projections with their bias; 0 where ``mask`` is off."""
    at = start + end - (r - 1) + j  # positions: the window starts on a multiple of r
    new = at - start  # offset among the row's new tokens (< 0: before the pass)
    fresh = (new >= 0)[:, None]
    phase = at % r
    t = tl.minimum(tl.maximum(new, 0), last_t)
    src = row_in + t[:, None] * stride_t + ch[None, :]
    s = tl.load(score_ptr + src, mask=mask & fresh, other=0.0)
    if HAS_BIAS:
        s += tl.load(bias_ptr + phase[:, None] * width + ch[None, :], mask=mask & fresh, other=0.0)
    v = tl.load(kv_ptr + src, mask=mask & fresh, other=0.0)
    buf = (slot * r + phase)[:, None] * width + ch[None, :]
    before = mask & (new < 0)[:, None]
    s = tl.where(fresh, s, tl.load(score_buf_ptr + buf, mask=before, other=0.0))
    v = tl.where(fresh, v, tl.load(kv_buf_ptr + buf, mask=before, other=0.0))
    return s, v


@triton.jit
def _write_tokens(  # noqa: PLR0917
    kv_ptr,
    score_ptr,
    bias_ptr,
    kv_buf_ptr,
    score_buf_ptr,
    hist_kv_ptr,
    hist_score_ptr,
    row_in,
    slot,
    positions,
    real,
    opened,
    r,
    width,
    keep,
    stride_t,
    t,
    ch,
    cmask,
    HISTORY: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
    """The row's real tokens' channels ``ch`` to the history ring (position p at row p %
    keep), the ``opened`` ones (its last ``r``) to the open window's rows."""
    phase = positions % r
    both = real[:, None] & cmask[None, :]
    src = row_in + t[:, None] * stride_t + ch[None, :]
    s = tl.load(score_ptr + src, mask=both, other=0.0)
    if HAS_BIAS:
        s += tl.load(bias_ptr + phase[:, None] * width + ch[None, :], mask=both, other=0.0)
    v = tl.load(kv_ptr + src, mask=both, other=0.0)
    at = (slot * r + phase)[:, None] * width + ch[None, :]
    tl.store(kv_buf_ptr + at, v, mask=both & opened[:, None])
    tl.store(score_buf_ptr + at, s, mask=both & opened[:, None])
    if HISTORY:
        ring = (slot * keep + positions % keep)[:, None] * width + ch[None, :]
        tl.store(hist_kv_ptr + ring, v, mask=both)
        tl.store(hist_score_ptr + ring, s, mask=both)


@triton.jit(do_not_specialize=["r", "dim", "keep", "t_len"])
def _verify_pool_kernel(  # noqa: PLR0917 (Triton kernels take positional arguments)
    kv_ptr,
    score_ptr,  # [B, T, c * dim] fp32, rows ``stride_b``, tokens ``stride_t`` apart
    bias_ptr,  # [r, c * dim] fp32: the position bias added to the scores (HAS_BIAS)
    kv_buf_ptr,
    score_buf_ptr,  # [slots, r, c * dim] fp32: the open windows
    prev_kv_ptr,
    prev_score_ptr,  # [slots, r, dim] fp32: the stored first halves (OVERLAP)
    hist_kv_ptr,
    hist_score_ptr,  # [slots, keep, c * dim] fp32: the history rings (HISTORY)
    slots_ptr,  # [B] int64, ``stride_slot`` apart
    positions_ptr,  # [B, T] int64, ``stride_pos`` apart: each token's position
    lengths_ptr,  # [B] int64, contiguous: each row's real tokens
    out_ptr,  # [B, NUM_WINDOWS, dim]: fp32, or rounded once to the entries' dtype
    r,
    dim,
    keep,
    t_len,
    stride_b,
    stride_t,
    stride_slot,
    stride_pos,
    stride_pos_t,
    NUM_WINDOWS: tl.constexpr,
    OVERLAP: tl.constexpr,
    HISTORY: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    EMULATE: tl.constexpr,  # the interpreter's casts truncate: round in fp32 first
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    b = tl.program_id(0)
    c = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    j = tl.arange(0, BLOCK_R)
    width = 2 * dim if OVERLAP else dim
    cmask = c < dim
    mask = (j < r)[:, None] & cmask[None, :]
    slot = tl.load(slots_ptr + b * stride_slot)
    length = tl.load(lengths_ptr + b)
    start = tl.load(positions_ptr + b * stride_pos)
    row_in = b * stride_b
    own = c + dim if OVERLAP else c  # this window's channels: its second halves with overlap
    first_end = r - 1 - start % r  # offset of the row's first window end
    carried = (slot * r + j[:, None]) * dim + c[None, :]
    last_s = tl.zeros((BLOCK_R, BLOCK_D), dtype=tl.float32)
    last_v = tl.zeros((BLOCK_R, BLOCK_D), dtype=tl.float32)
    if OVERLAP:  # window -1's first halves: the stored ones
        last_s = tl.load(prev_score_ptr + carried, mask=mask, other=0.0)
        last_v = tl.load(prev_kv_ptr + carried, mask=mask, other=0.0)
    s0 = tl.where(mask, last_s, float("-inf"))
    v0 = last_v
    for w in tl.static_range(NUM_WINDOWS):
        end = first_end + w * r
        pooled = tl.zeros((BLOCK_D,), dtype=tl.float32)
        if end < length:  # the window closes: read and pool it
            s, v = _window_rows(
                kv_ptr, score_ptr, bias_ptr, kv_buf_ptr, score_buf_ptr, row_in, slot, start,
                end, t_len - 1, r, width, stride_t, j, own, mask, HAS_BIAS,
            )  # fmt: skip
            s = tl.where(mask, s, float("-inf"))
            s = tl.where(cmask[None, :], s, 0.0)  # columns past the entry: finite, never stored
            if OVERLAP:
                pooled = pool_window(s, v, s0, v0, True)
                last_s, last_v = _window_rows(
                    kv_ptr, score_ptr, bias_ptr, kv_buf_ptr, score_buf_ptr, row_in, slot, start,
                    end, t_len - 1, r, width, stride_t, j, c, mask, HAS_BIAS,
                )  # fmt: skip
                s0 = tl.where(mask, last_s, float("-inf"))
                v0 = last_v
            else:
                pooled = pool_window(s, v, s, v, False)
        store_rounded(out_ptr + (b * NUM_WINDOWS + w) * dim + c, pooled, cmask, EMULATE)
    tl.debug_barrier()  # every thread has read the rows written below
    t = tl.arange(0, BLOCK_T)
    real = t < length
    positions = tl.load(positions_ptr + b * stride_pos + t * stride_pos_t, mask=real, other=0)
    opened = real & (t >= length - r)
    _write_tokens(
        kv_ptr, score_ptr, bias_ptr, kv_buf_ptr, score_buf_ptr, hist_kv_ptr, hist_score_ptr,
        row_in, slot, positions, real, opened, r, width, keep, stride_t, t, own, cmask,
        HISTORY, HAS_BIAS,
    )  # fmt: skip
    if OVERLAP:
        _write_tokens(
            kv_ptr, score_ptr, bias_ptr, kv_buf_ptr, score_buf_ptr, hist_kv_ptr, hist_score_ptr,
            row_in, slot, positions, real, opened, r, width, keep, stride_t, t, c, cmask,
            HISTORY, HAS_BIAS,
        )  # fmt: skip
        if first_end < length:  # a window closed: its first halves are the next one's
            tl.store(prev_score_ptr + carried, last_s, mask=mask)
            tl.store(prev_kv_ptr + carried, last_v, mask=mask)


def verify_pool(  # noqa: PLR0917
    kv: Tensor,
    score: Tensor,
    bias: Tensor | None,
    buffers: WindowBuffers,
    slots: Tensor,
    plan: VerifyPlan,
    *,
    overlap: bool,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """:meth:`deepinfer.backends.base.Backend.compress_verify` for ratios above 1, in one
    kernel: ``kv``/``score`` [B, T, c * D] fp32 (slices of one fused projection's output are
    read in place) -> [B, W, D] in ``dtype``, zeros in the windows that do not close."""
    b, t, width = kv.shape
    r = buffers.ratio
    dim = width // 2 if overlap else width
    n = -(-t // r)
    out = torch.empty(b, n, dim, dtype=dtype, device=kv.device)
    if b == 0:
        return out
    history = buffers.hist_kv_buf is not None
    kv_buf, score_buf, prev_kv, prev_score, hist_kv, hist_score = slot_buffers(
        buffers, overlap, history, "compress_verify"
    )
    if kv.stride(-1) != 1 or score.stride(-1) != 1 or kv.stride()[:2] != score.stride()[:2]:
        kv, score = kv.contiguous(), score.contiguous()
    block_r, block_d = pool_tiles(r, dim)
    positions, lengths = plan.positions, plan.lengths.contiguous()
    _verify_pool_kernel[(b, triton.cdiv(dim, block_d))](
        kv,
        score,
        kv_buf if bias is None else bias.contiguous(),
        kv_buf,
        score_buf,
        prev_kv,
        prev_score,
        hist_kv,
        hist_score,
        slots,
        positions,
        lengths,
        out,
        r,
        dim,
        hist_kv.shape[1] if history else 1,
        t,
        kv.stride(0),
        kv.stride(1),
        slots.stride(0),
        positions.stride(0),
        positions.stride(1),
        NUM_WINDOWS=n,
        OVERLAP=overlap,
        HISTORY=history,
        HAS_BIAS=bias is not None,
        EMULATE=EMULATE_CAST,
        BLOCK_R=block_r,
        BLOCK_D=block_d,
        BLOCK_T=max(16, triton.next_power_of_2(t)),
        **NO_FMA,
    )
    return out
