"""Shared storage for the fixed-size part of every running sequence's state.

Each running sequence owns one *slot*: row ``slot`` of a [rows, ...] tensor per layer holds its
SWA ring, per compressor its open window and previous half-window buffers; one more holds V4.1
Engram's token history. Given ``max_len``, the compressed entries live in pages of shared
tensors that a :class:`~deepinfer.cache.pages.PageTable` maps to slots, as the sequences grow.
Rows of one tensor let a decode batch write every sequence's new rows with one scatter and read
them with one gather per buffer, instead of one copy per sequence; they are also the fixed
addresses that graph capture needs. Without ``max_len`` the entries stay per sequence.

Slots are handed out as sequences are admitted and taken back when they finish or are
preempted. Row 0 is never handed out: padding rows of a captured batch write there. The
tensors grow (doubling, up to ``max_slots`` sequences) as more sequences run at once, so
memory follows the peak number of running sequences, which the engine's ``max_num_seqs``
bounds; growing moves the tensors (a captured step is keyed by their addresses). A slot's
rows are initialised from the state handed in, or for a fresh state from a template's, so
nothing of an earlier sequence remains visible even to a masked read.

Fresh states (:meth:`StateSlots.new_states`) are not built by the model and copied in: a
state's Python objects are copied from a template state's, and the rows of every slot handed
out at once are reset together, one copy per slotted tensor, where building and copying
would cost one allocation and one copy per tensor and sequence (hundreds of tensors a state
at V4-Flash's depth).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch import Tensor

from deepinfer.cache.pages import PageTable
from deepinfer.models.state import BUFFERS, CompressorState, LayerState, ModelState
from deepinfer.paging import PAGE_TOKENS, PageMap, pages_for
from deepinfer.transfer import copy_all, to_device


@dataclass
class CompressorPool:
    """One layer's compressor buffers for every running sequence (the model reads them as
    :class:`~deepinfer.models.state.SlotBuffers`): row ``slot`` is one sequence's; the entries
    live in pages that ``page_table`` maps to each slot. :class:`StateSlots` makes one per
    compressor and updates its tensors when they grow."""

    kv_buf: Tensor | None = None
    score_buf: Tensor | None = None
    prev_kv_buf: Tensor | None = None
    prev_score_buf: Tensor | None = None
    hist_kv_buf: Tensor | None = None
    hist_score_buf: Tensor | None = None
    ratio: int = 1
    pages: Tensor | None = None
    page_table: PageMap | None = None


@dataclass(frozen=True)
class _Field:
    """One slotted tensor of a state: ``state.layers[layer].<part>.<name>``."""

    layer: int  # -1: the state itself
    part: str  # "swa", "compressor", "indexer", "mtp" (an MTP layer's ring) or "state"
    name: str

    def owner(self, state: ModelState) -> object:
        if self.layer < 0:
            return state
        if self.part == "mtp":
            return state.mtp[self.layer].swa
        return getattr(state.layers[self.layer], self.part)


def _fields(state: ModelState) -> list[_Field]:
    out: list[_Field] = []
    for i, layer in enumerate(state.layers):
        out.append(_Field(i, "swa", "kv"))
        for part in ("compressor", "indexer"):
            comp = getattr(layer, part)
            if comp is not None:
                out.extend(_Field(i, part, n) for n in BUFFERS if getattr(comp, n) is not None)
    # MTP layers' rings, so drafts for many sequences run as one pass; an MTP layer with
    # compressors (none in the published configs) keeps its own tensors.
    out.extend(
        _Field(i, "mtp", "kv")
        for i, layer in enumerate(state.mtp)
        if layer.compressor is None and layer.indexer is None
    )
    if state.history_buf is not None:  # V4.1 Engram's token history
        out.append(_Field(-1, "state", "history_buf"))
    return out


def _compressors(state: ModelState) -> dict[tuple[int, str], CompressorState]:
    return {
        (i, part): getattr(layer, part)
        for i, layer in enumerate(state.layers)
        for part in ("compressor", "indexer")
        if getattr(layer, part) is not None
    }


_T = TypeVar("_T")


def _copy(obj: _T) -> _T:
    """A shallow copy of a plain (dataclass) object: its attributes, no ``copy`` protocol."""
    new = object.__new__(type(obj))
    new.__dict__.update(obj.__dict__)
    return new


def _fresh_copy(comp: CompressorState | None, own_entries: bool) -> CompressorState | None:
    if comp is None:
        return None
    new = _copy(comp)
    new.marks = {}
    if own_entries and comp.entries_buf is not None:  # empty: its own, grown on append
        new.entries_buf = comp.entries_buf.clone()
    return new


def _fresh_layer(layer: LayerState, own_entries: bool) -> LayerState:
    swa = _copy(layer.swa)
    swa.marks = {}
    comp, index = layer.compressor, layer.indexer
    return LayerState(swa, _fresh_copy(comp, own_entries), _fresh_copy(index, own_entries))


def _shell(template: ModelState, own_entries: bool) -> ModelState:
    """A state with Python objects of its own, shaped and counted as the fresh ``template``:
    its slotted tensors are the template's until :meth:`StateSlots._point` points them at a
    slot (the template's are never written); ``own_entries``: its compressors keep their
    entries in buffers of their own (else in the pool's pages)."""
    state = _copy(template)
    state.layers = [_fresh_layer(layer, own_entries) for layer in template.layers]
    state.mtp = [_fresh_layer(layer, own_entries) for layer in template.mtp]
    return state


class StateSlots:
    """Hands out slots of shared state tensors to single-sequence states (see the module).

    ``max_pages`` bounds the entry pages (default: enough for ``max_slots`` sequences of
    ``max_len`` tokens); ``initial_pages`` are allocated up front, the rest as needed.
    """

    def __init__(
        self,
        new_state: Callable[[], ModelState],
        max_slots: int,
        max_len: int | None = None,
        *,
        initial_slots: int = 8,
        max_pages: int | None = None,
        initial_pages: int = 64,
    ) -> None:
        if max_slots < 1:
            raise ValueError(f"max_slots must be >= 1, got {max_slots}")
        self._new_state = new_state
        self.max_slots = max_slots
        self._template = template = new_state()
        if template.batch_size != 1:
            raise ValueError("StateSlots holds single-sequence states (batch_size 1)")
        rows = min(initial_slots, max_slots) + 1  # + the padding row
        self.fields = _fields(template)
        #: A fresh state's rows, one per slotted tensor: what a new slot is reset to.
        self._blank = [getattr(f.owner(template), f.name) for f in self.fields]
        # An MTP layer with compressors keeps tensors of its own, which a shell would share.
        self._shells = all(m.compressor is None and m.indexer is None for m in template.mtp)
        self.tensors: list[Tensor] = []
        for f in self.fields:
            t = getattr(f.owner(template), f.name)
            self.tensors.append(t.new_zeros((rows, *t.shape[1:])))
        # One CompressorPool per compressor, shared by every state and updated when tensors grow.
        comps = _compressors(template)
        self._pools = {key: CompressorPool(ratio=comp.ratio) for key, comp in comps.items()}
        self.page_table: PageTable | None = None
        if max_len is not None and comps:
            self.page_table = table = PageTable(
                rows,
                max_len,
                max_pages if max_pages is not None else max_slots * pages_for(max_len),
                initial_pages,
                template.layers[0].swa.kv.device,
            )
            for key, comp in comps.items():
                assert comp.entries_buf is not None
                table.add_pool(self._pools[key], comp.entries_buf)
        self._sync_pools()
        self._free = list(range(rows - 1, 0, -1))  # popped from the end: lowest slot first
        self._live: dict[int, ModelState] = {}

    @property
    def num_slots(self) -> int:
        return self.tensors[0].shape[0] - 1

    @property
    def num_used(self) -> int:
        return len(self._live)

    def new_state(self) -> ModelState:
        """A fresh single-sequence state whose fixed-size tensors live in a free slot."""
        return self.new_states(1)[0]

    def new_states(self, n: int) -> list[ModelState]:
        """``n`` fresh single-sequence states in free slots (see the module): the slots'
        rows reset together, one copy per slotted tensor."""
        if not self._shells:
            return [self._adopt(self._new_state()) for _ in range(n)]
        slots: list[int] = []
        try:  # all slots first: growing moves the tensors
            slots += (self._take_slot() for _ in range(n))
        except RuntimeError:
            self._free += reversed(slots)  # none of them handed out
            raise
        if n == 1:  # (multi-tensor copies: a few launches, not one per tensor)
            copy_all([t[slots[0]] for t in self.tensors], [b[0] for b in self._blank])
        elif n:
            # (through pinned memory: a plain upload would wait for the steps in flight)
            index = to_device(torch.tensor(slots), self.tensors[0].device)
            for t, blank in zip(self.tensors, self._blank, strict=True):
                t.index_copy_(0, index, blank.expand(n, *blank.shape[1:]))
        states = []
        for slot in slots:
            state = _shell(self._template, own_entries=self.page_table is None)
            self._live[slot] = state
            self._point(state, slot)
            if self.page_table is not None:
                self.page_table.share(slot, [])
            states.append(state)
        return states

    def adopt(self, state: ModelState) -> ModelState:
        """Move ``state``, built on its own (``model.new_state(1)``, then run), into a free
        slot: its fixed-size tensors are copied into the slot's rows and its entries into the
        slot's pages; the state object then lives there."""
        if state.ring_pool is not None:
            raise ValueError("this state already lives in slot tensors")
        return self._adopt(state)

    def clone(self, state: ModelState) -> ModelState:
        """A deep copy of ``state`` in a slot of its own (the samples of an ``n`` > 1 group).
        Its full entry pages are shared, not copied: neither sequence writes them again."""
        # Deep-copy all but the slotted tensors (a plain deepcopy would copy each shared tensor
        # whole): the copy first shares the original's rows, then _adopt moves it to its own.
        memo: dict[int, object] = {id(t): t for t in self.tensors}
        memo.update({id(pool): pool for pool in self._pools.values()})
        for f in self.fields:
            t = getattr(f.owner(state), f.name)
            memo[id(t)] = t
        full: list[int] = []
        if self.page_table is not None:
            slot = state.layers[0].swa.slot
            full = self.page_table.pages_of(slot)[: state.pos // PAGE_TOKENS]
        return self._adopt(copy.deepcopy(state, memo), full)

    def release(self, state: ModelState) -> None:
        """Hand ``state``'s slot back; the state must not be used afterwards."""
        slot = state.layers[0].swa.slot
        if self._live.get(slot) is not state:
            raise ValueError("this state does not hold a slot of this pool")
        del self._live[slot]
        self._free.append(slot)
        if self.page_table is not None:
            self.page_table.release(slot)
        state.history_pool = None
        for layer in (*state.layers, *state.mtp):
            layer.swa.pool, layer.swa.slot = None, -1
            for comp in (layer.compressor, layer.indexer):
                if comp is not None:
                    comp.pool, comp.slot = None, -1

    def _adopt(self, state: ModelState, shared: list[int] | None = None) -> ModelState:
        """Copy ``state``'s slotted tensors into a free slot and point the state at it; its
        first blocks' entries are the pages ``shared``, the rest are copied."""
        if _fields(state) != self.fields:
            raise ValueError("state layout differs from the pool's (model or slack)")
        for t, f in zip(self.tensors, self.fields, strict=True):
            if getattr(f.owner(state), f.name).shape[1:] != t.shape[1:]:
                raise ValueError("state layout differs from the pool's (model or slack)")
        slot = self._take_slot()
        shared = shared or []
        first = len(shared) * PAGE_TOKENS  # tokens whose entries are in the shared pages
        comps = _compressors(state)
        tails = {}
        if self.page_table is not None:  # read before the state moves to its slot
            tails = {k: c.entries_from(first // c.ratio) for k, c in comps.items()}
        for t, f in zip(self.tensors, self.fields, strict=True):
            t[slot].copy_(getattr(f.owner(state), f.name)[0])
        self._live[slot] = state
        self._point(state, slot)
        if self.page_table is not None:
            self.page_table.share(slot, shared)
        for key, tail in tails.items():  # into the slot's own pages
            comps[key].count = first // comps[key].ratio
            comps[key].append_entries(tail)
        return state

    def _take_slot(self) -> int:
        if not self._free:
            self._grow()
        return self._free.pop()

    def _grow(self) -> None:
        old = self.num_slots
        if old >= self.max_slots:
            raise RuntimeError(
                f"all {self.max_slots} state slots are in use (more running sequences than "
                "max_num_seqs)"
            )
        new = min(2 * old, self.max_slots)
        grown = []
        for t in self.tensors:
            bigger = t.new_zeros((new + 1, *t.shape[1:]))
            bigger[: old + 1] = t
            grown.append(bigger)
        self.tensors = grown
        if self.page_table is not None:
            self.page_table.grow_rows(new + 1)
        self._sync_pools()
        self._free = list(range(new, old, -1))
        for slot, state in self._live.items():
            self._point(state, slot)

    def _sync_pools(self) -> None:
        for t, f in zip(self.tensors, self.fields, strict=True):
            if f.part in ("compressor", "indexer"):
                setattr(self._pools[f.layer, f.part], f.name, t)

    def _point(self, state: ModelState, slot: int) -> None:
        for t, f in zip(self.tensors, self.fields, strict=True):
            owner = f.owner(state)
            setattr(owner, f.name, t[slot : slot + 1])
            if f.part in ("swa", "mtp"):
                owner.pool, owner.slot = t, slot  # type: ignore[attr-defined]
            elif f.part == "state":
                state.history_pool = t
        for (layer, part), pool in self._pools.items():
            comp = getattr(state.layers[layer], part)
            comp.pool, comp.slot = pool, slot
            if pool.pages is not None:
                comp.entries_buf = None
