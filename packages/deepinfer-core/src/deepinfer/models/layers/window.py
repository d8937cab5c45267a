"""Sliding-window keys for one layer: read the ring, append the new rows, say what each sees.

Two layouts reach a layer. A sequence chunk ([B, S] in lockstep, one :class:`LayerState`) reads
the ring rows its first query can still see, in position order, then its own rows; each query
lists the ``window`` rows it sees (:func:`chunk_window`), so attention costs S x window rather
than S x (window + S). A decode batch ([B, 1], rows of a shared ring tensor at different
positions) writes its new rows into the rings first (the slot a new row takes held position
p - capacity, which no query at p can see), then reads every ring slot of every row and masks
by the position each slot holds, so the whole batch is one gather and one mask whatever the
positions (:func:`window_keys`). Both give each query its own token plus the ``window - 1``
before it.
"""

from __future__ import annotations

import torch
from torch import Tensor

from deepinfer.models.layouts import SlotRows
from deepinfer.models.state import LayerState


def chunk_window(kv: Tensor, state: LayerState, window: int) -> tuple[Tensor, Tensor]:
    """Keys [B, L, D] and each query's window rows [S, window] (-1 = none) for a chunk of new
    rows ``kv`` [B, S, D] that continues ``state``; writes the ring.

    The keys are the ring rows the first query still sees, then the chunk's, in position
    order, so query i (key row ``past + i``) sees rows ``past + i - j`` for j < window.
    """
    ring = state.swa
    start = ring.length  # tokens this layer has seen = position of the first new one
    past, _ = ring.read(start)
    keys = torch.cat((past.to(kv.dtype), kv), dim=1)
    ring.write(kv, start)
    rows = past.shape[1] + torch.arange(kv.shape[1], device=kv.device)[:, None]
    index = rows - torch.arange(window, device=kv.device)
    return keys, index.clamp(min=-1)


def window_keys(
    kv: Tensor, positions: Tensor, rows: SlotRows, window: int
) -> tuple[Tensor, Tensor]:
    """Keys [B, capacity, D] and visibility [B, 1, capacity] for a decode batch's new rows
    ``kv`` [B, 1, D] at ``positions`` [B, 1]; writes the rings. All on the device (capturable)."""
    ring, p = rows.ring, positions  # [B, 1]
    capacity = ring.shape[1]
    ring[rows.slots, p[:, 0] % capacity] = kv[:, 0].to(ring.dtype)
    keys = ring.index_select(0, rows.slots)  # [B, capacity, D]

    def mask() -> Tensor:  # the same for every layer of the step with this ring shape
        slot = torch.arange(capacity, device=kv.device)
        held = p - torch.remainder(p - slot, capacity)  # latest position <= p in each slot
        return ((held >= 0) & (p - held < window))[:, None, :]

    return keys.to(kv.dtype), rows.step_memo.get(("window", capacity, window), mask)
