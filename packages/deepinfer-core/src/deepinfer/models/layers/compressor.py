"""KV compressor: pools every ``ratio`` consecutive tokens into one long-range entry.

Used three ways: the CSA main compressor (ratio 4, overlapping windows, head_dim wide), the
indexer's key compressor (same, index_head_dim wide) and the HCA compressor (large ratio, no
overlap). With overlap each token is projected twice (two halves of ``wkv``/``wgate``): the second
half joins its own window's entry, the first half the next window's, so each entry sees 2*ratio
tokens at stride ratio. Projections and the softmax pooling run in fp32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from deepinfer.backends.base import Backend
from deepinfer.models.layers.fused import pair
from deepinfer.models.layers.norm import Linear, RMSNorm, fp32_param
from deepinfer.models.layers.rope import Rotary
from deepinfer.models.layers.verify_windows import (
    verify_entry_angles,
    verify_entry_targets,
    verify_plan,
)
from deepinfer.models.layouts import (
    CompressorRows,
    CompressorStates,
    RaggedCompressor,
    memo_of,
)
from deepinfer.models.ragged_plan import ClosePlan, close_plan, ring_writes
from deepinfer.models.state import CompressorState
from deepinfer.paging import PagedEntries


class Compressor(nn.Module):
    #: ``wkv`` and ``wgate`` project one input: one GEMM where the backend fuses projections
    #: (:mod:`.fused`); the decode step's kernel reads the two halves of its output in place.
    FUSED_PAIRS = (("wkv", "wgate"),)

    def __init__(
        self,
        hidden: int,
        dim: int,
        ratio: int,
        *,
        overlap: bool,
        eps: float,
    ) -> None:
        super().__init__()
        self.dim = dim
        self.ratio = ratio
        self.overlap = overlap
        width = 2 * dim if overlap else dim
        # Projections run in fp32 on a 16-bit checkpoint weight: held in fp32 from the load on,
        # not widened on every call (in bf16 where the backend computes fp32 products from it:
        # ``hold_bf16_projections``).
        self.wkv = Linear(hidden, width, torch.float32, computes_fp32=True)
        self.wgate = Linear(hidden, width, torch.float32, computes_fp32=True)
        self.ape = fp32_param(ratio, width)
        self.norm = RMSNorm(dim, eps)

    def new_state(
        self, batch: int, dtype: torch.dtype, device: torch.device, slack: int = 0
    ) -> CompressorState:
        return CompressorState.empty(
            batch,
            ratio=self.ratio,
            overlap=self.overlap,
            dim=self.dim,
            dtype=dtype,
            device=device,
            slack=slack,
        )

    def forward(  # noqa: PLR0917
        self,
        ops: Backend,
        x: Tensor,
        positions: Tensor,
        rotary: Rotary,
        state: CompressorStates,
        projected: tuple[Tensor, ...] | None = None,
    ) -> Tensor | PagedEntries:
        """Feed ``x`` [B, S, d] at ``positions``; returns every entry emitted so far [B, T, D]
        (for the shared rows of a decode batch, ``positions`` [B, 1], a view of their pages).
        ``projected``: ``wkv(x)`` and ``wgate(x)``, made by the layer's fused GEMM (None: here).
        """
        kv, score = projected if projected is not None else pair(self, "wkv", "wgate", ops, x)
        if isinstance(state, CompressorRows):
            return self._forward_slots(ops, kv, score, positions, rotary, state)
        if isinstance(state, RaggedCompressor):
            return self._forward_ragged(ops, kv[0], score[0], positions, rotary, state)
        memo, r = memo_of(state), self.ratio  # the same phases and angles in every layer
        # In place (fp32 both, the projection's own output): ``score`` stays a view beside
        # ``kv`` with its strides, so the pooling kernel reads both where they are.
        b, s, width = score.shape
        if state.fill == 0 and s % r == 0:  # whole windows from a window's start: no gather
            score.view(b, s // r, r, width).add_(self.ape)
        else:
            score.add_(self.ape[memo.get(("span phase", id(positions), r), lambda: positions % r)])
        windows = close_windows(state, kv, score)
        if windows is None:
            return state.entries
        win_kv, win_score = windows
        n = win_kv.shape[1]
        prev_kv, prev_score, dtype = state.prev_kv, state.prev_score, state.entry_dtype
        pooled = ops.compress(win_kv, win_score, prev_kv, prev_score, self.overlap, dtype=dtype)
        if self.overlap:
            state.prev_kv = win_kv[:, -1, :, : self.dim]  # copied into the state's buffer
            state.prev_score = win_score[:, -1, :, : self.dim]

        first = state.num_entries

        def angles() -> tuple[Tensor, Tensor]:
            return rotary.cos_sin(torch.arange(first, first + n, device=x.device) * r)

        cos, sin = memo.get(("entry angles", id(rotary), r, first, n), angles)
        entries = self.norm.rotated(ops, pooled, cos, sin)
        state.append_entries(entries, owned=True)
        return entries if first == 0 else state.entries  # no read back of what it just wrote

    def _forward_slots(  # noqa: PLR0917
        self,
        ops: Backend,
        kv: Tensor,
        score: Tensor,
        positions: Tensor,
        rotary: Rotary,
        rows: CompressorRows,
    ) -> PagedEntries:
        """One new token per row, rows of shared buffers, no host work (capturable).

        Every row writes an entry: its pooled window where the window completes, zeros (a
        provisional entry, :func:`slot_entries`) where it is still open; only complete
        windows replace the stored previous half. Returns entries ``:entry_limit`` of every
        row, in their pages.
        """
        if rows.tokens is not None:
            return self._forward_verify(ops, kv, score, positions, rotary, rows)
        pool = rows.pool
        at = slot_phase(rows, positions)
        ring = history_row(rows, at)
        assert pool.pages is not None
        pages = pool.pages.flatten(0, 1)  # the new entries go straight to their rows
        row = (kv[:, 0], score[:, 0], self.ape, pool, rows.slots, at.phase, ring)
        pooled = ops.compress_slots(*row, self.overlap, pages.dtype)
        cos, sin = rotary.cos_sin(at.entry_pos)
        target, entries = slot_entries(rows, at)
        self.norm.rotated_into(ops, pooled, cos, sin, pages, target)
        return entries

    def _forward_verify(  # noqa: PLR0917
        self,
        ops: Backend,
        kv: Tensor,
        score: Tensor,
        positions: Tensor,
        rotary: Rotary,
        rows: CompressorRows,
    ) -> PagedEntries:
        """A verification pass's tokens' projections [B, T, c*D] over shared buffers
        (capturable): each row's candidate windows pooled in one op, those that close written
        (:mod:`.verify_windows`)."""
        plan, pages = verify_plan(rows, ops), rows.pool.pages
        assert pages is not None
        verify = (kv, score, self.ape, rows.pool, rows.slots, plan)
        pooled = ops.compress_verify(*verify, self.overlap, pages.dtype)
        cos, sin = verify_entry_angles(rows, plan, rotary)
        target, entries = verify_entry_targets(rows, plan)
        self.norm.rotated_into(ops, pooled, cos, sin, entries.pages.flatten(0, 1), target)
        return entries

    def _forward_ragged(  # noqa: PLR0917
        self,
        ops: Backend,
        kv: Tensor,
        score: Tensor,
        positions: Tensor,
        rotary: Rotary,
        comp: RaggedCompressor,
    ) -> PagedEntries:
        """The projections [N, c*D] of a ragged pass's spans' new tokens: every completed
        window of every span pooled in one op, its entry written by index; returns every
        span's entries."""
        r, memo = self.ratio, comp.meta.step_memo  # phases and angles alike for the ratio
        phase = memo.get(("ragged phase", id(positions), r), lambda: positions % r)
        score = score + self.ape[phase]
        windows = ragged_windows(comp, kv, score, self.dim if self.overlap else 0)
        if windows.plan.num_windows:
            assert comp.pool.pages is not None
            pooled = ops.compress(
                windows.kv[:, None],
                windows.score[:, None],
                windows.prev_kv,
                windows.prev_score,
                self.overlap,
                dtype=comp.pool.pages.dtype,
            )
            cos, sin = ragged_entry_angles(comp, windows.plan, rotary)
            entries = self.norm.rotated(ops, pooled, cos, sin)
            write_ragged_entries(comp, windows.plan, entries)
        return ragged_entries(comp, windows.plan)


