"""Confidence-scheduled verification in the engine (``scheduling: "adaptive"``, ``dspark.md`` §6).

The speculator drafts ``k`` tokens per request with a confidence each; before a step runs,
:class:`AdaptiveVerifier` trims every verifying request's drafts to the lengths
:func:`.verify_plan.plan` picks for that step, which weighs their survival against the step's
cost (:class:`.verify_cost.StepCost`, profiled at engine start by :mod:`.verify_profile` or
given as tables), the step's rows and prefill chunks counted. The survivals are this step's
own, the drafter's confidences in the drafts about to be verified, recalibrated by how the
drafter's predictions have fared so far (per position and confidence,
:mod:`.online_calibration`, learnt from every planned row's outcome, the drafts its plan cut
judged by the tokens drawn after, :mod:`.draft_trials`): the best estimate there is, and safe
to use since the engine keeps a draft iff it equals the sampler's own draw, so no choice of
drafts can bias the output (see :mod:`.verify_plan`). One of the plans is to verify nothing:
the step's drafts are then dropped, and a step of decoding rows runs as a plain decode step
(:mod:`.speculative`). So a step verifies drafts only when their expected tokens pay for
what the verification rows cost over the plain step of the same rows.

Drafting costs time before any of that is known (:mod:`.draft_cost`), so before a round is
drafted :meth:`AdaptiveVerifier.drafting_pays` asks whether it is worth it at all. The round's
drafts do not exist yet, and a request's own last round says next to nothing of its next one
(their survivals hardly correlate, while a round's survivals do predict what it keeps), so the
estimate is the mean survival per position over the rounds drafted lately (their confidences
as calibrated when their rows were planned: drafts expected to be kept), all requests of a
sampling regime together (greedy and sampled requests keep their own: :mod:`.survival_memory`,
with its prior before any: the drafter's acceptance per position measured on held-out text
where it brings one), calibrated by what the rounds drafted on it then had accepted. When
drafting does not pay, the round is not drafted, its requests run plain decode steps, and what
was learnt of their regimes ages back towards the prior, so that drafting is tried again once in
a while. The other schedules are ``"fixed"`` (every draft) and DSpark's
``confidence_threshold``.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol, runtime_checkable

from torch import Tensor

from deepinfer.engine import profile_cache
from deepinfer.engine.decision_spells import DecisionSpells, Finding
from deepinfer.engine.draft_cost import ProfiledDrafter, profile_draft_cost
from deepinfer.engine.draft_trials import DraftTrials
from deepinfer.engine.request import Request
from deepinfer.engine.scheduler import SchedulerOutput
from deepinfer.engine.spec_config import CostTable
from deepinfer.engine.step_load import step_load
from deepinfer.engine.step_overhead import StepOverhead
from deepinfer.engine.survival_memory import MEASURED_ROWS, Learnt, sampled
from deepinfer.engine.verify_cost import StepCost, VerifyCost
from deepinfer.engine.verify_plan import (
    StepLoad,
    StepSeconds,
    drafting_plan,
    plan,
    survival,
)
from deepinfer.engine.verify_profile import profile_step_cost
from deepinfer.errors import InvalidRequestError
from deepinfer.models.causal_lm import DeepseekCausalLM
from deepinfer.models.state import ModelState

#: How much better than a plain step (a fraction of its tokens a second) verifying or
#: drafting must look to be chosen (TRT-LLM's ``confidence_min_predicted_gain``): the host work
#: of a speculative step beyond its pass and draws is not in the step cost.
MIN_PREDICTED_GAIN = 0.04
#: Rounds drafted while their host work is not yet measured (:mod:`.step_overhead`) may be
#: predicted to lose up to this share of a plain step's rate: the profile times passes, and
#: only rounds show what a round's host work adds or saves beyond them (on a GPU, where a
#: plain step is a couple of milliseconds, the difference can decide), so the first
#: :data:`PROBE_ROUNDS` rounds that come this close are drafted and timed.
PROBE_LOSS = 0.5
PROBE_ROUNDS = 4
#: Rounds are probed so, too, while a regime's calibration has tried fewer first drafts than
#: this and finds them kept more often than their raw confidences say: a drafter whose
#: confidences understate it (the MTP layer's) would otherwise stop drafting before its
#: calibration, which learns only from drafted rounds, could show it. One that overstates
#: them is not probed on.
PROBE_TRIALS = 32


@runtime_checkable
class ConfidentDrafter(Protocol):
    """A drafter that can say how sure it is: ``draft_with_confidence`` takes what
    ``Drafter.draft_batch`` takes and returns the [requests, k] drafts (none cut) with their
    [requests, k] confidences, each the chance that draft survives if the ones before it did."""

    k: int

    def draft_with_confidence(
        self,
        states: Sequence[ModelState],
        streams: Tensor,
        next_ids: Tensor,
        lengths: Sequence[int],
    ) -> tuple[Tensor, Tensor]: ...


def adaptive_verifier(  # noqa: PLR0917
    drafter: object,
    model: DeepseekCausalLM,
    max_num_seqs: int,
    table: CostTable | None,
    draft_table: CostTable | None = None,
    plain_table: CostTable | None = None,
    *,
    cuda_graphs: bool = False,
) -> AdaptiveVerifier:
    """The verifier for ``drafter`` on ``model``: the step cost of ``table`` (by tokens) and
    ``plain_table`` (a plain step's, by rows), or what of it is not given profiled now (plain
    steps replayed from CUDA graphs with ``cuda_graphs``, as the engine runs them), and
    ``draft_table``'s drafting cost, or that profiled now (a drafter that cannot run a made-up
    round is priced as drafting for free)."""
    if not isinstance(drafter, ConfidentDrafter):
        raise InvalidRequestError(
            "speculative_config",
            f"adaptive scheduling needs a drafter with confidences; "
            f"{type(drafter).__name__} gives none",
        )
    verifier = _priced(drafter, model, max_num_seqs, table, draft_table, plain_table, cuda_graphs)
    verifier.expect(getattr(drafter, "acceptance_prior", None))
    return verifier


def _priced(  # noqa: PLR0917
    drafter: ConfidentDrafter,
    model: DeepseekCausalLM,
    max_num_seqs: int,
    table: CostTable | None,
    draft_table: CostTable | None,
    plain_table: CostTable | None,
    cuda_graphs: bool,
) -> AdaptiveVerifier:
    """:func:`adaptive_verifier`'s verifier, its costs given or profiled."""
    if table is plain_table is draft_table is None:  # all measured: host work learnt on top
        return AdaptiveVerifier(*startup_profile(drafter, model, max_num_seqs, cuda_graphs))
    plain = None if plain_table is None else VerifyCost.from_table(dict(plain_table))
    if table is not None:
        cost = StepCost.by_tokens(VerifyCost.from_table(dict(table)), plain)
    else:
        cost = _profiled_steps(drafter, model, max_num_seqs, cuda_graphs)
        if plain is not None:
            cost = dataclasses.replace(cost, plain=plain)
    # a given table is taken as it is: no host work learnt on top
    if draft_table is not None:
        return AdaptiveVerifier(cost, VerifyCost.from_table(dict(draft_table)))
    if isinstance(drafter, ProfiledDrafter):
        return AdaptiveVerifier(cost, profile_draft_cost(drafter, max_num_seqs, model.device))
    return AdaptiveVerifier(cost)


