"""The verify planner (``dspark.md`` §6.2-§6.3), against exhaustive search and exact sums.

* On small random cases (ties, zero survivals, staircase costs, prefill tokens in the step, a
  drafting cost from none to several steps' worth) the budget's objective equals the best of
  every allocation of draft lengths, enumerated, the drafting priced in; the
  lengths it admits reach it, form a top-B set, and for every fixed B the top-B allocation has
  the most expected tokens of all allocations of B drafts.
* For a given budget, whether a draft is admitted does not depend on the survivals after it
  (those are computed from the draft itself).
* The paper's Appendix A example, enumerated exactly: choosing the budget from the drafts being
  verified biases the output to (0.85, 0.15); the planner, whose budget comes from other
  information, keeps the target's (0.7, 0.3) whatever that information says.
"""

from __future__ import annotations

import itertools
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from deepinfer.engine.verify_cost import VerifyCost
from deepinfer.engine.verify_plan import (
    StepLoad,
    allocate,
    best_budget,
    drafting_pays,
    plan,
    survival,
)

SETTINGS = settings(max_examples=300, deadline=None, derandomize=True, database=None)

#: Confidences, often from a few values so that survivals tie within and across requests.
confidence = st.sampled_from([0.0, 0.5, 1.0]) | st.sampled_from([0.25, 0.5, 1.0]) | st.floats(0, 1)
confidences = st.lists(st.lists(confidence, max_size=4), min_size=1, max_size=3)


