"""How many drafts of each request one verification step checks (``dspark.md`` §6.1-§6.4).

Each request's drafts come with confidences ``c_j`` (the chance that draft j survives when the
drafts before it did), so ``a_j = c_1 ... c_j`` is the chance that draft j is accepted, the
expected tokens a row of ``l`` drafts emits are ``1 + a_1 + ... + a_l``, and a step is worth

    Θ = τ / (D(R) + V(B)),    τ = Σ_r (1 + Σ_{j <= l_r} a_{r,j}),    B = the step's tokens,

with ``V(B)`` the seconds of a target step of ``B`` tokens and ``D(R)`` those of drafting the
round's ``R`` requests (vLLM's draft-cost table): a round is a drafting pass and a verifying step,
so the drafting is priced in the rate every draft must beat. A round need not draft at all:
:func:`drafting_pays` compares the best Θ with drafting against a plain step's
``samples / V(tokens)``, from survivals that exist before the round's drafts do.

For a fixed number of verified drafts the best allocation admits the slots of highest survival
(the gain of each admitted slot is its own ``a``); because ``a`` never grows along a row, that
set is a prefix of every row. The budget is the argmax of Θ over every count, not the end of a
greedy walk: the measured ``SPS`` is a staircase, so Θ has several local maxima.

Losslessness: whether draft j of a request is verified must not depend on draft j itself, and
``a_{j+1}`` is computed from it (the confidence head reads the previous draft). The top-B
admission is safe for a given budget, since a slot never outranks the slots before it in its
row and ties are broken by (request, position), never by value; the budget itself must then come
from information that does not involve the drafts being verified, so :func:`plan` takes it
from a separate survival snapshot (the engine passes each request's previous round, as DeepSeek
and vLLM size their capacity from stale confidences). Choosing the budget from the current
survivals (:func:`best_budget` on them) is the biased look-ahead of the paper's Appendix A.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

#: Seconds of a step of that many tokens (:meth:`.verify_cost.VerifyCost.step_seconds`).
StepSeconds = Callable[[int], float]


@dataclass(frozen=True)
class StepLoad:
    """What a step runs and emits besides the drafts: ``tokens`` counts every verifying row's
    own token and every prefill chunk's tokens; ``samples`` counts the requests that draw a
    token this step (verifying rows, and chunks that end their prompt; a chunk in the middle
    of a prompt draws nothing but still costs its tokens)."""

    tokens: int
    samples: int


@dataclass(frozen=True)
class Plan:
    """Drafts to verify per request (``lengths``), the budget they were taken under, and the
    objective that budget scored where it was chosen."""

    lengths: list[int]
    budget: int
    theta: float


def survival(confidences: Sequence[Sequence[float]]) -> list[list[float]]:
    """Per request, the running product of its confidences: ``a_{r,j}``."""
    return [list(itertools.accumulate(row, lambda a, c: a * c)) for row in confidences]


def ranked_slots(survivals: Sequence[Sequence[float]]) -> list[tuple[int, int]]:
    """Every slot (request, position) of positive survival, best first; equal survivals in
    (request, position) order, so the rank never depends on which tokens were drafted."""
    slots = [(r, j) for r, row in enumerate(survivals) for j, a in enumerate(row) if a > 0]
    return sorted(slots, key=lambda s: (-survivals[s[0]][s[1]], s[0], s[1]))


def best_budget(
    survivals: Sequence[Sequence[float]],
    load: StepLoad,
    step_seconds: StepSeconds,
    draft_seconds: float = 0.0,
) -> tuple[int, float]:
    """The number of drafts ``B`` whose top-``B`` allocation maximises Θ, over every ``B``
    from none to all positive slots (the smallest on a tie), and that Θ, for a round whose
    drafting took ``draft_seconds``."""
    tau = float(load.samples)
    best, theta = 0, tau / (draft_seconds + step_seconds(load.tokens))
    for b, (r, j) in enumerate(ranked_slots(survivals), start=1):
        tau += survivals[r][j]
        value = tau / (draft_seconds + step_seconds(load.tokens + b))
        if value > theta:
            best, theta = b, value
    return best, theta


def allocate(survivals: Sequence[Sequence[float]], budget: int) -> list[int]:
    """Per request, how many of its drafts the top-``budget`` slots admit (a prefix of its
    row: fewer than ``budget`` in all when fewer slots have positive survival)."""
    lengths = [0] * len(survivals)
    for r, _ in ranked_slots(survivals)[: max(0, budget)]:
        lengths[r] += 1
    return lengths


def plan(
    current: Sequence[Sequence[float]],
    budget_from: Sequence[Sequence[float]],
    load: StepLoad,
    step_seconds: StepSeconds,
    draft_seconds: float = 0.0,
) -> Plan:
    """Lengths for this step: the budget chosen on ``budget_from`` (survivals that do not
    involve this step's drafts, one row per request, no longer than its ``current`` row),
    then admitted by ``current`` survival."""
    budget, theta = best_budget(budget_from, load, step_seconds, draft_seconds)
    return Plan(allocate(current, budget), budget, theta)


def drafting_pays(
    survivals: Sequence[Sequence[float]],
    load: StepLoad,
    step_seconds: StepSeconds,
    draft_seconds: float,
) -> bool:
    """Whether drafting a round is worth its cost: the best Θ of a round that drafts (its
    ``draft_seconds`` spent, the budget chosen on ``survivals``, which must not involve the
    drafts the round would verify) beats a plain step's, ``samples / V(tokens)``."""
    plain = load.samples / step_seconds(load.tokens)
    return best_budget(survivals, load, step_seconds, draft_seconds)[1] > plain
