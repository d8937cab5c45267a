"""Speculator factories registered under ``deepinfer.speculators``.

``mtp`` drafts with the checkpoint's own MTP layer (:class:`~deepinfer_spec.mtp.MTPDrafter`);
the engine verifies its drafts (``LLM(..., speculative_config={"method": "mtp", ...})``).
``dspark`` is registered so that configuration and ``deepinfer info`` see it, but constructing
it raises, naming what is missing, instead of silently decoding without speculation.
"""

from __future__ import annotations

from typing import Any

from deepinfer.plugins import Availability
from deepinfer_spec.mtp import MTPDrafter


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


class MTPSpeculator(MTPDrafter):
    """Multi-token prediction with the checkpoint's MTP layers as the drafter: the engine
    builds one with ``(model, num_speculative_tokens)`` and calls ``draft_batch``."""

    name = "mtp"

    @classmethod
    def availability(cls) -> Availability:
        return Availability(True)
