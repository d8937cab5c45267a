"""Explicit per-sequence decoding state for DeepSeek-V4.

The model never hides state inside modules: every forward takes a :class:`ModelState` and
advances it, so the engine can own, copy and pool these objects. Per layer there is

* an SWA ring of the last ``sliding_window`` post-RoPE kv rows (slot = position % window);
* for compressed layers, a :class:`CompressorState`: the open (partial) window's raw projections,
  for the overlapping ratio-4 compressor the first half of the last complete window, and the
  append-only compressed entries, indexed by absolute window number;
* for CSA layers, a second :class:`CompressorState` for the lightning indexer's keys.

All tensors carry a leading batch dimension; the sequences of one state advance in lockstep.

V4.1 reuses the same objects: a KV-source layer keeps its ratio-1/2 compressor in ``compressor``
(no overlap, so ``prev_kv`` stays None) and its indexer keys in ``indexer`` (entries only; index
keys are derived from finished entries, so the buffers stay empty); the layers that share them
keep only their SWA ring. Engram hashes the last few token ids, kept in
:attr:`ModelState.token_history`. The lagged mHC carry lives within one token's pass through the
layers, so it needs no state.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch import Tensor

from deepinfer.transfer import to_device

if TYPE_CHECKING:
    from deepinfer.cache.pages import PageTable


def clone_or_none(t: Tensor | None) -> Tensor | None:
    return None if t is None else t.clone()


@dataclass
class SWARing:
    """The sliding window of one layer: ``kv[:, p % capacity]`` holds position p's row.

    The ring holds ``window + slack`` rows: the attention window plus the rows a rollback of up
    to ``slack`` tokens needs back (a speculative step overwrites them otherwise).
    """

    kv: Tensor  # [B, capacity, D]
    length: int = 0  # tokens written so far
    window: int = 0  # attention window; 0 = the whole capacity
    #: Set when ``kv`` is row ``slot`` of a shared [slots, capacity, D] tensor (the engine's
    #: :class:`~deepinfer.cache.slots.StateSlots`): a decode batch then writes and reads every
    #: row's ring with one indexed op instead of one per row.
    pool: Tensor | None = None
    slot: int = -1
    #: Lengths strictly inside the next chunk at which to keep a copy of the ring as it stood
    #: there (see :func:`set_marks`): filled in by :meth:`write`.
    marks: dict[int, Tensor | None] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not self.window:
            self.window = self.capacity

    @property
    def capacity(self) -> int:
        return self.kv.shape[1]

    def read(self, start: int) -> tuple[Tensor, Tensor]:
        """Rows queries from ``start`` on can still see: positions start-window+1 .. start-1."""
        first = max(0, start - self.window + 1)
        positions = torch.arange(first, start, device=self.kv.device)
        return self.kv[:, positions % self.capacity], positions

    def write(self, kv: Tensor, start: int) -> None:
        for length in self.marks:
            if start < length < start + kv.shape[1]:
                ring = self.kv.clone()
                _write_ring(ring, kv[:, : length - start], start)
                self.marks[length] = ring
        _write_ring(self.kv, kv, start)
        self.length = start + kv.shape[1]


def _write_ring(ring: Tensor, kv: Tensor, start: int) -> None:
    """Put rows ``kv`` [B, S, D] of positions start.. into ``ring`` [B, capacity, D]."""
    capacity = ring.shape[1]
    keep = min(kv.shape[1], capacity)
    positions = torch.arange(start + kv.shape[1] - keep, start + kv.shape[1], device=kv.device)
    ring[:, positions % capacity] = kv[:, -keep:].to(ring.dtype)


#: The fixed-size buffers of a :class:`CompressorState`, rows of a :class:`CompressorPool`.
BUFFERS = ("kv_buf", "score_buf", "prev_kv_buf", "prev_score_buf")


@dataclass
class CompressorPool:
    """One layer's compressor buffers for every running sequence: row ``slot`` is one
    sequence's (the engine's :class:`~deepinfer.cache.slots.StateSlots` owns the tensors), so a
    decode batch appends and pools every row's window with one indexed op each. The entries
    live in pages (:mod:`deepinfer.cache.pages`) that ``page_table`` maps to each slot."""

    kv_buf: Tensor | None = None  # [slots, ratio, c*D]
    score_buf: Tensor | None = None
    prev_kv_buf: Tensor | None = None  # [slots, ratio, D], overlapping compressors only
    prev_score_buf: Tensor | None = None
    ratio: int = 1
    pages: Tensor | None = None  # [num_pages + 1, 128 // ratio, D]; None: entries stay per state
    page_table: PageTable | None = None


@dataclass
class CompressorMark:
    """A compressor's open window (and, with overlap, the previous window's first half) as
    they stood at a length inside a chunk; the entries need no copy (they are append-only)."""

    buf_kv: Tensor  # [B, length % ratio, c*D]
    buf_score: Tensor
    prev_kv: Tensor | None  # [B, ratio, D]; None before the first complete window
    prev_score: Tensor | None


@dataclass
class CompressorState:
    """One compressor's running state (main KV compressor or indexer-key compressor).

    The open window and, with overlap, the previous window's first half live in fixed-size
    buffers (so they can be rows of a shared :class:`CompressorPool`), and the entries in a
    buffer of the state's own, grown as needed, or in the pool's pages; ``buf_kv``/``buf_score``,
    ``prev_kv``/``prev_score`` and ``entries`` read and assign them as variable-length tensors.
    """

    ratio: int
    overlap: bool
    kv_buf: Tensor  # [B, ratio, c*D] fp32: rows :fill are the open window's projections
    score_buf: Tensor  # [B, ratio, c*D] fp32 gate scores, position bias added
    #: [B, capacity, D]: rows :count are the finished entries (normalised, rotated, model
    #: dtype), indexed by absolute window number; None when they live in the pool's pages.
    entries_buf: Tensor | None
    count: int = 0
    fill: int = 0
    #: Overlap only: [B, ratio, D] first half of the last full window (there is one once an
    #: entry exists). Before the first window the scores are -inf (zero weight), so pooling
    #: never needs a special case.
    prev_kv_buf: Tensor | None = None
    prev_score_buf: Tensor | None = None
    #: Rollback support: the raw projections of the last ``keep`` tokens (fp32, like the
    #: buffers), from which the buffers of an earlier length are rebuilt. keep = 0: none kept.
    keep: int = 0
    hist_kv: Tensor | None = None  # [B, <= keep, c*D]
    hist_score: Tensor | None = None
    #: Set when the buffers are row ``slot`` of a shared pool.
    pool: CompressorPool | None = None
    slot: int = -1
    #: Lengths strictly inside the next chunk to record the buffers at (:meth:`capture`).
    marks: dict[int, CompressorMark | None] = field(default_factory=dict, repr=False)

    @property
    def num_entries(self) -> int:
        return self.count

    @property
    def paged(self) -> bool:
        """Whether the entries live in the pool's pages (else in ``entries_buf``)."""
        return self.entries_buf is None

    def _pages(self) -> tuple[Tensor, PageTable]:
        assert self.pool is not None and self.pool.pages is not None
        assert self.pool.page_table is not None
        return self.pool.pages, self.pool.page_table

    @property
    def entry_dim(self) -> int:
        return self._entry_storage().shape[-1]

    @property
    def entry_dtype(self) -> torch.dtype:
        return self._entry_storage().dtype

    def _entry_storage(self) -> Tensor:
        return self._pages()[0] if self.entries_buf is None else self.entries_buf

    @property
    def entries(self) -> Tensor:
        """[B, count, D] the finished entries (a copy when they live in pages)."""
        return self.entries_from(0)

    @entries.setter
    def entries(self, value: Tensor) -> None:
        self.count = 0
        self.append_entries(value)

    def entries_from(self, first: int) -> Tensor:
        """[B, count - first, D] the entries from number ``first`` on."""
        if self.entries_buf is not None:
            return self.entries_buf[:, first : self.count]
        pages, table = self._pages()
        return table.read(pages, self.slot, first, self.count)

    def append_entries(self, new: Tensor) -> None:
        """Append ``new`` [B, n, D] after the existing entries."""
        end = self.count + new.shape[1]
        if self.entries_buf is None:
            self._pages()[1].ensure(self.slot, end * self.ratio)  # may move the pages
            pages, table = self._pages()
            table.write(pages, self.slot, self.count, new.to(pages.dtype))
        else:
            self._reserve(end)
            self.entries_buf[:, self.count : end] = new
        self.count = end

    def _reserve(self, n: int) -> None:
        buf = self.entries_buf
        assert buf is not None
        if n <= buf.shape[1]:
            return
        grown = buf.new_empty(buf.shape[0], n, buf.shape[2])  # exact: the pool charges T rows
        grown[:, : self.count] = buf[:, : self.count]
        self.entries_buf = grown

    @property
    def buf_kv(self) -> Tensor:
        """[B, fill, c*D] the open window's projections."""
        return self.kv_buf[:, : self.fill]

    @buf_kv.setter
    def buf_kv(self, value: Tensor) -> None:
        self.kv_buf[:, : value.shape[1]] = value
        self.fill = value.shape[1]

    @property
    def buf_score(self) -> Tensor:
        return self.score_buf[:, : self.fill]

    @buf_score.setter
    def buf_score(self, value: Tensor) -> None:
        self.score_buf[:, : value.shape[1]] = value
        self.fill = value.shape[1]

    @property
    def has_prev(self) -> bool:
        return self.overlap and self.count > 0

    @property
    def prev_kv(self) -> Tensor | None:
        return self.prev_kv_buf if self.has_prev else None

    @prev_kv.setter
    def prev_kv(self, value: Tensor | None) -> None:
        self._set_prev(self.prev_kv_buf, value, 0.0)

    @property
    def prev_score(self) -> Tensor | None:
        return self.prev_score_buf if self.has_prev else None

    @prev_score.setter
    def prev_score(self, value: Tensor | None) -> None:
        self._set_prev(self.prev_score_buf, value, float("-inf"))

    def _set_prev(self, buf: Tensor | None, value: Tensor | None, empty: float) -> None:
        if buf is None:
            assert value is None, "only overlapping compressors keep a previous window"
            return
        if value is None:
            buf.fill_(empty)
        else:
            buf.copy_(value)

    @classmethod
    def empty(
        cls,
        batch: int,
        *,
        ratio: int,
        overlap: bool,
        dim: int,
        dtype: torch.dtype,
        device: torch.device,
        slack: int = 0,
        capacity: int = 0,
    ) -> CompressorState:
        """An empty state; ``slack`` > 0 keeps enough history to roll back that many tokens;
        ``capacity``: entries to allocate up front."""
        width = 2 * dim if overlap else dim
        empty = torch.zeros(batch, 0, width, dtype=torch.float32, device=device)

        def buf(d: int, value: float = 0.0) -> Tensor:
            return torch.full((batch, ratio, d), value, dtype=torch.float32, device=device)

        return cls(
            ratio=ratio,
            overlap=overlap,
            kv_buf=buf(width),
            score_buf=buf(width),
            entries_buf=torch.zeros(batch, capacity, dim, dtype=dtype, device=device),
            prev_kv_buf=buf(dim) if overlap else None,
            prev_score_buf=buf(dim, float("-inf")) if overlap else None,
            keep=slack + 2 * ratio if slack else 0,
            hist_kv=empty if slack else None,
            hist_score=empty if slack else None,
        )

    def capture(self, kv: Tensor, score: Tensor) -> None:
        """Record the buffers at each marked length: ``kv``/``score`` [B, fill + S, c*D] are
        the open window's rows followed by a chunk's new ones (read before the chunk changes
        any buffer)."""
        r, base = self.ratio, self.count * self.ratio  # position of kv's first row
        for length in self.marks:
            end = length - base
            if not self.fill < end < kv.shape[1]:
                continue
            closed = end // r * r  # rows of complete windows before the mark
            prev_kv, prev_score = self.prev_kv, self.prev_score
            if self.overlap and closed:
                dim = self.entry_dim
                prev_kv, prev_score = (
                    kv[:, closed - r : closed, :dim],
                    score[:, closed - r : closed, :dim],
                )
            self.marks[length] = CompressorMark(
                kv[:, closed:end].clone(),
                score[:, closed:end].clone(),
                clone_or_none(prev_kv),
                clone_or_none(prev_score),
            )

    def remember(self, kv: Tensor, score: Tensor) -> None:
        """Keep the newest raw projections [B, S, c*D] for rollback (no-op without slack)."""
        if not self.keep:
            return
        assert self.hist_kv is not None and self.hist_score is not None
        self.hist_kv = torch.cat((self.hist_kv, kv), dim=1)[:, -self.keep :]
        self.hist_score = torch.cat((self.hist_score, score), dim=1)[:, -self.keep :]


