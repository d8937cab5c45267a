"""A compressor's windows in a verification pass: up to T new tokens a row over shared buffers.

A verification row feeds its last token and its drafts ([B, T], :mod:`deepinfer.models.verify`).
Within T consecutive positions at most ceil(T / ratio) windows close, wherever the row stands,
so every row gets that many candidate windows, fixed in shape: the windows ending at the row's
next window ends. Each gathers its rows from the row's open window (positions before the step)
and the new projections; the ones that close within the row's real tokens are written as
entries, the others (and padding rows) go to the padding slot. Nothing depends on the host, so
the pass is capturable.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from deepinfer.models.layouts import CompressorRows, SlotTokens
from deepinfer.paging import PagedEntries

if TYPE_CHECKING:
    from deepinfer.models.layers.rope import Rotary


@dataclass
class VerifyWindows:
    """Each row's candidate windows and where their entries go."""

    kv: Tensor  # [B, W, ratio, width]: complete or not
    score: Tensor
    plan: Plan  # which windows close, their entries: alike for the ratio's compressors

    @property
    def closes(self) -> Tensor:
        """[B, W] bool: the window completes within the row's real tokens."""
        return self.plan.closes

    @property
    def entry(self) -> Tensor:
        """[B, W] the entry each window makes."""
        return self.plan.entry


@dataclass
class Plan:
    """What every compressor of one ratio computes alike in a pass (``step_memo``)."""

    closes: Tensor  # [B, W] bool: the window completes within the row's real tokens
    entry: Tensor  # [B, W] the entry each window makes
    source: Tensor  # [B, W, r] each window row's source among [open window ; new tokens]
    position: Tensor  # [B, W, r] each window row's position
    open_slots: Tensor  # [B, T] the slot whose open window a token fills (0: the padding's)
    count: Tensor  # [B] windows that close

    @functools.cached_property
    def last_closed(self) -> tuple[Tensor, Tensor, Tensor]:
        """(rows [B], each row's last closing window [B], whether it has one [B, 1, 1]): made
        once, for the compressors that keep the previous window's half (:func:`store_prev`)."""
        rows = torch.arange(self.count.shape[0], device=self.count.device)
        return rows, (self.count - 1).clamp(min=0), (self.count > 0)[:, None, None]


def verify_phase(rows: CompressorRows) -> Tensor:
    """[B, T] each token's phase in its window (position mod ratio), once a pass and ratio."""
    tokens, r = rows.tokens, rows.ratio
    assert tokens is not None
    return rows.step_memo.get(("verify phase", r), lambda: tokens.positions % r)


def verify_entry_angles(
    rows: CompressorRows, windows: VerifyWindows, rotary: Rotary
) -> tuple[Tensor, Tensor]:
    """(cos, sin) of each candidate window's entry position [B, W]: the same for every layer of
    the ratio (the plan is), so made once a pass and shared by compressors and KV sources."""
    key = ("verify entry angles", rows.ratio, id(rotary))
    return rows.step_memo.get(key, lambda: rotary.cos_sin(windows.entry * rows.ratio))


def verify_windows(rows: CompressorRows, kv: Tensor, score: Tensor) -> VerifyWindows:
    """Put the new projections ``kv``/``score`` [B, T, width] into each row's open window and
    (with rollback slack) history ring, and return the row's candidate windows."""
    tokens, pool, r = rows.tokens, rows.pool, rows.ratio
    assert tokens is not None
    plan = rows.step_memo.get(("verify windows", r), lambda: _plan(tokens, r))
    if pool.hist_kv_buf is not None:  # position p at row p % keep, as the decode pass writes
        assert pool.hist_score_buf is not None
        keep = pool.hist_kv_buf.shape[1]
        ring = rows.step_memo.get(("verify ring rows", keep), lambda: tokens.positions % keep)
        pool.hist_kv_buf[tokens.slots, ring] = kv
        pool.hist_score_buf[tokens.slots, ring] = score
    if r == 1:  # every token is a whole window: nothing to buffer
        win_kv, win_score = kv[:, :, None], score[:, :, None]
    else:
        if pool.hist_kv_buf is not None:
            assert pool.hist_score_buf is not None
            win_kv, win_score = _ring_windows(rows, plan, pool.hist_kv_buf, pool.hist_score_buf)
        else:
            open_kv = pool.kv_buf.index_select(0, rows.slots)
            open_score = pool.score_buf.index_select(0, rows.slots)
            win_kv = _gather(torch.cat((open_kv, kv), dim=1), plan.source)
            win_score = _gather(torch.cat((open_score, score), dim=1), plan.source)
        phase = verify_phase(rows)
        pool.kv_buf[plan.open_slots, phase] = kv
        pool.score_buf[plan.open_slots, phase] = score
    return VerifyWindows(win_kv, win_score, plan)


