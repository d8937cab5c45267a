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

    def read(self, start: int) -> tuple[Tensor, Tensor]:
        """Rows queries from ``start`` on can still see: positions start-window+1 .. start-1."""
        first = max(0, start - self.window + 1)
        positions = torch.arange(first, start, device=self.kv.device)
        return self.kv[:, positions % self.capacity], positions

    def write(self, kv: Tensor, start: int) -> None:
        for length in self.marks:
            if start < length < start + kv.shape[1]:
                ring = self.kv.clone()
                write_ring(ring, kv[:, : length - start], start)
                self.marks[length] = ring
        write_ring(self.kv, kv, start)
        self.length = start + kv.shape[1]


def write_ring(ring: Tensor, kv: Tensor, start: int) -> None:
    """Put rows ``kv`` [B, S, D] of positions start.. into ``ring`` [B, capacity, D]."""
    capacity = ring.shape[1]
    keep = min(kv.shape[1], capacity)
    positions = torch.arange(start + kv.shape[1] - keep, start + kv.shape[1], device=kv.device)
    ring[:, positions % capacity] = kv[:, -keep:].to(ring.dtype)
