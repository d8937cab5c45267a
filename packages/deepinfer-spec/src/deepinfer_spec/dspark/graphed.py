"""The engine's DSpark rounds replayed from CUDA graphs, over a ring of context per slot.

Drafting a round eagerly launches a few hundred small kernels and builds every request's
padded context on the host, several times a verification step's replayed graph on a GPU. Here
a round is :func:`~.ring.ring_round` over the :class:`~.ring.DraftRing` of the target's slot
rows (the engine's states live in slots whenever it has graphs), run through the engine's
:class:`~deepinfer.models.graphs.DecodeGraphs` under its own key: one graph per batch bucket,
captured on first use, sharing the engine's memory pool. The host only lays out each request's
newly verified rows (the last ``k + 1``, as many as a verification round keeps; longer runs of
new positions, after a prefill chunk or plain steps, write their earlier rows eagerly first).
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Sequence

import torch
from torch import Tensor

from deepinfer.models.graphs import DecodeGraphs
from deepinfer.models.state import ModelState
from deepinfer.transfer import to_device
from deepinfer_spec.dspark.model import DSparkDrafter, Embed, Head
from deepinfer_spec.dspark.ring import DraftRing, ring_round


class GraphedRounds:
    """Drafting rounds of ``k`` drafts a request over slot rings (see the module)."""

    def __init__(
        self, drafter: DSparkDrafter, embed: Embed, head: Head, graphs: DecodeGraphs, k: int
    ) -> None:
        self.drafter = drafter
        self.graphs = graphs
        self.ring = DraftRing.allocate(drafter, graphs.max_batch)
        self.rows = k + 1  # new positions a round absorbs in its graph
        if self.ring.window < self.rows:
            raise ValueError(f"a sliding_window of {self.ring.window} is shorter than a round")
        self.embed, self.head = embed, head
        #: per slot, the state whose context its ring holds and where that context ends
        self.owners: dict[int, tuple[weakref.ref[ModelState], int]] = {}

    def capture(self, context: int) -> None:
        """Capture every batch bucket's round now (made-up rounds, :meth:`dummy`), as the
        engine captures its decode steps at start-up, so no run pays for a capture."""
        for bucket in self.graphs.buckets:
            self.dummy(bucket, context)

    def covers(self, states: Sequence[ModelState]) -> bool:
        """Whether every state lives in a slot row (a state of its own has no ring)."""
        return all(0 < s.slot <= self.graphs.max_batch for s in states)

    def draft(
        self, states: Sequence[ModelState], streams: Tensor, next_ids: Tensor, lengths: list[int]
    ) -> tuple[Tensor, Tensor]:
        """Drafts and confidences [R, block], as ``DSparkSpeculator.draft_with_confidence``."""
        device, m, window = streams.device, self.rows, self.ring.window
        restart, early, early_slots, early_pos = [], [], [], []
        # per request: its m rows' slots and positions, its slot and its anchor's position
        # (the graph's plan), then its m rows of ``streams`` and its anchor's index; one
        # host-to-device copy for the lot. Unused rows go to the padding slot 0, whose ring
        # nothing reads, so any row of ``streams`` serves them.
        rows: list[list[int]] = []
        offsets = [0, *itertools.accumulate(lengths)]
        for i, (state, n) in enumerate(zip(states, lengths, strict=True)):
            slot, first, off = state.slot, state.pos - n, offsets[i]
            ref, end = self.owners.get(slot, (None, -1))
            if ref is None or ref() is not state or end != first:  # its context starts again
                restart.append(slot)
            self.owners[slot] = (weakref.ref(state), state.pos)
            tail = min(n, m)
            for j in range(max(0, n - window), n - tail):
                early.append(off + j)
                early_slots.append(slot)
                early_pos.append(first + j)
            pad = [0] * (m - tail)
            rows.append([*[slot] * tail, *pad,
                         *range(first + n - tail, first + n), *pad,
                         slot, state.pos,
                         *range(off + n - tail, off + n), *pad, off + n - 1])  # fmt: skip
        if restart:
            self.ring.clear(to_device(torch.tensor(restart), device))
        if early:
            where = to_device(torch.tensor((early, early_slots, early_pos)), device)
            self.ring.write(self.drafter, streams[where[0]], where[1], where[2])
        plan = to_device(torch.tensor(rows), device)  # no wait for the rollbacks queued
        at = 2 * m + 2
        return self._run(plan[:, :at], streams[plan[:, at : at + m]], next_ids[plan[:, -1]])

    def dummy(self, num_requests: int, context: int) -> None:
        """A made-up round of ``num_requests`` requests, each ``context`` positions in, all
        in the padding slot (a round's cost does not depend on its contexts' contents)."""
        c, device, m = self.drafter.c, self.ring.positions.device, self.rows
        gen = torch.Generator().manual_seed(0)
        features = torch.randn(num_requests, m, c.feature_size, generator=gen)
        plan = torch.zeros(num_requests, 2 * m + 2, dtype=torch.long, device=device)
        plan[:, m : 2 * m] = torch.arange(context, context + m, device=device)
        plan[:, -1] = context + m
        self._run(
            plan,
            features.to(device, self.drafter.fc.weight.dtype),
            torch.randint(3, c.vocab_size, (num_requests,), generator=gen).to(device),
        )

    def _run(self, plan: Tensor, features: Tensor, anchors: Tensor) -> tuple[Tensor, Tensor]:
        """One round: ``plan`` [R, 2m + 2] (each request's m rows' slots and positions, its
        slot and its anchor's position), the rows' ``features`` [R, m, F], ``anchors`` [R]."""
        tokens, confidence = self.graphs.run(
            ("dspark", self.rows), self._planned, plan, features, anchors
        )
        # the graph's outputs are shared buffers the next replay overwrites
        return tokens.clone(), confidence.clone()

    def _planned(self, plan: Tensor, features: Tensor, anchors: Tensor) -> tuple[Tensor, Tensor]:
        """:func:`~.ring.ring_round` over a packed plan (one graph input, not four)."""
        m = self.rows
        return ring_round(self.drafter, self.ring, self.embed, self.head, plan[:, :m],
                          plan[:, m : 2 * m], features, plan[:, 2 * m], anchors,
                          plan[:, 2 * m + 1])  # fmt: skip
