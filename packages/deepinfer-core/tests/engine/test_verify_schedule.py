"""The adaptive verifier's calibrations, against sums worked by hand.

* The confidences' calibration: each planned row's outcome taught to its regime's per-position
  counts (test_online_calibration.py checks the reading): positions up to the first draft not
  drawn as drafted, the drafts the plan cut judged by the tokens drawn after.
* The mean survival per position that drafting is decided on: the prior 0.5, 0.25, 0.125
  before any row, then each row drafted moves it 1/32 of the way to the row's survivals.
* The decision to draft: what it counted on (the mean survivals of the drafts it expected to
  verify) is set against what the round then had accepted, once the round is drafted; a
  decision that is not followed by drafting (a step that goes on without) is no prediction to
  check.
* Each decision is priced on the step's rows: a plain step's rate, beaten by 4%.
* A round not drafted moves what was learnt 1/128 of the way back to the prior.
* Greedy and sampled requests learn apart: one regime's rounds neither hold the other's back
  nor push it on.
* The steps' own host work, learnt from the decode-only steps' wall times, is added to the
  prices: it can make a round worth drafting that the profiled passes alone would not.
* Until a few rounds have been timed, a round predicted to lose at most half a plain step's
  rate is drafted anyway: only rounds show what a round's host work costs; and so, too, until
  the calibration has tried enough first drafts.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

from deepinfer.engine import decision_spells, step_overhead, verify_schedule
from deepinfer.engine.request import Request, RequestStatus
from deepinfer.engine.scheduler import SchedulerOutput
from deepinfer.engine.step_overhead import StepOverhead
from deepinfer.engine.verify_cost import StepCost, VerifyCost
from deepinfer.engine.verify_schedule import PROBE_ROUNDS, AdaptiveVerifier
from deepinfer.outputs import RequestMetrics
from deepinfer.sampling_params import SamplingParams


@pytest.fixture(autouse=True)
def _weigh_every_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests check each weighing: no finding stands for later steps
    (test_decision_spells.py checks the spells)."""
    monkeypatch.setattr(decision_spells, "QUIET_STEPS", 0)
    monkeypatch.setattr(decision_spells, "STEADY_STEPS", 0)
    monkeypatch.setattr(verify_schedule, "PROBE_TRIALS", 0)  # probed only where a test says


def _request(name: str, temperature: float = 0.0) -> Request:
    params = SamplingParams(temperature=temperature, max_tokens=8)
    return Request(name, name, 0, [5, 6, 7], params, 0, RequestMetrics(0.0), 11)


class _Drafter:
    """Three drafts a request, every one with confidence 0.5."""

    k = 3

    def draft_with_confidence(
        self, states: object, streams: Tensor, next_ids: Tensor, lengths: list[int]
    ) -> tuple[Tensor, Tensor]:
        n = len(lengths)
        return torch.full((n, 3), 9), torch.full((n, 3), 0.5)


def _verifying(reqs: list[Request]) -> SchedulerOutput:
    """A step of ``reqs`` as decoding rows: each has sampled a token past its prompt."""
    for req in reqs:
        req.output_token_ids, req.num_computed_tokens = [8], len(req.prompt_token_ids)
    return SchedulerOutput(scheduled=dict.fromkeys(reqs, 1))


def _draft(verifier: AdaptiveVerifier, reqs: list[Request]) -> None:
    """Draft for ``reqs`` and take the round's confidences in, as the engine does."""
    _, confidence = verifier.draft(
        _Drafter(), reqs, [], torch.zeros(0), torch.zeros(0), [1] * len(reqs)
    )
    verifier.took(dict(zip(reqs, confidence.tolist(), strict=True)))


