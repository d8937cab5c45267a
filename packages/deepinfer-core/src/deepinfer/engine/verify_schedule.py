"""Confidence-scheduled verification in the engine (``scheduling: "adaptive"``, ``dspark.md`` §6).

The speculator drafts ``k`` tokens per request with a confidence each; before a step runs,
:class:`AdaptiveVerifier` trims every verifying request's drafts to the lengths
:func:`.verify_plan.plan` picks for that step, which weighs their survival against the step's
cost (:class:`.verify_cost.VerifyCost`, profiled at engine start or given as a table) with the
step's prefill chunks counted in its tokens. The budget comes from each request's survivals of
its previous round, which are independent of the drafts being verified (a request's first round
counts every draft as sure to pass), and the current survivals choose which drafts fill it, so
verification stays lossless (see :mod:`.verify_plan`). The other schedules are ``"fixed"``
(every draft) and DSpark's ``confidence_threshold``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

from torch import Tensor

from deepinfer.checks import is_int, is_number
from deepinfer.engine.request import Request
from deepinfer.engine.scheduler import SchedulerOutput
from deepinfer.engine.verify_cost import VerifyCost, profile_verify_cost
from deepinfer.engine.verify_plan import StepLoad, plan, survival
from deepinfer.errors import InvalidRequestError
from deepinfer.models.causal_lm import DeepseekCausalLM
from deepinfer.models.state import ModelState

SCHEDULES = ("fixed", "adaptive")
#: A cost table as ``SpeculativeConfig`` holds it: (tokens, seconds) pairs.
CostTable = tuple[tuple[int, float], ...]


def parse_scheduling(raw: Mapping[str, object], threshold: float) -> tuple[str, CostTable | None]:
    """``speculative_config``'s schedule: ``"scheduling"`` (or vLLM's
    ``"enable_adaptive_verification"``) and ``"verify_cost"`` (``{tokens: seconds}``, JSON's
    string keys accepted); combinations that contradict each other are refused by name."""
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
    table = raw.get("verify_cost")
    if table is None:
        return mode, None
    if mode != "adaptive":
        raise InvalidRequestError(
            "speculative_config", "verify_cost prices adaptive scheduling; scheduling is 'fixed'"
        )
    return mode, _cost_table(table)


def _cost_table(table: object) -> CostTable:
    """``{tokens: seconds}`` as sorted pairs, each checked (tokens >= 1, seconds > 0)."""
    if not isinstance(table, Mapping) or not table:
        raise InvalidRequestError("speculative_config", "verify_cost must be a non-empty dict")
    pairs = []
    for n, s in table.items():
        tokens = int(n) if isinstance(n, str) and n.isdigit() else n
        if not is_int(tokens) or tokens < 1 or not is_number(s) or not 0 < s < math.inf:
            raise InvalidRequestError(
                "speculative_config",
                f"verify_cost maps tokens (>= 1) to seconds (> 0); got {n!r}: {s!r}",
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
    drafter: object, model: DeepseekCausalLM, max_num_seqs: int, table: CostTable | None
) -> AdaptiveVerifier:
    """The verifier for ``drafter`` on ``model``: ``table``'s cost, or one profiled now."""
    if not isinstance(drafter, ConfidentDrafter):
        raise InvalidRequestError(
            "speculative_config",
            f"adaptive scheduling needs a drafter with confidences; "
            f"{type(drafter).__name__} gives none",
        )
    if table is not None:
        return AdaptiveVerifier(VerifyCost.from_table(dict(table)))
    return AdaptiveVerifier(profile_verify_cost(model, drafter.k, max_num_seqs))


class AdaptiveVerifier:
    """Holds the cost table, each request's confidences for its pending drafts and its
    survivals of the previous round (the budget's information), and what it planned."""

    def __init__(self, cost: VerifyCost) -> None:
        self.cost = cost
        self.confidence: dict[Request, list[float]] = {}
        self.previous: dict[Request, list[float]] = {}
        #: Drafts verified per request in the latest planned step, by request id.
        self.last: dict[str, int] = {}
        #: Over the engine's life: verification rows planned, drafts they were offered, and
        #: drafts the plans kept.
        self.rows = 0
        self.offered = 0
        self.planned = 0

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

    def trim(self, out: SchedulerOutput, drafts: dict[Request, list[int]]) -> None:
        """Cut ``drafts`` of the requests that verify in ``out`` to this step's plan."""
        verifying, load = step_load(out, drafts)
        current, previous = [], []
        for req in verifying:
            n = len(drafts[req])
            current.append(survival([(self.confidence.pop(req, None) or [1.0] * n)[:n]])[0])
            # Last round's row; none yet: every draft sure to pass (a longer row than last
            # round's, which a shrinking length limit never gives, repeats its last survival).
            before = self.previous.get(req, [])[:n]
            previous.append(before + [before[-1] if before else 1.0] * (n - len(before)))
        chosen = plan(current, previous, load, self.cost.step_seconds)
        self.confidence = {r: c for r, c in self.confidence.items() if r in drafts}
        self.previous = {r: a for r, a in self.previous.items() if r in drafts}
        self.last = {}
        for req, row, length in zip(verifying, current, chosen.lengths, strict=True):
            self.previous[req] = row
            self.last[req.request_id] = length
            req.metrics.spec_trimmed_tokens += len(drafts[req]) - length
            self.offered += len(drafts[req])
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
        if n == 1 and start >= req.num_prompt_tokens and start + 1 == req.num_tokens:
            tokens, samples = tokens + 1, samples + 1
            if drafts.get(req):
                verifying.append(req)
        else:
            tokens, samples = tokens + n, samples + int(start + n >= req.num_tokens)
    return verifying, StepLoad(tokens, samples)
