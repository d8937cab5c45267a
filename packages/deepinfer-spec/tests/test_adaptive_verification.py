"""Adaptive verification's per-step decision in the engine, against hand-worked cost tables.

A drafter that knows the greedy continuations gives every draft one confidence ``c`` (k = 3,
so a row's survivals are c, c², c³), and the step costs are given: a plain step of any rows
1 second (``plain_cost``), a step with verification rows by its tokens (``verify_cost``), and
drafting free (the drafter cannot run a made-up round). Each case's outcome is worked out
below from Θ_b = (rows + a_1 + ... + a_b) / V(tokens) against the plain step's rows / 1 (which
a plan must beat by 4%, ``MIN_PREDICTED_GAIN``):

* verifying is as cheap as a plain step: every draft is verified, as with the fixed schedule;
* a step with any verification row costs five plain steps, more than the four tokens a row
  can emit: no round is drafted, every decoding step is a plain one;
* drafting pays on a first round's prior (every draft sure to pass) but the drafts' own
  survivals do not pay for verifying them: that step's drafts are dropped, it runs as a plain
  decode step, and no round is drafted after it;
* the same drafts, always right but with those survivals: the calibration learns from the
  dropped rows' first drafts that they are kept, until verifying them pays;
* one draft pays and two do not: every round verifies exactly one.

Outputs always equal the engine's without speculation, greedy and seeded.
"""

from __future__ import annotations

import random

import pytest
import torch
from _spec_drafters import ConfidentDrafter

from deepinfer.assets import random_tiny_model, tiny_tokenizer
from deepinfer.engine import spec_setup
from deepinfer.engine.config import EngineConfig
from deepinfer.engine.engine import LLMEngine
from deepinfer.models.causal_lm import DeepseekCausalLM
from deepinfer.outputs import RequestOutput
from deepinfer.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
SEEDED = SamplingParams(temperature=1.0, top_p=0.9, seed=4, max_tokens=24, ignore_eos=True)
ADAPTIVE = {"method": "mtp", "num_speculative_tokens": 3, "scheduling": "adaptive"}


@pytest.fixture(scope="module")
def model() -> DeepseekCausalLM:
    return random_tiny_model(torch.float32, seed=5)


def _prompts(n: int) -> list[list[int]]:
    """Short prompts: they prefill together in the first step (96 tokens a step)."""
    rnd = random.Random(n)
    return [[rnd.randrange(3, 8000) for _ in range(rnd.randint(5, 30))] for _ in range(n)]


def _run(
    model: DeepseekCausalLM, prompts: list[list[int]], params: SamplingParams, spec: dict | None
) -> tuple[list[list[int]], LLMEngine, list[RequestOutput]]:
    config = EngineConfig(max_num_batched_tokens=96, speculative_config=spec)
    engine = LLMEngine(model, tiny_tokenizer(), config)
    ids = [engine.add_request(p, params) for p in prompts]
    done = engine.run()
    return [done[i].outputs[0].token_ids for i in ids], engine, [done[i] for i in ids]


def _speculate(  # noqa: PLR0917
    model: DeepseekCausalLM,
    prompts: list[list[int]],
    params: SamplingParams,
    monkeypatch: pytest.MonkeyPatch,
    confidence: float,
    spec: dict,
) -> tuple[list[list[int]], LLMEngine, list[RequestOutput], LLMEngine]:
    """The engine without speculation, then with ``spec`` and a drafter that knows its
    outputs; returns the outputs with speculation, both engines and the outputs' metrics."""
    want, plain, _ = _run(model, prompts, params, None)
    drafter = ConfidentDrafter([p + w for p, w in zip(prompts, want, strict=True)], confidence)
    monkeypatch.setattr(spec_setup, "load_drafter", lambda *_: drafter)
    got, engine, outs = _run(model, prompts, params, spec)
    assert got == want
    return got, engine, outs, plain


