"""Drafting with the checkpoint's MTP layer: k tokens a round, chained through one layer.

An MTP layer predicts the token two positions ahead from the target's final residual streams at
position t and the token at t + 1. A round first feeds it, with the target's own streams, every
position verified since the last round (the anchor and the drafts the target kept); the last of
those predicts the first draft. Each further draft feeds the layer its own output streams and
the draft before (the layer is reused, as vLLM does when ``num_speculative_tokens`` exceeds the
checkpoint's MTP depth). Those chained positions saw approximate streams, so the layer is rolled
back to the verified positions right after drafting; the next round feeds them again with the
target's streams once they are verified.

Drafts are the MTP logits' argmax (a deterministic proposal), which verification accepts with
the target's own probability of the token: lossless at any temperature. Each comes with a
confidence, the MTP layer's own softmax probability of it (the chance it survives, as the layer
sees it, if the drafts before it did): what the adaptive schedule plans with (the engine learns
how far to trust it, ``engine/verify_schedule.py``) and the static ``confidence_threshold``
cuts at. The cut depends on the drafter alone, so verification stays lossless.

With the engine's CUDA graphs (:meth:`MTPDrafter.use_graphs`) a whole round replays one graph
per batch bucket (:mod:`.mtp_graphed`).

Under expert parallelism the MTP layer's MoE is a collective, so a round first agrees with the
other ranks on its ``k`` passes (ranks drafting nothing this step run dummy passes to match,
:mod:`deepinfer.dp.lockstep`) and each pass on its rows, as the target's forwards do; its
chained passes then stay eager (a graph holds no agreement).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from deepinfer.models.causal_lm import DeepseekCausalLM
from deepinfer.models.graphs import DecodeGraphs
from deepinfer.models.mtp_pass import mtp_forward_ragged, mtp_slotted
from deepinfer.models.rollback import rollback_mtp_layers
from deepinfer.models.state import ModelState
from deepinfer.parallel import find_expert_parallel
from deepinfer_spec.confidence import ThresholdDrafter, confident
from deepinfer_spec.mtp_graphed import GraphedMTPRounds


@dataclass
class Draft:
    tokens: Tensor  # [k] long: the proposed tokens
    logits: Tensor  # [k, V] fp32: the MTP logits each was the argmax of


class MTPDrafter(ThresholdDrafter):
    """Proposes ``k`` tokens per round for one sequence from its MTP layer (see the module)."""

    def __init__(self, model: DeepseekCausalLM, k: int, confidence_threshold: float = 0.0) -> None:
        if not model.has_mtp:
            raise ValueError("the model has no MTP layers to draft with")
        if k < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1, got {k}")
        self.model = model
        self.k = k
        self.threshold = confidence_threshold
        #: rounds replayed from the engine's CUDA graphs (None: eager passes)
        self.graphed: GraphedMTPRounds | None = None

    def use_graphs(self, graphs: DecodeGraphs) -> None:
        """Replay rounds from ``graphs`` (the engine's) on a GPU without expert parallelism;
        else keep them eager."""
        model = self.model
        if model.device.type == "cuda" and find_expert_parallel(model) is None:
            self.graphed = GraphedMTPRounds(model, graphs, self.k)

    def capture_graphs(self, state: ModelState) -> None:
        """Capture every batch bucket's round now, over the MTP ring of ``state`` (a
        throwaway state of the engine's slots), as the engine captures its decode steps, so
        no run pays for a capture."""
        if self.graphed is not None and mtp_slotted([state]):
            self.graphed.capture(state)

    @torch.no_grad()
    def draft(self, state: ModelState, streams: Tensor, next_ids: Tensor) -> Draft:
        """Feed the MTP layer the verified positions since the last round (``streams``
        [m, hc, d]: the target's at positions ``state.mtp_pos ..``; ``next_ids`` [m]: the
        token one position after each) and chain ``k`` drafts after them. The layer ends at
        the verified positions (``state.mtp_pos`` grows by m)."""
        model = self.model
        logits, out = model.mtp_forward(streams[None], next_ids[None], state)
        verified = state.mtp_pos
        rows, tokens = [logits[0, -1]], [int(torch.argmax(logits[0, -1]))]
        for _ in range(self.k - 1):
            ids = torch.tensor([[tokens[-1]]], device=model.device)
            logits, out = model.mtp_forward(out[:, -1:], ids, state)
            rows.append(logits[0, -1])
            tokens.append(int(torch.argmax(logits[0, -1])))
        rollback_mtp_layers(state, verified)
        return Draft(torch.tensor(tokens, device=model.device), torch.stack(rows))

    @property
    def profile_key(self) -> str:
        """What a round's cost depends on besides the target (whether its rounds replay
        graphs): the engine's start-up profile is cached under it."""
        return json.dumps({"mtp": True, "graphed": self.graphed is not None})

    @torch.no_grad()
    def draft_with_confidence(
        self,
        states: Sequence[ModelState],
        streams: Tensor,
        next_ids: Tensor,
        lengths: Sequence[int],
    ) -> tuple[Tensor, Tensor]:
        """:meth:`draft` for many sequences whose MTP rings live in the engine's slots, as one
        ragged pass of the layer per draft (or a round's graph): span i feeds ``lengths[i]``
        verified positions (``streams`` [N, hc, d] and ``next_ids`` [N], spans one after the
        other). Returns the drafts [n, k] (none cut) and their confidences [n, k] (fp32): what
        adaptive verification plans with; ``draft_batch`` cuts them at the threshold."""
        if self.graphed is not None and mtp_slotted(states):
            return self.graphed.draft(states, streams, next_ids, list(lengths))
        model = self.model
        ep = find_expert_parallel(model)
        if ep is not None:
            ep.agree_passes(self.k)

        def moe_pass(tokens: int) -> contextlib.AbstractContextManager[None]:
            return ep.forward(tokens) if ep is not None else contextlib.nullcontext()

        with moe_pass(len(next_ids)):
            logits, out = mtp_forward_ragged(model, states, streams, next_ids, lengths)
        verified = [s.mtp_pos for s in states]
        ends = torch.tensor(list(lengths)).cumsum(0) - 1
        picks = [confident(logits)]
        out = out[ends.to(out.device)]
        for _ in range(self.k - 1):
            with moe_pass(len(states)):
                logits, out = mtp_forward_ragged(
                    model, states, out, picks[-1][0], [1] * len(states)
                )
            picks.append(confident(logits))
        for state, length in zip(states, verified, strict=True):
            rollback_mtp_layers(state, length)
        return torch.stack([t for t, _ in picks], dim=1), torch.stack([c for _, c in picks], dim=1)