def _plan(tokens: SlotTokens, r: int) -> Plan:
    """The windows of a pass's rows at ratio ``r`` (:class:`Plan`)."""
    t = tokens.positions.shape[1]
    device = tokens.positions.device
    offset = torch.arange(t, device=device).expand_as(tokens.positions)
    start = tokens.positions[:, :1]  # [B, 1]: the row's first position (padding: 0)
    ends = (r - 1 - start) % r + r * torch.arange(-(-t // r), device=device)  # [B, W]
    closes = ends < tokens.lengths[:, None]
    at = (start + ends)[..., None] - (r - 1) + torch.arange(r, device=device)  # positions
    new = at - start[..., None]  # offset among the new tokens (< 0: before the step)
    source = torch.where(new >= 0, r + new.clamp(max=t - 1), at % r)
    # The window left open: the row's last real tokens, one per phase.
    last = tokens.real & (offset >= tokens.lengths[:, None] - r)
    open_slots = torch.where(last, tokens.slots, 0)
    return Plan(closes, (start + ends) // r, source, at, open_slots, closes.sum(dim=1))


def _ring_windows(
    rows: CompressorRows, plan: Plan, hist_kv: Tensor, hist_score: Tensor
) -> tuple[Tensor, Tensor]:
    """The candidate windows [B, W, r, width] read from the history rings, which the pass has
    just written: a ring keeps ``slack + 2 * ratio`` positions, so it holds the open window's
    rows and every real token of a row (a row has at most ``slack + 1``), and a window that
    closes within them has all its rows there. One row gather a buffer, where the open
    window joined to the new tokens takes three; a window past a row's real tokens reads
    stale rows, as it read padding before, and closes nowhere."""
    keep = hist_kv.shape[1]

    def ring_rows() -> Tensor:
        return (rows.slots[:, None, None] * keep + plan.position % keep).flatten()

    at = rows.step_memo.get(("verify window ring rows", rows.ratio, keep), ring_rows)
    shape = (*plan.position.shape, hist_kv.shape[-1])
    win_kv = hist_kv.flatten(0, 1).index_select(0, at).view(shape)
    return win_kv, hist_score.flatten(0, 1).index_select(0, at).view(shape)


def _gather(rows: Tensor, source: Tensor) -> Tensor:
    """``rows`` [B, R, width] at ``source`` [B, W, r]: [B, W, r, width]."""
    b, w, r = source.shape
    flat = source.reshape(b, w * r, 1).expand(-1, -1, rows.shape[-1])
    return rows.gather(1, flat).view(b, w, r, rows.shape[-1])


def store_prev(
    rows: CompressorRows,
    windows: Tensor,
    last_closed: tuple[Tensor, Tensor, Tensor],
    prev: Tensor,
    buf: Tensor,
) -> None:
    """Keep the first half of each row's last completed window (of ``windows`` [B, W, r,
    width], at :attr:`Plan.last_closed`) in ``buf``, where the next window's overlap
    reads it; a row that completed none keeps ``prev``."""
    b, last, completed = last_closed
    buf[rows.slots] = torch.where(completed, windows[b, last, :, : prev.shape[-1]], prev)


def write_verify_entries(rows: CompressorRows, windows: VerifyWindows, new: Tensor) -> PagedEntries:
    """Write the entries ``new`` [B, W, D] of the windows that close (the others to the
    padding slot's first entry); returns every row's entries ``:entry_limit``, in their pages.
    Where they go and the pages read back are the same for every layer of the ratio."""
    pages, table, tokens = rows.pool.pages, rows.pool.page_table, rows.tokens
    assert pages is not None and table is not None and tokens is not None
    per_page = pages.shape[1]

    def locate() -> tuple[Tensor, Tensor, Tensor, Tensor]:
        slots = torch.where(windows.closes, rows.slots[:, None], 0)
        page, row = table.locate(slots, torch.where(windows.closes, windows.entry, 0), per_page)
        last = tokens.positions[:, 0] + tokens.lengths - 1  # the row's last real position
        counts = torch.where(tokens.lengths > 0, last // rows.ratio + 1, 0)
        return page, row, table.row_pages(rows.slots, rows.entry_limit, per_page), counts

    key = ("verify pages", id(table), rows.ratio, per_page, rows.entry_limit)
    page, row, held, counts = rows.step_memo.get(key, locate)
    pages[page, row] = new.to(pages.dtype)
    return PagedEntries(pages, held, rows.entry_limit, counts)
