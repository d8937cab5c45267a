"""How many drafts of each request one verification step checks (``dspark.md`` §6.1-§6.2).

Each request's drafts come with confidences ``c_j`` (the chance that draft j survives when the
drafts before it did), so ``a_j = c_1 ... c_j`` is the chance that draft j is accepted, the
expected tokens a row of ``l`` drafts emits are ``1 + a_1 + ... + a_l``, and a step is worth

    Θ = τ / (D + V(B)),    τ = Σ_r (1 + Σ_{j <= l_r} a_{r,j}),    B = the step's tokens,

with ``V(B)`` the seconds of a target step of ``B`` tokens (for its rows: a step of no drafts
is the plain step, priced apart, :mod:`.verify_cost`) and ``D`` those of drafting, where the
drafting is still to be paid for. Verifying no draft at all is one of the choices, so a step
verifies drafts only where their expected tokens beat the plain step's rate. Whether to draft a
round at all, :func:`drafting_pays`, compares the best Θ with the round's drafting priced in
against the plain step's ``samples / V(tokens)``, on survivals that exist before the round's
drafts do.

For a fixed number of verified drafts the best allocation admits the slots of highest survival
(the gain of each admitted slot is its own ``a``); because ``a`` never grows along a row, that
set is a prefix of every row. The budget is the argmax of Θ over every count, not the end of a
greedy walk: the measured ``V`` is a staircase, so Θ has several local maxima.

Why the budget may look at the drafts being verified: the engine keeps a draft iff it equals the
sampler's own draw at its position (:mod:`.spec_sampling`), so every emitted token is the
engine's draw whichever drafts are verified, and no rule for choosing them can bias the output.
The paper's non-anticipation rule (§6.3, Appendix A) protects rejection sampling of drafts drawn
from the drafter's own distribution, where admitting draft j on the strength of ``a_{j+1}``
(computed from draft j) skews the output; that is not how the engine verifies, so
:func:`plan` takes the budget from the very survivals it admits by, which are the best
information there is on this step's drafts. Ranking still breaks ties by (request, position),
never by value, so a plan is a function of the survivals alone.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

#: Seconds of a step of that many tokens, that many of its positions drawn with noise (at a
#: temperature above 0), its rows given (:meth:`.verify_cost.StepCost.seconds`).
StepSeconds = Callable[[int, int], float]


@dataclass(frozen=True)
class StepLoad:
    """What a step runs and emits besides the drafts: ``tokens`` counts every verifying row's
    own token and every prefill chunk's tokens; ``samples`` counts the requests that draw a
    token this step (verifying rows, and chunks that end their prompt; a chunk in the middle
    of a prompt draws nothing but still costs its tokens). ``noisy`` counts those draws that
    are made with noise, and ``noisy_rows`` says, per request of the survivals, whether its
    drafts' positions are (each then costs a draw with noise: a sampled request's drafts cost
    more to verify than a greedy one's)."""

    tokens: int
    samples: int
    noisy: int = 0
    noisy_rows: tuple[bool, ...] = ()


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


#: Slots past which :func:`ranked_slots` sorts in numpy (below, its fixed costs dominate).
NUMPY_SLOTS = 64


class Ranked(NamedTuple):
    """Slots best first (:func:`ranked_slots`): each one's request and survival."""

    owners: list[int]
    gains: list[float]


def ranked_slots(survivals: Sequence[Sequence[float]]) -> Ranked:
    """Every slot (request, position) of positive survival, best first, as the request and
    the survival of each; equal survivals in (request, position) order, so the rank never
    depends on which tokens were drafted (a stable sort, by survival alone, of the slots
    listed in that order). A request's slots come in position order: survival never grows
    along a row. A step of 256 requests has over a thousand slots: those sort in numpy."""
    flat = list(itertools.chain.from_iterable(survivals))
    owner = [r for r, row in enumerate(survivals) for _ in row]
    if len(flat) <= NUMPY_SLOTS:
        worse = [-a for a in flat]
        order = sorted([i for i, a in enumerate(flat) if a > 0], key=worse.__getitem__)
        return Ranked([owner[i] for i in order], [flat[i] for i in order])
    values = np.array(flat)
    positive = np.flatnonzero(values > 0)
    picked = positive[np.argsort(-values[positive], kind="stable")]
    return Ranked(np.array(owner)[picked].tolist(), values[picked].tolist())


#: Budgets a search range holds at most before they are scored one by one.
SCAN = 8


