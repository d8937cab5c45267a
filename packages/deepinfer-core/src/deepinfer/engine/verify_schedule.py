"""Confidence-scheduled verification in the engine (``scheduling: "adaptive"``, ``dspark.md`` §6).

The speculator drafts ``k`` tokens per request with a confidence each; before a step runs,
:class:`AdaptiveVerifier` trims every verifying request's drafts to the lengths
:func:`.verify_plan.plan` picks for that step, which weighs their survival against the step's
cost (:class:`.verify_cost.VerifyCost`, profiled at engine start or given as a table) with the
step's prefill chunks counted in its tokens, plus the cost of drafting its requests
(:mod:`.draft_cost`, profiled or given the same way). Before a round is drafted,
:meth:`AdaptiveVerifier.drafting_pays` asks whether drafting it is worth its cost at all; when
it is not, the round is not drafted and its requests run plain decode steps. The budget comes
from each request's survivals of the latest round it verified, which are independent of the
drafts being verified (a request's first round counts every draft as sure to pass), and the
current survivals choose which drafts fill it, so verification stays lossless (see
:mod:`.verify_plan`); whether to draft is decided from the same past survivals, before the
drafts exist. The other schedules are ``"fixed"`` (every draft) and DSpark's
``confidence_threshold``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

from torch import Tensor

from deepinfer.checks import is_int, is_number
from deepinfer.engine.draft_cost import ProfiledDrafter, profile_draft_cost
from deepinfer.engine.request import Request
from deepinfer.engine.scheduler import SchedulerOutput
from deepinfer.engine.verify_cost import VerifyCost, profile_verify_cost
from deepinfer.engine.verify_plan import StepLoad, drafting_pays, plan, survival
from deepinfer.errors import InvalidRequestError
from deepinfer.models.causal_lm import DeepseekCausalLM
from deepinfer.models.state import ModelState

SCHEDULES = ("fixed", "adaptive")
#: Pseudo-drafts, accepted as predicted, that calibration starts from.
CALIBRATION_PRIOR = 8.0
#: A cost table as ``SpeculativeConfig`` holds it: (tokens, seconds) pairs.
CostTable = tuple[tuple[int, float], ...]


def parse_scheduling(
    raw: Mapping[str, object], threshold: float
) -> tuple[str, CostTable | None, CostTable | None]:
    """``speculative_config``'s schedule: ``"scheduling"`` (or vLLM's
    ``"enable_adaptive_verification"``), ``"verify_cost"`` (``{tokens: seconds}``, JSON's
    string keys accepted) and ``"draft_cost"`` (``{requests: seconds}``); combinations that
    contradict each other are refused by name."""
    scheduling, enable = raw.get("scheduling"), raw.get("enable_adaptive_verification")
    if scheduling is not None and scheduling not in SCHEDULES:
        raise InvalidRequestError(
            "speculative_config", f"scheduling must be one of {SCHEDULES}, got {scheduling!r}"
        )
    if enable is not None and not isinstance(enable, bool):
        raise InvalidRequestError(
            "speculative_config", f"enable_adaptive_verification must be a boolean, got {enable!r}"
        )
    if scheduling is not None and enable is not None and (scheduling == "adaptive") != enable:
        raise InvalidRequestError(
            "speculative_config",
            f"enable_adaptive_verification={enable} contradicts scheduling={scheduling!r}",
        )
    mode = str(scheduling or ("adaptive" if enable else "fixed"))
    if mode == "adaptive" and threshold:
        raise InvalidRequestError(
            "speculative_config",
            "confidence_threshold cannot be combined with adaptive scheduling (the schedule "
            "decides how many drafts to verify)",
        )
    tables = []
    for name in ("verify_cost", "draft_cost"):
        table = raw.get(name)
        if table is not None and mode != "adaptive":
            raise InvalidRequestError(
                "speculative_config", f"{name} prices adaptive scheduling; scheduling is 'fixed'"
            )
        tables.append(None if table is None else _cost_table(name, table))
    return mode, tables[0], tables[1]


def _cost_table(name: str, table: object) -> CostTable:
    """``{count: seconds}`` as sorted pairs, each checked (count >= 1, seconds > 0)."""
    if not isinstance(table, Mapping) or not table:
        raise InvalidRequestError("speculative_config", f"{name} must be a non-empty dict")
    unit = "tokens" if name == "verify_cost" else "requests"
    pairs = []
    for n, s in table.items():
        tokens = int(n) if isinstance(n, str) and n.isdigit() else n
        if not is_int(tokens) or tokens < 1 or not is_number(s) or not 0 < s < math.inf:
            raise InvalidRequestError(
                "speculative_config",
                f"{name} maps {unit} (>= 1) to seconds (> 0); got {n!r}: {s!r}",
            )
        pairs.append((int(tokens), float(s)))
    return tuple(sorted(pairs))


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


def adaptive_verifier(
    drafter: object,
    model: DeepseekCausalLM,
    max_num_seqs: int,
    table: CostTable | None,
    draft_table: CostTable | None = None,
) -> AdaptiveVerifier:
    """The verifier for ``drafter`` on ``model``: ``table``'s verify cost and
    ``draft_table``'s drafting cost, or those profiled now (a drafter that cannot run a
    made-up round is priced as drafting for free)."""
    if not isinstance(drafter, ConfidentDrafter):
        raise InvalidRequestError(
            "speculative_config",
            f"adaptive scheduling needs a drafter with confidences; "
            f"{type(drafter).__name__} gives none",
        )
    if table is not None:
        cost = VerifyCost.from_table(dict(table))
    else:
        cost = profile_verify_cost(model, drafter.k, max_num_seqs)
    if draft_table is not None:
        return AdaptiveVerifier(cost, VerifyCost.from_table(dict(draft_table)))
    if isinstance(drafter, ProfiledDrafter):
        return AdaptiveVerifier(cost, profile_draft_cost(drafter, max_num_seqs, model.device))
    return AdaptiveVerifier(cost)


class AdaptiveVerifier:
    """Holds the cost tables, each request's confidences for its pending drafts and its
    survivals of the latest round it verified (the budget's information), and what it planned."""

    def __init__(self, cost: VerifyCost, draft_cost: VerifyCost | None = None) -> None:
        self.cost = cost
        #: Seconds of drafting a round against its requests (None: drafting is free).
        self.draft_cost = draft_cost
        self.confidence: dict[Request, list[float]] = {}
        self.previous: dict[Request, list[float]] = {}
        #: Drafts verified per request in the latest planned step, by request id.
        self.last: dict[str, int] = {}
        #: Over the engine's life: verification rows planned, drafts they were offered, and
        #: drafts the plans kept; and rounds not drafted because drafting did not pay.
        self.rows = 0
        self.offered = 0
        self.planned = 0
        self.skipped = 0
        #: Survival the plans admitted, and drafts verification then accepted (the runner
        #: adds them): their ratio calibrates the past survivals the budget is taken on.
        self.expected = 0.0
        self.accepted = 0

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
    ) -> list[list[int]]:
        """Draft for ``reqs`` (as ``Drafter.draft_batch``), keeping each row's confidences."""
        tokens, confidence = drafter.draft_with_confidence(states, streams, next_ids, lengths)
        for req, row in zip(reqs, confidence.tolist(), strict=True):
            self.confidence[req] = row
        return tokens.tolist()

    def draft_seconds(self, num_requests: int) -> float:
        """Seconds of drafting a round of ``num_requests`` requests."""
        return self.draft_cost.step_seconds(num_requests) if self.draft_cost else 0.0

    def _before(self, req: Request, n: int) -> list[float]:
        """The request's survivals of the latest round it verified, ``n`` long; none yet:
        every draft sure to pass (a longer row than that round's, which a shrinking length
        limit never gives, repeats its last survival)."""
        before = [a * self.calibration for a in self.previous.get(req, [])[:n]]
        return before + [before[-1] if before else 1.0] * (n - len(before))

    @property
    def calibration(self) -> float:
        """Accepted drafts per unit of admitted survival so far, at most 1, with a prior of
        :data:`CALIBRATION_PRIOR` drafts as predicted: an over-confident head would otherwise
        buy drafts that do not pay. It depends on verified rounds only, so the budget and the
        decision to draft still never see the drafts being verified."""
        prior = CALIBRATION_PRIOR
        return min(1.0, (self.accepted + prior) / (self.expected + prior))

    def drafting_pays(self, reqs: Sequence[Request], load: StepLoad, k: int) -> bool:
        """Whether drafting ``k`` tokens for each of ``reqs`` before a step of ``load`` is
        worth its cost (:func:`.verify_plan.drafting_pays` on their past survivals, known
        before the drafts are); counts the rounds it turns down."""
        past = [self._before(req, k) for req in reqs]
        pays = drafting_pays(past, load, self.cost.step_seconds, self.draft_seconds(len(reqs)))
        self.skipped += not pays
        return pays

    def trim(self, out: SchedulerOutput, drafts: dict[Request, list[int]]) -> None:
        """Cut ``drafts`` of the requests that verify in ``out`` to this step's plan."""
        verifying, load = step_load(out, drafts)
        current = []
        for req in verifying:
            n = len(drafts[req])
            current.append(survival([(self.confidence.pop(req, None) or [1.0] * n)[:n]])[0])
        previous = [self._before(req, len(drafts[req])) for req in verifying]
        drafting = self.draft_seconds(len(verifying))
        chosen = plan(current, previous, load, self.cost.step_seconds, drafting)
        self.confidence = {r: c for r, c in self.confidence.items() if r in drafts}
        self.previous = {r: a for r, a in self.previous.items() if not r.finished}
        self.last = {}
        for req, row, length in zip(verifying, current, chosen.lengths, strict=True):
            self.previous[req] = row
            self.last[req.request_id] = length
            req.metrics.spec_trimmed_tokens += len(drafts[req]) - length
            self.offered += len(drafts[req])
            self.expected += sum(row[:length])
            drafts[req] = drafts[req][:length]
        self.rows += len(verifying)
        self.planned += sum(chosen.lengths)


def step_load(
    out: SchedulerOutput, drafts: Mapping[Request, list[int]]
) -> tuple[list[Request], StepLoad]:
    """The requests of ``out`` that verify drafts, and what the step holds besides them: a
    decoding row's own token (it draws one), a prefill chunk's tokens (it draws one only where
    it ends the sequence). Decoding rows are told apart as the speculative step does."""
    verifying: list[Request] = []
    tokens = samples = 0
    for req, n in out.scheduled.items():
        start = req.num_computed_tokens
        if is_decoding(req, n):
            tokens, samples = tokens + 1, samples + 1
            if drafts.get(req):
                verifying.append(req)
        else:
            tokens, samples = tokens + n, samples + int(start + n >= req.num_tokens)
    return verifying, StepLoad(tokens, samples)


def is_decoding(req: Request, n: int) -> bool:
    """Whether ``req``'s ``n`` scheduled tokens are a decoding row (its last token, after its
    prompt), not a prefill chunk, as the speculative step tells them apart."""
    start = req.num_computed_tokens
    return n == 1 and start >= req.num_prompt_tokens and start + 1 == req.num_tokens
