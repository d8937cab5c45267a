"""The verify planner (``dspark.md`` §6.2-§6.3), against exhaustive search and exact sums.

* On small random cases (ties, zero survivals, staircase costs, prefill tokens in the step, a
  drafting cost from none to several steps' worth) the budget's objective equals the best of
  every allocation of draft lengths, enumerated, the drafting priced in; the
  lengths it admits reach it, form a top-B set, and for every fixed B the top-B allocation has
  the most expected tokens of all allocations of B drafts.
* For a given budget, whether a draft is admitted does not depend on the survivals after it
  (those are computed from the draft itself).
* A step verifies drafts only when they beat the plain step: hand-computed steps where one,
  all or none of a request's drafts pay, and where drafting a round pays or does not.
* The paper's Appendix A example, enumerated exactly. It is a statement about rejection
  sampling (drafts drawn from the drafter's q, kept with probability min(1, p/q)): choosing
  the budget from the drafts being verified biases the output to (0.85, 0.15), a budget from
  other information keeps the target's (0.7, 0.3). Under the engine's exact matching (a draft
  kept iff it equals the sampler's draw at its position, :class:`PositionTargets`) the very
  same look-ahead plan keeps (0.7, 0.3), whether the drafts are drawn from q or fixed: which
  is why the planner may take its budget from the current survivals.
"""

from __future__ import annotations

import itertools
import math
from functools import partial

from hypothesis import given, settings
from hypothesis import strategies as st

