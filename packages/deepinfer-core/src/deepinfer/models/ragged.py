"""Spans of any length over shared slot rows, in one pass whose op count does not grow with them.

The engine keeps every running sequence's state in shared slot tensors with its entries in pages
(:class:`~deepinfer.cache.slots.StateSlots`). A step that mixes prefill chunks, k-token
verification rows and decode rows packs all their tokens along one [1, N] batch: token-wise work
(projections, MoE, mHC) runs once over the N tokens, and each layer reads and writes every
span's ring, open windows and entries with a few indexed ops whose indices depend only on where
the spans stand (:mod:`.ragged_plan`, built once per step). Attention is one sparse op over the
whole step: each query lists its window rows and entries among every span's keys. Spans of
similar length share the ops that score a span's queries against its own keys (the indexers).

A span may carry record points (the prefix cache's 128-token boundaries inside a chunk): the
layers copy its ring and open windows as they pass them, and the states there come back as
read-only views.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from deepinfer.models.batch import SequenceSpan
from deepinfer.models.layouts import (
    RaggedCompressor,
    RaggedMeta,
    RaggedRows,
    page_table_of,
)
from deepinfer.models.ragged_plan import look_back_index
from deepinfer.models.state import CompressorState, LayerState, ModelState, clone_or_none
from deepinfer.models.state_views import clear_marks, set_marks, states_at
from deepinfer.models.trunk import LayerInputs, StepModel, history_after
from deepinfer.transfer import to_device


def score_padding(device: torch.device) -> float:
    """:attr:`RaggedMeta.padding` on ``device``: an accelerator scores a padded group for
    about the cost of one span, while the CPU pays for every padded row."""
    return 0.5 if device.type != "cpu" else 0.0


@dataclass
class RaggedResult:
    logits: Tensor  # [sum of num_logits, V] in span order
    views: list[list[ModelState]]  # per span, its states at ``record_at``
    streams: Tensor | None  # [N, hc, d] when asked for


def run_ragged(
    model: StepModel, spans: Sequence[SequenceSpan], chunks: Sequence[Tensor], streams: bool
) -> RaggedResult:
    """Feed each span its ids ``chunks[i]`` ([S_i]) in one ragged pass (see the module);
    returns the kept logits in span order, the states at record points, and the streams of
    every token when asked for."""
    states = [s.state for s in spans]
    meta = _meta(model, spans)
    marked = [i for i, s in enumerate(spans) if s.record_at]
    history = {i: clone_or_none(states[i].token_history) for i in marked}
    for i in marked:
        set_marks(states[i], spans[i].record_at)
    ids = to_device(torch.cat([c.reshape(-1) for c in chunks]), model.device)[None]
    engram = _engram_windows(model, ids, states[0].history_pool, meta)
    keep, end = [], 0
    for s in spans:
        end += s.num_tokens
        keep += range(end - s.num_logits, end)
    rows = to_device(torch.tensor(keep, dtype=torch.long), model.device)
    try:
        layers = layer_rows(meta, states, marked)
        inputs = LayerInputs(ids, meta.positions, layers, engram_ids=engram, rows=rows)
        logits, x = model.run_layers(inputs)
        for s, span in zip(states, spans, strict=True):
            s.pos += span.num_tokens
            s.counters_behind = True  # the layers' counters follow when next read
        views = [states_at(states[i], spans[i].record_at) for i in marked]
    finally:
        for i in marked:
            clear_marks(states[i])
    out: list[list[ModelState]] = [[] for _ in spans]
    for i, at in zip(marked, views, strict=True):
        for view in at:
            n = view.pos - spans[i].start
            view.token_history = history_after(history[i], chunks[i], n, model.device)
        out[i] = at
    return RaggedResult(logits[0], out, x[0] if streams else None)


def _engram_windows(
    model: StepModel, ids: Tensor, pool: Tensor | None, meta: RaggedMeta
) -> Tensor | None:
    """V4.1 Engram's look-back window of every packed token [1, N, history + 1] (compressed
    ids, oldest first, the token last), and each span's slot row of ``pool`` (the raw look-back
    ids) moved past its chunk: for all spans with a few ops, None without Engram."""
    h = model.engram_history
    if not h:
        return None
    assert pool is not None  # a ragged pass's states live in slots, their look-back too
    before = pool.index_select(0, meta.slots)  # [n, h] raw ids before each span
    raw = torch.cat((before.flatten(), ids[0]))  # span i's look-back at i * h, tokens after
    window, after = look_back_index(meta, h)
    pool[meta.slots] = raw[after]
    return model.engram_map(raw[window])[None]


def _meta(model: StepModel, spans: Sequence[SequenceSpan]) -> RaggedMeta:
    """Where the spans stand; holds every span's entry pages up to its end."""
    starts = [s.state.pos for s in spans]
    lengths = [s.num_tokens for s in spans]
    slot_ids = [s.state.slot for s in spans]
    found = page_table_of(spans[0].state)
    if found is not None:
        found[0].ensure_all(slot_ids, [start + n for start, n in zip(starts, lengths, strict=True)])
    return ragged_meta(model.device, slot_ids, starts, lengths)


def ragged_meta(
    device: torch.device, slot_ids: list[int], starts: list[int], lengths: list[int]
) -> RaggedMeta:
    """:class:`RaggedMeta` of spans in slots ``slot_ids`` that start at ``starts`` and feed
    ``lengths`` tokens: per-token positions and spans built on the host, moved at once."""
    counts = torch.tensor(lengths)
    span_start = torch.tensor(starts).repeat_interleave(counts)
    first = torch.tensor(starts) - torch.tensor([0, *lengths[:-1]]).cumsum(0)
    positions = torch.arange(int(counts.sum())) + first.repeat_interleave(counts)
    spans = torch.arange(len(lengths)).repeat_interleave(counts)
    on_device = to_device(torch.stack((positions, spans, span_start)), device)
    return RaggedMeta(
        slots=to_device(torch.tensor(slot_ids), device),
        slot_ids=slot_ids,
        starts=starts,
        lengths=lengths,
        positions=on_device[0],
        token_span=on_device[1],
        span_start=on_device[2],
        padding=score_padding(device),
    )


def layer_rows(
    meta: RaggedMeta, states: Sequence[ModelState], marked: Sequence[int]
) -> list[RaggedRows]:
    """Every layer's shared tensors for the step, with the marked spans' own layer states."""
    template = states[0].layers
    own = [states[i].layers for i in marked]

    def rows(part: str, layer: int) -> RaggedCompressor | None:
        comp: CompressorState | None = getattr(template[layer], part)
        if comp is None:
            return None
        assert comp.pool is not None
        mine = [(i, getattr(o[layer], part)) for i, o in zip(marked, own, strict=True)]
        return RaggedCompressor(comp.pool, meta, comp.ratio, mine)

    out = []
    for index, layer in enumerate(template):
        assert layer.swa.pool is not None
        mine: list[tuple[int, LayerState]] = [
            (i, o[index]) for i, o in zip(marked, own, strict=True)
        ]
        out.append(
            RaggedRows(
                layer.swa.pool,
                meta,
                rows("compressor", index),
                rows("indexer", index),
                mine,
            )
        )
    return out