@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_free_verification_verifies_every_draft(
    model: DeepseekCausalLM, params: SamplingParams, monkeypatch: pytest.MonkeyPatch
) -> None:
    """V = 1 at any tokens: each draft adds its survival (> 0) at no cost, so all are
    verified, as the fixed schedule verifies them (the same drafts, kept the same)."""
    prompts = _prompts(3)
    fixed = {"method": "mtp", "num_speculative_tokens": 3}
    _, every, _, _ = _speculate(model, prompts, params, monkeypatch, 0.9, fixed)
    spec = {**ADAPTIVE, "verify_cost": {1: 1.0}, "plain_cost": {1: 1.0}}
    _, engine, _, _ = _speculate(model, prompts, params, monkeypatch, 0.9, spec)
    assert engine.spec is not None and every.spec is not None
    assert engine.spec.num_drafts == every.spec.num_drafts > 0
    assert engine.spec.num_accepted == every.spec.num_accepted > 0
    assert engine.spec.verifier is not None and engine.spec.verifier.skipped == 0


@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_a_verification_dearer_than_its_tokens_never_drafts(
    model: DeepseekCausalLM, params: SamplingParams, monkeypatch: pytest.MonkeyPatch
) -> None:
    """V = 5 for any step with a draft: at most 1 + 3 tokens a row for 5 plain steps' time,
    even with every draft sure (c = 1). No round is drafted, and every step is a plain one,
    the prompts' included (the engine's own: no drafter features taken for a round that would
    not pay): as many steps as without speculation."""
    spec = {**ADAPTIVE, "verify_cost": {1: 5.0}, "plain_cost": {1: 1.0}}
    _, engine, outs, plain = _speculate(model, _prompts(3), params, monkeypatch, 1.0, spec)
    assert engine.spec is not None and engine.spec.verifier is not None
    verifier = engine.spec.verifier
    assert engine.spec.num_drafts == verifier.offered == verifier.planned == 0
    assert verifier.skipped > 0
    assert engine.num_steps == plain.num_steps == GREEDY.max_tokens
    assert engine.spec.plain_steps == engine.num_steps
    assert all(o.metrics is not None and o.metrics.spec_rounds == 0 for o in outs)


