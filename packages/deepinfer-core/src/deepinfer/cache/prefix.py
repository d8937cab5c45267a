"""Exact prefix cache at 128-token boundaries.

For every full block of 128 tokens a sequence has computed, the cache keeps what restoring the
state at that boundary needs: the compressed entries and indexer keys appended during the block,
and the boundary's SWA ring and compressor partial-window buffers. A later request whose tokens
start with the same blocks gets the state rebuilt exactly (entries block by block, the rest
copied from the last block), so its outputs equal a cold run while the cached prefill is
skipped. Blocks are keyed by a hash chained over all tokens from the start, and evicted least
recently used first, each together with the blocks that extend it, under a byte budget.

A block's entries are one entry page (:mod:`deepinfer.cache.pages`) when the sequence's state
lives in pages: the block holds a reference to the page instead of a copy, and a restored state
maps its first blocks to those pages. Such pages live in the state pool's memory, not the
cache's budget; when the pool needs them the cache gives up blocks (:meth:`reclaim_page`).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from deepinfer.cache.pages import PageTable
from deepinfer.models.layouts import page_table_of
from deepinfer.models.rollback import seed_history
from deepinfer.models.state import CompressorState, ModelState, SlotBuffers, clone_or_none
from deepinfer.paging import PAGE_TOKENS
from deepinfer.transfer import copy_all

#: A block's compressed entries fill whole entry pages.
BLOCK_SIZE = PAGE_TOKENS


def _nbytes(t: Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()


@dataclass
class _CompressorSnap:
    entries: Tensor | None  # the entries appended during this block only; None: in ``pages``
    buf_kv: Tensor
    buf_score: Tensor
    prev_kv: Tensor | None
    prev_score: Tensor | None
    num_entries: int  # entries in the whole prefix up to the boundary
    hist_kv: Tensor | None = None  # rollback history ring of states built with slack
    hist_score: Tensor | None = None
    pages: SlotBuffers | None = None  # the pool whose pages hold the block's entries

    @classmethod
    def take(
        cls, comp: CompressorState, first: int, paged: bool, clones: _Clones
    ) -> _CompressorSnap:
        return cls(
            None if paged else _owned_copy(comp, first, clones),
            clones.of(comp.buf_kv),
            clones.of(comp.buf_score),
            clones.of_or_none(comp.prev_kv),
            clones.of_or_none(comp.prev_score),
            comp.num_entries,
            clones.of_or_none(comp.hist_kv_buf),
            clones.of_or_none(comp.hist_score_buf),
            comp.pool if paged else None,
        )

    def block_entries(self, page: int | None) -> Tensor:
        """The block's entries [1, n, D], wherever they are."""
        if self.entries is not None:
            return self.entries
        assert self.pages is not None and self.pages.pages is not None and page is not None
        return self.pages.pages[page][None]

    def nbytes(self) -> int:
        tensors = (self.entries, self.buf_kv, self.buf_score, self.prev_kv, self.prev_score)
        return sum(_nbytes(t) for t in (*tensors, self.hist_kv, self.hist_score))


class _Clones:
    """Copies asked for one by one and made together (:meth:`make`: one multi-tensor copy
    per dtype, :func:`.transfer.copy_all`), where a clone each would be a launch each:
    a snapshot of a V4-Flash state has hundreds of tensors."""

    def __init__(self) -> None:
        self.sources: list[Tensor] = []
        self.copies: list[Tensor] = []

    def of(self, t: Tensor) -> Tensor:
        """A tensor like ``t`` that holds its values once :meth:`make` has run."""
        new = torch.empty_like(t)
        self.sources.append(t)
        self.copies.append(new)
        return new

    def of_or_none(self, t: Tensor | None) -> Tensor | None:
        return None if t is None else self.of(t)

    def make(self) -> None:
        copy_all(self.copies, self.sources)


def _owned_copy(comp: CompressorState, first: int, clones: _Clones) -> Tensor:
    """Entries ``first:`` as a tensor of their own (read from pages, they already are)."""
    entries = comp.entries_from(first)
    return entries if comp.paged else clones.of(entries)


def _take(
    comp: CompressorState | None, prev: _CompressorSnap | None, paged: bool, clones: _Clones
) -> _CompressorSnap | None:
    """Snapshot ``comp`` keeping only the entries appended since the previous block (none
    when ``paged``: the block's page holds them)."""
    if comp is None:
        return None
    return _CompressorSnap.take(comp, prev.num_entries if prev else 0, paged, clones)