@dataclass
class LayerState:
    swa: SWARing
    compressor: CompressorState | None = None
    indexer: CompressorState | None = None


@dataclass
class ModelState:
    """Everything a sequence (or a lockstep batch of them) carries between forward calls."""

    layers: list[LayerState]
    mtp: list[LayerState] = field(default_factory=list)
    pos: int = 0  # tokens consumed by the main model
    #: Tokens a rollback may take back (``model.new_state(slack=...)``), and the length of the
    #: last rollback: tokens before it are final, so no later rollback goes below it.
    slack: int = 0
    committed: int = 0
    mtp_pos: int = 0  # positions consumed by the MTP layers
    #: V4.1 Engram only: [B, engram_max_ngram_size - 1] raw token ids before ``pos`` (oldest
    #: first), the pad id where the sequence is shorter; read and assigned as
    #: :attr:`token_history` (assignment copies into it, so it can be a row of a shared tensor,
    #: ``history_pool``). None for models without Engram.
    history_buf: Tensor | None = None
    history_pool: Tensor | None = None

    @property
    def batch_size(self) -> int:
        return self.layers[0].swa.kv.shape[0]

    @property
    def token_history(self) -> Tensor | None:
        """The Engram history. A state restored from a prefix cache must set it to the
        prefix's last ids."""
        return self.history_buf

    @token_history.setter
    def token_history(self, value: Tensor | None) -> None:
        if value is None or self.history_buf is None or self.history_pool is None:
            self.history_buf = value
        else:
            self.history_buf.copy_(value)


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

    pool: CompressorPool
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


