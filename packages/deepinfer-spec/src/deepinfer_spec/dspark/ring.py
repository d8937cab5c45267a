"""Every request's drafter context in fixed tensors: drafting rounds a CUDA graph can replay.

A drafter with a ``sliding_window`` attends to the last ``window`` positions before its anchor,
so each request's context keys and values fit a ring of ``window`` rows per draft layer
(position p at row p % window), one tensor over all slots, row 0 the padding slot (as the
target's slot tensors). A round is then a fixed sequence of device ops over those tensors
(:func:`ring_round`): write the newly verified positions' keys and values, gather each
request's ring, mask the rows outside its window, run the block. Nothing depends on a
context's length or runs per request on the host, so one graph per batch bucket replays it,
where the eager round (:mod:`.batch`) pads and copies every context on every round.

Attention is indifferent to the order of its keys (each key is rotated at its own position
before it is stored), so a ring holds the same context as :class:`~.draft.DraftContext`'s
chronological rows and drafts the same tokens, up to the order of fp sums.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from deepinfer_spec.dspark.batch import draft_block
from deepinfer_spec.dspark.model import DSparkDrafter, Embed, Head


@dataclass
class DraftRing:
    """Context rings of ``num_slots`` requests plus the padding slot 0."""

    keys: list[Tensor]  # per draft layer [slots + 1, window, H, D]
    values: list[Tensor]
    #: [slots + 1, window] the position each row holds (-1: none)
    positions: Tensor

    @classmethod
    def allocate(cls, drafter: DSparkDrafter, num_slots: int) -> DraftRing:
        c = drafter.c
        if c.sliding_window is None:
            raise ValueError("a context ring needs a drafter with a sliding_window")
        weight = drafter.fc.weight
        shape = (num_slots + 1, c.sliding_window, c.num_heads, c.head_dim)
        keys = [weight.new_zeros(shape) for _ in range(c.num_layers)]
        values = [weight.new_zeros(shape) for _ in range(c.num_layers)]
        positions = torch.full(shape[:2], -1, dtype=torch.long, device=weight.device)
        return cls(keys, values, positions)

    @property
    def window(self) -> int:
        return self.positions.shape[1]

    def clear(self, slots: Tensor) -> None:
        """Forget the contexts of ``slots`` (a request that starts its context again)."""
        self.positions[slots] = -1

    def write(
        self, drafter: DSparkDrafter, features: Tensor, slots: Tensor, positions: Tensor
    ) -> None:
        """Project target features [N, F] of ``positions`` [N] into the rings of ``slots``
        [N]; a slot's rows must be at most ``window`` distinct positions (padding rows go to
        slot 0, whose contents nothing reads)."""
        new = drafter.context(features[None], positions[None])
        rows = positions % self.window
        for (k, v), keys, values in zip(new, self.keys, self.values, strict=True):
            keys[slots, rows] = k[0]
            values[slots, rows] = v[0]
        self.positions[slots, rows] = positions

    def context(
        self, slots: Tensor, starts: Tensor, block_size: int
    ) -> tuple[list[tuple[Tensor, Tensor]], Tensor]:
        """Per layer the rings of ``slots`` [R] ([R, window, H, D] keys and values) and the
        mask [R, block, window + block] that shows a block at ``starts`` [R] the positions of
        its window before it, and its whole block."""
        layers = [(k[slots], v[slots]) for k, v in zip(self.keys, self.values, strict=True)]
        held, start = self.positions[slots], starts[:, None]
        seen = (held >= 0) & (held < start) & (held >= start - self.window)
        mask = torch.cat((seen, seen.new_ones(len(slots), block_size)), dim=1)
        return layers, mask[:, None].expand(-1, block_size, -1)


def ring_round(  # noqa: PLR0917
    drafter: DSparkDrafter,
    ring: DraftRing,
    embed: Embed,
    head: Head,
    row_slots: Tensor,
    row_positions: Tensor,
    row_features: Tensor,
    slots: Tensor,
    anchors: Tensor,
    starts: Tensor,
) -> tuple[Tensor, Tensor]:
    """One round over R requests: absorb each one's newly verified positions (``row_*``
    [R, m] and features [R, m, F]; unused rows in slot 0), then draft a block after each
    anchor [R] at ``starts`` [R] from the rings of ``slots`` [R]. Greedy drafts and their
    confidences [R, block], as :func:`~.batch.propose_batch`."""
    ring.write(drafter, row_features.flatten(0, 1), row_slots.flatten(), row_positions.flatten())
    context, mask = ring.context(slots, starts, drafter.c.block_size)
    return draft_block(drafter, context, mask, anchors, starts, embed, head)
