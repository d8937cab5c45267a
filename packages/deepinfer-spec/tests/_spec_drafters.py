"""A drafter for engine tests that knows the sequences it will see."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from deepinfer.models.state import ModelState


class KnowingDrafter:
    """Proposes the continuation of whichever known sequence has the last verified token at
    that position (a later sequence wins a shared key), corrupting the second draft of every
    third round, so rows keep all, some or none of their drafts; follows the verified
    positions as the MTP drafter does."""

    def __init__(self, sequences: Sequence[Sequence[int]], k: int = 3) -> None:
        self.k = k
        self.next: dict[tuple[int, int], list[int]] = {}
        for seq in sequences:
            for t in range(len(seq) - 1):
                self.next[t, seq[t]] = list(seq[t + 1 : t + 1 + k])
        self.rounds = 0

    def draft_batch(
        self,
        states: Sequence[ModelState],
        streams: Tensor,
        next_ids: Tensor,
        lengths: Sequence[int],
    ) -> Tensor:
        out, end = [], 0
        for state, n in zip(states, lengths, strict=True):
            end += n
            state.mtp_pos += n
            row = list(self.next.get((state.mtp_pos, int(next_ids[end - 1])), []))
            row += [7] * (self.k - len(row))
            self.rounds += 1
            if self.rounds % 3 == 0:
                row[1] = (row[1] + 1) % 8000
            out.append(row)
        return torch.tensor(out)


class ConfidentDrafter(KnowingDrafter):
    """A :class:`KnowingDrafter` that gives every draft the same ``confidence`` (adaptive
    scheduling's input) and reads one feature layer as DSpark does, so a step without drafts
    takes the plain decode pass."""

    feature_layers = (0,)

    def __init__(self, sequences: Sequence[Sequence[int]], confidence: float, k: int = 3) -> None:
        super().__init__(sequences, k)
        self.confidence = confidence

    def draft_with_confidence(
        self,
        states: Sequence[ModelState],
        streams: Tensor,
        next_ids: Tensor,
        lengths: Sequence[int],
    ) -> tuple[Tensor, Tensor]:
        drafts = self.draft_batch(states, streams, next_ids, lengths)
        return drafts, torch.full(drafts.shape, self.confidence)
