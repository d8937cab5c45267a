"""What one layer's forward receives, by kind of row.

A single span (one sequence, or a lockstep batch of sequences at one position) carries its
:class:`~deepinfer.models.state.LayerState`; a batch of decode rows, whose states live in shared
slot tensors, those tensors and the rows it uses (:class:`SlotRows`); a packed pass its spans
(:class:`Packed`). The layers branch on these; the step code (:mod:`.decode`,
:mod:`.packing`) builds them.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from torch import Tensor

from deepinfer.models.state import CompressorState, LayerState, ModelState, SlotBuffers

if TYPE_CHECKING:
    from deepinfer.paging import PageMap


@dataclass
class Packed:
    """Chunks of several sequences packed along the sequence dim of one [1, N] batch.

    Token-wise work (projections, MoE, mHC) runs once over all N tokens; each layer's attention
    walks the spans, each with its own state. A span of ``rows`` > 1 is a lockstep group: its
    tokens are the rows of a [rows, length / rows] chunk, one after the other, and its state
    a batch of that many rows.
    """

    states: list[LayerState]
    lengths: list[int]
    rows: list[int] = field(default_factory=list)  # empty: one row each

    def spans(self) -> list[tuple[slice, LayerState, int]]:
        out, start = [], 0
        rows = self.rows or [1] * len(self.states)
        for state, n, r in zip(self.states, self.lengths, rows, strict=True):
            out.append((slice(start, start + n), state, r))
            start += n
        return out


_T = TypeVar("_T")


class StepMemo:
    """Values every layer of one decode step computes alike from the step's positions and rows:
    the window mask, a compression ratio's window phase and entry index, the entries' page
    locations. A real model has dozens of layers; each would otherwise launch the same ~10
    small integer kernels. One memo per step, shared by its layers' rows; it must not outlive
    the step (a CUDA graph captured after a warm-up run would read the warm-up's values)."""

    def __init__(self) -> None:
        self._values: dict[Hashable, Any] = {}

    def get(self, key: Hashable, make: Callable[[], _T]) -> _T:
        """The value stored under ``key``, made by ``make()`` the first time it is asked for."""
        if key not in self._values:
            self._values[key] = make()
        return self._values[key]


@dataclass
class CompressorRows:
    """One compressor's shared buffers for a decode batch of slotted states (all on the
    device): row ``slots[i]`` of each buffer is decode row i's, and its entries are in the pages
    that row ``slots[i]`` of the page table maps. ``entry_limit``: how many entries to read (the
    batch's most, or an entry bucket's when the step is captured)."""

    pool: SlotBuffers
    slots: Tensor  # [B] long
    ratio: int
    entry_limit: int
    step_memo: StepMemo = field(default_factory=StepMemo, repr=False)


@dataclass
class SlotRows:
    """One layer's state for a decode batch of slotted states: the shared tensors and the rows
    the batch uses, so the whole batch reads and writes with a few indexed ops and no per-row
    host work (a captured step replays them unchanged)."""

    ring: Tensor  # [rows, capacity, D]
    slots: Tensor  # [B] long
    compressor: CompressorRows | None = None
    indexer: CompressorRows | None = None
    step_memo: StepMemo = field(default_factory=StepMemo, repr=False)


#: What a layer's forward receives: the state of a span ([B, S] layout), the shared rows of a
#: batch of decode rows ([B, 1] layout), or packed spans ([1, N] layout).
LayerStates = LayerState | SlotRows | Packed
CompressorStates = CompressorState | CompressorRows


def page_table_of(state: ModelState) -> tuple[PageMap, int] | None:
    """The entry page table and slot of a state whose entries live in pages (one table for
    every compressor of the model); None otherwise."""
    for layer in state.layers:
        for comp in (layer.compressor, layer.indexer):
            if comp is not None:
                if not comp.paged:
                    return None
                assert comp.pool is not None and comp.pool.page_table is not None
                return comp.pool.page_table, comp.slot
    return None


def compressor_states(state: LayerStates, which: str = "compressor") -> CompressorStates:
    """A layer's ``compressor`` (or ``indexer``) state, or its shared rows in a decode batch."""
    assert not isinstance(state, Packed), "packed spans are split before this point"
    found = getattr(state, which)
    assert found is not None
    return found


def per_layer_states(states: Sequence[ModelState]) -> list[list[LayerState]]:
    """Transpose per-sequence states into, for each layer, one state per row."""
    return [list(layer) for layer in zip(*(s.layers for s in states), strict=True)]