@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_drafts_that_do_not_pay_are_dropped_for_a_plain_step(
    model: DeepseekCausalLM, params: SamplingParams, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two rows, V(tokens) = 1.5 + 0.1 (tokens - 1) / 63. A first round is drafted on the
    prior (0.5, 0.25, 0.125 a row): 2 + 1.75 tokens in V(8) = 1.51 s, 2.48 a second, beat the
    plain step's 2 by more than 4%. The drafts' own survivals (0.2, 0.04, 0.008 a row) never
    pay: at most 2 + 2 * 0.248 tokens for V(3) = 1.5 s or more, under 2 a second, and the
    drafts are wrong (a drafter that knows no continuation), so what the calibration learns of
    them only lowers them. So every round drafted (the first, and any drafted again once what
    was learnt has aged back towards the prior) has all its drafts dropped and runs as a plain
    step, as do the steps between."""
    spec = {**ADAPTIVE, "verify_cost": {1: 1.5, 64: 1.6}, "plain_cost": {1: 1.0}}
    prompts = _prompts(2)
    want, plain, _ = _run(model, prompts, params, None)
    monkeypatch.setattr(spec_setup, "load_drafter", lambda *_: ConfidentDrafter([], 0.2))
    got, engine, outs = _run(model, prompts, params, spec)
    assert got == want
    assert engine.spec is not None and engine.spec.verifier is not None
    verifier = engine.spec.verifier
    assert verifier.dropped >= 1 and verifier.offered == 6 * verifier.dropped
    assert engine.spec.num_drafts == verifier.planned == 0
    assert sum(o.metrics.spec_trimmed_tokens for o in outs if o.metrics) == verifier.offered
    assert engine.num_steps == plain.num_steps == GREEDY.max_tokens
    assert engine.spec.plain_steps == engine.num_steps - 1


def test_an_under_confident_drafter_is_verified_once_calibrated(
    model: DeepseekCausalLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The costs of the test before, four rows, drafts always right (bar a corrupted second
    draft every third round) at confidence 0.2. The first rounds' drafts are dropped, but
    every dropped row's drafts are judged by the tokens drawn at their positions in the steps
    after (``draft_trials``): the first ones kept, the second ones kept but where corrupted.
    The first position's calibration rises with them (its scale, hits over expected hits, and
    its bin), and verifying one draft a row pays once it reads above about 0.55 (4 + 4 c in
    V(8) = 1.51 s against 4 * 1.04 a second); so rows are verified, their drafts kept, and the
    run takes fewer steps. That every first draft was judged kept, and some second ones not,
    checks that each draft met the token drawn at its own position."""
    spec = {**ADAPTIVE, "verify_cost": {1: 1.5, 64: 1.6}, "plain_cost": {1: 1.0}}
    _, engine, _, plain = _speculate(model, _prompts(4), GREEDY, monkeypatch, 0.2, spec)
    assert engine.spec is not None and engine.spec.verifier is not None
    verifier = engine.spec.verifier
    assert verifier.dropped >= 1 and verifier.planned > 0
    assert engine.spec.num_accepted > 0
    calibration = verifier.learnt[False].calibration
    tried, kept = calibration.trials[:2].sum(axis=1), calibration.hits[:2].sum(axis=1)
    assert tried[0] > 4 and kept[0] == pytest.approx(tried[0])
    assert 0 < kept[1] < tried[1]
    assert engine.num_steps < plain.num_steps


def test_a_step_verifies_the_one_draft_that_pays(
    model: DeepseekCausalLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One row, V = {2: 1.2, 3: 3, 4: 4}, every draft at c = 0.9. The calibration reads the
    first as c' from 0.9 up to 1 (that draft is always right, and its bin learns so) and the
    later ones at 0.9 (never verified, never tried): one draft gives (1 + c') / 1.2 >= 1.58,
    above the plain step's 1 by more than the 4% a plan must win by; two give at most
    (1 + 1 + 0.9) / 3 and three (1 + 1 + 0.9 + 0.81) / 4, both below 1. So every round
    verifies exactly one draft, and the first is always kept: two tokens a step."""
    spec = {**ADAPTIVE, "verify_cost": {2: 1.2, 3: 3.0, 4: 4.0}, "plain_cost": {1: 1.0}}
    _, engine, outs, plain = _speculate(model, _prompts(1), GREEDY, monkeypatch, 0.9, spec)
    metrics = outs[0].metrics
    assert engine.spec is not None and metrics is not None
    assert metrics.spec_rounds > 0 and metrics.spec_draft_tokens == metrics.spec_rounds
    assert engine.spec.num_accepted == engine.spec.num_drafts == metrics.spec_rounds
    assert engine.num_steps < plain.num_steps


@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_a_round_not_drafted_verifies_nothing(
    model: DeepseekCausalLM, params: SamplingParams, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One row, V = {2: 1.1, 3: 1.2, 4: 1.3}, drafting 0.3 s, c = 0.3, and a drafter that
    knows no continuation (its drafts are all wrong). Rounds are drafted on the prior: 1.875
    tokens in 0.3 + 1.3 s is 1.17 a second, above 1.04. Verifying is priced without the
    drafting, spent by then: one draft, (1 + 0.3) / 1.1 = 1.18, beats two, 1.39 / 1.2 = 1.16,
    and three, 1.42 / 1.3. The drafts fail, so the calibrations fall until drafting stops
    paying and rounds are skipped; a skipped round's step verifies nothing, not the drafts
    already spent: every draft verified was drafted for its step, one a round."""
    spec = {**ADAPTIVE, "verify_cost": {2: 1.1, 3: 1.2, 4: 1.3}, "plain_cost": {1: 1.0},
            "draft_cost": {1: 0.3}}  # fmt: skip
    prompts = _prompts(1)
    want, plain, _ = _run(model, prompts, params, None)
    drafter = ConfidentDrafter([], 0.3)
    monkeypatch.setattr(spec_setup, "load_drafter", lambda *_: drafter)
    got, engine, outs = _run(model, prompts, params, spec)
    assert got == want
    assert engine.spec is not None and engine.spec.verifier is not None
    verifier = engine.spec.verifier
    assert verifier.skipped > 0 and 1 <= drafter.rounds < engine.num_steps - 1
    assert 3 <= verifier.offered <= 3 * drafter.rounds
    metrics = outs[0].metrics
    assert metrics is not None and metrics.spec_draft_tokens == metrics.spec_rounds > 0
    assert engine.spec.num_drafts == verifier.planned == metrics.spec_rounds
    assert engine.num_steps == plain.num_steps
