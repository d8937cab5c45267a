"""Draft confidences: where MTP's come from, and the static threshold's cut on any drafter's.

A confidence is the drafter's estimate that a draft survives verification if the drafts before
it did. DSpark's come from its confidence head; MTP's are the MTP layer's own softmax
probability of its (argmax) draft. The static threshold (``"confidence_threshold"``) verifies a
row's drafts up to the first less confident than it: the cut depends on the drafter alone, not
on the target, so verification stays lossless.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from deepinfer.models.state import ModelState


def confident(logits: Tensor) -> tuple[Tensor, Tensor]:
    """The argmax of each row of MTP ``logits`` [n, V] and its softmax probability (fp32),
    ``exp(logit - logsumexp)``: one pass over the vocabulary, no [n, V] probabilities."""
    logits = logits.float()
    tokens = logits.argmax(dim=-1)
    top = logits.gather(1, tokens[:, None])[:, 0]
    return tokens, torch.exp(top - torch.logsumexp(logits, dim=-1))


def cut_below(tokens: Tensor, confidence: Tensor, threshold: float) -> Tensor:
    """``tokens`` [n, k] with -1 from each row's first draft whose confidence is below
    ``threshold`` on (a threshold of 0 cuts nothing)."""
    if threshold <= 0:
        return tokens
    low = (confidence < threshold).cumsum(dim=1) > 0
    return tokens.masked_fill(low, -1)


class ThresholdDrafter:
    """A drafter whose ``draft_batch`` is its ``draft_with_confidence`` cut at its static
    ``threshold`` (what the engine calls when it plans no cut itself)."""

    threshold: float

    def draft_with_confidence(
        self,
        states: Sequence[ModelState],
        streams: Tensor,
        next_ids: Tensor,
        lengths: Sequence[int],
    ) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def draft_batch(
        self,
        states: Sequence[ModelState],
        streams: Tensor,
        next_ids: Tensor,
        lengths: Sequence[int],
    ) -> Tensor:
        """[requests, k] drafts; with a threshold, -1 from each row's first draft whose
        confidence is below it (a non-anticipating cut: the drafter's own confidences only)."""
        tokens, confidence = self.draft_with_confidence(states, streams, next_ids, lengths)
        return cut_below(tokens, confidence, self.threshold)
