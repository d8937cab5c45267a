"""``speculative_config`` as the engine reads it (vLLM's option), and the sampling options a
speculative step refuses by name."""

from __future__ import annotations

from dataclasses import dataclass

from deepinfer.engine.verify_schedule import TABLES, parse_scheduling
from deepinfer.errors import InvalidRequestError
from deepinfer.sampling_params import SamplingParams

#: Sampling options a speculative step does not apply yet: refused by name rather than ignored
#: (prompt logprobs need every logit of a prompt chunk, which its prefill keeps one of).
UNSUPPORTED = ("prompt_logprobs",)


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

    @classmethod
    def parse(cls, raw: object) -> SpeculativeConfig | None:
        if raw is None or isinstance(raw, SpeculativeConfig):
            return raw
        if not isinstance(raw, dict):
            raise InvalidRequestError("speculative_config", "must be a dict or None")
        known = {"method", "num_speculative_tokens", "model", "confidence_threshold"}
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
        return cls(method, k, model, float(threshold), *parse_scheduling(raw, float(threshold)))


def check_params(params: SamplingParams) -> None:
    """Refuse the sampling options a speculative step does not apply (see the module)."""
    defaults = SamplingParams()
    for name in UNSUPPORTED:
        if getattr(params, name, None) != getattr(defaults, name, None):
            raise InvalidRequestError(name, "not supported with speculative decoding yet")
