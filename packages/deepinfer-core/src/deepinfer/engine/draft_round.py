"""A drafting round launched on the device and read on the host when the next step needs it.

Drafting is the last work of a speculative step. Reading its drafts at once would leave the
device idle through the host's end of the step (tokens taken in, outputs built, the next
schedule made) and then idle again while the next step is laid out. So the round's tokens (and
confidences) stay on the device until the next step asks for them: the host's work between
steps runs while the drafter's kernels do, and the round costs the host one read of both.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from deepinfer.engine.request import Request


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
