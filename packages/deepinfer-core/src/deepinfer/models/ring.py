"""One layer's sliding window of post-RoPE kv rows, as a ring (see :mod:`.state`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass
class SWARing:
    """The sliding window of one layer: ``kv[:, p % capacity]`` holds position p's row.

    The ring holds ``window + slack`` rows: the attention window plus the rows a rollback of up
    to ``slack`` tokens needs back (a speculative step overwrites them otherwise).
    """

    kv: Tensor  # [B, capacity, D]
    length: int = 0  # tokens written so far
    window: int = 0  # attention window; 0 = the whole capacity
    #: Set when ``kv`` is row ``slot`` of a shared [slots, capacity, D] tensor (the engine's
    #: :class:`~deepinfer.cache.slots.StateSlots`): a decode batch then writes and reads every
    #: row's ring with one indexed op instead of one per row.
    pool: Tensor | None = None
    slot: int = -1
    #: Lengths strictly inside the next chunk at which to keep a copy of the ring as it stood
    #: there (see :func:`set_marks`): filled in by :meth:`write`.
    marks: dict[int, Tensor | None] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not self.window:
            self.window = self.capacity

    @property
    def capacity(self) -> int:
        return self.kv.shape[1]

    def past_rows(self, start: int) -> Tensor:
        """The ring rows of the positions queries from ``start`` on can still see:
        start-window+1 .. start-1."""
        first = max(0, start - self.window + 1)
        return torch.arange(first, start, device=self.kv.device) % self.capacity

    def write(self, kv: Tensor, start: int, rows: Tensor | None = None) -> None:
        """Put ``kv`` [B, S, D] of positions start.. in the ring (``rows``: their
        :func:`write_rows`, where the caller has them)."""
        for length in self.marks:
            if start < length < start + kv.shape[1]:
                ring = self.kv.clone()
                write_ring(ring, kv[:, : length - start], start)
                self.marks[length] = ring
        write_ring(self.kv, kv, start, rows)
        self.length = start + kv.shape[1]


def write_rows(capacity: int, start: int, count: int, device: torch.device) -> Tensor:
    """The rows of a ``capacity`` ring that the last of ``count`` new rows of positions start..
    go to (those a ring can hold)."""
    keep = min(count, capacity)
    return torch.arange(start + count - keep, start + count, device=device) % capacity


def write_ring(ring: Tensor, kv: Tensor, start: int, rows: Tensor | None = None) -> None:
    """Put rows ``kv`` [B, S, D] of positions start.. into ``ring`` [B, capacity, D]
    (``rows``: their :func:`write_rows`, made here if None)."""
    capacity, count = ring.shape[1], kv.shape[1]
    at = write_rows(capacity, start, count, kv.device) if rows is None else rows
    ring[:, at] = kv[:, -min(count, capacity) :].to(ring.dtype)
