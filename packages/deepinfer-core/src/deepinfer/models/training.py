"""Training forwards: the inference maths with autograd on, plus the MTP layers' predictions.

Inference runs under ``no_grad``; training needs gradients through the very same code, so these
call the model's undecorated one-span pass (``run_span``) under
``enable_grad``. Parameters are created with ``requires_grad=False``; a trainer switches on the
ones it optimises. Selections (top-k routing, indexer picks) pass no gradient, as in any
MoE/sparse model.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor, nn

from deepinfer.models.batch import SequenceSpan
from deepinfer.models.layers.block import ForwardContext
from deepinfer.models.layers.norm import Embedding, Linear
from deepinfer.models.trunk import StepModel


class TrainableModel(StepModel, Protocol):
    """The model as training sees it (:class:`~deepinfer.models.causal_lm.DeepseekCausalLM`)."""

    embed: Embedding
    head: Linear
    mtp: nn.ModuleList

    def run_span(
        self, input_ids: Tensor, span: SequenceSpan, image_embeds: Tensor | None = None
    ) -> tuple[Tensor, Tensor]: ...


def mtp_context(model: TrainableModel, ids: Tensor, start: int) -> ForwardContext:
    """The context an MTP layer runs in: ``ids`` [B, S] at positions ``start..``."""
    positions = torch.arange(start, start + ids.shape[1], device=ids.device)
    return ForwardContext(model.ops, positions, ids, model.rotary)


def train_logits(
    model: TrainableModel, input_ids: Tensor, with_mtp: bool
) -> tuple[Tensor, list[Tensor]]:
    """(logits [B, S, V], one [B, S - 1 - k, V] tensor per MTP depth k) from a fresh state.

    Depth k's row t predicts token ``t + 2 + k`` from the main streams at t (chained through the
    earlier depths' output streams) and the embedding of token ``t + 1 + k``, the way
    ``mtp_forward`` feeds them at decode time.
    """
    with torch.enable_grad():
        b, s = input_ids.shape
        state = model.new_state(b)
        logits, streams = model.run_span(input_ids, SequenceSpan.new(state, s, s))
        if not with_mtp:
            return logits, []
        input_ids = input_ids.to(model.device)
        out: list[Tensor] = []
        h, nxt = streams[:, :-1], input_ids[:, 1:]
        for block in model.mtp:
            if nxt.shape[1] == 0:
                break
            block_state = block.new_state(b, model.dtype, model.device)
            ctx = mtp_context(model, nxt, 0)
            hidden, h = block.predict(h, model.embed(nxt), ctx, block_state)
            out.append(model.head(model.ops, hidden))
            h, nxt = h[:, :-1], nxt[:, 1:]
        return logits, out
