"""Speculator factories registered under ``deepinfer.speculators``.

``mtp`` drafts with the checkpoint's own MTP layer (:class:`~deepinfer_spec.mtp.MTPDrafter`);
``dspark`` with a DSpark drafter (:mod:`deepinfer_spec.dspark`) reading the target's layer
outputs: the one shipped for the embedded tiny model, or the directory given as
``speculative_config["model"]``. The engine verifies either's drafts
(``LLM(..., speculative_config={"method": ..., "num_speculative_tokens": k})``).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

from deepinfer.models.causal_lm import DeepseekCausalLM
from deepinfer.models.state import ModelState
from deepinfer.plugins import Availability
from deepinfer_spec.dspark.draft import DraftContext, propose
from deepinfer_spec.dspark.weights import SHIPPED, load_drafter
from deepinfer_spec.mtp import MTPDrafter


class DSparkSpeculator:
    """DSpark in the engine: a block of drafts per request and round, its first ``k`` verified.

    Drafts are the drafter's greedy choices (deterministic drafts, which verification keeps
    lossless at any temperature). With ``confidence_threshold`` > 0 a row stops at the first
    draft whose confidence is below it (``dspark.md`` §7; -1 past it): the cut depends on the
    drafter alone, so verification stays lossless. With adaptive scheduling the engine takes
    the confidences with the drafts (:meth:`draft_with_confidence`) and plans the cut itself.
    Each request's drafter context follows its state and starts again when the state does (a
    preemption, a prefix-cache hit). Requests are drafted one after another: the drafter is
    small, and batching its rounds is the next step.
    """

    name = "dspark"

    @classmethod
    def availability(cls) -> Availability:
        return Availability(True)

    def __init__(
        self,
        model: DeepseekCausalLM,
        num_speculative_tokens: int,
        path: str | None = None,
        confidence_threshold: float = 0.0,
    ) -> None:
        self.drafter = load_drafter(Path(path) if path else SHIPPED, model)
        block = self.drafter.c.block_size
        if num_speculative_tokens > block:
            raise ValueError(
                f"the DSpark drafter proposes {block} tokens a round; "
                f"num_speculative_tokens={num_speculative_tokens} asks for more"
            )
        self.model = model
        self.k = num_speculative_tokens
        self.threshold = confidence_threshold
        self.feature_layers = self.drafter.c.target_layer_ids
        #: each live state's drafter context, by id (states compare by value, so they are
        #: no dict keys); the reference tells a reused id from the state it was taken for
        self.contexts: dict[int, tuple[weakref.ref[ModelState], DraftContext]] = {}

    def draft_batch(
        self,
        states: Sequence[ModelState],
        streams: Tensor,
        next_ids: Tensor,
        lengths: Sequence[int],
    ) -> Tensor:
        """[requests, k] drafts; ``streams`` are the feature rows of each request's newly
        verified positions, ``next_ids`` the token after each (the last: the anchor). With a
        threshold, -1 from the first draft whose confidence is below it."""
        tokens, confidence = self.draft_with_confidence(states, streams, next_ids, lengths)
        if self.threshold > 0:  # a non-anticipating cut: the drafter's own confidences only
            low = (confidence < self.threshold).cumsum(dim=1) > 0
            tokens = tokens.masked_fill(low, -1)
        return tokens

    @torch.no_grad()
    def draft_with_confidence(
        self,
        states: Sequence[ModelState],
        streams: Tensor,
        next_ids: Tensor,
        lengths: Sequence[int],
    ) -> tuple[Tensor, Tensor]:
        """[requests, k] drafts (as :meth:`draft_batch`, none cut) and [requests, k] their
        confidences: what adaptive verification plans with (``scheduling: "adaptive"``)."""
        self.contexts = {k: v for k, v in self.contexts.items() if v[0]() is not None}
        tokens, confidence, end = [], [], 0
        for state, n in zip(states, lengths, strict=True):
            features, end = streams[end : end + n], end + n
            first = state.pos - n
            ref, ctx = self.contexts.get(id(state), (None, None))
            if ctx is None or ref is None or ref() is not state or ctx.end != first:
                ctx = DraftContext(first=first)
                self.contexts[id(state)] = (weakref.ref(state), ctx)
            ctx.absorb(self.drafter, features)
            anchor = int(next_ids[end - 1])
            prop = propose(self.drafter, ctx, anchor, self.model.embed, self.model.logits)
            tokens.append(prop.tokens[: self.k])
            confidence.append(prop.confidence[: self.k].float())
        return torch.stack(tokens), torch.stack(confidence)


class MTPSpeculator(MTPDrafter):
    """Multi-token prediction with the checkpoint's MTP layers as the drafter: the engine
    builds one with ``(model, num_speculative_tokens)`` and calls ``draft_batch``."""

    name = "mtp"

    @classmethod
    def availability(cls) -> Availability:
        return Availability(True)
