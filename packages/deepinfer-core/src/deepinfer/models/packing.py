"""Spans of sequences whose states hold their own tensors, in one packed pass over the layers.

Token-wise work (projections, MoE, mHC) runs once over all tokens of the step; each layer's
attention walks the spans, each with its own state. States in the engine's shared slot tensors
take the ragged pass instead (:mod:`.ragged`), whose op count does not grow with the spans; this
pass serves states built on their own (``model.new_state()``: tests, tools), where a few ops per
span do not matter. A sequence's state can also be handed back as it stood at lengths inside its
span (``record_at``): the layers copy the ring and the open windows as they pass those positions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from deepinfer.models.batch import SequenceSpan
from deepinfer.models.layouts import Packed, per_layer_states
from deepinfer.models.state import ModelState, clone_or_none
from deepinfer.models.state_views import clear_marks, set_marks, states_at
from deepinfer.models.trunk import LayerInputs, StepModel, history_after
from deepinfer.transfer import to_device


@dataclass
class PackedResult:
    logits: Tensor  # [sum of num_logits, V] in span order
    views: list[list[ModelState]]  # per span, its states at ``record_at``
    streams: Tensor | None  # [same rows, hc, d] when asked for


def run_packed(
    model: StepModel,
    spans: Sequence[SequenceSpan],
    chunks: Sequence[Tensor],
    streams: bool = False,
) -> PackedResult:
    """Run single-sequence ``spans`` with ids ``chunks`` ([S] each) in one packed pass (see
    the module)."""
    states = [s.state for s in spans]
    # The Engram history before the chunk, where a state inside it must be rebuilt.
    history = [
        clone_or_none(s.token_history) if span.record_at else None
        for s, span in zip(states, spans, strict=True)
    ]
    views: list[list[ModelState]] = [[] for _ in spans]
    for state, span in zip(states, spans, strict=True):
        set_marks(state, span.record_at)
    try:
        logits, out_streams = _forward_spans(model, spans, chunks, streams)
        for i, (state, span) in enumerate(zip(states, spans, strict=True)):
            views[i] = states_at(state, span.record_at)
    finally:
        for state in states:
            clear_marks(state)
    for i, span in enumerate(spans):
        for view in views[i]:
            n = view.pos - span.start
            view.token_history = history_after(history[i], chunks[i], n, model.device)
    return PackedResult(logits, views, out_streams)


def _forward_spans(
    model: StepModel, spans: Sequence[SequenceSpan], chunks: Sequence[Tensor], streams: bool
) -> tuple[Tensor, Tensor | None]:
    """The packed pass: fp32 logits of each span's kept positions (and their streams)."""
    device = model.device
    ids = to_device(torch.cat([c.reshape(-1) for c in chunks]), device)[None]
    positions, keep, offset = [], [], 0
    engram: list[Tensor] | None = []
    for s, chunk in zip(spans, chunks, strict=True):
        n = s.num_tokens
        positions.append(torch.arange(s.state.pos, s.state.pos + n))
        offset += n
        keep += range(offset - s.num_logits, offset)
        span_ids, s.state.token_history = model.engram_ids(
            to_device(chunk.reshape(1, -1), device), s.state.token_history
        )
        engram = None if span_ids is None or engram is None else [*engram, span_ids]
    sizes = [s.num_tokens for s in spans]
    packed = [Packed(list(layer), sizes) for layer in per_layer_states([s.state for s in spans])]
    rows = to_device(torch.tensor(keep, dtype=torch.long), device)
    inputs = LayerInputs(
        ids, to_device(torch.cat(positions), device), packed, engram_ids=engram, rows=rows
    )
    logits, x = model.run_layers(inputs)
    for s in spans:
        s.state.pos += s.num_tokens
    return logits[0], x[0, rows] if streams else None
