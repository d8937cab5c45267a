"""A verification pass's compressor windows over shared slot buffers, in torch ops (the reference
of :meth:`~deepinfer.backends.base.Backend.compress_verify`).

A verification row feeds its last token and its drafts, up to T tokens at consecutive positions.
Within T positions at most ceil(T / ratio) windows close, wherever the row stands, so every row
gets that many candidate windows, fixed in shape: the windows ending at the row's next window
ends. Each takes its rows from the row's open window (positions before the pass) and the new
projections; which of them close within the row's real tokens is in the :class:`VerifyPlan`,
made once a pass for every compressor of the ratio. Here that is about twenty indexed ops a
compressor (history and open-window writes, window gathers, the stored previous half), which a
kernel backend does in one launch.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch
from torch import Tensor

from deepinfer.backends.compress_ref import Compress, WindowBuffers


@dataclass
class VerifyPlan:
    """Where a verification pass's rows stand in the windows of one ratio: the same for every
    compressor of that ratio (a pass makes it once). Padding tokens (and padding rows, in slot
    0) are at position 0."""

    positions: Tensor  # [B, T] each token's position
    token_slots: Tensor  # [B, T] the slot each token writes (padding: 0)
    lengths: Tensor  # [B] real tokens of each row
    phase: Tensor  # [B, T] each token's row in its window (position % ratio)
    closes: Tensor  # [B, W] bool: the window completes within the row's real tokens
    entry: Tensor  # [B, W] the entry each window makes
    source: Tensor  # [B, W, r] each window row's source among [open window ; new tokens]
    position: Tensor  # [B, W, r] each window row's position
    open_slots: Tensor  # [B, T] the slot whose open window a token fills (0: the padding's)
    count: Tensor  # [B] windows that close
    _rings: dict[tuple[str, int], Tensor] = field(default_factory=dict, repr=False)

    @functools.cached_property
    def last_closed(self) -> tuple[Tensor, Tensor, Tensor]:
        """(rows [B], each row's last closing window [B], whether it has one [B, 1, 1])."""
        rows = torch.arange(self.count.shape[0], device=self.count.device)
        return rows, (self.count - 1).clamp(min=0), (self.count > 0)[:, None, None]

    def ring_rows(self, keep: int) -> Tensor:
        """[B, T] each token's history-ring row (position p at row p % keep)."""
        key = ("tokens", keep)
        if key not in self._rings:
            self._rings[key] = self.positions % keep
        return self._rings[key]

    def window_ring_rows(self, slots: Tensor, keep: int) -> Tensor:
        """The flattened rings' row of every candidate window row [B * W * r]."""
        key = ("windows", keep)
        if key not in self._rings:
            rows = slots[:, None, None] * keep + self.position % keep
            self._rings[key] = rows.flatten()
        return self._rings[key]


def plan_windows(positions: Tensor, slots: Tensor, lengths: Tensor, r: int) -> VerifyPlan:
    """The windows of a verification pass's rows at ratio ``r`` (:class:`VerifyPlan`): rows of
    tokens at ``positions`` [B, T] writing ``slots`` [B, T], the first ``lengths`` [B] real."""
    t = positions.shape[1]
    device = positions.device
    offset = torch.arange(t, device=device).expand_as(positions)
    start = positions[:, :1]  # [B, 1]: the row's first position (padding: 0)
    ends = (r - 1 - start) % r + r * torch.arange(-(-t // r), device=device)  # [B, W]
    closes = ends < lengths[:, None]
    at = (start + ends)[..., None] - (r - 1) + torch.arange(r, device=device)  # positions
    new = at - start[..., None]  # offset among the new tokens (< 0: before the step)
    source = torch.where(new >= 0, r + new.clamp(max=t - 1), at % r)
    # The window left open: the row's last real tokens, one per phase.
    last = (offset < lengths[:, None]) & (offset >= lengths[:, None] - r)
    return VerifyPlan(
        positions=positions,
        token_slots=slots,
        lengths=lengths,
        phase=positions % r,
        closes=closes,
        entry=(start + ends) // r,
        source=source,
        position=at,
        open_slots=torch.where(last, slots, 0),
        count=closes.sum(dim=1),
    )


def pool_verify_windows(  # noqa: PLR0917
    compress: Compress,
    kv: Tensor,
    score: Tensor,
    bias: Tensor | None,
    buffers: WindowBuffers,
    slots: Tensor,
    plan: VerifyPlan,
    *,
    overlap: bool,
) -> Tensor:
    """``Backend.compress_verify`` with ``compress`` (the backend's) pooling the windows."""
    if bias is not None:
        score = score + bias[plan.phase]
    hist_kv, hist_score = buffers.hist_kv_buf, buffers.hist_score_buf
    if hist_kv is not None:  # position p at row p % keep, as the decode pass writes
        assert hist_score is not None
        ring = plan.ring_rows(hist_kv.shape[1])
        hist_kv[plan.token_slots, ring] = kv
        hist_score[plan.token_slots, ring] = score
    if buffers.ratio == 1:  # every token is a whole window: nothing to buffer
        win_kv, win_score = kv[:, :, None], score[:, :, None]
    else:
        assert buffers.kv_buf is not None and buffers.score_buf is not None
        if hist_kv is not None:
            assert hist_score is not None
            win_kv, win_score = _ring_windows(plan, slots, hist_kv, hist_score)
        else:
            open_kv = buffers.kv_buf.index_select(0, slots)
            open_score = buffers.score_buf.index_select(0, slots)
            win_kv = _gather(torch.cat((open_kv, kv), dim=1), plan.source)
            win_score = _gather(torch.cat((open_score, score), dim=1), plan.source)
        buffers.kv_buf[plan.open_slots, plan.phase] = kv
        buffers.score_buf[plan.open_slots, plan.phase] = score
    prev_kv = prev_score = None
    if overlap:
        assert buffers.prev_kv_buf is not None and buffers.prev_score_buf is not None
        prev_kv = buffers.prev_kv_buf.index_select(0, slots)
        prev_score = buffers.prev_score_buf.index_select(0, slots)
        _store_prev(slots, win_kv, plan.last_closed, prev_kv, buffers.prev_kv_buf)
        _store_prev(slots, win_score, plan.last_closed, prev_score, buffers.prev_score_buf)
    return compress(win_kv, win_score, prev_kv, prev_score, overlap)


def _ring_windows(
    plan: VerifyPlan, slots: Tensor, hist_kv: Tensor, hist_score: Tensor
) -> tuple[Tensor, Tensor]:
    """The candidate windows [B, W, r, width] read from the history rings, which the pass has
    just written: a ring keeps ``slack + 2 * ratio`` positions, so it holds the open window's
    rows and every real token of a row (a row has at most ``slack + 1``), and a window that
    closes within them has all its rows there. One row gather a buffer, where the open
    window joined to the new tokens takes three; a window past a row's real tokens reads
    stale rows and closes nowhere."""
    at = plan.window_ring_rows(slots, hist_kv.shape[1])
    shape = (*plan.position.shape, hist_kv.shape[-1])
    win_kv = hist_kv.flatten(0, 1).index_select(0, at).view(shape)
    return win_kv, hist_score.flatten(0, 1).index_select(0, at).view(shape)


def _gather(rows: Tensor, source: Tensor) -> Tensor:
    """``rows`` [B, R, width] at ``source`` [B, W, r]: [B, W, r, width]."""
    b, w, r = source.shape
    flat = source.reshape(b, w * r, 1).expand(-1, -1, rows.shape[-1])
    return rows.gather(1, flat).view(b, w, r, rows.shape[-1])


def _store_prev(
    slots: Tensor,
    windows: Tensor,
    last_closed: tuple[Tensor, Tensor, Tensor],
    prev: Tensor,
    buf: Tensor,
) -> None:
    """Keep the first half of each row's last completed window (of ``windows`` [B, W, r,
    width]) in ``buf``, where the next window's overlap reads it; a row that completed none
    keeps ``prev``."""
    b, last, completed = last_closed
    buf[slots] = torch.where(completed, windows[b, last, :, : prev.shape[-1]], prev)
