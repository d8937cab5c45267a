"""How long the adaptive schedule's findings stand (:mod:`deepinfer.engine.decision_spells`),
through :meth:`AdaptiveVerifier.drafting_pays`: which calls weigh the batch (the plan search
runs) and which reuse a finding, counted by hand against the spells' rules."""

from __future__ import annotations

import pytest

from deepinfer.engine import verify_schedule
from deepinfer.engine.decision_spells import QUIET_STEPS, STEADY_STEPS, DecisionSpells, Finding
from deepinfer.engine.request import Request
from deepinfer.engine.verify_cost import StepCost, VerifyCost
from deepinfer.engine.verify_schedule import AdaptiveVerifier
from deepinfer.outputs import RequestMetrics
from deepinfer.sampling_params import SamplingParams

LOW, HIGH = [0.2, 0.04, 0.008], [1.0, 1.0, 1.0]


def _request(name: str) -> Request:
    params = SamplingParams(temperature=0.0, max_tokens=8)
    return Request(name, name, 0, [5, 6, 7], params, 0, RequestMetrics(0.0), 11)


class _Weighed:
    """A verifier whose plain step costs 1 s, a verification step 1.5 s and drafting 0.2 s:
    greedy survivals LOW never pay, HIGH always do; ``steps`` lists the calls that weighed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.steps: list[int] = []
        self.now = 0
        plan = verify_schedule.drafting_plan

        def recorded(*args: object, **kwargs: object) -> object:
            self.steps.append(self.now)
            return plan(*args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(verify_schedule, "drafting_plan", recorded)
        cost = StepCost.by_tokens(VerifyCost.from_table({1: 1.5}), VerifyCost.from_table({1: 1.0}))
        self.verifier = AdaptiveVerifier(cost, VerifyCost.from_table({1: 0.2}))

    def pays(self, reqs: list[Request], step: int, survivals: list[float]) -> bool:
        self.now = step
        self.verifier.learnt[False].mean_survival = list(survivals)  # anew: aging moves it
        return self.verifier.drafting_pays(reqs, 3)


def test_a_batch_found_not_to_pay_is_weighed_again_after_quiet_spells(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Never paying, the batch is weighed at steps 0, 2, 5, 10, 19 and 28: quiet spells of 1,
    2, 4 and then QUIET_STEPS = 8 steps, every step counted as a round not drafted. A batch of
    other rows is weighed at once, its spells starting again from one step."""
    assert QUIET_STEPS == 8
    w = _Weighed(monkeypatch)
    a, b, c = _request("a"), _request("b"), _request("c")
    assert not any(w.pays([a, b], step, LOW) for step in range(29))
    assert w.steps == [0, 2, 5, 10, 19, 28] and w.verifier.skipped == 29
    assert not w.pays([a, b, c], 29, LOW) and w.steps[-1] == 29  # other rows: at once
    assert not w.pays([a, b, c], 30, HIGH) and w.steps[-1] == 29  # its one quiet step
    assert w.pays([a, b, c], 31, HIGH) and w.steps[-1] == 31


def test_a_batch_found_to_pay_drafts_on_that_finding_for_steady_steps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found to pay at step 0, the batch drafts on that finding (its lengths: every draft)
    through step STEADY_STEPS = 4 whatever was learnt since, and is weighed at step 5; found
    not to pay then, it starts quiet spells from one step."""
    assert STEADY_STEPS == 4
    w = _Weighed(monkeypatch)
    a, b = _request("a"), _request("b")
    assert w.pays([a, b], 0, HIGH)
    assert all(w.pays([a, b], step, LOW) for step in range(1, 5)) and w.steps == [0]
    assert w.verifier._decided == {a: 3.0, b: 3.0}  # what the finding counted on: HIGH's
    assert not w.pays([a, b], 5, LOW) and w.steps == [0, 5]
    assert not w.pays([a, b], 6, HIGH) and w.steps == [0, 5]
    assert w.pays([a, b], 7, HIGH) and w.steps == [0, 5, 7]


def test_spells_by_hand() -> None:
    """The spell rules on their own: a paying finding stands STEADY_STEPS steps; quiet spells
    double per finding in a row for one batch; another batch's finding restarts them."""
    spells = DecisionSpells()
    one, two = (2, 0, 3), (3, 0, 3)
    assert spells.standing(one) is None
    spells.found(Finding(one, {False: [0.0]}, [1, 1]))
    assert [spells.standing(one) is not None for _ in range(5)] == [True] * 4 + [False]
    lengths = []
    for _ in range(5):
        spells.found(Finding(one))
        n = 0
        while spells.standing(one) is not None:
            n += 1
        lengths.append(n)
    assert lengths == [1, 2, 4, 8, 8]
    spells.found(Finding(two))
    assert spells.standing(one) is None  # another batch's finding
    assert spells.standing(two) is not None and spells.standing(two) is None
