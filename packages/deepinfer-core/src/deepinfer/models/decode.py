"""A batch of single-token rows over shared slot rows, each sequence at its own position.

One batched pass over the layers advances every row by one token, as separate forwards would.
The rows' states live in shared slot tensors (:class:`~deepinfer.cache.slots.StateSlots` with
entry pages; :func:`slot_decodable`), so every layer reads and writes all rows
with a few indexed ops and no per-row host work. The step is then a fixed sequence of device ops
over the slot tensors, and on a GPU it is captured whole, once per batch bucket and entry bucket
(:mod:`.graphs`). Rows of states with their own tensors run one after the other.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from deepinfer.models.graphs import DecodeGraphs, entry_bucket
from deepinfer.models.layouts import CompressorRows, SlotRows, SlotTokens, page_table_of
from deepinfer.models.memo import StepMemo
from deepinfer.models.state import CompressorState, LayerState, ModelState
from deepinfer.models.trunk import LayerInputs, StepModel
from deepinfer.paging import PAGE_TOKENS, PageMap, pages_for
from deepinfer.transfer import to_device


def run_decode(
    model: StepModel, ids: Tensor, states: Sequence[ModelState], graphs: DecodeGraphs | None
) -> Tensor:
    """Feed ``ids`` [B] to the slotted ``states`` (:func:`slot_decodable`); fp32 logits [B, V].

    On a GPU the step runs through ``graphs``: it reads the entries of ``num_tokens`` tokens,
    the batch's longest rounded up to a bucket of pages (eagerly: the longest itself).
    """
    ids = to_device(ids.reshape(-1, 1), model.device)
    where = to_device(torch.tensor([(s.pos, s.slot) for s in states]), model.device)
    positions, slots = where[:, :1], where[:, 1]
    template = states[0].layers
    history = states[0].history_pool
    found = page_table_of(states[0])
    if found is not None:  # the step writes each row's next entry by index: hold its page
        found[0].ensure_all([s.slot for s in states], [s.pos + 1 for s in states])
    num_tokens = max(s.pos for s in states) + 1

    def step(ids: Tensor, positions: Tensor, slots: Tensor, num_tokens: int) -> Tensor:
        engram = None
        if history is not None:
            engram, new_history = model.engram_ids(ids, history.index_select(0, slots))
            assert new_history is not None
            history[slots] = new_history
        rows = step_rows(template, slots, num_tokens)
        logits, _ = model.run_layers(LayerInputs(ids, positions, rows, engram_ids=engram))
        return logits[:, 0]

    if graphs is not None and model.ops.supports_cuda_graphs(model.dtype):
        num_tokens, addresses = graph_shape(found, num_tokens, template, history)
        key = ("step", num_tokens, *addresses)
        fn = lambda *a: (step(*a, num_tokens),)  # noqa: E731
        logits = graphs.run(key, fn, ids, positions, slots, defer=True)[0]
    else:
        logits = step(ids, positions, slots, num_tokens)
    for s in states:  # the layers' counters follow when next read (ModelState.layers)
        s.pos += 1
        s.counters_behind = True
    return logits


def graph_shape(
    found: tuple[PageMap, int] | None,
    num_tokens: int,
    layers: Sequence[LayerState],
    history: Tensor | None,
) -> tuple[int, tuple[int, ...]]:
    """What a captured step over slot rows is keyed by: the tokens whose entries it reads (the
    entry bucket of ``num_tokens``'s pages; none without compressed layers) and the addresses
    of every shared tensor it bakes in, which change if they grow."""
    pages = 0
    if found is not None:
        pages = entry_bucket(pages_for(num_tokens), found[0].pages_per_slot)
    shared = (*slot_tensors(layers), *(() if history is None else (history,)))
    return pages * PAGE_TOKENS, tuple(t.data_ptr() for t in shared)


def slot_decodable(states: Sequence[ModelState]) -> bool:
    """Whether a decode pass can run ``states``: every one lives in the same shared slot
    tensors, entries, (with Engram) token history and (with slack) rollback history
    included."""
    if not all_slotted(states):
        return False
    return states[0].history_buf is None or states[0].history_pool is not None


def all_slotted(states: Sequence[ModelState]) -> bool:
    """Whether every state lives in the same shared slot tensors, entries included."""
    ring = states[0].ring_pool
    if ring is None or any(s.ring_pool is not ring for s in states):
        return False
    return all(
        comp.pool is not None and comp.pool.pages is not None
        for layer in states[0].layers
        for comp in (layer.compressor, layer.indexer)
        if comp is not None
    )


def step_rows(
    layers: Sequence[LayerState], slots: Tensor, num_tokens: int, tokens: SlotTokens | None = None
) -> list[SlotRows]:
    """Every layer's shared tensors for decode rows ``slots`` (verification rows: with their
    ``tokens``), sharing one step memo; entries are read up to what a sequence of
    ``num_tokens`` tokens has."""
    memo = StepMemo()

    def rows(comp: CompressorState | None) -> CompressorRows | None:
        if comp is None:
            return None
        assert comp.pool is not None
        limit = num_tokens // comp.ratio
        return CompressorRows(comp.pool, slots, comp.ratio, limit, memo, tokens)

    out = []
    for layer in layers:
        assert layer.swa.pool is not None
        compressor, indexer = rows(layer.compressor), rows(layer.indexer)
        out.append(SlotRows(layer.swa.pool, slots, compressor, indexer, memo, tokens))
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
