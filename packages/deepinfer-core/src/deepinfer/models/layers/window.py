"""Sliding-window keys for one layer: read the ring, append the new rows, say what each sees.

Three layouts reach a layer. A sequence chunk ([B, S] in lockstep, one :class:`LayerState`) reads
the ring rows its first query can still see, in position order, then its own rows; each query
lists the ``window`` rows it sees (:func:`chunk_window`), so attention costs S x window rather
than S x (window + S). A decode batch ([B, 1], rows of a shared ring tensor at different
positions) writes its new rows into the rings first, as the kv norm stores them
(:func:`ring_rows`), then lists the ring slots whose positions each row sees; attention reads
the rings where they are, so the batch copies no key whatever the positions
(:func:`window_pages`). Spans of any length over shared rings ([1, N] packed) gather
every span's ring before writing any, and list each query's rows among those and the new ones
(:func:`ragged_window`). Verification rows ([B, T] over shared rings) write their T rows as a
decode batch writes its one, then list each query's ring slots as a decode row's, read in place
(:func:`verify_window_pages`). All give each query its own token plus the ``window - 1`` before it.
"""

from __future__ import annotations

import torch
from torch import Tensor

from deepinfer.models.layouts import RaggedRows, SlotRows
from deepinfer.models.memo import StepMemo
from deepinfer.models.ragged_plan import window_plan
from deepinfer.models.ring import write_ring, write_rows
from deepinfer.models.state import LayerState
from deepinfer.paging import KeyPages


def chunk_window(
    kv: Tensor, state: LayerState, window: int, memo: StepMemo
) -> tuple[Tensor, Tensor]:
    """Keys [B, L, D] and each query's window rows [S, window] (-1 = none) for a chunk of new
    rows ``kv`` [B, S, D] that continues ``state``; writes the ring. The ring rows read and
    written and the window rows are the same for every layer of a span's call (``memo``).

    The keys are the ring rows the first query still sees, then the chunk's, in position
    order, so query i (key row ``past + i``) sees rows ``past + i - j`` for j < window.
    """
    ring = state.swa
    start, s = ring.length, kv.shape[1]  # tokens this layer has seen = the first new position

    def plan() -> tuple[Tensor, Tensor, Tensor]:
        past = ring.past_rows(start)
        rows = past.shape[0] + torch.arange(s, device=kv.device)[:, None]
        index = (rows - torch.arange(window, device=kv.device)).clamp(min=-1)
        return past, write_rows(ring.capacity, start, s, kv.device), index

    key = ("chunk window", start, s, ring.capacity, ring.window, window)
    past, written, index = memo.get(key, plan)
    # A fresh state's first chunk has no past rows (start is host-known): its keys are its own.
    keys = torch.cat((ring.kv[:, past].to(kv.dtype), kv), dim=1) if start else kv
    ring.write(kv, start, written)
    return keys, index


def ring_rows(positions: Tensor, rows: SlotRows) -> tuple[Tensor, Tensor]:
    """(the rings flattened [slots * capacity, D], the row of it that each new kv row goes to:
    [B] for a decode batch at ``positions`` [B, 1], [B, T] for a verification pass's tokens at
    ``positions`` [B, T], a padding token's in the padding slot): the slot a new row takes held
    position p - capacity, which no query at p can see (a verification row's own later tokens
    included, while T <= slack + 1). The rows are the same for every layer of the pass with
    this ring shape. All on the device (capturable)."""
    ring = rows.ring
    capacity = ring.shape[1]

    def make() -> Tensor:
        if rows.tokens is None:
            return rows.slots * capacity + positions[:, 0] % capacity
        return rows.tokens.slots * capacity + positions % capacity

    return ring.flatten(0, 1), rows.step_memo.get(("ring rows", capacity), make)


def window_pages(positions: Tensor, rows: SlotRows, window: int) -> KeyPages:
    """The ring slots each row of a decode batch at ``positions`` [B, 1] sees, its ring one
    page of ``capacity`` entries read in place; the rows' new kv rows are in the rings already
    (:func:`ring_rows`)."""
    ring, p = rows.ring, positions  # [B, 1]
    capacity = ring.shape[1]

    def seen() -> Tensor:  # the same for every layer of the step with this ring shape
        slot = torch.arange(capacity, device=p.device)
        held = p - torch.remainder(p - slot, capacity)  # latest position <= p in each slot
        return torch.where((held >= 0) & (p - held < window), slot, -1)[:, None, :]

    entries = rows.step_memo.get(("window", capacity, window), seen)
    return KeyPages(ring, rows.slots[:, None], entries)


def verify_window_pages(positions: Tensor, rows: SlotRows, window: int) -> KeyPages:
    """The ring slots each query of a verification pass at ``positions`` [B, T] sees, listed
    as its own decode row's ([B * T] rows, row b's T queries one after another), the rings
    read in place (:func:`window_pages`); the pass's new kv rows are in the rings already
    (:func:`ring_rows`). A slot holds the latest position <= the query's that it was written
    for: a ring of ``window + slack`` rows loses a position p - j only to a write of
    p - j + capacity, past the row's last token while T <= slack + 1."""
    ring = rows.ring
    capacity = ring.shape[1]

    def seen() -> tuple[Tensor, Tensor]:  # the same for every layer of the pass
        p = positions.reshape(-1, 1)
        slot = torch.arange(capacity, device=p.device)
        held = p - torch.remainder(p - slot, capacity)  # latest position <= p in each slot
        entries = torch.where((held >= 0) & (p - held < window), slot, -1)[:, None, :]
        return rows.slots.repeat_interleave(positions.shape[1])[:, None], entries

    pages, entries = rows.step_memo.get(("verify window", capacity, window), seen)
    return KeyPages(ring, pages, entries)


def ragged_window(kv: Tensor, rows: RaggedRows, window: int) -> tuple[Tensor, Tensor]:
    """Keys [1, n * capacity + N, D] (every span's ring as it stood, then the new rows) and
    each query's window rows [1, N, window] (-1 = none) for the new rows ``kv`` [1, N, D] of
    a ragged pass's spans; writes the rings and records the marked spans' rings."""
    ring, meta = rows.ring, rows.meta
    capacity = ring.shape[1]
    plan = meta.step_memo.get(
        ("window", capacity, window), lambda: window_plan(meta, capacity, window)
    )
    past = ring.index_select(0, meta.slots)  # [n, capacity, D], before any write
    for i, state in rows.marked:  # the ring as it stood at each mark inside the span
        start, offset = meta.starts[i], meta.offsets[i]
        for length in state.swa.marks:
            if start < length < start + meta.lengths[i]:
                at = past[i : i + 1].clone()
                write_ring(at, kv[:, offset : offset + length - start], start)
                state.swa.marks[length] = at
    ring[plan.write_slots, plan.write_rows] = kv[0, plan.write_tokens].to(ring.dtype)
    keys = torch.cat((past.flatten(0, 1).to(kv.dtype), kv[0]))[None]
    return keys, plan.index
