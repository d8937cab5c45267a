"""A decode step's compressor windows over shared slot buffers, in torch ops (the reference of
:meth:`~deepinfer.backends.base.Backend.compress_slots`).

Each row's new projections are written into its open window (and history ring), the window is
read back and pooled (kept where it completes, zeros where it is still open), and the stored
previous half is replaced where the window completes: about ten indexed ops a compressor, which
a kernel backend does in one launch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch
from torch import Tensor

#: ``Backend.compress``: (kv, score, prev_kv, prev_score, overlap) -> pooled entries.
Compress = Callable[[Tensor, Tensor, Tensor | None, Tensor | None, bool], Tensor]


class WindowBuffers(Protocol):
    """One compressor's open-window buffers for every running sequence (row ``slot`` is one
    sequence's): what :meth:`Backend.compress_slots` reads and writes."""

    kv_buf: Tensor | None  # [slots, ratio, c*D] fp32
    score_buf: Tensor | None
    prev_kv_buf: Tensor | None  # [slots, ratio, D], overlapping compressors only
    prev_score_buf: Tensor | None
    hist_kv_buf: Tensor | None  # [slots, keep, c*D], states with rollback slack only
    hist_score_buf: Tensor | None
    ratio: int


def pool_slot_windows(  # noqa: PLR0917
    compress: Compress,
    kv: Tensor,
    score: Tensor,
    bias: Tensor | None,
    buffers: WindowBuffers,
    slots: Tensor,
    phase: Tensor,
    history_row: Tensor | None,
    *,
    overlap: bool,
) -> Tensor:
    """``Backend.compress_slots`` with ``compress`` (the backend's) pooling the windows."""
    if bias is not None:
        score = score + bias[phase]
    if history_row is not None:
        assert buffers.hist_kv_buf is not None and buffers.hist_score_buf is not None
        buffers.hist_kv_buf[slots, history_row] = kv
        buffers.hist_score_buf[slots, history_row] = score
    if buffers.ratio == 1:  # every token is a whole window: nothing to buffer
        win_kv, win_score = kv[:, None], score[:, None]
    else:
        assert buffers.kv_buf is not None and buffers.score_buf is not None
        buffers.kv_buf[slots, phase] = kv
        buffers.score_buf[slots, phase] = score
        win_kv = buffers.kv_buf.index_select(0, slots)
        win_score = buffers.score_buf.index_select(0, slots)
    prev_kv = prev_score = None
    if overlap:
        assert buffers.prev_kv_buf is not None and buffers.prev_score_buf is not None
        dim = buffers.prev_kv_buf.shape[-1]
        closes = (phase == buffers.ratio - 1)[:, None, None]
        prev_kv = buffers.prev_kv_buf.index_select(0, slots)
        prev_score = buffers.prev_score_buf.index_select(0, slots)
        buffers.prev_kv_buf[slots] = torch.where(closes, win_kv[..., :dim], prev_kv)
        buffers.prev_score_buf[slots] = torch.where(closes, win_score[..., :dim], prev_score)
    pooled = compress(win_kv[:, None], win_score[:, None], prev_kv, prev_score, overlap)
    return pooled.masked_fill((phase != buffers.ratio - 1)[:, None, None], 0.0)