def test_the_decision_to_draft_is_checked_against_what_its_rounds_kept() -> None:
    free = StepCost.by_tokens(VerifyCost.from_table({1: 1.0}))  # verifying costs nothing
    verifier = AdaptiveVerifier(free)
    greedy = verifier.learnt[False]  # the tests' requests are greedy
    a, b = _request("a"), _request("b")
    assert greedy.draft_calibration == 1.0
    assert verifier.drafting_pays([a, b], 3)  # first rounds, on the prior: 0.875 each
    _draft(verifier, [a, b])
    verifier.verified(a, [9, 9, 7], 4)  # two drafts kept, then the token after them
    verifier.verified(b, [7], 4)
    assert (greedy.foreseen, greedy.realized) == (1.75, 2)

    assert verifier.drafting_pays([a, b], 3)  # every slot, at no cost
    verifier.verified(a, [9, 7], 4)  # a row of a round drafted before this decision
    assert greedy.foreseen == 1.75
    assert verifier.drafting_pays([a], 3)  # decided again, for a alone, and then drafted
    _draft(verifier, [a])
    verifier.verified(a, [7], 4)
    verifier.verified(b, [9, 9, 9, 7], 4)  # b's round was never drafted on the decision
    assert math.isclose(greedy.foreseen, 2.625) and greedy.realized == 2
    assert math.isclose(greedy.draft_calibration, (2 + 8) / (2.625 + 8))


def test_a_measured_prior_weighs_in_the_draft_calibration_as_its_rows() -> None:
    """With a measured acceptance (32 rows of 1.66 drafts kept a round: 53.1 drafts), three
    rounds foreseen to keep 5 drafts that kept 1 move the draft calibration to
    (1 + 53.1) / (5 + 53.1) = 0.93, where the guess's prior of 8 drafts would give 0.69; at
    costs under which a round that keeps 1.66 drafts pays by a third (a verification step of
    1.4 plain steps, drafting 0.6), the next round is still drafted."""
    cost = StepCost.by_tokens(VerifyCost.from_table({1: 1.0, 6: 1.4}))
    verifier = AdaptiveVerifier(cost, VerifyCost.from_table({1: 0.6}))
    verifier.expect({False: [0.628, 0.427, 0.273, 0.186, 0.144]})
    greedy = verifier.learnt[False]
    greedy.foreseen, greedy.realized = 5.0, 1.0
    prior = 32 * 1.658
    assert math.isclose(greedy.draft_calibration, (1 + prior) / (5 + prior))
    assert verifier.drafting_pays([_request("a")], 5)
    guessed = verifier.learnt[True]  # no measured prior for sampled requests here
    guessed.foreseen, guessed.realized = 5.0, 1.0
    assert math.isclose(guessed.draft_calibration, (1 + 8) / (5 + 8))


def test_a_round_not_drafted_ages_what_was_learnt() -> None:
    """A plain step costs nothing next to any verification step: no round is drafted. Each
    decision moves the mean survivals and the counts 1/128 of the way to the prior."""
    cost = StepCost.by_tokens(VerifyCost.from_table({1: 100.0}), VerifyCost.from_table({1: 1.0}))
    verifier = AdaptiveVerifier(cost)
    greedy = verifier.learnt[False]  # the tests' requests are greedy
    greedy.learn([0.9, 0.1, 0.0])  # the prior, as 4 rows, averaged with this row
    learnt = [0.5 + 0.4 / 5, 0.25 - 0.15 / 5, 0.125 - 0.125 / 5]
    assert all(map(math.isclose, greedy.mean_survival, learnt))
    greedy.foreseen, greedy.realized = 8, 0
    assert not verifier.drafting_pays([_request("a")], 3)
    aged = [
        0.5 + 0.4 / 5 * 127 / 128,
        0.25 - 0.15 / 5 * 127 / 128,
        0.125 - 0.125 / 5 * 127 / 128,
    ]
    assert all(map(math.isclose, greedy.mean_survival, aged))
    assert math.isclose(greedy.rows, 4 + 127 / 128)  # back towards the prior's 4 rows
    assert (greedy.foreseen, greedy.realized) == (7.9375, 0.0)
    assert verifier.skipped == 1


