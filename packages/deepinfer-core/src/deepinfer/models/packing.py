"""Spans of many sequences in one packed pass over the layers.

Token-wise work (projections, MoE, mHC) runs once over all tokens of the step; each layer's
attention walks the spans, each with its own state, so prefill of many requests costs about one
long forward, not one forward per request, and verification rows of k tokens ride along as
spans whose every position keeps its logits. Sequences at one position with chunks of similar
length go further: they run as one lockstep chunk, whose attention is batched too
(:func:`lockstep_groups`); on the CPU (see :data:`MAX_PADDING`) only fresh prompts of one length
do. A sequence's state can also be handed back as it stood at lengths inside its span
(``record_at``): the layers copy the ring and the open windows as they pass those positions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from deepinfer.models.batch import SequenceSpan, span_order_index
from deepinfer.models.layouts import Packed, per_layer_states
from deepinfer.models.rollback import rollback_layers
from deepinfer.models.state import ModelState, clone_or_none
from deepinfer.models.state_rows import entry_bytes_per_token, gather_rows, scatter_rows
from deepinfer.models.state_views import clear_marks, select_row, set_marks, states_at
from deepinfer.models.trunk import LayerInputs, StepModel, history_after
from deepinfer.transfer import to_device

#: Fewest fresh prompts worth a lockstep chunk of their own.
MIN_GROUP = 2
#: Most padding a lockstep group may add on an accelerator, as a fraction of its real tokens.
#: Each span of a packed pass costs its own attention ops per layer, so where the host bounds
#: the step a padded batch is far cheaper than the spans; where compute bounds it the padding is
#: wasted work, hence the cap, and none on the CPU (there padding costs more than the spans;
#: ``benchmarks/prefill.py`` measures both).
MAX_PADDING = 0.5
#: Most bytes of compressed entries a lockstep group of sequences under way may copy into its
#: batch state (each row's entries so far; a fresh prompt has none). Long contexts run as
#: spans instead, whose attention reads the entries where they are.
MAX_GATHER_BYTES = 1 << 30


@dataclass
class LockstepGroup:
    """Sequences at one position as the rows of one lockstep batch inside a packed pass."""

    ids: Tensor  # [G, S] on the device, each row padded at the end to the longest
    batch: ModelState  # G rows, with rollback slack for the padding
    lengths: list[int]  # each row's real tokens


@dataclass
class PackedResult:
    logits: Tensor  # [sum of num_logits, V] in span order
    views: list[list[ModelState]]  # per span, its states at ``record_at``
    streams: Tensor | None  # [same rows, hc, d] when asked for


def run_packed(
    model: StepModel,
    spans: Sequence[SequenceSpan],
    chunks: Sequence[Tensor],
    padding: float,
    streams: bool = False,
) -> PackedResult:
    """Run single-sequence ``spans`` with ids ``chunks`` ([S] each) in one packed pass (see
    the module); ``padding``: the most a lockstep group may pad (0: only fresh prompts of one
    length group)."""
    states = [s.state for s in spans]
    groups = lockstep_groups(spans, padding, continuing=padding > 0)
    grouped = {i for g in groups for i in g}
    # The Engram history before the chunk, where a state inside it must be rebuilt (a mark, a
    # padded group row): the forward overwrites the sequence's own.
    history = [
        clone_or_none(s.token_history) if spans[i].record_at or i in grouped else None
        for i, s in enumerate(states)
    ]
    batches = [
        _lockstep_batch(model, [spans[i] for i in g], [chunks[i] for i in g]) for g in groups
    ]
    rest = [i for i in range(len(spans)) if i not in grouped]
    views: list[list[ModelState]] = [[] for _ in spans]
    for i in rest:
        set_marks(states[i], spans[i].record_at)
    try:
        logits, out_streams = _forward_items(
            model, batches, [spans[i] for i in rest], [chunks[i] for i in rest], streams
        )
        for i in rest:
            views[i] = states_at(states[i], states[i], spans[i].record_at)
    finally:
        for i in rest:
            clear_marks(states[i])
    # Rows come out groups first, then the other spans; put them back in span order.
    if groups:
        order = [i for g in groups for i in g] + rest
        index = to_device(torch.tensor(span_order_index(order, spans)), model.device)
        logits = torch.empty_like(logits).index_copy_(0, index, logits)
        if out_streams is not None:
            out_streams = torch.empty_like(out_streams).index_copy_(0, index, out_streams)
    for group, lockstep in zip(groups, batches, strict=True):
        members = [spans[i] for i in group]
        landed = _land_group(lockstep.batch, members, [chunks[i] for i in group], history, group)
        for i, v in zip(group, landed, strict=True):
            views[i] = v
    for i, span in enumerate(spans):
        for view in views[i]:
            n = view.pos - span.start
            view.token_history = history_after(history[i], chunks[i], n, model.device)
    return PackedResult(logits, views, out_streams)


def lockstep_groups(
    spans: Sequence[SequenceSpan],
    max_padding: float = MAX_PADDING,
    continuing: bool = True,
    max_gather_bytes: int = MAX_GATHER_BYTES,
) -> list[list[int]]:
    """Indices of spans at one position (fresh prompts, or with ``continuing`` also sequences
    under way: suffixes after a prefix-cache hit, the next pieces of chunked prompts) in groups
    of at least :data:`MIN_GROUP` of similar length: each group runs as one lockstep chunk
    padded to its longest (its sequences see identical positions, so row i of a [G, S] batch
    state is sequence i's, once rolled back to its own length). Only spans that keep their
    last logits alone join. A group's padding stays within ``max_padding`` times its real
    tokens (0: equal lengths only), and the entries its rows bring along within
    ``max_gather_bytes``."""
    ready = sorted(
        (s.state.pos, s.num_tokens, i)
        for i, s in enumerate(spans)
        if not s.state.slack and s.rows == 1 and s.num_logits == 1
        if continuing or not s.state.pos
    )
    per_token = entry_bytes_per_token(spans[0].state) if ready else 0.0
    groups: list[list[int]] = []
    group: list[int] = []
    real, pos = 0, -1
    for p, n, i in ready:  # ascending: the newest member is the group's longest
        padded = (len(group) + 1) * n > (1 + max_padding) * (real + n)
        copied = (len(group) + 1) * p * per_token > max_gather_bytes
        if group and (p != pos or padded or copied):
            groups.append(group)
            group, real = [], 0
        group.append(i)
        real, pos = real + n, p
    groups.append(group)
    return [sorted(g) for g in groups if len(g) >= MIN_GROUP]


def _lockstep_batch(
    model: StepModel, spans: Sequence[SequenceSpan], chunks: Sequence[Tensor]
) -> LockstepGroup:
    """Sequences at one position as rows of one lockstep batch: their chunks as ids [G, S],
    padded at the end to the longest, and the batch state, loaded with their states and
    recording every member's ``record_at``.

    Padding changes no real token (attention is causal), only the batch state past each
    chunk's end, so the state is built with that much rollback slack and each row is rolled
    back to its own length before it lands in its sequence's state (:func:`_land_group`).
    """
    lengths = [s.num_tokens for s in spans]
    longest = max(lengths)
    rows = [
        torch.cat((c, c[-1:].expand(longest - n))) for c, n in zip(chunks, lengths, strict=True)
    ]
    ids = to_device(torch.stack(rows), model.device)
    batch = model.new_state(len(spans), slack=longest - min(lengths))
    states = [s.state for s in spans]
    if states[0].pos:
        gather_rows(states, batch)
    set_marks(batch, sorted({m for s in spans for m in s.record_at}))
    batch.pos = states[0].pos
    return LockstepGroup(ids, batch, lengths)


def _land_group(
    batch: ModelState,
    spans: Sequence[SequenceSpan],
    chunks: Sequence[Tensor],
    history: Sequence[Tensor | None],
    group: Sequence[int],
) -> list[list[ModelState]]:
    """Put each row of a lockstep batch that ran its chunk into its sequence's state (rolled
    back to the row's own length) and return each one's states at its ``record_at``;
    ``history[group[j]]``: row j's Engram history before the chunk."""
    states = [s.state for s in spans]
    start = spans[0].start
    if batch.slack == 0:
        scatter_rows(batch, states)
    else:
        device = batch.layers[0].swa.kv.device
        for j, (span, dst) in enumerate(zip(spans, states, strict=True)):
            row = select_row(batch, j)
            rollback_layers(row, start + span.num_tokens)
            row.token_history = history_after(history[group[j]], chunks[j], span.num_tokens, device)
            scatter_rows(row, [dst])
    return [
        states_at(batch, dst, span.record_at, row=j)
        for j, (dst, span) in enumerate(zip(states, spans, strict=True))
    ]


def _forward_items(
    model: StepModel,
    groups: Sequence[LockstepGroup],
    spans: Sequence[SequenceSpan],
    chunks: Sequence[Tensor],
    streams: bool,
) -> tuple[Tensor, Tensor | None]:
    """The packed pass over lockstep groups and single-sequence spans: fp32 logits of each
    group row's last token, then of each span's kept positions."""
    ids, positions, packed, keep = _pack(groups, spans, chunks, model.device)
    engram: list[Tensor] | None = [] if groups or spans else None
    for g in groups:  # one [1, history + S] row per group row, then one per span
        rows, g.batch.token_history = model.engram_ids(g.ids, g.batch.token_history)
        engram = None if rows is None or engram is None else [*engram, *rows.split(1)]
    for s, chunk in zip(spans, chunks, strict=True):
        span_ids, s.state.token_history = model.engram_ids(
            to_device(chunk.reshape(1, -1), model.device), s.state.token_history
        )
        engram = None if span_ids is None or engram is None else [*engram, span_ids]
    inputs = LayerInputs(ids, positions, packed, engram_ids=engram, rows=keep)
    logits, x = model.run_layers(inputs)
    for g in groups:
        g.batch.pos += g.ids.shape[1]
    for s in spans:
        s.state.pos += s.num_tokens
    return logits[0], x[0, keep] if streams else None


def _pack(
    groups: Sequence[LockstepGroup],
    spans: Sequence[SequenceSpan],
    chunks: Sequence[Tensor],
    device: torch.device,
) -> tuple[Tensor, Tensor, list[Packed], Tensor]:
    """(ids [1, N], positions [N], one :class:`Packed` per layer, kept rows) for lockstep
    ``groups`` (row by row) followed by single-sequence spans."""
    pieces = [g.ids.reshape(-1) for g in groups]
    if spans:
        pieces.append(to_device(torch.cat([c.reshape(-1) for c in chunks]), device))
    positions, keep, offset = [], [], 0
    for g in groups:
        height, width = g.ids.shape
        positions.append(torch.arange(g.batch.pos, g.batch.pos + width).repeat(height))
        keep += [offset + j * width + n - 1 for j, n in enumerate(g.lengths)]
        offset += height * width
    for s in spans:
        n = s.num_tokens
        positions.append(torch.arange(s.state.pos, s.state.pos + n))
        offset += n
        keep += range(offset - s.num_logits, offset)
    sizes = [g.ids.numel() for g in groups] + [s.num_tokens for s in spans]
    rows = [g.ids.shape[0] for g in groups] + [1] * len(spans)
    members = [g.batch for g in groups] + [s.state for s in spans]
    packed = [Packed(list(layer), sizes, rows) for layer in per_layer_states(members)]
    return (
        torch.cat(pieces)[None],
        to_device(torch.cat(positions), device),
        packed,
        to_device(torch.tensor(keep, dtype=torch.long), device),
    )