@dataclass
class _LayerSnap:
    swa_kv: Tensor
    compressor: _CompressorSnap | None
    indexer: _CompressorSnap | None


@dataclass(eq=False)
class Block:
    key: bytes
    parent: Block | None
    end: int  # tokens covered from the start of the sequence
    layers: list[_LayerSnap]
    nbytes: int
    token_history: Tensor | None = None  # V4.1 Engram: the last token ids before ``end``
    children: set[Block] = field(default_factory=set)
    #: The entry page holding the block's entries (a reference taken from ``table``).
    page: int | None = None
    table: PageTable | None = None

    def chain(self) -> list[Block]:
        blocks: list[Block] = []
        node: Block | None = self
        while node is not None:
            blocks.append(node)
            node = node.parent
        return blocks[::-1]


@dataclass(eq=False)
class Snapshot:
    """A sequence's state at a block boundary, taken before the block is keyed: with
    asynchronous scheduling the block's last token may still be on the device when the state
    reaches the boundary (the copies are queued at once; the key waits for the token)."""

    end: int
    layers: list[_LayerSnap]
    nbytes: int
    token_history: Tensor | None
    page: int | None = None
    table: PageTable | None = None


def block_key(parent: bytes | None, tokens: list[int]) -> bytes:
    h = hashlib.sha256(parent or b"root")
    h.update(torch.tensor(tokens, dtype=torch.int64).numpy().tobytes())
    return h.digest()


def _restore_layers(state: ModelState, block: Block, chain: list[Block], shared: int) -> None:
    """Put the cached layers of ``block`` into ``state``'s (slot) tensors: every ring and
    buffer copy of the state at once (:func:`.transfer.copy_all`: a few launches where one
    copy per tensor would be hundreds at V4-Flash's depth), the entries past the ``shared`` pages
    appended, and a history ring the snapshot lacks rebuilt from the buffers after."""
    dst: list[Tensor] = []
    src: list[Tensor] = []
    seeds: list[CompressorState] = []
    for i, layer in enumerate(state.layers):
        snap = block.layers[i]
        dst.append(layer.swa.kv)
        src.append(snap.swa_kv)
        layer.swa.length = block.end
        for name in ("compressor", "indexer"):
            comp: CompressorState | None = getattr(layer, name)
            last: _CompressorSnap | None = getattr(snap, name)
            if comp is None or last is None:
                continue
            comp.count = shared * BLOCK_SIZE // comp.ratio  # in the shared pages
            pieces = [getattr(b.layers[i], name).block_entries(b.page) for b in chain[shared:]]
            if pieces:
                comp.append_entries(torch.cat(pieces, dim=1))
            comp.fill = n = last.buf_kv.shape[1]
            dst += [comp.kv_buf[:, :n], comp.score_buf[:, :n]]
            src += [last.buf_kv, last.buf_score]
            comp.prev_kv, comp.prev_score = last.prev_kv, last.prev_score  # (setters copy)
            if comp.hist_kv_buf is not None and last.hist_kv is not None:
                assert comp.hist_score_buf is not None and last.hist_score is not None
                dst += [comp.hist_kv_buf, comp.hist_score_buf]
                src += [last.hist_kv, last.hist_score]
            elif comp.keep:  # rebuilt from the buffers: a rollback reads no further back
                seeds.append(comp)
    copy_all(dst, src)
    for comp in seeds:
        seed_history(comp, block.end)


@dataclass
class PrefixCacheStats:
    queries: int = 0  # prompt tokens looked up
    hits: int = 0  # prompt tokens restored instead of computed
    inserted_blocks: int = 0
    evicted_blocks: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