def test_the_mean_averages_the_prior_with_the_rows_then_moves_by_a_32nd() -> None:
    """The guessed prior counts as 4 rows: after n rows of survival 1 the mean of position 1
    is (4 * 0.5 + n) / (4 + n) until it holds 32 rows, then each row moves it 1/32 of the way.
    A measured prior (``expect``) counts as 32 rows from the start."""
    verifier = AdaptiveVerifier(StepCost.by_tokens(VerifyCost.from_table({1: 1.0}), None))
    greedy, noisy = verifier.learnt[False], verifier.learnt[True]
    for n in range(1, 29):
        greedy.learn([1.0])
        assert math.isclose(greedy.mean_survival[0], (2 + n) / (4 + n))
    before = greedy.mean_survival[0]
    greedy.learn([1.0])
    assert math.isclose(greedy.mean_survival[0], before + (1 - before) / 32)
    verifier.expect({True: [0.6, 0.3]})
    assert noisy.survivals(3) == [0.6, 0.3, 0.125]  # the guess past the measured positions
    noisy.learn([1.0, 1.0])
    assert math.isclose(noisy.mean_survival[0], 0.6 + 0.4 / 32)  # a full mean already


def test_greedy_and_sampled_requests_learn_apart() -> None:
    """The costs of the next test. Sampled rounds that kept little (survivals 0.2, 0.04,
    0.008) stop sampled requests from drafting, while greedy ones still draft on the prior;
    turning the sampled round down ages only what was learnt of sampled requests, and a
    sampled row's verification counts in the sampled calibration only."""
    cost = StepCost.by_tokens(VerifyCost.from_table({1: 1.5}), VerifyCost.from_table({1: 1.0}))
    verifier = AdaptiveVerifier(cost, VerifyCost.from_table({1: 0.2}))
    greedy, noisy = verifier.learnt[False], verifier.learnt[True]
    noisy.mean_survival = [0.2, 0.04, 0.008]
    hot = [_request("s1", temperature=1.0), _request("s2", temperature=1.0)]
    assert not verifier.drafting_pays(hot, 3)
    assert greedy.mean_survival == []  # untouched: still the prior
    assert math.isclose(noisy.mean_survival[0], 0.2 + (0.5 - 0.2) / 128)  # aged
    assert verifier.drafting_pays([_request("g1"), _request("g2")], 3)
    _draft(verifier, hot)
    verifier.trim(_verifying(hot), {req: [9, 9, 9] for req in hot})
    verifier.verified(hot[0], [9, 9, 7], 4)
    assert noisy.calibration.trials.sum() > 0 and greedy.calibration.trials.size == 0


def test_drafting_pays_against_the_plain_step_of_its_rows() -> None:
    """Two rows; a plain step 1 s, a step with verification rows 1.5 s, drafting 0.2 s. With
    mean survivals (0.5, 0.25, 0.125), scaled by 1: the best round verifies every draft,
    (2 + 2 * 0.875) / 1.7 = 2.21 a second against 2 * 1.04; with (0.2, 0.04, 0.008):
    (2 + 2 * 0.248) / 1.7 = 1.47, and no fewer drafts do better, so it is not drafted."""
    cost = StepCost.by_tokens(VerifyCost.from_table({1: 1.5}), VerifyCost.from_table({1: 1.0}))
    verifier = AdaptiveVerifier(cost, VerifyCost.from_table({1: 0.2}))
    greedy = verifier.learnt[False]  # the tests' requests are greedy
    a, b = _request("a"), _request("b")
    assert verifier.drafting_pays([a, b], 3) and verifier.skipped == 0  # the prior
    greedy.mean_survival = [0.2, 0.04, 0.008]
    assert not verifier.drafting_pays([a, b], 3) and verifier.skipped == 1


