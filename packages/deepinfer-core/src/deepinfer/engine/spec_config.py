"""``speculative_config`` as the engine reads it (vLLM's option), and the speculation ``LLM``
runs by default for a model that ships a drafter."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass

from deepinfer import plugins
from deepinfer.checks import is_int, is_number
from deepinfer.engine.config import EngineConfig
from deepinfer.errors import InvalidRequestError

logger = logging.getLogger(__name__)

#: What ``LLM("tiny")`` speculates with when not given ``speculative_config``: the DSpark
#: drafter shipped for the embedded model (``deepinfer-spec``), five drafts a round, each step
#: verifying what its confidences and the profiled costs say pays (a step it does not pay for
#: runs plain). ``speculative_config=None`` turns it off.
TINY_SPECULATION: dict[str, object] = {
    "method": "dspark",
    "num_speculative_tokens": 5,
    "scheduling": "adaptive",
}
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
    #: The static threshold (``dspark.md`` §7): verify drafts up to the first whose
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
        if not 0.0 <= threshold <= 1.0:
            raise InvalidRequestError(
                "speculative_config", f"confidence_threshold must be in [0, 1], got {threshold!r}"
            )
        eager = raw.get("enforce_eager", False)
        if not isinstance(eager, bool):
            raise InvalidRequestError("speculative_config", "enforce_eager must be a bool")
        scheduling = parse_scheduling(raw, float(threshold))
        return cls(method, k, model, float(threshold), *scheduling, enforce_eager=eager)


def default_speculation(
    model: str, config: EngineConfig, data_parallel: bool, device: str
) -> dict[str, object] | None:
    """``speculative_config`` for ``LLM(model)`` when it is not given: the embedded model's
    drafter (:data:`TINY_SPECULATION`) where its plugin is installed, in one process, and
    unless an option that speculation cannot be combined with is on (asynchronous scheduling,
    batch invariance); None otherwise. On a GPU asynchronous scheduling is on by default and
    stays so: there the tiny model's steps are a millisecond or two of mostly host work, and
    its speculation ran at 0.7x-1.1x of no speculation (``benchmarks/results/
    speculative_h200.json``), before the overlap that asynchronous scheduling adds."""
    if model != "tiny" or data_parallel or "dspark" not in plugins.speculators:
        return None
    on_gpu = not device.startswith("cpu")
    if (
        config.async_scheduling
        or config.batch_invariant
        or (on_gpu and config.async_scheduling is None)
    ):
        logger.info(
            "speculation: the tiny model's default drafter is off (asynchronous scheduling or "
            "batch invariance is on; async_scheduling=False turns it on)"
        )
        return None
    logger.info(
        "speculation: DSpark with the tiny model's drafter (speculative_config=None turns it off)"
    )
    return dict(TINY_SPECULATION)