from deepinfer.engine.spec_sampling import PositionTargets
from deepinfer.engine.verify_cost import StepCost, VerifyCost
from deepinfer.engine.verify_plan import (
    StepLoad,
    StepSeconds,
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

    def step(tokens: int, _noisy: int) -> float:
        return seconds[tokens]

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
    # the plan is that best allocation
    assert plan(a, load, step, draft).lengths == lengths


def _every_budget(
    a: list[list[float]], load: StepLoad, step: StepSeconds, draft: float
) -> list[float]:
    """Θ of every budget b (index b), scored one by one: the top-b slots by survival (ties
    by request, then position), τ and the noisy draws summed from them."""
    ranked = sorted((-x, r, j) for r, row in enumerate(a) for j, x in enumerate(row) if x > 0)
    flags = [r < len(load.noisy_rows) and load.noisy_rows[r] for r in range(len(a))]
    values = []
    for b in range(len(ranked) + 1):
        top = ranked[:b]
        tau = load.samples + math.fsum(-x for x, _, _ in top)
        noisy = load.noisy + sum(flags[r] for _, r, _ in top)
        values.append(tau / (draft + step(load.tokens + b, noisy)))
    return values


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(
    st.integers(1, 96),
    st.lists(confidence, min_size=1, max_size=6),
    st.lists(st.lists(confidence, min_size=0, max_size=6), max_size=8),
    st.integers(1, 40),
    st.floats(0.0, 0.5),
    st.sampled_from([0.0, 1e-4, 0.01]),
    st.sampled_from([0.0, 0.02, 0.5]),
    st.data(),
)
def test_large_batches_find_the_budget_of_scoring_every_count(  # noqa: PLR0917
    copies: int,
    shared: list[float],
    others: list[list[float]],
    width: int,
    jump: float,
    slope: float,
    draft: float,
    data: st.DataObject,
) -> None:
    """Batches of up to a hundred requests (many sharing one row of survivals, as a regime's
    requests do when a round is priced before its drafts exist), some drawn with noise, on
    staircase costs: the budget and Θ are those of scoring every budget, and only the
    budget's top slots are admitted."""
    a = _survivals([*[shared] * copies, *others])
    noisy_rows = tuple(data.draw(st.lists(st.booleans(), max_size=len(a) + 2)))
    load = StepLoad(len(a), len(a), sum(noisy_rows[: len(a)]), noisy_rows)

    def step(tokens: int, noisy: int) -> float:
        return 1.0 + jump * -(-tokens // width) + slope * tokens + 0.003 * noisy

    budget, theta = best_budget(a, load, step, draft)
    every = _every_budget(a, load, step, draft)
    assert math.isclose(theta, max(every), rel_tol=1e-12)
    assert math.isclose(every[budget], max(every), rel_tol=1e-12)
    lengths = allocate(a, budget)
    assert sum(lengths) == budget
    admitted = [a[r][j] for r, n in enumerate(lengths) for j in range(n)]
    left = [a[r][j] for r, n in enumerate(lengths) for j in range(n, len(a[r]))]
    assert min(admitted, default=1.0) >= max(left, default=0.0)


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


def test_a_step_verifies_only_the_drafts_that_beat_the_plain_step() -> None:
    """One row, survivals (0.9, 0.81, 0.729); a plain step of 1 second. Each table below is
    worked by hand: Θ_b = (1 + a_1 + ... + a_b) / V(1 + b) against Θ_0 = 1 / 1."""
    a = [[0.9, 0.81, 0.729]]
    load = StepLoad(tokens=1, samples=1)
    plain = VerifyCost.from_table({1: 1.0})

    def lengths(verify: dict[int, float]) -> list[int]:
        cost = StepCost.by_tokens(VerifyCost.from_table(verify), plain)
        return plan(a, load, partial(cost.seconds, 1)).lengths

    # 1.9/1.5 = 1.27, 2.71/1.6 = 1.69, 3.439/1.7 = 2.02: every draft
    assert lengths({2: 1.5, 3: 1.6, 4: 1.7}) == [3]
    # 1.9/1.2 = 1.58, 2.71/3 = 0.90, 3.439/4 = 0.86: the first only
    assert lengths({2: 1.2, 3: 3.0, 4: 4.0}) == [1]
    # 1.9/2 = 0.95, 2.71/3 = 0.90, 3.439/4 = 0.86: none beats the plain step's 1
    assert lengths({2: 2.0, 3: 3.0, 4: 4.0}) == [0]
    # the same verification priced alone (its plain step at 1 token: 2 seconds) would pay
    alone = StepCost.by_tokens(VerifyCost.from_table({1: 2.0, 2: 2.0, 3: 3.0, 4: 4.0}))
    assert plan(a, load, partial(alone.seconds, 1)).lengths == [1]
    # drafting first (0.5 s): (1 + 2.439) / (0.5 + 1.7) = 1.56 beats 1, (1 + 2.439) / 3.6 not
    cheap = StepCost.by_tokens(VerifyCost.from_table({2: 1.5, 3: 1.6, 4: 1.7}), plain)
    assert drafting_pays(a, load, partial(cheap.seconds, 1), 0.5)
    assert not drafting_pays(a, load, partial(cheap.seconds, 1), 1.9)


def test_draws_with_noise_are_priced_per_request() -> None:
    """Two rows, one greedy (survival 0.5), one sampled (0.9, ranked first), whose own draw is
    made with noise. The pass costs {2: 1.0, 3: 1.2, 4: 1.4} by tokens, drawing one position
    with noise 0.1 more, two 0.6 more. Priced as the sampler runs them: Θ_0 = 2 / 1.1 = 1.82,
    Θ_1 = 2.9 / 1.8 = 1.61, Θ_2 = 3.4 / 2.0 = 1.7: no draft. Were the sampled request's drafts
    drawn greedily: 2.9 / 1.3 = 2.23 and 3.4 / 1.5 = 2.27, both; all greedy: 2, 2.42, 2.43."""
    table = VerifyCost.from_table({2: 1.0, 3: 1.2, 4: 1.4})
    cost = StepCost(table, (table,), draws=VerifyCost.from_table({1: 0.1, 2: 0.6}))
    a = [[0.5], [0.9]]
    seconds = partial(cost.seconds, 2)
    assert plan(a, StepLoad(2, 2, 1, (False, True)), seconds).lengths == [0, 0]
    assert plan(a, StepLoad(2, 2, 1, (False, False)), seconds).lengths == [1, 1]
    assert plan(a, StepLoad(2, 2), seconds).lengths == [1, 1]
    assert math.isclose(best_budget(a, StepLoad(2, 2), seconds)[1], 3.4 / 1.4)
    assert math.isclose(best_budget(a, StepLoad(2, 2, 1, (False, True)), seconds)[1], 2 / 1.1)


# Appendix A: one request, two drafts over tokens {A, B}; the target's distribution for the
# first token is P, the drafter draws the first draft from Q; c_1 = 0.8, and c_2 = 0.9 after A
# but 0 after B. SPS = {1: 1.0, 2: 0.5, 3: 0.45} steps per second.
P, Q = (0.7, 0.3), (0.5, 0.5)
COST = VerifyCost.from_table({1: 1.0, 2: 2.0, 3: 1 / 0.45})


def _seconds(tokens: int, _noisy: int) -> float:
    return COST.step_seconds(tokens)


LOAD = StepLoad(tokens=1, samples=1)


def _rejection_first_token(length_after: dict[int, int]) -> tuple[float, float]:
    """Rejection sampling's exact distribution of the first emitted token when the drafts
    verified after a first draft x (drawn from Q) are ``length_after[x]`` (0: none, the token
    is drawn from P; otherwise x is kept with probability min(1, P/Q), else the residual
    max(P - Q, 0), normalised, is drawn)."""
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


def _matching_first_token(length_after: dict[int, int], drafts: tuple[float, float]) -> list[float]:
    """Exact matching's distribution of the first emitted token, enumerated: the first draft
    x has probability ``drafts[x]``, the sampler draws t from P at that position, and the row
    (x verified iff ``length_after[x]`` > 0) emits what the engine's :class:`PositionTargets`
    says: the draws up to the first draft that differs, so its first token."""
    out = [0.0, 0.0]
    for x, t, after in itertools.product((0, 1), (0, 1), (0, 1)):
        verified = [x, 0][: length_after[x]]  # the second draft: any token
        row = PositionTargets(verified, [t, after, 0][: len(verified) + 1], [0.0] * 3, None)  # type: ignore[arg-type]
        first = row.tokens[: row.kept() + 1][0]
        out[first] += drafts[x] * P[t] * 0.5  # ``after``: the later draw, either token
    return out


def _conf(x: int) -> list[float]:
    return [0.8, 0.9 if x == 0 else 0.0]


def test_appendix_a_a_look_ahead_budget_biases_rejection_sampling_not_exact_matching() -> None:
    budget, theta = best_budget(survival([_conf(0)]), LOAD, _seconds)
    assert budget == 2 and math.isclose(theta, (1 + 0.8 + 0.72) * 0.45)
    assert best_budget(survival([[0.8]]), LOAD, _seconds) == (0, 1.0)  # 1.8 * 0.5 < 1

    # the planner's plan: its budget from the survivals of the drafts it verifies
    look_ahead = {x: plan(survival([_conf(x)]), LOAD, _seconds).lengths[0] for x in (0, 1)}
    assert look_ahead == {0: 2, 1: 0}
    biased = _rejection_first_token(look_ahead)
    assert math.isclose(biased[0], 0.85) and math.isclose(biased[1], 0.15)

    # rejection sampling stays exact when the budget comes from other information
    seen = set()
    cases = ([0.8, 0.72], [0.8, 0.0], [1.0, 1.0], [0.3, 0.1], [0.0, 0.0])
    for before, draft in itertools.product(cases, (0.0, 0.5)):  # a drafting cost changes B only
        budget = best_budget([before], LOAD, _seconds, draft)[0]
        lengths = {x: allocate(survival([_conf(x)]), budget)[0] for x in (0, 1)}
        seen.update(lengths.values())
        exact = _rejection_first_token(lengths)
        assert math.isclose(exact[0], 0.7) and math.isclose(exact[1], 0.3)
    assert {0, 2} <= seen  # budgets that verify nothing and both drafts were both exercised

    # exact matching keeps P under the look-ahead plan, for drafts drawn from Q or fixed
    for drafts in (Q, (1.0, 0.0), (0.0, 1.0)):
        for lengths in (look_ahead, {0: 0, 1: 2}, {0: 1, 1: 1}):
            got = _matching_first_token(lengths, drafts)
            assert math.isclose(got[0], 0.7) and math.isclose(got[1], 0.3)
