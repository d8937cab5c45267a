"""Speculator factories registered under ``deepinfer.speculators``.

Both are registered so that configuration and ``deepinfer info`` see them, but the engine does not
run speculative steps yet: constructing one raises, naming what is missing, instead of silently
decoding without speculation. MTP drafting and lossless verification exist for one sequence
(:func:`deepinfer_spec.speculative.speculative_generate`, the engine's future reference).
"""

from __future__ import annotations

from typing import Any

from deepinfer.plugins import Availability


class DSparkSpeculator:
    """DSpark: a drafter proposes 5 tokens; a confidence head picks how many to verify."""

    name = "dspark"

    @classmethod
    def availability(cls) -> Availability:
        return Availability(False, "not implemented in deepinfer-spec 0.1")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(
            "DSpark speculative decoding is not implemented in deepinfer-spec "
            "0.1: the drafter, confidence head and verification are still missing"
        )


class MTPSpeculator:
    """Multi-token prediction with the checkpoint's MTP layers as the drafter."""

    name = "mtp"

    @classmethod
    def availability(cls) -> Availability:
        return Availability(False, "not implemented in deepinfer-spec 0.1")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(
            "MTP speculative decoding in the engine is not implemented in deepinfer-spec 0.1: "
            "drafting and verification run for one sequence "
            "(deepinfer_spec.speculative.speculative_generate), the engine's speculative "
            "steps are still missing"
        )
