"""The compressor's softmax pooling of windows into entries, as one kernel.

The reference concatenates the previous window's first halves to the current ones (overlapping
ratios), runs a softmax over the window's positions, multiplies and sums: four to eight launches,
and the softmax over a strided dimension is slow in torch (a V4 decode step spent ~25 us in each
ratio-128 layer's softmax, at one row as at 32). Here one program takes one window's block of
channels: it loads the window's scores and values (and, with overlap, the previous window's or the
carried ``prev`` halves), and writes the pooled entry.

A decode step's windows over the shared slot buffers (:func:`slot_pool`) take one kernel more
for all of it: the new row written into the window and the history ring, the window read and
pooled where it completes, the stored previous half replaced there. In torch ops that is
about ten launches a compressor, in every compressor of every decode step. A window still open
is not read at all (a ratio-128 window is 512 KiB of fp32 rows at V4's width): its row of the
result is zeros, a provisional entry that no query sees before the step completing the window
overwrites it.

Both kernels pool through :func:`pool_window`, whose sums over a window's rows have an order
fixed by the window (not by the tile's layout, which the compiler picks per kernel), and both
launch with FMA contraction off: a window pooled by a prefill chunk and by a decode step (or a
verification row) gets the same bits, so no output depends on which path computed an entry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl
from torch import Tensor

from deepinfer_kernels_sm100.fp8_quant import EMULATE_CAST
from deepinfer_kernels_sm100.fp8_split import store_rounded

if TYPE_CHECKING:
    from deepinfer.backends.compress_ref import WindowBuffers


#: A launch option of both pooling kernels: every product rounded before it is added, so the
#: compiler cannot fuse a product into whichever add the tile's layout puts next to it.
NO_FMA = {"enable_fp_fusion": False}


@triton.jit
def _row_sum(x):
    """``x`` [R, C] (R a power of two) summed over its rows by a pairwise tree fixed by R: row j
    plus row j + R/2, then the same over the halves. Every add has two operands, so the bits do
    not depend on the layout; ``tl.sum``'s order over R rows does, and the layouts differ between
    kernels."""
    for _ in tl.static_range(16):
        if x.shape[0] > 1:
            x = tl.sum(tl.reshape(x, (2, x.shape[0] // 2, x.shape[1])), axis=0)
    return tl.reshape(x, (x.shape[1],))


@triton.jit
def pool_window(s, v, s0, v0, OVERLAP: tl.constexpr):
    """A window's softmax-weighted sum over its rows: scores ``s`` and values ``v`` [R, C]
    fp32 (and, with ``OVERLAP``, the previous window's first halves ``s0``/``v0``), masked rows
    at -inf score -> [C]."""
    top = tl.max(s, axis=0)
    if OVERLAP:
        top = tl.maximum(top, tl.max(s0, axis=0))
        e0 = tl.exp(s0 - top[None, :])
        e = tl.exp(s - top[None, :])
        denom = _row_sum(e0) + _row_sum(e)
        total = _row_sum(e0 * v0) + _row_sum(e * v)
    else:
        e = tl.exp(s - top[None, :])
        denom = _row_sum(e)
        total = _row_sum(e * v)
    return total / denom


def pool_tiles(r: int, dim: int) -> tuple[int, int]:
    """(BLOCK_R, BLOCK_D) of every pooling kernel: a window's rows padded to a power of two
    and a block of channels, two [BLOCK_R, BLOCK_D] tiles (four with overlap) in one
    program's registers. One rule for all of them: :func:`_row_sum`'s tree follows BLOCK_R,
    so the kernels pool a window to the same bits."""
    block_r = max(16, triton.next_power_of_2(r))
    return block_r, max(16, min(128, triton.next_power_of_2(dim), 4096 // block_r))


@triton.jit(do_not_specialize=["n", "r", "dim"])
def _softmax_pool_kernel(  # noqa: PLR0917 (Triton kernels take positional arguments)
    kv_ptr,
    score_ptr,  # [B, n, r, c * dim] fp32, last dimension contiguous, the strides below
    prev_kv_ptr,
    prev_score_ptr,  # [B, r, dim], contiguous: window -1's first halves (HAS_PREV)
    out_ptr,  # [B, n, dim]: fp32 or the entries' dtype (rounded once)
    n,
    r,
    dim,
    stride_b,
    stride_n,
    stride_r,
    OVERLAP: tl.constexpr,
    HAS_PREV: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
    EMULATE: tl.constexpr,  # the interpreter's casts truncate: round in fp32 first
):
    row = tl.program_id(0)  # b * n + i
    b = row // n
    i = row % n
    c = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    j = tl.arange(0, BLOCK_R)
    mask = (j < r)[:, None] & (c < dim)[None, :]
    base = b * stride_b + i * stride_n + j[:, None] * stride_r
    # this window's values: its second halves with overlap
    at = base + (c + dim if OVERLAP else c)[None, :]
    s = tl.load(score_ptr + at, mask=mask, other=float("-inf")).to(tl.float32)
    v = tl.load(kv_ptr + at, mask=mask, other=0.0).to(tl.float32)
    s = tl.where((c < dim)[None, :], s, 0.0)  # columns past the entry: finite, never stored
    s0, v0 = s, v
    if OVERLAP:
        # the first halves of window i - 1: in this tensor, or the carried ones for i = 0
        before = base - stride_n + c[None, :]
        inside = mask & (i > 0)
        s0 = tl.load(score_ptr + before, mask=inside, other=float("-inf")).to(tl.float32)
        v0 = tl.load(kv_ptr + before, mask=inside, other=0.0).to(tl.float32)
        if HAS_PREV:
            carried = (b * r + j[:, None]) * dim + c[None, :]
            first = mask & (i == 0)
            s0 = tl.where(
                first, tl.load(prev_score_ptr + carried, mask=first, other=0.0).to(tl.float32), s0
            )
            v0 = tl.where(
                first, tl.load(prev_kv_ptr + carried, mask=first, other=0.0).to(tl.float32), v0
            )
    store_rounded(out_ptr + row * dim + c, pool_window(s, v, s0, v0, OVERLAP), c < dim, EMULATE)


def softmax_pool(
    kv: Tensor,
    score: Tensor,
    prev_kv: Tensor | None,
    prev_score: Tensor | None,
    overlap: bool,
    *,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """:meth:`deepinfer.backends.base.Backend.compress`: ``kv``/``score`` [B, n, r, c * D] fp32
    (c = 2 with ``overlap``), ``prev_kv``/``prev_score`` [B, r, D] or None -> [B, n, D],
    pooled in fp32 and stored as ``dtype`` (round to nearest even, as ``Tensor.to``)."""
    b, n, r, width = kv.shape
    dim = width // 2 if overlap else width
    out = torch.empty(b, n, dim, dtype=dtype, device=kv.device)
    if out.numel() == 0:
        return out
    if kv.stride() != score.stride() or kv.stride(-1) != 1:
        kv, score = kv.contiguous(), score.contiguous()
    has_prev = overlap and prev_kv is not None and prev_score is not None
    if has_prev:
        assert prev_kv is not None and prev_score is not None
        prev_kv, prev_score = prev_kv.contiguous(), prev_score.contiguous()
    else:
        prev_kv, prev_score = kv, score  # never read
    block_r, block_d = pool_tiles(r, dim)
    _softmax_pool_kernel[(b * n, triton.cdiv(dim, block_d))](
        kv,
        score,
        prev_kv,
        prev_score,
        out,
        n,
        r,
        dim,
        kv.stride(0),
        kv.stride(1),
        kv.stride(2),
        OVERLAP=overlap,
        HAS_PREV=has_prev,
        BLOCK_R=block_r,
        BLOCK_D=block_d,
        EMULATE=EMULATE_CAST,
        **NO_FMA,
    )
    return out


@triton.jit(do_not_specialize=["r", "dim", "keep"])
def _slot_pool_kernel(  # noqa: PLR0917 (Triton kernels take positional arguments)
    kv_ptr,
    score_ptr,  # [B, c * dim] fp32, rows ``stride_in`` apart: each row's new projections
    bias_ptr,  # [r, c * dim] fp32: the position bias added to the scores (HAS_BIAS)
    kv_buf_ptr,
    score_buf_ptr,  # [slots, r, c * dim] fp32: the open windows
    prev_kv_ptr,
    prev_score_ptr,  # [slots, r, dim] fp32: the stored first halves (OVERLAP)
    hist_kv_ptr,
    hist_score_ptr,  # [slots, keep, c * dim] fp32: the history rings (HISTORY)
    slots_ptr,  # [B] int64, ``stride_slot`` apart (a column of the step's index upload)
    phase_ptr,
    hist_row_ptr,  # [B] int64, contiguous
    out_ptr,  # [B, dim]: fp32, or rounded once to the entries' dtype
    r,
    dim,
    keep,
    stride_in,
    stride_slot,
    OVERLAP: tl.constexpr,
    HISTORY: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    EMULATE: tl.constexpr,  # the interpreter's casts truncate: round in fp32 first
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """One row's block of entry channels: where its window completes, the window (the
    buffer's rows, the new one from the inputs) pooled with ``_softmax_pool_kernel``'s
    arithmetic, elsewhere zeros (a provisional entry no query sees: no window row is read);
    then the new row, the history row and, where the window completes, the previous half
    written."""
    b = tl.program_id(0)
    c = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    j = tl.arange(0, BLOCK_R)
    width = 2 * dim if OVERLAP else dim
    cmask = c < dim
    mask = (j < r)[:, None] & cmask[None, :]
    slot = tl.load(slots_ptr + b * stride_slot)
    phase = tl.load(phase_ptr + b)
    fresh = (j == phase)[:, None]  # the new row: from the inputs, not the buffer
    kept = mask & ~fresh
    own = c + dim if OVERLAP else c  # this window's channels: its second halves with overlap
    rows = slot * r * width + j[:, None] * width
    new_s = tl.load(score_ptr + b * stride_in + own, mask=cmask, other=0.0)
    new_v = tl.load(kv_ptr + b * stride_in + own, mask=cmask, other=0.0)
    if HAS_BIAS:
        new_s += tl.load(bias_ptr + phase * width + own, mask=cmask, other=0.0)
    carried = (slot * r + j[:, None]) * dim + c[None, :]
    if phase == r - 1:
        s = tl.load(score_buf_ptr + rows + own[None, :], mask=kept, other=float("-inf"))
        v = tl.load(kv_buf_ptr + rows + own[None, :], mask=kept, other=0.0)
        s = tl.where(fresh, new_s[None, :], s)
        v = tl.where(fresh, new_v[None, :], v)
        s = tl.where(cmask[None, :], s, 0.0)  # columns past the entry: finite, never stored
        s0, v0 = s, v
        if OVERLAP:
            s0 = tl.load(prev_score_ptr + carried, mask=mask, other=0.0)
            s0 = tl.where(mask, s0, float("-inf"))
            v0 = tl.load(prev_kv_ptr + carried, mask=mask, other=0.0)
        pooled = pool_window(s, v, s0, v0, OVERLAP)
    else:
        pooled = tl.zeros((BLOCK_D,), dtype=tl.float32)
    store_rounded(out_ptr + b * dim + c, pooled, cmask, EMULATE)
    tl.debug_barrier()  # every thread has read the rows written below
    at = slot * r * width + phase * width
    tl.store(kv_buf_ptr + at + own, new_v, mask=cmask)
    tl.store(score_buf_ptr + at + own, new_s, mask=cmask)
    if HISTORY:
        ring = (slot * keep + tl.load(hist_row_ptr + b)) * width
        tl.store(hist_kv_ptr + ring + own, new_v, mask=cmask)
        tl.store(hist_score_ptr + ring + own, new_s, mask=cmask)
    if OVERLAP:
        first_s = tl.load(score_ptr + b * stride_in + c, mask=cmask, other=0.0)
        first_v = tl.load(kv_ptr + b * stride_in + c, mask=cmask, other=0.0)
        if HAS_BIAS:
            first_s += tl.load(bias_ptr + phase * width + c, mask=cmask, other=0.0)
        tl.store(kv_buf_ptr + at + c, first_v, mask=cmask)
        tl.store(score_buf_ptr + at + c, first_s, mask=cmask)
        if HISTORY:
            tl.store(hist_kv_ptr + ring + c, first_v, mask=cmask)
            tl.store(hist_score_ptr + ring + c, first_s, mask=cmask)
        if phase == r - 1:  # the window completes: its first halves are the next one's
            f_s = tl.load(score_buf_ptr + rows + c[None, :], mask=kept, other=0.0)
            f_v = tl.load(kv_buf_ptr + rows + c[None, :], mask=kept, other=0.0)
            tl.store(prev_score_ptr + carried, tl.where(fresh, first_s[None, :], f_s), mask=mask)
            tl.store(prev_kv_ptr + carried, tl.where(fresh, first_v[None, :], f_v), mask=mask)


def slot_pool(  # noqa: PLR0917
    kv: Tensor,
    score: Tensor,
    bias: Tensor | None,
    buffers: WindowBuffers,
    slots: Tensor,
    phase: Tensor,
    history_row: Tensor | None,
    *,
    overlap: bool,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """:meth:`deepinfer.backends.base.Backend.compress_slots` for ratios above 1, in one
    kernel: ``kv``/``score`` [B, c * D] fp32 (row slices of one fused projection's output
    are read in place) -> [B, 1, D] in ``dtype`` (the fp32 pooling rounded once)."""
    b, width = kv.shape
    r = buffers.ratio
    dim = width // 2 if overlap else width
    out = torch.empty(b, 1, dim, dtype=dtype, device=kv.device)
    if b == 0:
        return out
    history = history_row is not None
    kv_buf, score_buf, prev_kv, prev_score, hist_kv, hist_score = slot_buffers(
        buffers, overlap, history, "compress_slots"
    )
    if kv.stride(-1) != 1 or score.stride(-1) != 1 or kv.stride(0) != score.stride(0):
        kv, score = kv.contiguous(), score.contiguous()
    phase = phase.contiguous()
    history_row = None if history_row is None else history_row.contiguous()
    block_r, block_d = pool_tiles(r, dim)
    _slot_pool_kernel[(b, triton.cdiv(dim, block_d))](
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
        phase,
        history_row if history_row is not None else phase,
        out,
        r,
        dim,
        hist_kv.shape[1] if history else 1,
        kv.stride(0),
        slots.stride(0),
        OVERLAP=overlap,
        HISTORY=history,
        HAS_BIAS=bias is not None,
        EMULATE=EMULATE_CAST,
        BLOCK_R=block_r,
        BLOCK_D=block_d,
        **NO_FMA,
    )
    return out


def slot_buffers(
    buffers: WindowBuffers, overlap: bool, history: bool, op: str
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(open windows kv/score, stored halves kv/score, history rings kv/score) as the slot
    kernels take them, checked contiguous fp32 (the kernels index them as such); an argument
    the launch's constexprs leave unread (no overlap, no history) gets the window buffer."""
    kv_buf, score_buf = buffers.kv_buf, buffers.score_buf
    assert kv_buf is not None and score_buf is not None
    prev = (buffers.prev_kv_buf, buffers.prev_score_buf) if overlap else (kv_buf, kv_buf)
    hist = (buffers.hist_kv_buf, buffers.hist_score_buf) if history else (kv_buf, kv_buf)
    assert prev[0] is not None and prev[1] is not None
    assert hist[0] is not None and hist[1] is not None
    written = (kv_buf, score_buf, prev[0], prev[1], hist[0], hist[1])
    if not all(x.is_contiguous() and x.dtype == torch.float32 for x in written):
        raise ValueError(f"{op} needs contiguous fp32 buffers")
    return written
