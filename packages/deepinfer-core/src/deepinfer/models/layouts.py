"""What one layer's forward receives, by kind of row.

A single span (one sequence, or a batch of sequences fed alike, with tensors of its own or rows
of the shared slots) carries its :class:`~deepinfer.models.state.LayerState`; spans of any length
whose states live in the shared slot tensors, those tensors and where each span stands
(:class:`RaggedRows`; with one token a span, or a few a row as verification feeds them, the
capturable :class:`SlotRows`). The layers branch
on these; the step code (:mod:`.causal_lm`, :mod:`.decode`, :mod:`.ragged`) builds them.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from torch import Tensor

from deepinfer.models.memo import StepMemo
from deepinfer.models.state import CompressorState, LayerState, ModelState, SlotBuffers

if TYPE_CHECKING:
    from deepinfer.paging import PageMap


@dataclass
class SlotTokens:
    """Where the tokens of a verification pass go: every slotted row feeds up to T tokens
    ([B, T], :mod:`.verify`), the first ``lengths[i]`` of row i real, the rest padding whose
    state writes go to the slot tensors' padding row 0 (as a captured step's padding rows
    do), so rows of different lengths share one fixed shape."""

    positions: Tensor  # [B, T] each token's position (padding: 0)
    slots: Tensor  # [B, T] the slot row each token writes (padding: 0)
    lengths: Tensor  # [B] real tokens of each row


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
    #: A verification pass's tokens (None: one token a row, the decode pass).
    tokens: SlotTokens | None = None


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
    #: A verification pass's tokens (None: one token a row, the decode pass).
    tokens: SlotTokens | None = None


@dataclass
class RaggedMeta:
    """Where the spans of a ragged pass stand (one per sequence, any number of tokens each,
    packed along one [1, N] batch), built once per step on the host: every layer derives its
    gathers and scatters from these (memoised in ``step_memo``), so the number of device ops
    per layer does not grow with the number of spans."""

    slots: Tensor  # [n] long: each span's slot row
    slot_ids: list[int]  # the same on the host
    starts: list[int]  # tokens each span's state held before the step
    lengths: list[int]  # tokens each span feeds
    positions: Tensor  # [N] absolute position of every token
    token_span: Tensor  # [N] long: the span of every token
    span_start: Tensor  # [N] long: the start of every token's span
    #: Most padding a group of spans may add where a per-span op (the indexer's scores) runs
    #: them as one [G, S] batch, as a fraction of their real tokens (0: equal lengths only).
    padding: float = 0.0
    step_memo: StepMemo = field(default_factory=StepMemo, repr=False)

    @property
    def num_spans(self) -> int:
        return len(self.starts)

    @property
    def offsets(self) -> list[int]:
        """Each span's first token in the packed batch."""
        return self.step_memo.get(
            "offsets", lambda: list(itertools.accumulate(self.lengths[:-1], initial=0))
        )


@dataclass
class RaggedCompressor:
    """One compressor's shared buffers for a ragged pass; ``marked``: the spans whose state
    records marks in this step (the prefix cache's record points), with their own states."""

    pool: SlotBuffers
    meta: RaggedMeta
    ratio: int
    marked: list[tuple[int, CompressorState]] = field(default_factory=list)


@dataclass
class RaggedRows:
    """One layer's state for a ragged pass: the shared ring tensor, the compressors' buffers
    and the step's :class:`RaggedMeta`; ``marked`` as in :class:`RaggedCompressor`."""

    ring: Tensor  # [rows, capacity, D]
    meta: RaggedMeta
    compressor: RaggedCompressor | None = None
    indexer: RaggedCompressor | None = None
    marked: list[tuple[int, LayerState]] = field(default_factory=list)


#: What a layer's forward receives: the state of a span ([B, S] layout), the shared rows of a
#: batch of decode rows ([B, 1] layout) or of spans packed along [1, N] (ragged).
LayerStates = LayerState | SlotRows | RaggedRows
CompressorStates = CompressorState | CompressorRows | RaggedCompressor


def memo_of(state: LayerStates | CompressorStates) -> StepMemo:
    """The step memo shared by a pass's layers: a state of its own has its span's call's
    (:func:`span_memo`), or outside one a fresh one."""
    if isinstance(state, SlotRows | CompressorRows):
        return state.step_memo
    if isinstance(state, RaggedRows | RaggedCompressor):
        return state.meta.step_memo
    return state.step_memo if state.step_memo is not None else StepMemo()


@contextmanager
def span_memo(state: ModelState) -> Iterator[StepMemo]:
    """One memo for every layer of a span's call through the layers (its layers all stand at
    the same position, so their index and angle tensors are the same); removed afterwards."""
    memo = StepMemo()
    held = [s for layer in state.layers for s in (layer, layer.compressor, layer.indexer) if s]
    for s in held:
        s.step_memo = memo
    try:
        yield memo
    finally:
        for s in held:
            s.step_memo = None


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
    found = getattr(state, which)
    assert found is not None
    return found
