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
the target's own probability of the token: lossless at any temperature.

With the engine's CUDA graphs (:meth:`MTPDrafter.use_graphs`) the ``k - 1`` chained passes,
one token a request each, are decode passes of the layer over its slotted rings, all of them
replayed from one graph per batch bucket (captured at engine start, :meth:`capture_graphs`):
run eagerly they are ``k - 1`` ragged passes of many small kernels each, several times a
replayed verification step on a GPU. The first pass, of any number of verified positions a
request, stays ragged and eager.

Under expert parallelism the MTP layer's MoE is a collective, so a round first agrees with the
other ranks on its ``k`` passes (ranks drafting nothing this step run dummy passes to match,
:mod:`deepinfer.dp.lockstep`) and each pass on its rows, as the target's forwards do; its
chained passes then stay eager (a graph holds no agreement).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from deepinfer.models.causal_lm import DeepseekCausalLM
from deepinfer.models.graphs import DecodeGraphs
from deepinfer.models.layers.block import ForwardContext
from deepinfer.models.layouts import SlotRows
from deepinfer.models.mtp_pass import mtp_forward_ragged, mtp_slotted
from deepinfer.models.rollback import rollback_mtp_layers
from deepinfer.models.state import ModelState
from deepinfer.parallel import find_expert_parallel
from deepinfer.transfer import to_device


@dataclass
class Draft:
    tokens: Tensor  # [k] long: the proposed tokens
    logits: Tensor  # [k, V] fp32: the MTP logits each was the argmax of


class MTPDrafter:
    """Proposes ``k`` tokens per round for one sequence from its MTP layer (see the module)."""

    def __init__(self, model: DeepseekCausalLM, k: int) -> None:
        if not model.has_mtp:
            raise ValueError("the model has no MTP layers to draft with")
        if k < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1, got {k}")
        self.model = model
        self.k = k
        #: the engine's graphs, which replay the chained passes (None: eager)
        self.graphs: DecodeGraphs | None = None

    def use_graphs(self, graphs: DecodeGraphs) -> None:
        """Replay the chained passes from ``graphs`` (the engine's) on a GPU without expert
        parallelism; else keep them eager."""
        model = self.model
        if self.k > 1 and model.device.type == "cuda" and find_expert_parallel(model) is None:
            self.graphs = graphs

    @torch.no_grad()
    def capture_graphs(self, state: ModelState) -> None:
        """Capture every batch bucket's chained passes now, over the MTP ring of ``state`` (a
        throwaway state of the engine's slots), as the engine captures its decode steps, so
        no run pays for a capture. The made-up rounds run in the padding slot."""
        if self.graphs is None or not mtp_slotted([state]):
            return
        model, cfg = self.model, self.model.cfg
        for bucket in self.graphs.buckets:
            zeros = torch.zeros(bucket, dtype=torch.long, device=model.device)
            streams = torch.zeros(
                bucket, cfg.hc_mult, cfg.hidden_size, dtype=model.dtype, device=model.device
            )
            self._chained(state, streams, zeros, zeros, zeros)

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

    @torch.no_grad()
    def draft_batch(
        self,
        states: Sequence[ModelState],
        streams: Tensor,
        next_ids: Tensor,
        lengths: Sequence[int],
    ) -> Tensor:
        """:meth:`draft` for many sequences whose MTP rings live in the engine's slots, as one
        ragged pass of the layer per draft: span i feeds ``lengths[i]`` verified positions
        (``streams`` [N, hc, d] and ``next_ids`` [N], spans one after the other). Returns the
        drafts [n, k]."""
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
        drafts = [logits.argmax(dim=-1)]
        out = out[ends.to(out.device)]
        if self.graphs is not None and self.k > 1:
            where = [(s.mtp_pos, s.mtp[0].swa.slot) for s in states]
            at = to_device(torch.tensor(where), out.device)
            chained = self._chained(states[0], out, drafts[0], at[:, 0], at[:, 1])
            for state, length in zip(states, verified, strict=True):
                rollback_mtp_layers(state, length)  # (the graph moved no host counter)
            return torch.cat((drafts[0][:, None], chained), dim=1)
        for _ in range(self.k - 1):
            with moe_pass(len(states)):
                logits, out = mtp_forward_ragged(model, states, out, drafts[-1], [1] * len(states))
            drafts.append(logits.argmax(dim=-1))
        for state, length in zip(states, verified, strict=True):
            rollback_mtp_layers(state, length)
        return torch.stack(drafts, dim=1)

    def _chained(
        self, state: ModelState, out: Tensor, ids: Tensor, positions: Tensor, slots: Tensor
    ) -> Tensor:
        """The drafts [n, k - 1] after ``ids`` [n] (the first drafts), chained from the
        layer's output streams ``out`` [n, hc, d] at ``positions`` [n] in the MTP ring rows
        ``slots`` [n] of ``state``'s slot tensor, through the graph of this batch's bucket."""
        pool = state.mtp[0].swa.pool
        assert self.graphs is not None and pool is not None

        def passes(out: Tensor, ids: Tensor, positions: Tensor, slots: Tensor) -> tuple[Tensor]:
            model, block, drafts = self.model, self.model.mtp[0], []
            for j in range(self.k - 1):
                step = ids[:, None]
                ctx = ForwardContext(model.ops, (positions + j)[:, None], step, model.rotary)
                hidden, x = block.predict(
                    out[:, None], model.embed(step), ctx, SlotRows(pool, slots)
                )
                ids, out = model.head(model.ops, hidden[:, 0]).argmax(dim=-1), x[:, 0]
                drafts.append(ids)
            return (torch.stack(drafts, dim=1),)

        key = ("mtp", self.k, pool.data_ptr())
        return self.graphs.run(key, passes, out, ids, positions, slots)[0].clone()
