"""``speculative_config`` as the engine reads it (vLLM's option), and the sampling options a
speculative step refuses by name."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from deepinfer.checks import is_int, is_number
from deepinfer.errors import InvalidRequestError
from deepinfer.sampling_params import SamplingParams

#: Sampling options a speculative step does not apply yet: refused by name rather than ignored
#: (prompt logprobs need every logit of a prompt chunk, which its prefill keeps one of).
UNSUPPORTED = ("prompt_logprobs",)
#: ``"scheduling"``'s values: every draft verified, or a plan each step (:mod:`.verify_schedule`).
SCHEDULES = ("fixed", "adaptive")
#: A cost table as ``SpeculativeConfig`` holds it: (tokens, seconds) pairs.
CostTable = tuple[tuple[int, float], ...]
#: The tables ``speculative_config`` may give, in the order :func:`parse_scheduling` returns.
TABLES = ("verify_cost", "draft_cost", "plain_cost")


def parse_scheduling(
    raw: Mapping[str, object], threshold: float
) -> tuple[str, CostTable | None, CostTable | None, CostTable | None]:
    """``speculative_config``'s schedule: ``"scheduling"`` (or vLLM's
    ``"enable_adaptive_verification"``), ``"verify_cost"`` (``{tokens: seconds}``, JSON's
    string keys accepted), ``"draft_cost"`` (``{requests: seconds}``) and ``"plain_cost"``
    (``{rows: seconds}``, a plain step's); combinations that contradict each other are refused
    by name."""
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
    for name in TABLES:
        table = raw.get(name)
        if table is not None and mode != "adaptive":
            raise InvalidRequestError(
                "speculative_config", f"{name} prices adaptive scheduling; scheduling is 'fixed'"
            )
        tables.append(None if table is None else _cost_table(name, table))
    return mode, tables[0], tables[1], tables[2]


def _cost_table(name: str, table: object) -> CostTable:
    """``{count: seconds}`` as sorted pairs, each checked (count >= 1, seconds > 0)."""
    if not isinstance(table, Mapping) or not table:
        raise InvalidRequestError("speculative_config", f"{name} must be a non-empty dict")
    unit = {"verify_cost": "tokens", "draft_cost": "requests", "plain_cost": "rows"}[name]
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


@dataclass(frozen=True)
class SpeculativeConfig:
    """vLLM's ``speculative_config``: ``{"method": "mtp", "num_speculative_tokens": k}``;
    ``"scheduling": "adaptive"`` (vLLM: ``"enable_adaptive_verification": True``) plans each
    step's verified drafts from their confidences and the step's cost (:mod:`.verify_schedule`;
    ``"verify_cost": {tokens: seconds}``, ``"plain_cost": {rows: seconds}`` and
    ``"draft_cost": {requests: seconds}`` give the costs instead of profiling them)."""

    method: str
    num_speculative_tokens: int
    #: the drafter's directory (DSpark; None: the one shipped for the model, if any)
    model: str | None = None
    #: DSpark's static threshold (``dspark.md`` §7): verify drafts up to the first whose
    #: confidence is below it (0: every draft)
    confidence_threshold: float = 0.0
    scheduling: str = "fixed"
    verify_cost: tuple[tuple[int, float], ...] | None = None
    draft_cost: tuple[tuple[int, float], ...] | None = None
    plain_cost: tuple[tuple[int, float], ...] | None = None
    #: draft eagerly even where the engine has CUDA graphs (vLLM's name); verification steps
    #: keep theirs
    enforce_eager: bool = False

    @classmethod
    def parse(cls, raw: object) -> SpeculativeConfig | None:
        if raw is None or isinstance(raw, SpeculativeConfig):
            return raw
        if not isinstance(raw, dict):
            raise InvalidRequestError("speculative_config", "must be a dict or None")
        known = {"method", "num_speculative_tokens", "model", "confidence_threshold"}
        known |= {"enforce_eager"}
        known |= {"scheduling", "enable_adaptive_verification", *TABLES}
        unknown = set(raw) - known
        if unknown:
            raise InvalidRequestError("speculative_config", f"unknown keys {sorted(unknown)}")
        method, k = raw.get("method"), raw.get("num_speculative_tokens")
        if not isinstance(method, str):
            raise InvalidRequestError("speculative_config", "needs 'method' ('mtp' or 'dspark')")
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= 16:
            raise InvalidRequestError(
                "speculative_config", f"num_speculative_tokens must be 1..16, got {k!r}"
            )
        model = raw.get("model")
        if model is not None and (method != "dspark" or not isinstance(model, str)):
            raise InvalidRequestError(
                "speculative_config",
                "'model' names a DSpark drafter directory (MTP drafts with the checkpoint's "
                "own layers)",
            )
        threshold = raw.get("confidence_threshold", 0.0)
        if not isinstance(threshold, int | float) or isinstance(threshold, bool):
            raise InvalidRequestError("speculative_config", "confidence_threshold must be a number")
        if (threshold and method != "dspark") or not 0.0 <= threshold <= 1.0:
            raise InvalidRequestError(
                "speculative_config",
                f"confidence_threshold is DSpark's, in [0, 1]; got {threshold!r} for {method!r}",
            )
        eager = raw.get("enforce_eager", False)
        if not isinstance(eager, bool):
            raise InvalidRequestError("speculative_config", "enforce_eager must be a bool")
        scheduling = parse_scheduling(raw, float(threshold))
        return cls(method, k, model, float(threshold), *scheduling, enforce_eager=eager)


def check_params(params: SamplingParams) -> None:
    """Refuse the sampling options a speculative step does not apply (see the module)."""
    defaults = SamplingParams()
    for name in UNSUPPORTED:
        if getattr(params, name, None) != getattr(defaults, name, None):
            raise InvalidRequestError(name, "not supported with speculative decoding yet")