def startup_profile(
    drafter: ConfidentDrafter, model: DeepseekCausalLM, max_num_seqs: int, cuda_graphs: bool
) -> tuple[StepCost, VerifyCost | None, StepOverhead]:
    """Every cost profiled (:mod:`.verify_profile`, :mod:`.draft_cost`; a drafter that cannot
    run a made-up round drafts for free), or read from the profile cache where a drafter that
    names itself (``profile_key``) was profiled so before (:mod:`.profile_cache`); with a
    :class:`.StepOverhead` that learns the steps' host work on top."""
    named = getattr(drafter, "profile_key", None)
    key = None
    if isinstance(named, str):
        key = profile_cache.profile_key(model, named, max_num_seqs, cuda_graphs, drafter.k)
        found = profile_cache.read(key)
        if found is not None:
            return (*found, StepOverhead())
    cost = _profiled_steps(drafter, model, max_num_seqs, cuda_graphs)
    drafting = None
    if isinstance(drafter, ProfiledDrafter):
        drafting = profile_draft_cost(drafter, max_num_seqs, model.device)
    if key is not None:
        profile_cache.write(key, cost, drafting)
    return cost, drafting, StepOverhead()


def _profiled_steps(
    drafter: ConfidentDrafter, model: DeepseekCausalLM, max_num_seqs: int, cuda_graphs: bool
) -> StepCost:
    """The target's step costs profiled now, with the drafter's feature layers captured."""
    layers = tuple(getattr(drafter, "feature_layers", None) or ())
    return profile_step_cost(model, drafter.k, max_num_seqs, layers, cuda_graphs=cuda_graphs)


