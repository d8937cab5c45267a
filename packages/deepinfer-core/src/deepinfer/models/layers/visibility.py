"""Which compressed entries a query sees: the one rule every attention and indexer path shares.

Entry ``j`` of a ratio-``r`` compressor pools positions ``j*r .. j*r + r - 1``; a query at
position ``p`` sees it once that whole window is in its past, so it sees the first
``(p + 1) // r`` entries. Keeping the rule in one place keeps V4's CSA/HCA layers, V4.1's shared
source layers and the indexers from drifting apart.
"""

from __future__ import annotations

import torch
from torch import Tensor


def visible_count(positions: Tensor, ratio: int) -> Tensor:
    """How many entries a query at each of ``positions`` sees (same shape)."""
    return (positions + 1) // ratio


def visible_mask(positions: Tensor, ratio: int, num_entries: int, batch: int) -> Tensor:
    """[batch, S, num_entries] True where the query at ``positions`` ([S], or [B, 1] for a
    decode batch) sees the entry."""
    entries = torch.arange(num_entries, device=positions.device)
    seen = entries < visible_count(positions, ratio)[..., None]
    return seen.expand(batch, positions.shape[-1], num_entries)