@dataclass
class RaggedWindows:
    """The windows a ragged step completes, with the window before each (overlap only)."""

    plan: ClosePlan
    kv: Tensor  # [W, ratio, c*D]
    score: Tensor
    prev_kv: Tensor | None  # [W, ratio, D]
    prev_score: Tensor | None


def ragged_windows(comp: RaggedCompressor, kv: Tensor, score: Tensor, half: int) -> RaggedWindows:
    """Every span's completed windows from its open window and the new projections ``kv``/
    ``score`` [N, c*D]; with overlap (``half`` = D > 0) also each window's previous one. Then
    stores the last completed half and the rows left open, and records the marked spans."""
    pool, meta = comp.pool, comp.meta
    plan = meta.step_memo.get(("close", comp.ratio), lambda: close_plan(meta, comp.ratio))
    for i, state in comp.marked:  # record before any buffer changes
        chunk = slice(meta.offsets[i], meta.offsets[i] + meta.lengths[i])
        state.capture(
            torch.cat((state.buf_kv, kv[None, chunk]), dim=1),
            torch.cat((state.buf_score, score[None, chunk]), dim=1),
        )
    open_kv = pool.kv_buf.index_select(0, meta.slots).flatten(0, 1)
    open_score = pool.score_buf.index_select(0, meta.slots).flatten(0, 1)
    win_kv = torch.cat((open_kv, kv))[plan.rows]
    win_score = torch.cat((open_score, score))[plan.rows]
    prev_kv = prev_score = None
    if half:
        assert pool.prev_kv_buf is not None and pool.prev_score_buf is not None
        stored_kv = pool.prev_kv_buf.index_select(0, meta.slots)
        stored_score = pool.prev_score_buf.index_select(0, meta.slots)
        prev_kv = torch.cat((win_kv[..., :half], stored_kv))[plan.prev]
        prev_score = torch.cat((win_score[..., :half], stored_score))[plan.prev]
        pool.prev_kv_buf[plan.last_slots] = win_kv[plan.last, :, :half]
        pool.prev_score_buf[plan.last_slots] = win_score[plan.last, :, :half]
    pool.kv_buf[plan.open_slots, plan.open_rows] = kv[plan.open_tokens]
    pool.score_buf[plan.open_slots, plan.open_rows] = score[plan.open_tokens]
    if pool.hist_kv_buf is not None:  # states with rollback slack keep their projections
        assert pool.hist_score_buf is not None
        kept = ring_writes(meta, pool.hist_kv_buf.shape[1])
        pool.hist_kv_buf[kept.slots, kept.rows] = kv[kept.tokens]
        pool.hist_score_buf[kept.slots, kept.rows] = score[kept.tokens]
    return RaggedWindows(plan, win_kv, win_score, prev_kv, prev_score)