def test_the_steps_host_work_is_learnt_from_decode_only_steps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Step starts at 0, 3, 3, 10, 12, 16 and 60 s on a made-up clock. A plain step priced
    1 s that took 3 s: 2 s beyond. The next one's end is a step with a prefill chunk (an idle
    gap may sit before it): not measured. A round priced 1.7 s that took 2 s: 0.3 s beyond. A
    plain step priced 1 s that took 4 s (3 s beyond) moves the plain mean a fifth of the way:
    2 + 0.2 = 2.2. A round priced 1.7 s that took 44 s (more than 4 times its price: a graph
    captured on first use) is not learnt."""
    clock = iter([0.0, 3.0, 3.0, 10.0, 12.0, 16.0, 60.0])
    monkeypatch.setattr(step_overhead.time, "perf_counter", lambda: next(clock))
    overhead = StepOverhead()
    assert overhead.extra(False) == overhead.extra(True) == 0.0
    overhead.launched(overhead.begin(True), False, 1.0)
    start = overhead.begin(True)
    assert overhead.plain == 2.0 and overhead.round is None
    assert overhead.extra(True) == 2.0  # a round's, until one is measured
    overhead.launched(start, False, 1.0)
    overhead.begin(False)
    assert overhead.plain == 2.0
    overhead.launched(overhead.begin(True), True, 1.7)
    start = overhead.begin(True)
    assert overhead.round is not None and math.isclose(overhead.round, 0.3)
    overhead.launched(start, False, 1.0)
    start = overhead.begin(True)
    assert overhead.plain is not None and math.isclose(overhead.plain, 2.2)
    overhead.launched(start, True, 1.7)
    overhead.begin(True)
    assert overhead.round is not None and math.isclose(overhead.round, 0.3)


def test_the_steps_host_work_is_priced() -> None:
    """The rows and costs of the test above, survivals (0.2, 0.04, 0.008): not drafted on
    the profile alone. With 4 s of host work a step: a plain step 2 / 5 = 0.4 a second (0.416
    with the 4% margin), a round (2 + 0.496) / (0.2 + 1.5 + 4) = 0.438: drafted. If a round's
    own host work is 6 s: 2.496 / 7.7 = 0.324, not drafted."""
    cost = StepCost.by_tokens(VerifyCost.from_table({1: 1.5}), VerifyCost.from_table({1: 1.0}))
    overhead = StepOverhead(rounds=PROBE_ROUNDS)  # the probe rounds are over (next test)
    verifier = AdaptiveVerifier(cost, VerifyCost.from_table({1: 0.2}), overhead)
    greedy = verifier.learnt[False]  # the tests' requests are greedy
    greedy.mean_survival = [0.2, 0.04, 0.008]
    a, b = _request("a"), _request("b")
    assert not verifier.drafting_pays([a, b], 3)
    greedy.mean_survival = [0.2, 0.04, 0.008]  # as before the decision's aging
    overhead.plain = 4.0
    assert verifier.drafting_pays([a, b], 3)
    overhead.round = 6.0
    assert not verifier.drafting_pays([a, b], 3)


def test_rounds_are_probed_until_their_host_work_is_measured() -> None:
    """The rows and costs above, survivals (0.2, 0.04, 0.008): a round 2.496 / 1.7 = 1.47 a
    second against a plain step's 2. Before any round is timed, a round predicted to lose up to
    half of the plain rate is drafted (1.47 >= 2 * 0.5); with 2 s of drafting, 2.496 / 3.5 =
    0.71 is not. Once PROBE_ROUNDS rounds are timed, the 4% gain is asked again: not drafted."""
    cost = StepCost.by_tokens(VerifyCost.from_table({1: 1.5}), VerifyCost.from_table({1: 1.0}))
    overhead = StepOverhead()
    a, b = _request("a"), _request("b")
    for drafting, probed in ((0.2, True), (2.0, False)):
        verifier = AdaptiveVerifier(cost, VerifyCost.from_table({1: drafting}), overhead)
        greedy = verifier.learnt[False]  # the tests' requests are greedy
        greedy.mean_survival = [0.2, 0.04, 0.008]
        assert verifier.drafting_pays([a, b], 3) == probed
    overhead.rounds = PROBE_ROUNDS
    verifier = AdaptiveVerifier(cost, VerifyCost.from_table({1: 0.2}), overhead)
    greedy = verifier.learnt[False]  # the tests' requests are greedy
    greedy.mean_survival = [0.2, 0.04, 0.008]
    assert not verifier.drafting_pays([a, b], 3)


def test_rounds_are_probed_until_an_understated_drafter_has_tried_enough_first_drafts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Host work measured, survivals (0.2, 0.04, 0.008): a round is predicted to lose (see
    above). While the greedy calibration has tried fewer than PROBE_TRIALS first drafts and
    found them kept more often than their confidences said, a loss up to half the plain rate
    is drafted anyway; once it has tried enough, the 4% gain is asked. A drafter found to
    overstate its first drafts is not probed on."""
    monkeypatch.setattr(verify_schedule, "PROBE_TRIALS", 1.5)  # two trials, decayed: 1.999
    cost = StepCost.by_tokens(VerifyCost.from_table({1: 1.5}), VerifyCost.from_table({1: 1.0}))
    overhead = StepOverhead()
    overhead.rounds = PROBE_ROUNDS
    a, b = _request("a"), _request("b")
    for hit, probed in ((1, True), (0, False)):
        verifier = AdaptiveVerifier(cost, VerifyCost.from_table({1: 0.2}), overhead)
        greedy = verifier.learnt[False]
        greedy.mean_survival = [0.2, 0.04, 0.008]
        assert not verifier.drafting_pays([a, b], 3)  # no trial yet: nothing understated
        greedy.calibration.observe([0.2], trials=1, hits=hit)
        greedy.mean_survival = [0.2, 0.04, 0.008]
        assert verifier.drafting_pays([a, b], 3) == probed
    greedy.calibration.observe([0.2], trials=1, hits=1)
    greedy.mean_survival = [0.2, 0.04, 0.008]
    assert greedy.calibration.scale()[0] > 1
    assert not verifier.drafting_pays([a, b], 3)


