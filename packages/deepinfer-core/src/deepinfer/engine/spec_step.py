"""What a speculative step hands the engine, what it asks of the runner, and what it keeps of
each request between steps (:mod:`.speculative`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from torch import Tensor

from deepinfer.engine.request import Request
from deepinfer.models.state import ModelState


class Recorder(Protocol):
    """The runner's prefix-cache recording, as a speculative step uses it."""

    def boundaries(self, req: Request, end: int) -> list[int]: ...

    def record_block(self, req: Request, state: ModelState) -> None: ...

    def maybe_record(self, req: Request) -> None: ...


@dataclass
class SpecStep:
    """What a speculative step hands the engine."""

    num_computed: dict[Request, int] = field(default_factory=dict)
    #: Per request, the tokens it emits this step with their logprobs, in order.
    tokens: dict[Request, list[tuple[int, float]]] = field(default_factory=dict)
    #: Whether the step ran as a plain decode step (single-token rows only: no verification).
    plain: bool = False
    #: Positions the step's pass ran, and requests drafted after it.
    positions: int = 0
    drafted: int = 0
    #: (state, length, token ids) of every verification row that rejected a draft: rolled
    #: back together once the step's rows are read (``model.rollback_many``).
    rollbacks: list[tuple[ModelState, int, list[int]]] = field(default_factory=list)


@dataclass
class PendingPositions:
    """A request's verified positions the drafter has not read yet, for the state they are
    in (a preempted request starts again with a new state)."""

    state: ModelState | None
    streams: list[Tensor] = field(default_factory=list)  # [m, hc, d] pieces
    next_ids: list[int] = field(default_factory=list)


def count_round(req: Request, offered: int, kept: int, plain: bool) -> None:
    """Count on ``req``'s metrics a verification row of ``offered`` drafts that kept the
    first ``kept`` (a plain step's row, which verifies nothing, counts no round)."""
    metrics = req.metrics
    metrics.spec_rounds += not plain
    metrics.spec_draft_tokens += offered
    metrics.spec_accepted_tokens += kept
    per = metrics.spec_accepted_per_position
    per += [0] * (offered - len(per))
    for j in range(kept):
        per[j] += 1