#: What a layer's forward receives: the state of a lockstep chunk, one state per decode row
#: ([B, 1] layout), the shared rows of slotted decode rows, or packed spans ([1, N] layout).
LayerStates = LayerState | list[LayerState] | SlotRows | Packed
CompressorStates = CompressorState | list[CompressorState] | CompressorRows


def page_table_of(state: ModelState) -> tuple[PageTable, int] | None:
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
    """A layer's ``compressor`` (or ``indexer``) state, per row when ``state`` is per row."""
    assert not isinstance(state, Packed), "packed spans are split before this point"
    if isinstance(state, list):
        rows = [getattr(s, which) for s in state]
        assert all(r is not None for r in rows)
        return rows
    found = getattr(state, which)
    assert found is not None
    return found


def set_marks(state: ModelState, lengths: Sequence[int]) -> None:
    """Have the next chunk record ``state`` as it stands after each of ``lengths`` tokens
    (strictly inside the chunk): the ring and the compressors' open windows are copied as the
    layers pass those positions, so :func:`states_at` can rebuild the state there after one
    forward over the whole chunk (the prefix cache records its 128-token boundaries so)."""
    for layer in state.layers:
        layer.swa.marks = dict.fromkeys(lengths)
        for comp in (layer.compressor, layer.indexer):
            if comp is not None:
                comp.marks = dict.fromkeys(lengths)