def _staircase(width: int, jump: float, slope: float) -> list[float]:
    """Seconds for 0..18 tokens: a jump every ``width`` tokens, a gentle slope between."""
    return [0.5 + jump * -(-b // width) + slope * b for b in range(19)]


#: Step seconds for 0..18 tokens, never decreasing: staircases (padding buckets), whose Θ has
#: several local maxima, and random increments.
increments = st.sampled_from([0.0, 0.0, 0.05, 1.0, 4.0]) | st.floats(0.0, 2.0)
steps = st.builds(
    _staircase, st.integers(1, 6), st.floats(0.0, 3.0), st.sampled_from([0.0, 0.01, 0.2])
) | st.lists(increments, min_size=18, max_size=18).map(
    lambda inc: [0.5, *itertools.accumulate(inc, initial=0.5)]
)
loads = st.builds(StepLoad, tokens=st.integers(1, 5), samples=st.integers(0, 5))
#: Seconds of drafting a round: none (the planner without a draft cost), small, large.
drafts = st.sampled_from([0.0, 0.0, 0.1, 3.0]) | st.floats(0.0, 5.0)


def _survivals(rows: list[list[float]]) -> list[list[float]]:
    """Running products, computed here from their definition."""
    return [[math.prod(row[: j + 1]) for j in range(len(row))] for row in rows]


def _theta(
    a: list[list[float]],
    lengths: tuple[int, ...],
    load: StepLoad,
    sec: list[float],
    draft: float = 0.0,
) -> float:
    tau = load.samples + sum(sum(a[r][:n]) for r, n in enumerate(lengths))
    return tau / (draft + sec[load.tokens + sum(lengths)])


@SETTINGS
@given(confidences, loads, steps, drafts)
def test_the_budget_is_the_best_of_every_allocation(
    rows: list[list[float]], load: StepLoad, seconds: list[float], draft: float
) -> None:
    a = _survivals(rows)
    assert survival(rows) == a
    step = seconds.__getitem__
    every = list(itertools.product(*(range(len(row) + 1) for row in a)))
    best = max(_theta(a, x, load, seconds, draft) for x in every)
    budget, theta = best_budget(a, load, step, draft)
    assert math.isclose(theta, best, rel_tol=1e-9)
    lengths = allocate(a, budget)
    assert sum(lengths) == budget
    assert math.isclose(_theta(a, tuple(lengths), load, seconds, draft), best, rel_tol=1e-9)
    plain = load.samples / seconds[load.tokens]
    if not math.isclose(best, plain, rel_tol=1e-9):  # drafting pays iff some allocation wins
        assert drafting_pays(a, load, step, draft) == (best > plain)
    admitted = [a[r][j] for r, n in enumerate(lengths) for j in range(n)]
    left = [a[r][j] for r, n in enumerate(lengths) for j in range(n, len(a[r]))]
    assert min(admitted, default=1.0) >= max(left, default=0.0)
    assert all(x > 0 for x in admitted)
    positive = sum(x > 0 for row in a for x in row)
    for b in range(positive + 1):  # for a fixed B, the top-B slots give the most tokens
        tau = max(sum(sum(a[r][:n]) for r, n in enumerate(x)) for x in every if sum(x) == b)
        top = allocate(a, b)
        assert sum(top) == b
        assert math.isclose(sum(sum(a[r][:n]) for r, n in enumerate(top)), tau, rel_tol=1e-9)
    # with the budget taken on the same survivals, the plan is that best allocation
    assert plan(a, a, load, step, draft).lengths == lengths


@SETTINGS
@given(confidences, st.integers(0, 12), st.data())
def test_admission_ignores_the_survivals_after_a_draft(
    rows: list[list[float]], budget: int, data: st.DataObject
) -> None:
    """Position j's successors are functions of draft j: redrawing them (the confidences after
    j) must not change whether draft j is verified under a given budget."""
    a = _survivals(rows)
    r = data.draw(st.integers(0, len(a) - 1))
    if not a[r]:
        return
    j = data.draw(st.integers(0, len(a[r]) - 1))
    factors = data.draw(st.lists(confidence, min_size=len(a[r]) - j - 1,
                                 max_size=len(a[r]) - j - 1))  # fmt: skip
    changed = [list(row) for row in a]
    for i, f in enumerate(factors, start=j + 1):
        changed[r][i] = changed[r][i - 1] * f
    assert (allocate(a, budget)[r] > j) == (allocate(changed, budget)[r] > j)


# Appendix A: one request, two drafts over tokens {A, B}; the target's distribution for the
# first token is P, the drafter draws the first draft from Q; c_1 = 0.8, and c_2 = 0.9 after A
# but 0 after B. SPS = {1: 1.0, 2: 0.5, 3: 0.45} steps per second.
P, Q = (0.7, 0.3), (0.5, 0.5)
COST = VerifyCost.from_table({1: 1.0, 2: 2.0, 3: 1 / 0.45})
LOAD = StepLoad(tokens=1, samples=1)


def _first_token(length_after: dict[int, int]) -> tuple[float, float]:
    """The exact distribution of the first emitted token when the drafts verified after a
    first draft x are ``length_after[x]`` (0: none, the token is drawn from P; otherwise x is
    kept with probability min(1, P/Q), else the residual max(P - Q, 0), normalised, is drawn)."""
    out = [0.0, 0.0]
    residual = [max(0.0, p - q) for p, q in zip(P, Q, strict=True)]
    for x in (0, 1):
        if length_after[x] == 0:
            for t in (0, 1):
                out[t] += Q[x] * P[t]
            continue
        keep = min(1.0, P[x] / Q[x])
        out[x] += Q[x] * keep
        for t in (0, 1):
            out[t] += Q[x] * (1 - keep) * residual[t] / sum(residual)
    return out[0], out[1]


def _conf(x: int) -> list[float]:
    return [0.8, 0.9 if x == 0 else 0.0]


def test_appendix_a_budget_from_the_drafts_is_biased_the_plan_is_not() -> None:
    budget, theta = best_budget(survival([_conf(0)]), LOAD, COST.step_seconds)
    assert budget == 2 and math.isclose(theta, (1 + 0.8 + 0.72) * 0.45)
    assert best_budget(survival([[0.8]]), LOAD, COST.step_seconds) == (0, 1.0)  # 1.8 * 0.5 < 1

    def look_ahead(x: int) -> int:
        a = survival([_conf(x)])
        return allocate(a, best_budget(a, LOAD, COST.step_seconds)[0])[0]

    biased = _first_token({x: look_ahead(x) for x in (0, 1)})
    assert math.isclose(biased[0], 0.85) and math.isclose(biased[1], 0.15)

    seen = set()
    cases = ([0.8, 0.72], [0.8, 0.0], [1.0, 1.0], [0.3, 0.1], [0.0, 0.0])
    for before, draft in itertools.product(cases, (0.0, 0.5)):  # a drafting cost changes B only
        lengths = {x: plan(survival([_conf(x)]), [before], LOAD, COST.step_seconds,
                           draft).lengths[0] for x in (0, 1)}  # fmt: skip
        seen.update(lengths.values())
        exact = _first_token(lengths)
        assert math.isclose(exact[0], 0.7) and math.isclose(exact[1], 0.3)
    assert {0, 2} <= seen  # budgets that verify nothing and both drafts were both exercised