def test_rows_the_plan_cut_are_judged_by_the_tokens_drawn_after() -> None:
    """Verification costs 100 plain steps: the plan cuts every row to nothing. Each row's
    drafts (9, 9, 9) are still judged, each by the token the request draws at its position in
    the steps after: here 9 (the first draft kept) then 4 (the second not), a trial at
    positions 0 and 1 and a hit at 0. After 24 rows (decayed) a confidence of 0.5 reads its
    bin's hits over trials, with 8 pseudo-trials at 0.5 times its position's scale (hits over
    expected hits, 4 pseudo-hits each); position 2, never tried, stays raw. Each draft is
    learnt as it is judged. A row whose first draft is not drawn is a miss at position 0; one
    whose drafts are all drawn, over three steps, three hits; a request that finishes drops
    its open trial."""
    cost = StepCost.by_tokens(VerifyCost.from_table({1: 100.0}), VerifyCost.from_table({1: 1.0}))
    verifier = AdaptiveVerifier(cost)
    calibration = verifier.learnt[False].calibration

    def planned(name: str) -> Request:
        req = _request(name)
        _draft(verifier, [req])
        drafts = {req: [9, 9, 9]}
        verifier.trim(_verifying([req]), drafts)  # the first draft at position 4
        assert drafts[req] == []
        return req

    for i in range(24):
        req = planned(f"r{i}")
        verifier.verified(req, [9], 4)
        assert calibration.hits[0].sum() > calibration.hits[1:].sum()  # learnt at once
        verifier.verified(req, [4], 5)  # the next step draws another token
    n = sum(0.999**j for j in range(24))  # the counts decay by 0.999 a row observed
    assert math.isclose(calibration.trials[0].sum(), n)
    assert math.isclose(calibration.trials[1].sum(), n)
    assert math.isclose(calibration.hits.sum(), n)
    got = calibration.calibrate([0.5, 0.5, 0.5])
    # bins' priors: 0.5 times the position's scale, (hits + 4) / (0.5 * trials + 4)
    prior = [min(1.0, 0.5 * (n + 4) / (0.5 * n + 4)), 0.5 * 4 / (0.5 * n + 4)]
    assert math.isclose(got[0], (n + 8 * prior[0]) / (n + 8))
    assert math.isclose(got[1], 8 * prior[1] / (n + 8))
    assert got[2] == 0.5

    miss = planned("miss")
    verifier.verified(miss, [4], 4)
    assert math.isclose(calibration.trials[0].sum(), n * 0.999 + 1)
    assert math.isclose(calibration.hits.sum(), n * 0.999)

    full = planned("full")
    for at in (4, 5, 6):
        verifier.verified(full, [9], at)
    assert calibration.trials.shape[0] == 3 and math.isclose(calibration.trials[2].sum(), 1)
    assert math.isclose(calibration.hits[2].sum(), 1)

    ends = planned("ends")
    before = calibration.hits[0].sum()
    verifier.verified(ends, [9], 4)
    assert math.isclose(calibration.hits[0].sum(), before * 0.999 + 1)
    ends.status = RequestStatus.FINISHED
    verifier.trim(SchedulerOutput(scheduled={}), {})
    assert not verifier.trials.open