def states_at(
    src: ModelState, own: ModelState, lengths: Sequence[int], row: int = 0
) -> list[ModelState]:
    """``own`` as it stood after each of ``lengths`` tokens, from the marks a chunk recorded in
    ``src`` (``own`` itself, or the lockstep batch it ran in, row ``row``) and ``own``'s
    entries (append-only, so final ones serve). The Engram history is the caller's to set.
    Each state is a read-only view for a snapshot, laid out like ``own``."""
    out = [ModelState(layers=[], pos=length) for length in lengths]
    for src_layer, own_layer in zip(src.layers, own.layers, strict=True):
        for state, length in zip(out, lengths, strict=True):
            kv = src_layer.swa.marks[length]
            assert kv is not None, f"no ring was recorded at {length}"
            if kv.shape[1] != own_layer.swa.capacity:  # a batch with slack: every row at once
                ring = SWARing(kv, length, src_layer.swa.window)
                kv = src_layer.swa.marks[length] = ring_layout(ring, own_layer.swa.capacity)
            layer = LayerState(SWARing(kv[row : row + 1], length, own_layer.swa.window))
            for part in ("compressor", "indexer"):
                comp: CompressorState | None = getattr(own_layer, part)
                if comp is not None:
                    setattr(
                        layer, part, _compressor_at(getattr(src_layer, part), comp, length, row)
                    )
            state.layers.append(layer)
    return out


