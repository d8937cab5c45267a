"""A batch of single-token rows, each sequence at its own position (continuous-batching decode).

One batched pass over the layers advances every row by one token, as separate forwards would.
States in shared slot tensors (:class:`~deepinfer.cache.slots.StateSlots` with entry pages,
no rollback slack) decode with a few indexed ops per layer and no per-row host work; that step
is a fixed sequence of device ops over the slot tensors, so on a GPU it is captured whole, once
per batch bucket and entry bucket (:mod:`.graphs`). Other states (own tensors, slack) go through
the per-row layout, with only each layer's FFN half captured.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from deepinfer.models.graphs import DecodeGraphs, entry_bucket
from deepinfer.models.layouts import (
    CompressorRows,
    SlotRows,
    StepMemo,
    page_table_of,
    per_layer_states,
)
from deepinfer.models.state import CompressorState, LayerState, ModelState
from deepinfer.models.trunk import LayerInputs, StepModel
from deepinfer.paging import PAGE_TOKENS, pages_for
from deepinfer.transfer import to_device

#: A decode step over slot rows: (ids [B, 1], positions [B, 1], slots [B], tokens whose entries
#: it reads: the batch's longest sequence, or an entry bucket when captured) -> logits [B, V].
SlotStep = Callable[[Tensor, Tensor, Tensor, int], Tensor]


def run_decode(
    model: StepModel, ids: Tensor, states: Sequence[ModelState], graphs: DecodeGraphs | None
) -> Tensor:
    """Feed ``ids`` [B] to single-sequence ``states``; fp32 logits [B, V]."""
    ids = to_device(ids.reshape(-1, 1), model.device)
    positions = to_device(torch.tensor([[s.pos] for s in states]), model.device)
    history = states[0].history_pool
    if all_slotted(states) and (states[0].history_buf is None or history is not None):
        return _decode_slots(model, ids, positions, states, graphs)
    engram, new_history = None, None
    if states[0].history_buf is not None:
        before = torch.cat([s.history_buf for s in states])  # type: ignore[misc]
        engram, new_history = model.engram_ids(ids, before)
    inputs = LayerInputs(ids, positions, per_layer_states(states), engram_ids=engram, graphs=graphs)
    logits, _ = model.run_layers(inputs)
    for i, s in enumerate(states):
        s.pos += 1
        if new_history is not None:
            s.token_history = new_history[i : i + 1]
    return logits[:, 0]


def _decode_slots(
    model: StepModel,
    ids: Tensor,
    positions: Tensor,
    states: Sequence[ModelState],
    graphs: DecodeGraphs | None,
) -> Tensor:
    """Decode rows whose whole state, Engram history included, lives in shared slots."""
    template = states[0].layers
    pool = states[0].history_pool

    def step(ids: Tensor, positions: Tensor, slots: Tensor, num_tokens: int) -> Tensor:
        engram = None
        if pool is not None:
            engram, new_history = model.engram_ids(ids, pool.index_select(0, slots))
            assert new_history is not None
            pool[slots] = new_history
        rows = step_rows(template, slots, num_tokens)
        logits, _ = model.run_layers(LayerInputs(ids, positions, rows, engram_ids=engram))
        return logits[:, 0]

    extra = () if pool is None else (pool,)
    return _slot_step(model, step, ids, positions, states, graphs, extra)


def _slot_step(  # noqa: PLR0917
    model: StepModel,
    step: SlotStep,
    ids: Tensor,
    positions: Tensor,
    states: Sequence[ModelState],
    graphs: DecodeGraphs | None,
    extra: Sequence[Tensor] = (),
) -> Tensor:
    """Run a decode ``step`` over slot rows and advance the states' host counters.

    The step is a fixed sequence of device ops over the slot tensors (and ``extra``, further
    shared tensors it reads or writes), so on a GPU it is captured whole, once per batch bucket
    and entry bucket: it reads the entries of ``num_tokens`` tokens, the batch's longest rounded
    up to a bucket of pages (eagerly: the longest itself).
    """
    slots = to_device(torch.tensor([s.layers[0].swa.slot for s in states]), model.device)
    found = page_table_of(states[0])
    if found is not None:  # the step writes each row's next entry by index: hold its page
        for s in states:
            found[0].ensure(s.layers[0].swa.slot, s.pos + 1)
    num_tokens = max(s.pos for s in states) + 1
    if graphs is not None and model.ops.supports_cuda_graphs(model.dtype):
        pages = 0  # no compressed layers: no entries to read
        if found is not None:
            pages = entry_bucket(pages_for(num_tokens), found[0].pages_per_slot)
        num_tokens = pages * PAGE_TOKENS
        # The graph bakes in the shared tensors' addresses, which change if they grow.
        shared = (*slot_tensors(states[0].layers), *extra)
        key = ("step", num_tokens, *(t.data_ptr() for t in shared))
        fn = lambda *a: (step(*a, num_tokens),)  # noqa: E731
        logits = graphs.run(key, fn, ids, positions, slots)[0]
    else:
        logits = step(ids, positions, slots, num_tokens)
    for s in states:
        s.pos += 1
        advance_slotted(s)
    return logits


def all_slotted(states: Sequence[ModelState]) -> bool:
    """Whether every state lives in the same shared slot tensors, entries included, with no
    rollback history (the shared-rows decode path keeps none)."""
    ring = states[0].layers[0].swa.pool
    if ring is None or any(s.layers[0].swa.pool is not ring or s.slack for s in states):
        return False
    return all(
        comp.pool is not None and comp.pool.pages is not None
        for layer in states[0].layers
        for comp in (layer.compressor, layer.indexer)
        if comp is not None
    )


def step_rows(layers: Sequence[LayerState], slots: Tensor, num_tokens: int) -> list[SlotRows]:
    """Every layer's shared tensors for decode rows ``slots``, sharing one step memo; entries
    are read up to what a sequence of ``num_tokens`` tokens has."""
    memo = StepMemo()

    def rows(comp: CompressorState | None) -> CompressorRows | None:
        if comp is None:
            return None
        assert comp.pool is not None
        return CompressorRows(comp.pool, slots, comp.ratio, num_tokens // comp.ratio, memo)

    out = []
    for layer in layers:
        assert layer.swa.pool is not None
        out.append(
            SlotRows(layer.swa.pool, slots, rows(layer.compressor), rows(layer.indexer), memo)
        )
    return out


def slot_tensors(layers: Sequence[LayerState]) -> list[Tensor]:
    """Every shared tensor a slotted decode step reads or writes."""
    out: list[Tensor] = []
    for layer in layers:
        assert layer.swa.pool is not None
        out.append(layer.swa.pool)
        for comp in (layer.compressor, layer.indexer):
            if comp is not None and comp.pool is not None:
                out += [t for t in vars(comp.pool).values() if isinstance(t, Tensor)]
                if comp.pool.page_table is not None:
                    out.append(comp.pool.page_table.table)
    return out


def advance_slotted(state: ModelState) -> None:
    """The host-side counters of a state whose shared rows a decode step advanced to
    ``state.pos`` tokens."""
    pos = state.pos
    for layer in state.layers:
        layer.swa.length = pos
        for comp in (layer.compressor, layer.indexer):
            if comp is not None:
                comp.fill, comp.count = pos % comp.ratio, pos // comp.ratio