def best_budget(
    survivals: Sequence[Sequence[float]],
    load: StepLoad,
    step_seconds: StepSeconds,
    draft_seconds: float = 0.0,
) -> tuple[int, float]:
    """The number of drafts ``B`` whose top-``B`` allocation maximises Θ, over every ``B``
    from none to all positive slots (the smallest on a tie), and that Θ, for a round whose
    drafting took ``draft_seconds``.

    The step is priced at few counts, not at every one (a step of 256 rows has over a
    thousand, and pricing them all took a large share of a GPU step's host time): a branch
    and bound over ranges of counts. A range ``[lo, hi]`` can score at most its largest τ
    over its cheapest step, ``τ(hi) / seconds(lo)`` (τ never shrinks as slots are admitted;
    steps with drafts never get cheaper with more tokens or more noisy draws); ranges are
    opened most promising first, halved, scored one by one once small, and dropped once
    their bound cannot beat the best count found, a larger Θ or an equal one at a smaller
    count. So the result is exactly that of scoring every count."""
    return _best(ranked_slots(survivals), len(survivals), load, step_seconds, draft_seconds)


def _best(
    ranked: Ranked,
    num_requests: int,
    load: StepLoad,
    step_seconds: StepSeconds,
    draft_seconds: float,
) -> tuple[int, float]:
    """:func:`best_budget` on slots ranked already."""
    owners, gains = ranked
    tau = list(itertools.accumulate(gains, initial=float(load.samples)))
    noisy = [load.noisy] * (len(gains) + 1)
    if any(load.noisy_rows):  # whether each request's draws are noisy
        flags = [*load.noisy_rows[:num_requests], *[False] * num_requests]
        noisy = list(itertools.accumulate([flags[r] for r in owners], initial=load.noisy))

    def seconds(b: int) -> float:
        return draft_seconds + step_seconds(load.tokens + b, noisy[b])

    best = (tau[0] / seconds(0), 0)  # (Θ, -B): the larger wins

    def bounded(lo: int, hi: int) -> tuple[float, int, int]:
        return (-tau[hi] / seconds(lo), lo, hi)

    ranges = [bounded(1, len(gains))] if gains else []
    while ranges:
        bound, lo, hi = heapq.heappop(ranges)
        if (-bound, -lo) <= best:
            break  # nor can any range left: none has a larger bound
        if hi - lo < SCAN:
            best = max(best, *((tau[b] / seconds(b), -b) for b in range(lo, hi + 1)))
            continue
        mid = (lo + hi) // 2
        heapq.heappush(ranges, bounded(lo, mid))
        heapq.heappush(ranges, bounded(mid + 1, hi))
    return -best[1], best[0]


def allocate(survivals: Sequence[Sequence[float]], budget: int) -> list[int]:
    """Per request, how many of its drafts the top-``budget`` slots admit (a prefix of its
    row: fewer than ``budget`` in all when fewer slots have positive survival)."""
    return _admit(ranked_slots(survivals), len(survivals), budget)


def _admit(ranked: Ranked, num_requests: int, budget: int) -> list[int]:
    """:func:`allocate` on slots ranked already."""
    lengths = [0] * num_requests
    for r in ranked.owners[: max(0, budget)]:
        lengths[r] += 1
    return lengths


def plan(
    survivals: Sequence[Sequence[float]],
    load: StepLoad,
    step_seconds: StepSeconds,
    draft_seconds: float = 0.0,
    margin: float = 0.0,
) -> Plan:
    """Lengths for this step: the budget that maximises Θ on ``survivals`` (one row per
    request that verifies), admitted by the same survivals; none at all unless some count of
    drafts beats the step without them by ``margin`` (a fraction of its Θ)."""
    ranked, n = ranked_slots(survivals), len(survivals)
    budget, theta = _best(ranked, n, load, step_seconds, draft_seconds)
    plain = load.samples / (draft_seconds + step_seconds(load.tokens, load.noisy))
    if theta <= plain * (1 + margin):
        budget, theta = 0, plain
    return Plan(_admit(ranked, n, budget), budget, theta)


def drafting_plan(
    survivals: Sequence[Sequence[float]],
    load: StepLoad,
    step_seconds: StepSeconds,
    draft_seconds: float,
    margin: float = 0.0,
) -> Plan | None:
    """The drafts a round would verify if drafting it is worth its cost, None if it is not:
    the best Θ of a round that drafts (its ``draft_seconds`` spent, the budget chosen on
    ``survivals``, an estimate made before the round's drafts exist) must beat a plain
    step's, ``samples / V(tokens)``, by ``margin`` (a fraction of it)."""
    plain = load.samples / step_seconds(load.tokens, load.noisy)
    # No round can do better than every survival for the cheapest verification step: when
    # even that loses, the search over budgets is not needed.
    most = load.samples + sum(map(sum, survivals))
    if most / (draft_seconds + step_seconds(load.tokens + 1, load.noisy)) <= plain * (1 + margin):
        return None
    ranked, n = ranked_slots(survivals), len(survivals)
    budget, theta = _best(ranked, n, load, step_seconds, draft_seconds)
    return Plan(_admit(ranked, n, budget), budget, theta) if theta > plain * (1 + margin) else None


def drafting_pays(
    survivals: Sequence[Sequence[float]],
    load: StepLoad,
    step_seconds: StepSeconds,
    draft_seconds: float,
) -> bool:
    """Whether drafting a round is worth its cost (:func:`drafting_plan`)."""
    return drafting_plan(survivals, load, step_seconds, draft_seconds) is not None