def _compressor_at(
    src: CompressorState, own: CompressorState, length: int, row: int
) -> CompressorState:
    mark = src.marks.get(length)
    if mark is None:  # entries only (V4.1 index keys, no forward of their own): no open window
        kv = score = own.kv_buf[:, :0]
        prev_kv, prev_score = own.prev_kv_buf, own.prev_score_buf
    else:
        kv, score = mark.buf_kv[row : row + 1], mark.buf_score[row : row + 1]
        prev_kv = mark.prev_kv[row : row + 1] if mark.prev_kv is not None else own.prev_kv_buf
        prev_score = (
            mark.prev_score[row : row + 1] if mark.prev_score is not None else own.prev_score_buf
        )
    return CompressorState(
        ratio=own.ratio,
        overlap=own.overlap,
        kv_buf=kv,
        score_buf=score,
        entries_buf=own.entries_buf,
        count=length // own.ratio,
        fill=kv.shape[1],
        prev_kv_buf=prev_kv,
        prev_score_buf=prev_score,
        # Entries in pages are read through own's slot (the view writes nothing).
        pool=None if own.entries_buf is not None else own.pool,
        slot=own.slot,
    )


def clear_marks(state: ModelState) -> None:
    """Stop recording: later chunks copy nothing."""
    set_marks(state, ())


def clone_state(state: ModelState) -> ModelState:
    """A deep copy (for branching a sequence, e.g. before a speculative draft). A state in
    shared slot tensors is copied with :meth:`~deepinfer.cache.slots.StateSlots.clone`."""
    return copy.deepcopy(state)


def scatter_rows(src: ModelState, dst: Sequence[ModelState]) -> None:
    """Make ``dst[i]`` (single-sequence states) equal row i of the lockstep state ``src``.

    A batch of fresh prompts of one length runs as one lockstep chunk, then lands in the
    sequences' own states here. States in the same shared slot tensors take one indexed write
    per tensor for the whole batch; any other state is copied row by row.
    """
    if len(dst) != src.batch_size:
        raise ValueError(f"{len(dst)} states for a batch of {src.batch_size}")
    ring = dst[0].layers[0].swa.pool
    slots: Tensor | None = None  # set when every state is a row of the same slot tensors
    if ring is not None and all(
        s.layers[0].swa.pool is ring and s.history_pool is dst[0].history_pool for s in dst
    ):
        slots = to_device(torch.tensor([s.layers[0].swa.slot for s in dst]), ring.device)
    for i, layer in enumerate(src.layers):
        rings = [s.layers[i].swa for s in dst]
        kv = ring_layout(layer.swa, rings[0].capacity)
        if slots is not None:
            pool = rings[0].pool  # this layer's shared ring tensor
            assert pool is not None
            pool[slots] = kv
        else:
            for j, r in enumerate(rings):
                r.kv.copy_(kv[j : j + 1])
        for r in rings:
            r.length = layer.swa.length
        for part in ("compressor", "indexer"):
            comp: CompressorState | None = getattr(layer, part)
            if comp is not None:
                _scatter_compressor(comp, [getattr(s.layers[i], part) for s in dst], slots)
    if src.history_buf is not None:
        if slots is not None and dst[0].history_pool is not None:
            dst[0].history_pool[slots] = src.history_buf
        else:
            for j, s in enumerate(dst):
                s.token_history = src.history_buf[j : j + 1]
    for s in dst:
        s.pos = src.pos


def entry_bytes_per_token(state: ModelState) -> float:
    """Bytes of compressed entries (and index keys) a sequence adds per token, all layers."""
    total = 0.0
    for layer in state.layers:
        for comp in (layer.compressor, layer.indexer):
            if comp is not None:
                total += comp.entry_dim * comp.entry_dtype.itemsize / comp.ratio
    return total


def gather_rows(src: Sequence[ModelState], batch: ModelState) -> None:
    """Load single-sequence states, all at one position, into the fresh lockstep state
    ``batch`` (one row each; built with rollback slack when its chunk is padded).

    The inverse of :func:`scatter_rows`: the batch then continues every sequence as one
    [G, S] chunk. Rings are re-laid out to the batch's capacity; compressor buffers, entries
    and the Engram history are stacked; a compressor that keeps rollback history starts it
    with what its buffers hold (the previous window's first half, the open window), which is
    all a rollback to a length from this position on reads.
    """
    pos = src[0].pos
    if any(s.pos != pos or s.batch_size != 1 for s in src) or batch.batch_size != len(src):
        raise ValueError("gather_rows takes single-sequence states at one position")
    for i, layer in enumerate(batch.layers):
        rows = [s.layers[i] for s in src]
        ring = SWARing(torch.cat([r.swa.kv for r in rows]), pos, layer.swa.window)
        layer.swa.kv.copy_(ring_layout(ring, layer.swa.capacity))
        layer.swa.length = pos
        for part in ("compressor", "indexer"):
            comp: CompressorState | None = getattr(layer, part)
            if comp is not None:
                _gather_compressor([getattr(r, part) for r in rows], comp)
    if batch.history_buf is not None:
        batch.token_history = torch.cat([s.history_buf for s in src])  # type: ignore[misc]
    batch.pos = batch.committed = pos


