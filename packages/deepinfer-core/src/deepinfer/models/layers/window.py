"""Sliding-window keys for one layer: read the ring, append the new rows, say what each sees.

Two layouts reach a layer. A sequence chunk ([B, S] in lockstep, one :class:`LayerState`) reads
the ring rows its first query can still see, in position order, then its own rows; each query
lists the ``window`` rows it sees (:func:`chunk_window`), so attention costs S x window rather
than S x (window + S). A decode batch ([B, 1], one state per row, rows at different positions)
writes its new rows into the rings first, then reads every ring slot of every row and masks by
the position each slot holds, so the whole batch is one gather and one mask whatever the
positions (:func:`window_keys`). Both give each query its own token plus the ``window - 1``
before it.
"""

from __future__ import annotations

import torch
from torch import Tensor

from deepinfer.models.layouts import SlotRows
from deepinfer.models.state import LayerState
from deepinfer.transfer import to_device


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
    kv: Tensor, positions: Tensor, state: list[LayerState] | SlotRows, window: int
) -> tuple[Tensor, Tensor]:
    """Keys [B, L, D] and visibility [B, 1, L] for a decode batch's new rows ``kv`` [B, 1, D]
    at ``positions`` [B, 1]; writes the rings."""
    if isinstance(state, SlotRows):
        return _slot_window_keys(kv, positions, state, window)
    return _decode_window_keys(kv, positions, state, window)


def _decode_window_keys(
    kv: Tensor, positions: Tensor, states: list[LayerState], window: int
) -> tuple[Tensor, Tensor]:
    rings = [s.swa for s in states]
    pool = rings[0].pool
    if pool is not None and all(r.pool is pool for r in rings):
        # Rows of one shared ring tensor: one scatter writes every row, one gather reads them.
        slots = to_device(torch.tensor([r.slot for r in rings]), kv.device)
        for ring in rings:
            ring.length += 1
        return _slot_window_keys(kv, positions, SlotRows(pool, slots), window)
    # The new rows go into the rings first: the slot they take held position p - capacity, which
    # no query at p can see (capacity >= window), so the rings alone are the keys, with no
    # second copy to append the new rows. Each ring's length is its row's position, known on
    # the host: one fused copy writes all rows.
    p = positions  # [B, 1]
    sizes = [r.capacity for r in rings]  # window + each state's rollback slack
    targets = [r.kv.select(1, r.length % r.capacity) for r in rings]  # [1, D] views
    torch._foreach_copy_(targets, list(kv[:, 0].to(rings[0].kv.dtype).split(1)))
    if len(set(sizes)) == 1:
        keys = torch.cat([r.kv for r in rings])  # [B, capacity, D]
    else:
        keys = torch.nn.utils.rnn.pad_sequence([r.kv[0] for r in rings], batch_first=True)
    for ring in rings:
        ring.length += 1
    capacity = to_device(torch.tensor(sizes), kv.device)[:, None]
    slot = torch.arange(keys.shape[1], device=kv.device)
    # Slot j holds the latest position up to p that is j mod capacity (negative: never written).
    held = p - torch.remainder(p - slot, capacity)  # [B, max capacity]
    visible = (held >= 0) & (p - held < window) & (slot < capacity)
    return keys.to(kv.dtype), visible[:, None, :]


def _slot_window_keys(
    kv: Tensor, positions: Tensor, rows: SlotRows, window: int
) -> tuple[Tensor, Tensor]:
    """The decode path for rows of one shared ring tensor, all on the device (capturable)."""
    ring, p = rows.ring, positions  # [B, 1]
    capacity = ring.shape[1]
    ring[rows.slots, p[:, 0] % capacity] = kv[:, 0].to(ring.dtype)
    keys = ring.index_select(0, rows.slots)  # [B, capacity, D]

    def mask() -> Tensor:  # the same for every layer of the step with this ring shape
        slot = torch.arange(capacity, device=kv.device)
        held = p - torch.remainder(p - slot, capacity)  # latest position <= p in each slot
        return ((held >= 0) & (p - held < window))[:, None, :]

    return keys.to(kv.dtype), rows.step_memo.get(("window", capacity, window), mask)