def ragged_entry_angles(
    comp: RaggedCompressor, plan: ClosePlan, rotary: Rotary
) -> tuple[Tensor, Tensor]:
    """(cos, sin) [W, 1, r/2] of a ragged step's completed windows' entry positions: the same
    for every layer of the ratio, so made once a pass (compressors and KV sources alike)."""
    key = ("ragged entry angles", comp.ratio, id(rotary))
    return comp.meta.step_memo.get(key, lambda: rotary.cos_sin(plan.entry[:, None] * comp.ratio))


def write_ragged_entries(comp: RaggedCompressor, plan: ClosePlan, new: Tensor) -> None:
    """Write the entries ``new`` [W, 1, D] of a ragged step's completed windows."""
    pages, table = comp.pool.pages, comp.pool.page_table
    assert pages is not None and table is not None
    per_page = pages.shape[1]
    page, row = comp.meta.step_memo.get(
        ("ragged pages", comp.ratio, per_page),
        lambda: table.locate(plan.entry_slots, plan.entry, per_page),
    )
    pages[page, row] = new[:, 0].to(pages.dtype)


def ragged_entries(comp: RaggedCompressor, plan: ClosePlan) -> PagedEntries:
    """Every span's entries after a ragged step, in their pages ([n, most entries, D])."""
    pages, table = comp.pool.pages, comp.pool.page_table
    assert pages is not None and table is not None
    per_page, limit = pages.shape[1], max(plan.counts, default=0)
    held = comp.meta.step_memo.get(
        ("ragged held", comp.ratio, per_page),
        lambda: table.row_pages(comp.meta.slots, limit, per_page),
    )
    return PagedEntries(pages, held, limit)