class PrefixCache:
    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self.blocks: OrderedDict[bytes, Block] = OrderedDict()
        self.used_bytes = 0
        self.stats = PrefixCacheStats()

    def match(self, token_ids: list[int]) -> Block | None:
        """The last block of the longest cached prefix that leaves at least one token to run."""
        usable = (len(token_ids) - 1) // BLOCK_SIZE
        parent: bytes | None = None
        found: Block | None = None
        for i in range(usable):
            key = block_key(parent, token_ids[i * BLOCK_SIZE : (i + 1) * BLOCK_SIZE])
            block = self.blocks.get(key)
            if block is None:
                break
            found, parent = block, key
        if found is not None:
            for block in reversed(found.chain()):  # ancestors end up most recently used
                self.blocks.move_to_end(block.key)
        return found

    def restore(self, block: Block, new_state: Callable[[], ModelState]) -> ModelState:
        """A fresh state equal to the one the cached sequence had at ``block.end``; in pages,
        its first blocks map to the cached pages (as far as the chain has them)."""
        chain = block.chain()
        state = new_state()
        shared = 0
        found = page_table_of(state)
        if found is not None:
            table, slot = found
            pages = []
            for b in chain:  # the chain's leading blocks whose pages are in this table
                if b.page is None or b.table is not table:
                    break
                pages.append(b.page)
            shared = len(pages)
            table.share(slot, pages)
            # Pages for the rest now: reclaiming them may evict blocks of this very chain,
            # whose copies are still read below (the shared pages are the slot's already).
            table.ensure(slot, block.end)
        _restore_layers(state, block, chain, shared)
        state.pos = block.end
        state.token_history = clone_or_none(block.token_history)
        return state

    def snapshot(self, parent: Block | None, state: ModelState, share: bool = False) -> Snapshot:
        """What :meth:`insert` keeps of ``state`` at the boundary after ``parent``. ``share``:
        take a reference to the block's entry page rather than a copy of its entries (a
        snapshot that may never be inserted copies, so that it holds no page)."""
        assert state.pos == (parent.end if parent else 0) + BLOCK_SIZE
        found = page_table_of(state) if share else None
        page = None
        if found is not None:
            page = found[0].hold(found[1], state.pos // BLOCK_SIZE - 1)
        layers: list[_LayerSnap] = []
        clones, paged = _Clones(), page is not None
        for i, layer in enumerate(state.layers):
            prev = parent.layers[i] if parent else None
            layers.append(
                _LayerSnap(
                    clones.of(layer.swa.kv),
                    _take(layer.compressor, prev.compressor if prev else None, paged, clones),
                    _take(layer.indexer, prev.indexer if prev else None, paged, clones),
                )
            )
        clones.make()
        nbytes = sum(
            _nbytes(s.swa_kv) + sum(c.nbytes() for c in (s.compressor, s.indexer) if c)
            for s in layers
        )
        history = clone_or_none(state.token_history)
        table = found[0] if found is not None else None
        return Snapshot(state.pos, layers, nbytes, history, page, table)

    def insert(
        self, parent: Block | None, tokens: list[int], state: ModelState | Snapshot
    ) -> Block:
        """Record the block that ends at ``state``'s position (``tokens`` are its 128 tokens),
        from the state itself or from a :meth:`snapshot` taken at the boundary."""
        assert len(tokens) == BLOCK_SIZE
        key = block_key(parent.key if parent else None, tokens)
        existing = self.blocks.get(key)
        if existing is not None:
            self.blocks.move_to_end(key)
            return existing
        snap = state if isinstance(state, Snapshot) else self.snapshot(parent, state, share=True)
        assert snap.end == (parent.end if parent else 0) + BLOCK_SIZE
        block = Block(
            key,
            parent,
            snap.end,
            snap.layers,
            snap.nbytes,
            snap.token_history,
            page=snap.page,
            table=snap.table,
        )
        if parent is not None:
            parent.children.add(block)
        self.blocks[key] = block
        self.used_bytes += snap.nbytes
        self.stats.inserted_blocks += 1
        self._evict(keep=block)
        return block

    def clear(self) -> None:
        """Forget every block (the statistics are kept; a clear is not an eviction)."""
        for block in self.blocks.values():
            _drop_page(block)
        self.blocks.clear()
        self.used_bytes = 0

    def reclaim_page(self) -> bool:
        """Evict the least recently used block that holds an entry page (with the blocks that
        extend it), for a page table that ran out; False when no block holds one."""
        for block in self.blocks.values():
            if block.page is not None:
                self._remove(block)
                return True
        return False

    def _evict(self, keep: Block) -> None:
        if self.used_bytes <= self.budget_bytes:
            return
        protected = set(keep.chain())
        for key in list(self.blocks):
            if self.used_bytes <= self.budget_bytes:
                return
            block = self.blocks.get(key)
            if block is not None and block not in protected:
                self._remove(block)

    def _remove(self, block: Block) -> None:
        for child in list(block.children):
            self._remove(child)
        if self.blocks.pop(block.key, None) is not None:
            self.used_bytes -= block.nbytes
            self.stats.evicted_blocks += 1
            _drop_page(block)
        if block.parent is not None:
            block.parent.children.discard(block)

    def __contains__(self, block: object) -> bool:
        return isinstance(block, Block) and self.blocks.get(block.key) is block


def _drop_page(block: Block) -> None:
    if block.page is not None:
        assert block.table is not None
        block.table.drop(block.page)
        block.page = None
