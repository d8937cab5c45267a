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

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import torch
from torch import Tensor

from deepinfer.models.memo import StepMemo
from deepinfer.models.ring import SWARing, write_ring

if TYPE_CHECKING:
    from deepinfer.paging import PageMap


def clone_or_none(t: Tensor | None) -> Tensor | None:
    return None if t is None else t.clone()


#: The fixed-size buffers of a :class:`CompressorState`, rows of its :class:`SlotBuffers`.
BUFFERS = ("kv_buf", "score_buf", "prev_kv_buf", "prev_score_buf", "hist_kv_buf", "hist_score_buf")


class SlotBuffers(Protocol):
    """What a state row reads of one layer's compressor buffers for every running sequence
    (the cache's :class:`~deepinfer.cache.slots.CompressorPool` owns them): row ``slot`` is one
    sequence's, so a decode batch appends and pools every row's window with one indexed op
    each, and the entries live in pages (:mod:`deepinfer.paging`) that ``page_table`` maps to
    each slot."""

    kv_buf: Tensor | None  # [slots, ratio, c*D]
    score_buf: Tensor | None
    prev_kv_buf: Tensor | None  # [slots, ratio, D], overlapping compressors only
    prev_score_buf: Tensor | None
    hist_kv_buf: Tensor | None  # [slots, keep, c*D], states with rollback slack only
    hist_score_buf: Tensor | None
    ratio: int
    pages: Tensor | None  # [num_pages + 1, 128 // ratio, D]; None: entries stay per state
    page_table: PageMap | None


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
    buffers (so they can be rows of shared :class:`SlotBuffers`), and the entries in a
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
    #: buffers), from which the buffers of an earlier length are rebuilt, in a ring like the
    #: SWA window's (position p at row p % keep, so a decode step writes them by index).
    #: keep = 0: none kept.
    keep: int = 0
    hist_kv_buf: Tensor | None = None  # [B, keep, c*D]
    hist_score_buf: Tensor | None = None
    #: The first position whose projections the ring holds, where a state was restored
    #: without its history (``rollback.seed_history``); 0 otherwise.
    hist_from: int = 0
    #: Set when the buffers are row ``slot`` of a shared pool.
    pool: SlotBuffers | None = None
    slot: int = -1
    #: Lengths strictly inside the next chunk to record the buffers at (:meth:`capture`).
    marks: dict[int, CompressorMark | None] = field(default_factory=dict, repr=False)
    #: Entries appended from outside and no open window (V4.1 index keys): ``fill`` stays 0.
    entries_only: bool = False
    #: The memo of the span call running through it (:func:`~deepinfer.models.layouts.span_memo`).
    step_memo: StepMemo | None = field(default=None, repr=False, compare=False)

    @property
    def num_entries(self) -> int:
        return self.count

    @property
    def paged(self) -> bool:
        """Whether the entries live in the pool's pages (else in ``entries_buf``)."""
        return self.entries_buf is None

    def _pages(self) -> tuple[Tensor, PageMap]:
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

    def append_entries(self, new: Tensor, *, owned: bool = False) -> None:
        """Append ``new`` [B, n, D] after the existing entries. ``owned``: nothing else holds
        ``new``, so a state with no entries that must grow its buffer takes ``new`` as it."""
        end, buf = self.count + new.shape[1], self.entries_buf
        if buf is None:
            self._pages()[1].ensure(self.slot, end * self.ratio)  # may move the pages
            pages, table = self._pages()
            table.write(pages, self.slot, self.count, new.to(pages.dtype))
        elif owned and not self.count and end > buf.shape[1] and new.dtype == buf.dtype:
            self.entries_buf = new.contiguous()  # a fresh state's first chunk: no copy
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
        if self.count:
            grown[:, : self.count] = buf[:, : self.count]
        self.entries_buf = grown

    @property
    def buf_kv(self) -> Tensor:
        """[B, fill, c*D] the open window's projections."""
        return self.kv_buf[:, : self.fill]

    @buf_kv.setter
    def buf_kv(self, value: Tensor) -> None:
        self._set_open(self.kv_buf, value)

    @property
    def buf_score(self) -> Tensor:
        return self.score_buf[:, : self.fill]

    @buf_score.setter
    def buf_score(self, value: Tensor) -> None:
        self._set_open(self.score_buf, value)

    def _set_open(self, buf: Tensor, value: Tensor) -> None:
        """Hold ``value`` [B, fill, width] as the open window in ``buf``."""
        if value.shape[1]:  # a chunk that ends on a window's end leaves nothing open
            buf[:, : value.shape[1]] = value
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
        entries_only: bool = False,
    ) -> CompressorState:
        """An empty state; ``slack`` > 0 keeps enough history to roll back that many tokens;
        ``capacity``: entries to allocate up front."""
        width = 2 * dim if overlap else dim
        keep = slack + 2 * ratio if slack else 0

        def buf(d: int, value: float = 0.0, rows: int = ratio) -> Tensor:
            return torch.full((batch, rows, d), value, dtype=torch.float32, device=device)

        return cls(
            ratio=ratio,
            overlap=overlap,
            kv_buf=buf(width),
            score_buf=buf(width),
            entries_buf=torch.zeros(batch, capacity, dim, dtype=dtype, device=device),
            prev_kv_buf=buf(dim) if overlap else None,
            prev_score_buf=buf(dim, float("-inf")) if overlap else None,
            keep=keep,
            hist_kv_buf=buf(width, rows=keep) if keep else None,
            hist_score_buf=buf(width, rows=keep) if keep else None,
            entries_only=entries_only,
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
        """Keep the newest raw projections [B, S, c*D] (a chunk's, before it changes the
        buffers) for rollback; no-op without slack."""
        if not self.keep:
            return
        assert self.hist_kv_buf is not None and self.hist_score_buf is not None
        start = self.count * self.ratio + self.fill  # position of the chunk's first token
        write_ring(self.hist_kv_buf, kv, start)
        write_ring(self.hist_score_buf, score, start)


@dataclass
class LayerState:
    swa: SWARing
    compressor: CompressorState | None = None
    indexer: CompressorState | None = None
    #: The memo of the span call running through it (:func:`~deepinfer.models.layouts.span_memo`).
    step_memo: StepMemo | None = field(default=None, repr=False, compare=False)


class _LayersAtRest:
    """The descriptor behind :attr:`ModelState.layers` (a dataclass field with no default):
    reading it first writes any counters a slotted decode step left behind."""

    def __get__(self, state: ModelState | None, owner: type | None = None) -> list[LayerState]:
        if state is None:
            raise AttributeError("layers has no default")  # so the field stays required
        layers = state._layers
        if state.counters_behind:
            state.counters_behind = False
            pos = state.pos
            for layer in layers:
                layer.swa.length = pos
                for comp in (layer.compressor, layer.indexer):
                    if comp is not None:
                        comp.count = pos // comp.ratio
                        comp.fill = 0 if comp.entries_only else pos % comp.ratio
        return layers

    def __set__(self, state: ModelState, value: list[LayerState]) -> None:
        state._layers = value


@dataclass
class ModelState:
    """Everything a sequence (or a lockstep batch of them) carries between forward calls.

    At rest (between steps) every layer has seen ``pos`` tokens, so each layer's host-side
    counters (ring length, open-window fill, entry count) are functions of ``pos``. A decode
    step over shared slot rows advances ``pos`` alone and sets ``counters_behind``: writing
    three counters per layer per row would cost a large batch more host time than the step's
    launches. :attr:`layers` brings them up to date before anyone reads them.
    """

    layers: _LayersAtRest = _LayersAtRest()
    mtp: list[LayerState] = field(default_factory=list)
    pos: int = 0  # tokens consumed by the main model
    #: Tokens a rollback may take back (``model.new_state(slack=...)``), and the length of the
    #: last rollback: tokens before it are final, so no later rollback goes below it.
    slack: int = 0
    committed: int = 0
    #: The most tokens the state has held (``pos`` before the last rollback, if larger): the
    #: rollback history rings hold the projections of positions from ``fed - keep`` on.
    fed: int = 0
    mtp_pos: int = 0  # positions consumed by the MTP layers
    #: V4.1 Engram only: [B, engram_max_ngram_size - 1] raw token ids before ``pos`` (oldest
    #: first), the pad id where the sequence is shorter; read and assigned as
    #: :attr:`token_history` (assignment copies into it, so it can be a row of a shared tensor,
    #: ``history_pool``). None for models without Engram.
    history_buf: Tensor | None = None
    history_pool: Tensor | None = None
    counters_behind: bool = field(default=False, repr=False)
    _layers: list[LayerState] = field(init=False, repr=False, compare=False)

    @functools.cached_property
    def batch_size(self) -> int:
        """Sequences in the state (fixed for its life: read once per decode row and step)."""
        return self._layers[0].swa.kv.shape[0]

    @property
    def slot(self) -> int:
        """The state's row of shared slot tensors (-1: it owns its tensors); read without
        bringing the layer counters up to date, as a decode step does for every row."""
        return self._layers[0].swa.slot

    @property
    def ring_pool(self) -> Tensor | None:
        """The shared ring tensor the state's first layer is a row of (None: its own)."""
        return self._layers[0].swa.pool

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