class AdaptiveVerifier:
    """Holds the cost tables, each request's confidences for its pending drafts, and, per
    sampling regime, the mean survivals of the rows drafted lately (what drafting is decided
    on) and what it planned and what came of it (its calibrations)."""

    def __init__(
        self,
        cost: StepCost,
        draft_cost: VerifyCost | None = None,
        overhead: StepOverhead | None = None,
    ) -> None:
        self.cost = cost
        #: Seconds of drafting a round against its requests (None: drafting is free).
        self.draft_cost = draft_cost
        #: The steps' host work beyond the profiled costs, learnt as they run (None: the
        #: costs are taken as they are).
        self.overhead = overhead
        self.confidence: dict[Request, list[float]] = {}
        #: What drafting taught, per sampling regime (True: sampled), see the module.
        self.learnt = {False: Learnt(), True: Learnt()}
        #: Drafts verified per request in the latest planned step, by request id.
        self.last: dict[str, int] = {}
        #: Over the engine's life: verification rows planned, drafts they were offered, and
        #: drafts the plans kept; rounds not drafted because drafting did not pay; and steps
        #: whose plan verified none of the drafts offered (dropped: the step is a plain one
        #: unless a prefill chunk rides in it).
        self.rows = 0
        self.offered = 0
        self.planned = 0
        self.skipped = 0
        self.dropped = 0
        #: What the latest decision to draft counted on, per request (kept once drafted),
        #: and what the rounds drafted so and not verified yet count on.
        self._decided: dict[Request, float] = {}
        self._foreseen: dict[Request, float] = {}
        #: Each planned row's raw confidences and drafts before the plan cut them, until the
        #: tokens drawn after say how far they would have been kept (:meth:`verified`).
        self.trials = DraftTrials()
        #: How long the latest decision to draft (or not) stands (:mod:`.decision_spells`).
        self.spells = DecisionSpells()

    def expect(self, prior: Mapping[bool, Sequence[float]] | None) -> None:
        """Start each regime (True: sampled) from the drafter's own acceptance per position
        (``acceptance_prior``, measured on held-out text), where it has one."""
        for regime, survivals in (prior or {}).items():
            learnt = self.learnt[regime]
            learnt.prior = [float(a) for a in survivals]
            learnt.prior_rows = learnt.rows = MEASURED_ROWS

    def of(self, req: Request) -> Learnt:
        """What was learnt of ``req``'s sampling regime."""
        return self.learnt[sampled(req.params.temperature)]

    @property
    def mean_planned(self) -> float:
        """Drafts verified per planned row, on average (0 before any)."""
        return self.planned / self.rows if self.rows else 0.0

    def draft(  # noqa: PLR0917
        self,
        drafter: ConfidentDrafter,
        reqs: Sequence[Request],
        states: Sequence[ModelState],
        streams: Tensor,
        next_ids: Tensor,
        lengths: Sequence[int],
    ) -> tuple[Tensor, Tensor]:
        """Launch drafting for ``reqs``: [R, k] drafts and their confidences, on the device
        (taken in by :meth:`took`), keeping what the decision to draft them counted on."""
        for req in reqs:
            if req in self._decided:
                self._foreseen[req] = self._decided[req]
        self._decided = {}
        return drafter.draft_with_confidence(states, streams, next_ids, lengths)

    def took(self, confidence: Mapping[Request, list[float]]) -> None:
        """Keep each drafted request's confidences, read from the round, for its next plan."""
        self.confidence.update(confidence)

    def draft_seconds(self, num_requests: int) -> float:
        """Seconds of drafting a round of ``num_requests`` requests."""
        return self.draft_cost.step_seconds(num_requests) if self.draft_cost else 0.0

    def step_seconds(self, rows: int) -> StepSeconds:
        """Seconds of a step of ``rows`` rows by its tokens and noisy draws: the profiled
        cost plus the steps' own host work where learnt (:mod:`.step_overhead`)."""

        def seconds(tokens: int, noisy: int = 0) -> float:
            base = self.cost.seconds(rows, tokens, noisy)
            extra = self.overhead.extra(tokens > rows) if self.overhead is not None else 0.0
            return max(base + extra, base / 2)

        return seconds

    def predicted(self, rows: int, tokens: int, drafted: int) -> float:
        """Profiled seconds of a step and of drafting ``drafted`` requests after it."""
        return self.cost.seconds(rows, tokens) + (self.draft_seconds(drafted) if drafted else 0)

    def _margin(self, regimes: Iterable[bool] = ()) -> float:
        """The gain over a plain step that drafting and verifying must promise:
        :data:`MIN_PREDICTED_GAIN`, or a loss of up to :data:`PROBE_LOSS` while fewer than
        :data:`PROBE_ROUNDS` rounds have been timed or (drafting) one of ``regimes`` has
        tried fewer than :data:`PROBE_TRIALS` first drafts, found understated."""
        if self.overhead is not None and self.overhead.rounds < PROBE_ROUNDS:
            return -PROBE_LOSS
        for g in regimes:
            calibration = self.learnt[g].calibration
            if calibration.first_trials < PROBE_TRIALS and calibration.scale()[0] > 1:
                return -PROBE_LOSS
        return MIN_PREDICTED_GAIN

    def drafting_pays(self, reqs: Sequence[Request], k: int, noisy: int | None = None) -> bool:
        """Whether drafting ``k`` tokens for each of ``reqs`` before a step of their decoding
        rows is worth its cost (:func:`.verify_plan.drafting_plan` on the survivals expected
        of a round of each request's regime, its draft calibration applied: the mean is of
        survivals the confidences' calibration already scaled, see the module); counts the
        rounds it turns down (and ages what was learnt of their regimes), and remembers what
        the others count on. A finding stands for a few steps of the same batch
        (:mod:`.decision_spells`); ``noisy``: how many of ``reqs`` sample, if counted."""
        if noisy is None:
            noisy = sum(sampled(req.params.temperature) for req in reqs)
        batch = (len(reqs), noisy, k)
        standing = self.spells.standing(batch)
        if standing is not None and not standing.pays:
            self._skip({g for g, m in ((True, noisy), (False, len(reqs) - noisy)) if m}, k)
            return False
        regimes = [sampled(req.params.temperature) for req in reqs]
        if standing is not None:
            self._decide(reqs, regimes, standing.counted or {}, standing.lengths or [])
            return True
        expected = {g: self.learnt[g].survivals(k) for g in set(regimes)}
        scale = {g: self.learnt[g].draft_calibration for g in expected}
        calibrated = {g: [a * scale[g] for a in expected[g]] for g in expected}
        past = [calibrated[g] for g in regimes]  # a regime's requests share their row
        load = StepLoad(len(reqs), len(reqs), sum(regimes), tuple(regimes))
        seconds = self.step_seconds(len(reqs))
        drafting = self.draft_seconds(len(reqs))
        found = drafting_plan(past, load, seconds, drafting, self._margin(expected))
        if found is None:
            self._skip(expected, k)
            self.spells.found(Finding(batch))
            return False
        counted = {g: list(itertools.accumulate(expected[g], initial=0.0)) for g in expected}
        self.spells.found(Finding(batch, counted, found.lengths))
        self._decide(reqs, regimes, counted, found.lengths)
        return True

    def _decide(
        self,
        reqs: Sequence[Request],
        regimes: Sequence[bool],
        counted: Mapping[bool, list[float]],
        lengths: Sequence[int],
    ) -> None:
        """Remember what drafting ``lengths`` for ``reqs`` counts on (by each regime's
        cumulative survivals ``counted``), for the draft calibration."""
        self._decided = {
            req: counted[g][n] for req, g, n in zip(reqs, regimes, lengths, strict=True)
        }

    def _skip(self, regimes: Iterable[bool], k: int) -> None:
        """Count a round not drafted, and age what was learnt of its ``regimes``."""
        self.skipped += 1
        for g in regimes:
            self.learnt[g].age(k)

    def verified(self, req: Request, emitted: Sequence[int], first: int) -> None:
        """Take in that ``req``'s step drew ``emitted`` (a verification row's kept drafts and
        the token after them, a plain row's token), the first at token position ``first``.
        The planned rows these tokens judge (:mod:`.draft_trials`: this step's row, up to its
        first draft not drawn, and earlier rows' cut drafts at these positions) teach the
        confidences; the drafts this step kept are set against what the decision to draft
        them counted on (the draft calibration: the drafts a plan cut count as not kept, so
        drafting stops where the plans cut its rounds)."""
        learnt = self.of(req)
        for trial, start, tried in self.trials.drawn(req, emitted, first):
            learnt.calibration.observe(trial.confidence, tried, trial.judged, start)
        foreseen = self._foreseen.pop(req, None)
        if foreseen is not None:
            learnt.foreseen += foreseen
            learnt.realized += len(emitted) - 1  # the drafts this step verified and kept

    def trim(self, out: SchedulerOutput, drafts: dict[Request, list[int]]) -> None:
        """Cut ``drafts`` of the requests that verify in ``out`` to this step's plan, made on
        their calibrated survivals with the step's rows and tokens priced (the drafting is
        done: only verifying is weighed against the plain step)."""
        verifying, load = step_load(out, drafts)
        current = []
        for req in verifying:
            n = len(drafts[req])
            raw = (self.confidence.pop(req, None) or [1.0] * n)[:n]
            self.trials.plan(req, raw, drafts[req], req.num_computed_tokens + 1)
            current.append(survival([self.of(req).calibration.calibrate(raw)])[0])
        seconds = self.step_seconds(len(out.scheduled))
        chosen = plan(current, load, seconds, margin=self._margin())
        self.confidence = {r: c for r, c in self.confidence.items() if r in drafts}
        self._foreseen = {r: a for r, a in self._foreseen.items() if not r.finished}
        self.trials.forget_finished()
        self.last = {}
        for req, calibrated, length in zip(verifying, current, chosen.lengths, strict=True):
            self.of(req).learn(calibrated)  # in the units of the prior: drafts expected kept
            self.last[req.request_id] = length
            req.metrics.spec_trimmed_tokens += len(drafts[req]) - length
            self.offered += len(drafts[req])
            drafts[req] = drafts[req][:length]
        self.rows += len(verifying)
        self.planned += sum(chosen.lengths)
        self.dropped += bool(verifying) and not chosen.budget
