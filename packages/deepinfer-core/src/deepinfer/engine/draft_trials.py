"""Each planned row's drafts judged by the tokens the request goes on to draw.

The confidences' calibration (:mod:`.online_calibration`) learns from *trials*: a draft whose
predecessors were all kept, checked against the target. A verification row only checks the
drafts its plan kept, and the plan cuts most drafts of an under-confident drafter, so a row
alone would teach its calibration little beyond its first cut draft, and positions after it
would keep their raw (low) confidences for good: the schedule would never verify them.

But every draft has a verdict waiting in the tokens the request draws next: the engine keeps a
draft iff it equals the sampler's draw at its position, and the steps after this one draw those
positions anyway (as a verification row's bonus token or as plain decode steps). So a planned
row's drafts stay open here, each judged when the token at its position is drawn, until one
differs (the trial ends there: it was tried and not kept) or all were kept. For greedy and
seeded requests that draw is the very one a verification would have made (the same logits, the
same seed at that position); for unseeded ones it is another draw from the same distribution, so
the counts stay unbiased.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from deepinfer.engine.request import Request


@dataclasses.dataclass
class DraftTrial:
    """A planned row's raw ``confidence`` and ``offered`` drafts (before its plan cut them), the
    first at token position ``first``; ``judged`` of them were drawn as drafted so far."""

    confidence: list[float]
    offered: list[int]
    first: int
    judged: int = 0


#: Positions of a trial judged at once: the trial, the first position judged and the
#: positions tried so far (its ``judged`` of them kept).
Outcome = tuple[DraftTrial, int, int]


class DraftTrials:
    """The open trials of each request, judged as its tokens are drawn."""

    def __init__(self) -> None:
        self.open: dict[Request, list[DraftTrial]] = {}

    def plan(
        self, req: Request, confidence: Sequence[float], offered: Sequence[int], first: int
    ) -> None:
        """Open a trial of ``req``'s ``offered`` drafts, the first at position ``first``."""
        if offered:
            trial = DraftTrial(list(confidence), list(offered), first)
            self.open.setdefault(req, []).append(trial)

    def drawn(self, req: Request, tokens: Sequence[int], first: int) -> list[Outcome]:
        """``req`` drew ``tokens``, the first at position ``first``: the positions of its
        trials that these judge, a piece per trial (learnt at once, so that a row's first
        positions teach the next step's plan); a trial ends at its first draft not drawn or
        its last one drawn."""
        trials = self.open.pop(req, [])
        judged, still = [], []
        for trial in trials:
            start = trial.judged
            tried, done = _judge(trial, tokens, first)
            if tried > start:
                judged.append((trial, start, tried))
            if not done:
                still.append(trial)
        if still:
            self.open[req] = still
        return judged

    def forget_finished(self) -> None:
        """Drop the trials of requests that finished (no token will judge the rest)."""
        for req in [r for r in self.open if r.finished]:
            del self.open[req]


def _judge(trial: DraftTrial, tokens: Sequence[int], first: int) -> tuple[int, bool]:
    """``trial``'s next drafts against ``tokens`` drawn from position ``first`` on: (positions
    tried so far, whether it ended). A position passed without a verdict (tokens the trial
    never saw: the request was preempted and recomputed) ends it where it stands."""
    n = len(trial.offered)
    while trial.judged < n:
        at = trial.first + trial.judged - first
        if at < 0:
            return trial.judged, True
        if at >= len(tokens):
            return trial.judged, False
        if tokens[at] != trial.offered[trial.judged]:
            return trial.judged + 1, True
        trial.judged += 1
    return n, True
