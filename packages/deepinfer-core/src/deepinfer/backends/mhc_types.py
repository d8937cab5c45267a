"""Mixer products handed from one mHC exit to the next entry (see :class:`StreamMix`)."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass(frozen=True)
class StreamMix:
    """The next sublayer's mixer products of a sublayer's new streams, made as the exit wrote
    them (:meth:`Backend.mhc_post_mix`), in the layout of the backend that made them.

    A decode step's mHC exit writes the streams that the next entry's mixer reads back at
    once; a backend that makes both in one kernel hands the products over in this, so the next
    entry skips the mixer's own pass (one launch a sublayer fewer). The streams and the mixer
    weight are kept, so an entry uses the products only for the very tensors they are of.
    """

    streams: Tensor
    fn: Tensor
    parts: tuple[Tensor, ...]

    def of(self, streams: Tensor, fn: Tensor) -> bool:
        """Whether these are the products of ``streams`` by ``fn`` (the same tensors)."""
        return self.streams is streams and self.fn is fn
