"""Draft confidences: where MTP's come from, and the static threshold's cut on any drafter's.

A confidence is the drafter's estimate that a draft survives verification if the drafts before
it did. DSpark's come from its confidence head; MTP's are the MTP layer's own softmax
probability of its (argmax) draft. The static threshold (``"confidence_threshold"``) verifies a
row's drafts up to the first less confident than it: the cut depends on the drafter alone, not
on the target, so verification stays lossless.
"""

from __future__ import annotations

import torch
from torch import Tensor


def confident(logits: Tensor) -> tuple[Tensor, Tensor]:
    """The argmax of each row of MTP ``logits`` [n, V] and its softmax probability (fp32)."""
    tokens = logits.argmax(dim=-1)
    probs = torch.softmax(logits.float(), dim=-1)
    return tokens, probs.gather(1, tokens[:, None])[:, 0]


def cut_below(tokens: Tensor, confidence: Tensor, threshold: float) -> Tensor:
    """``tokens`` [n, k] with -1 from each row's first draft whose confidence is below
    ``threshold`` on (a threshold of 0 cuts nothing)."""
    if threshold <= 0:
        return tokens
    low = (confidence < threshold).cumsum(dim=1) > 0
    return tokens.masked_fill(low, -1)