def close_windows(
    state: CompressorState, kv: Tensor, score: Tensor
) -> tuple[Tensor, Tensor] | None:
    """Append a chunk's projections ``kv``/``score`` [B, S, width] to ``state``'s open window
    (kept for rollback and recorded at marks on the way) and return the windows that closed,
    [B, n, ratio, width] each, or None; the rest stays open in the state's buffers."""
    state.remember(kv, score)
    if state.fill:  # a fresh state's chunk starts a window: nothing to join it to
        kv = torch.cat((state.buf_kv, kv), dim=1)
        score = torch.cat((state.buf_score, score), dim=1)
    state.capture(kv, score)
    b, total, width = kv.shape
    r = state.ratio
    n = total // r
    state.buf_kv, state.buf_score = kv[:, n * r :], score[:, n * r :]
    if n == 0:
        return None
    return kv[:, : n * r].view(b, n, r, width), score[:, : n * r].view(b, n, r, width)


@dataclass
class SlotPhase:
    """Where a decode step's rows stand in the windows of one compression ratio. Every layer
    of that ratio (compressor and indexer keys alike) needs the same, so one step computes
    it once (:func:`slot_phase`)."""

    phase: Tensor  # [B] p % ratio: the row's slot in its open window
    index: Tensor  # [B] p // ratio: the entry that window makes
    entry_pos: Tensor  # [B, 1] index * ratio: the position the entry is rotated at


def slot_phase(rows: CompressorRows, positions: Tensor) -> SlotPhase:
    """:class:`SlotPhase` of the step's ``positions`` [B, 1] for ``rows``' ratio (memoised in
    the step)."""
    r = rows.ratio

    def make() -> SlotPhase:
        p = positions[:, 0]
        phase, index = p % r, p // r
        return SlotPhase(phase, index, (index * r)[:, None])

    return rows.step_memo.get(("phase", r), make)


def history_row(rows: CompressorRows, at: SlotPhase) -> Tensor | None:
    """Each row's history-ring row (position % keep) where the states keep rollback history
    (None otherwise), once a step for every ring of its shape."""
    if rows.pool.hist_kv_buf is None:
        return None
    keep = rows.pool.hist_kv_buf.shape[1]
    return rows.step_memo.get(
        ("history row", rows.ratio, keep), lambda: (at.index * rows.ratio + at.phase) % keep
    )


def slot_entries(rows: CompressorRows, at: SlotPhase) -> tuple[Tensor, PagedEntries]:
    """(the flattened pages' row [B] where row i's entry ``at.index[i]`` goes, every row's
    entries ``:entry_limit`` in their pages). A row whose window is still open writes a
    provisional entry at an index no query can see yet; the real one overwrites it when the
    window completes. The same for every layer of the ratio: memoised in the step."""
    pages, table = rows.pool.pages, rows.pool.page_table
    assert pages is not None and table is not None
    per_page = pages.shape[1]

    def locate() -> tuple[Tensor, Tensor, Tensor]:
        page, row = table.locate(rows.slots, at.index, per_page)
        held = table.row_pages(rows.slots, rows.entry_limit, per_page)
        return page * per_page + row, held, at.index + 1

    key = ("pages", id(table), rows.ratio, per_page, rows.entry_limit)
    target, held, counts = rows.step_memo.get(key, locate)
    return target, PagedEntries(pages, held, rows.entry_limit, counts)


def write_slot_entries(rows: CompressorRows, at: SlotPhase, new: Tensor) -> PagedEntries:
    """Write row i's entry ``new`` [B, 1, D] at entry ``at.index[i]`` (:func:`slot_entries`);
    returns every row's entries ``:entry_limit`` in their pages."""
    target, entries = slot_entries(rows, at)
    entries.pages.flatten(0, 1)[target] = new[:, 0].to(entries.pages.dtype)
    return entries
