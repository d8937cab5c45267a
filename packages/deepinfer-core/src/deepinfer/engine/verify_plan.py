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

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

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
    drafting took ``draft_seconds``. The walk stops once no larger count can win: every later
    count adds at most the survivals left to a step that costs no less (steps with drafts
    never get cheaper with more tokens or more noisy draws), which at a large batch ends it
    after a few rows' worth of slots rather than all of them."""
    tau, noisy, rows = float(load.samples), load.noisy, load.noisy_rows
    best, theta = 0, tau / (draft_seconds + step_seconds(load.tokens, noisy))
    slots = ranked_slots(survivals)
    gains = [survivals[r][j] for r, j in slots]
    left = list(itertools.accumulate(reversed(gains), initial=0.0))[::-1]  # sum(gains[i:])
    for b, (r, _) in enumerate(slots, start=1):
        tau += gains[b - 1]
        noisy += r < len(rows) and rows[r]
        seconds = draft_seconds + step_seconds(load.tokens + b, noisy)
        value = tau / seconds
        if value > theta:
            best, theta = b, value
        if (tau + left[b]) / seconds <= theta:
            break
    return best, theta


def allocate(survivals: Sequence[Sequence[float]], budget: int) -> list[int]:
    """Per request, how many of its drafts the top-``budget`` slots admit (a prefix of its
    row: fewer than ``budget`` in all when fewer slots have positive survival)."""
    lengths = [0] * len(survivals)
    for r, _ in ranked_slots(survivals)[: max(0, budget)]:
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
    budget, theta = best_budget(survivals, load, step_seconds, draft_seconds)
    plain = load.samples / (draft_seconds + step_seconds(load.tokens, load.noisy))
    if theta <= plain * (1 + margin):
        budget, theta = 0, plain
    return Plan(allocate(survivals, budget), budget, theta)


def drafting_budget(
    survivals: Sequence[Sequence[float]],
    load: StepLoad,
    step_seconds: StepSeconds,
    draft_seconds: float,
    margin: float = 0.0,
) -> int | None:
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
    budget, theta = best_budget(survivals, load, step_seconds, draft_seconds)
    return budget if theta > plain * (1 + margin) else None


def drafting_pays(
    survivals: Sequence[Sequence[float]],
    load: StepLoad,
    step_seconds: StepSeconds,
    draft_seconds: float,
) -> bool:
    """Whether drafting a round is worth its cost (:func:`drafting_budget`)."""
    return drafting_budget(survivals, load, step_seconds, draft_seconds) is not None