def _gather_compressor(src: list[CompressorState], dst: CompressorState) -> None:
    dst.entries = torch.cat([c.entries for c in src])
    dst.buf_kv = torch.cat([c.buf_kv for c in src])
    dst.buf_score = torch.cat([c.buf_score for c in src])
    for name in ("prev_kv_buf", "prev_score_buf"):
        buf = getattr(dst, name)
        if buf is not None:
            buf.copy_(torch.cat([getattr(c, name) for c in src]))
    dst.count, dst.fill = src[0].count, src[0].fill
    if dst.keep:
        kv, score = dst.buf_kv, dst.buf_score
        if dst.has_prev:  # only its first half is ever read back, as the previous window
            assert dst.prev_kv is not None and dst.prev_score is not None
            pad = kv.shape[-1] - dst.prev_kv.shape[-1]
            kv = torch.cat((torch.nn.functional.pad(dst.prev_kv, (0, pad)), kv), dim=1)
            score = torch.cat((torch.nn.functional.pad(dst.prev_score, (0, pad)), score), dim=1)
        dst.hist_kv, dst.hist_score = kv.clone(), score.clone()


def ring_layout(ring: SWARing, capacity: int) -> Tensor:
    """``ring``'s rows as a ring of ``capacity`` rows holds them (position p at p % capacity):
    a state built with rollback slack has a larger ring than the sequence's own."""
    if ring.capacity == capacity:
        return ring.kv
    first = max(0, ring.length - min(capacity, ring.capacity))
    positions = torch.arange(first, ring.length, device=ring.kv.device)
    out = ring.kv.new_zeros(ring.kv.shape[0], capacity, ring.kv.shape[2])
    out[:, positions % capacity] = ring.kv[:, positions % ring.capacity]
    return out


def select_row(state: ModelState, row: int) -> ModelState:
    """Row ``row`` of a lockstep state as a single-sequence state whose tensors are views of
    the batch's (so it can be rolled back and scattered on its own)."""

    def cut(t: Tensor | None) -> Tensor | None:
        return None if t is None else t[row : row + 1]

    def layer(ls: LayerState) -> LayerState:
        out = LayerState(swa=SWARing(ls.swa.kv[row : row + 1], ls.swa.length, ls.swa.window))
        for part in ("compressor", "indexer"):
            comp: CompressorState | None = getattr(ls, part)
            if comp is not None:
                assert comp.entries_buf is not None, "a lockstep state holds its own entries"
                names = (*BUFFERS, "entries_buf", "hist_kv", "hist_score")
                fields = {name: cut(getattr(comp, name)) for name in names}
                setattr(
                    out,
                    part,
                    CompressorState(
                        ratio=comp.ratio,
                        overlap=comp.overlap,
                        count=comp.count,
                        fill=comp.fill,
                        keep=comp.keep,
                        **fields,  # type: ignore[arg-type]
                    ),
                )
        return out

    return ModelState(
        layers=[layer(ls) for ls in state.layers],
        mtp=[layer(ls) for ls in state.mtp],
        pos=state.pos,
        slack=state.slack,
        committed=state.committed,
        mtp_pos=state.mtp_pos,
        history_buf=cut(state.history_buf),
    )


def _scatter_compressor(
    src: CompressorState, dst: list[CompressorState], slots: Tensor | None
) -> None:
    pool = dst[0].pool if slots is not None else None
    names = [n for n in BUFFERS if getattr(src, n) is not None]
    for name in names:
        if pool is not None:
            getattr(pool, name)[slots] = getattr(src, name)
        else:
            for j, d in enumerate(dst):
                getattr(d, name).copy_(getattr(src, name)[j : j + 1])
    if pool is not None and pool.pages is not None:  # every row's entries in one write
        table = pool.page_table
        assert table is not None and slots is not None
        for d in dst:
            table.ensure(d.slot, src.count * src.ratio)
        index = torch.arange(src.count, device=slots.device)
        table.scatter_rows(pool.pages, slots[:, None], index, src.entries)
    else:
        for j, d in enumerate(dst):
            d.entries = src.entries[j : j + 1]
    for d in dst:
        d.count, d.fill = src.count, src.fill
