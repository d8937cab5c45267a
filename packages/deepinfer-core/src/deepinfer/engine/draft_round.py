"""A drafting round launched on the device and read on the host when the next step needs it.

Drafting is the last work of a speculative step. Reading its drafts at once would leave the
device idle through the host's end of the step (tokens taken in, outputs built, the next
schedule made) and then idle again while the next step is laid out. So the round's tokens (and
confidences) stay on the device until the next step asks for them: the host's work between
steps runs while the drafter's kernels do, and the round costs the host one read of both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from deepinfer.engine.request import Request
from deepinfer.transfer import to_device


@dataclass
class LaunchedRound:
    """A round's outputs, still on the device, and what taking them in needs."""

    #: The requests drafted for, in the rows' order.
    reqs: list[Request]
    #: Per request, how many tokens it may still generate after the step that drafted.
    rooms: list[int]
    #: [R, k] the drafts (-1: not worth verifying, and none after it).
    tokens: Tensor
    #: [R, k] their confidences (None: a round drafted without, fixed or threshold).
    confidence: Tensor | None
    #: Whether ``tokens`` may hold -1s (a confidence threshold's cut, made on the device).
    cut: bool = False

    def ahead(self, reqs: Sequence[Request]) -> tuple[Tensor, dict[Request, int]] | None:
        """The drafts of ``reqs``, in that order, for a step to verify before reading them:
        [len(reqs), k] on the device and how many each request takes (its room), where every one
        of ``reqs`` was drafted here with no draft cut (a threshold's -1s decide how long a
        row is, which the host must know to lay it out). Else None."""
        if self.cut or self.confidence is not None:
            return None
        at = {r: i for i, r in enumerate(self.reqs)}
        order = [at.get(r, -1) for r in reqs]
        if -1 in order or any(self.rooms[i] <= 0 for i in order):
            return None
        counts = {
            r: min(self.tokens.shape[1], self.rooms[i]) for r, i in zip(reqs, order, strict=True)
        }
        if order == list(range(len(self.reqs))):
            return self.tokens, counts
        index = to_device(torch.tensor(order), self.tokens.device)
        return self.tokens.index_select(0, index), counts

    def read(self) -> tuple[dict[Request, list[int]], dict[Request, list[float]]]:
        """Each live request's drafts (cut at a -1 and at its room) and confidences: one copy
        from the device for the lot (the host waits here for the round to finish)."""
        if self.confidence is None:
            tokens, confidence = self.tokens.tolist(), None
        else:  # ids are exact in fp32 (below 2**24): one read of both
            both = torch.cat((self.tokens.float(), self.confidence.float()), dim=1).tolist()
            k = self.tokens.shape[1]
            tokens = [[int(t) for t in row[:k]] for row in both]
            confidence = [row[k:] for row in both]
        drafts, confidences = {}, {}
        for i, (req, room) in enumerate(zip(self.reqs, self.rooms, strict=True)):
            if req.finished or req.state is None:  # ended or preempted since: nothing to verify
                continue
            row = tokens[i]
            kept = row[: row.index(-1)] if -1 in row else row
            drafts[req] = kept[: max(0, room)]
            if confidence is not None:
                confidences[req] = confidence[i]
        return drafts, confidences


def charge(reqs: list[Request], seconds: float) -> float:
    """Count ``seconds`` of the host's drafting (launching a round, waiting for it) on each
    of ``reqs``' metrics; returns ``seconds``."""
    for req in reqs:
        req.metrics.spec_draft_time += seconds
    return seconds
