"""Which compressed entries a query sees: the one rule every attention and indexer path shares.

Entry ``j`` of a ratio-``r`` compressor pools positions ``j*r .. j*r + r - 1``; a query at
position ``p`` sees it once that whole window is in its past, so it sees the first
``(p + 1) // r`` entries. Keeping the rule in one place keeps V4's CSA/HCA layers, V4.1's shared
source layers and the indexers from drifting apart.
"""

from __future__ import annotations

import torch
from torch import Tensor

from deepinfer.models.memo import StepMemo


def visible_count(positions: Tensor, ratio: int, memo: StepMemo | None = None) -> Tensor:
    """How many entries a query at each of ``positions`` sees (same shape); the same for every
    layer of a ratio, so computed once per step where the pass has a ``memo``."""
    if memo is None:
        return (positions + 1) // ratio
    return memo.get(("visible", ratio), lambda: (positions + 1) // ratio)


def visible_mask(
    positions: Tensor, ratio: int, num_entries: int, batch: int, memo: StepMemo | None = None
) -> Tensor:
    """[batch, S, num_entries] True where the query at ``positions`` ([S], or [B, 1] for a
    decode batch) sees the entry (once per step and shape where the pass has a ``memo``)."""

    def make() -> Tensor:
        entries = torch.arange(num_entries, device=positions.device)
        seen = entries < visible_count(positions, ratio, memo)[..., None]
        return seen.expand(batch, positions.shape[-1], num_entries)

    if memo is None:
        return make()
    return memo.get(("visible mask", ratio, num_entries, batch), make)


def visible_entries(
    positions: Tensor, ratio: int, num_entries: int, batch: int, memo: StepMemo
) -> Tensor:
    """[batch, 1, num_entries] int64 for a decode batch at ``positions`` [B, 1]: entry ``e``
    where the row sees it, else -1 (:func:`visible_mask` as the list paged attention reads),
    once per step and shape."""

    def make() -> Tensor:
        return listed(visible_mask(positions, ratio, num_entries, batch, memo))

    return memo.get(("visible entries", ratio, num_entries, batch), make)


def listed(seen: Tensor) -> Tensor:
    """A visibility mask [..., T] as the entries it shows: ``e`` where ``seen[..., e]``, else
    -1 (int64)."""
    return torch.where(seen, torch.arange(seen.shape[-1], device=seen.device), -1)
