"""Speculator factories registered under ``deepinfer.speculators``.

``mtp`` drafts with the checkpoint's own MTP layer (:class:`~deepinfer_spec.mtp.MTPDrafter`);
``dspark`` with a DSpark drafter (:mod:`deepinfer_spec.dspark`) reading the target's layer
outputs: the one shipped for the embedded tiny model, or the directory given as
``speculative_config["model"]``. The engine verifies either's drafts
(``LLM(..., speculative_config={"method": ..., "num_speculative_tokens": k})``).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import weakref
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

from deepinfer.models.causal_lm import DeepseekCausalLM
from deepinfer.models.graphs import DecodeGraphs
from deepinfer.models.state import ModelState
from deepinfer.plugins import Availability
from deepinfer_spec.confidence import ThresholdDrafter
from deepinfer_spec.dspark.batch import absorb_all, propose_batch
from deepinfer_spec.dspark.draft import DraftContext
from deepinfer_spec.dspark.graphed import GraphedRounds
from deepinfer_spec.dspark.weights import SHIPPED, load_acceptance, load_drafter
from deepinfer_spec.mtp import MTPDrafter

#: Context positions of each made-up request of :meth:`DSparkSpeculator.dummy_draft`.
DUMMY_CONTEXT = 128


class DSparkSpeculator(ThresholdDrafter):
    """DSpark in the engine: a block of drafts per request and round, its first ``k`` verified.

    Drafts are the drafter's greedy choices (deterministic drafts, which verification keeps
    lossless at any temperature). With ``confidence_threshold`` > 0 a row stops at the first
    draft whose confidence is below it (``dspark.md`` §7; -1 past it): the cut depends on the
    drafter alone, so verification stays lossless. With adaptive scheduling the engine takes
    the confidences with the drafts (:meth:`draft_with_confidence`) and plans the cut itself.
    Each request's drafter context follows its state and starts again when the state does (a
    preemption, a prefix-cache hit). All requests of a round are drafted in one pass of the
    drafter (:mod:`~deepinfer_spec.dspark.batch`), so a round's drafting cost grows far slower
    than its number of requests, which the verify planner weighs (:meth:`dummy_draft`). With
    the engine's CUDA graphs and a drafter whose context is a sliding window, rounds replay
    graphs over a context ring per slot instead (:meth:`use_graphs`).
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
        where = Path(path) if path else SHIPPED
        self.drafter = load_drafter(where, model)
        #: What the adaptive schedule expects of a round before it has drafted any: this
        #: drafter's acceptance per position on held-out text, as trained (None: unknown).
        self.acceptance_prior = load_acceptance(where)
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
        #: rounds replayed from CUDA graphs (None: eager rounds over ``contexts``)
        self.graphed: GraphedRounds | None = None

    def use_graphs(self, graphs: DecodeGraphs) -> None:
        """Draft through ``graphs`` (the engine's) where the drafter's context is bounded
        (``sliding_window``) and the model is on a GPU; else keep drafting eagerly."""
        if self.drafter.c.sliding_window is not None and self.model.device.type == "cuda":
            self.graphed = GraphedRounds(
                self.drafter, self.model.embed, self.model.logits, graphs, self.k
            )
            self.graphed.capture(DUMMY_CONTEXT)

    @torch.no_grad()
    def draft_with_confidence(
        self,
        states: Sequence[ModelState],
        streams: Tensor,
        next_ids: Tensor,
        lengths: Sequence[int],
    ) -> tuple[Tensor, Tensor]:
        """[requests, k] drafts (none cut) and [requests, k] their confidences: what adaptive
        verification plans with (``scheduling: "adaptive"``); ``draft_batch`` cuts them at the
        threshold. ``streams`` are the feature rows of each request's newly verified
        positions, ``next_ids`` the token after each (the last: the anchor)."""
        if self.graphed is not None and self.graphed.covers(states):
            tokens, confidence = self.graphed.draft(states, streams, next_ids, list(lengths))
            return tokens[:, : self.k], confidence[:, : self.k].float()
        self.contexts = {k: v for k, v in self.contexts.items() if v[0]() is not None}
        contexts = [self._context(s, n) for s, n in zip(states, lengths, strict=True)]
        absorb_all(self.drafter, contexts, streams, lengths)
        anchors = next_ids[torch.tensor(list(itertools.accumulate(lengths))) - 1]
        tokens, confidence = propose_batch(
            self.drafter, contexts, anchors, self.model.embed, self.model.logits
        )
        return tokens[:, : self.k], confidence[:, : self.k].float()

    def _context(self, state: ModelState, n: int) -> DraftContext:
        """``state``'s drafter context, started again unless it ends where the ``n`` newly
        verified positions begin (a new state, a preemption, a prefix-cache hit)."""
        first = state.pos - n
        ref, ctx = self.contexts.get(id(state), (None, None))
        if ctx is None or ref is None or ref() is not state or ctx.end != first:
            ctx = DraftContext(first=first)
            self.contexts[id(state)] = (weakref.ref(state), ctx)
        return ctx

    @property
    def profile_key(self) -> str:
        """What a round's cost depends on besides the target (the drafter's shape and whether
        its rounds replay graphs): the engine's start-up profile is cached under it."""
        shape = dataclasses.asdict(self.drafter.c)
        return json.dumps({"dspark": shape, "graphed": self.graphed is not None}, sort_keys=True)

    @torch.no_grad()
    def dummy_draft(self, num_requests: int) -> None:
        """One drafting round over ``num_requests`` made-up requests, as the engine runs it:
        each absorbs ``k + 1`` newly verified positions after :data:`DUMMY_CONTEXT` context
        positions (random keys and values, made before the round) and drafts a block."""
        if self.graphed is not None:
            self.graphed.dummy(num_requests, DUMMY_CONTEXT)
            return
        c, device = self.drafter.c, self.drafter.fc.weight.device
        dtype = self.drafter.fc.weight.dtype
        gen = torch.Generator().manual_seed(0)
        shape = (1, DUMMY_CONTEXT, c.num_heads, c.head_dim)
        kv = [(torch.randn(shape, generator=gen), torch.randn(shape, generator=gen))
              for _ in range(c.num_layers)]  # fmt: skip
        kv = [(k.to(device, dtype), v.to(device, dtype)) for k, v in kv]
        contexts = [DraftContext(kv=list(kv)) for _ in range(num_requests)]
        new = torch.randn(num_requests * (self.k + 1), c.feature_size, generator=gen)
        anchors = torch.randint(3, c.vocab_size, (num_requests,), generator=gen)
        absorb_all(self.drafter, contexts, new.to(device, dtype), [self.k + 1] * num_requests)
        propose_batch(self.drafter, contexts, anchors, self.model.embed, self.model.logits)


class MTPSpeculator(MTPDrafter):
    """Multi-token prediction with the checkpoint's MTP layers as the drafter: the engine
    builds one with ``(model, num_speculative_tokens)`` and calls ``draft_batch``."""

    name = "mtp"

    @classmethod
    def availability(cls) -> Availability:
        return Availability(True)
