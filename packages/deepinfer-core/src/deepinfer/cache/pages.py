"""Compressed entries and indexer keys in fixed-size pages.

A sequence's compressed entries grow with its length (one per ``ratio`` tokens per compressor),
so reserving every running sequence's rows for ``max_model_len`` wastes the memory of all the
sequences that stop short of it, or does not fit at all for long contexts. Instead the entries
of each 128-token block of a sequence (``128 / ratio`` rows per compressor, the same block the
prefix cache hashes) live in one *page*: page ``p`` is row ``p`` of a
``[num_pages + 1, 128 / ratio, D]`` tensor per compressor, and one table per slot, shared by
every compressor of the model, maps the sequence's blocks to pages. Pages come from a free list
as a sequence grows and go back when it ends; the engine sizes the list from its state budget,
so memory follows the tokens actually held.

A finished page never changes (entries are append-only and a sequence writes only past its
count), so the prefix cache keeps a cached block's entries by holding a reference to its page,
and a sequence restored from the cache maps its first blocks to those pages instead of copying
them. A page goes back to the free list when no slot and no cached block refers to it; when the
list runs dry, the cache gives up least recently used blocks (``reclaim``) before allocation
fails. Running sequences are charged for every page they map, shared or not, so reclaiming the
pages only the cache holds always suffices.

Page 0 is never handed out: unused table cells point at it, and a captured decode batch's
padding rows write there. A page is zeroed when handed out, so nothing of an earlier sequence
stays visible, even to a masked read.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from deepinfer.models.state import SlotBuffers
from deepinfer.paging import PAGE_TOKENS, PagedEntries, page_size, pages_for
from deepinfer.transfer import to_device

__all__ = ["PAGE_TOKENS", "PageTable", "PagedEntries", "page_size", "pages_for"]


class PageTable:
    """Hands out pages to slots and maps each slot's blocks to them (see the module).

    ``table`` [rows, pages_per_slot] lives on the device (decode steps read it); which pages a
    slot owns is also kept on the host, so chunk writes need no device reads. The page tensors
    start with ``initial_pages`` pages and double, up to ``max_pages``, as slots need more;
    growing moves them (a captured step is keyed by their addresses).
    """

    def __init__(
        self,
        rows: int,
        max_len: int,
        max_pages: int,
        initial_pages: int,
        device: torch.device,
    ) -> None:
        if max_pages < 1:
            raise ValueError(f"max_pages must be >= 1, got {max_pages}")
        self.pages_per_slot = pages_for(max_len)
        self.max_pages = max_pages
        self.num_pages = max(1, min(initial_pages, max_pages))
        self.table = torch.zeros(rows, self.pages_per_slot, dtype=torch.long, device=device)
        self.pools: list[SlotBuffers] = []
        self._free = list(range(self.num_pages, 0, -1))  # popped from the end: lowest first
        self._owned: dict[int, list[int]] = {}
        self._refs: dict[int, int] = {}  # page -> slots and cached blocks that refer to it
        self._rows_memo: dict[int, tuple[tuple, Tensor]] = {}  # see _flat_rows
        #: Frees cached pages when the list runs dry: drops one cached block (the least
        #: recently used that holds a page), False when none is left.
        self.reclaim: Callable[[], bool] | None = None

    @property
    def num_free(self) -> int:
        return len(self._free) + self.max_pages - self.num_pages

    def add_pool(self, pool: SlotBuffers, entry: Tensor) -> None:
        """Give ``pool`` page tensors for entries like ``entry`` [..., D] at its ratio."""
        rows = page_size(pool.ratio)
        pool.pages = entry.new_zeros(self.num_pages + 1, rows, entry.shape[-1])
        pool.page_table = self
        self.pools.append(pool)

    def grow_rows(self, rows: int) -> None:
        """Room for ``rows`` slots (the slot tensors grew)."""
        bigger = self.table.new_zeros(rows, self.pages_per_slot)
        bigger[: self.table.shape[0]] = self.table
        self.table = bigger

    def pages_of(self, slot: int) -> list[int]:
        return self._owned.get(slot, [])

    def ensure(self, slot: int, num_tokens: int) -> None:
        """Give ``slot`` pages for the entries of its first ``num_tokens`` tokens."""
        self.ensure_all([slot], [num_tokens])

    def ensure_all(self, slots: Sequence[int], num_tokens: Sequence[int]) -> None:
        """:meth:`ensure` for each of ``slots``, the pages handed out zeroed and mapped
        together: one copy to the device and one op per page tensor for the whole step (a
        model has a page tensor per compressor), not per slot."""
        new_pages: list[int] = []
        cells: list[int] = []  # their table cells, flattened
        for slot, n in zip(slots, num_tokens, strict=True):
            owned = self._owned.setdefault(slot, [])
            need = pages_for(n)
            if need <= len(owned):
                continue
            if need > self.pages_per_slot:
                raise RuntimeError(
                    f"{n} tokens exceed the entry pages' capacity of "
                    f"{self.pages_per_slot * PAGE_TOKENS} (the engine's max_model_len)"
                )
            self._take(need - len(owned))
            new = [self._free.pop() for _ in range(need - len(owned))]
            self._refs.update(dict.fromkeys(new, 1))
            cells.extend(
                range(slot * self.pages_per_slot + len(owned), slot * self.pages_per_slot + need)
            )
            owned.extend(new)
            new_pages.extend(new)
        if not new_pages:
            return
        index, where = to_device(torch.tensor([new_pages, cells]), self.table.device).unbind(0)
        for pool in self.pools:
            assert pool.pages is not None
            pool.pages[index] = 0
        self.table.view(-1)[where] = index

    def _take(self, count: int) -> None:
        """Have ``count`` free pages (reclaiming cached ones, growing), or RuntimeError."""
        while count > self.num_free and self.reclaim is not None and self.reclaim():
            pass
        if count > self.num_free:
            raise RuntimeError(
                f"out of entry pages ({self.max_pages} in all): the state budget's accounting "
                "should have preempted a sequence first"
            )
        if count > len(self._free):
            self._grow(count)

    def share(self, slot: int, pages: list[int]) -> None:
        """Map the first blocks of ``slot`` (which holds none yet) to existing ``pages``."""
        if self._owned.get(slot):
            raise ValueError(f"slot {slot} already holds pages")
        if len(pages) > self.pages_per_slot:
            raise ValueError(f"{len(pages)} pages exceed a slot's {self.pages_per_slot}")
        for page in pages:
            self._refs[page] += 1
        self._owned[slot] = list(pages)
        if pages:
            self.table[slot, : len(pages)] = to_device(torch.tensor(pages), self.table.device)

    def hold(self, slot: int, block: int) -> int:
        """Take a reference to the page of ``slot``'s block ``block`` (for the prefix cache)."""
        page = self._owned[slot][block]
        self._refs[page] += 1
        return page

    def drop(self, page: int) -> None:
        """Give up one reference to ``page``; it is free once none is left."""
        self._refs[page] -= 1
        if not self._refs[page]:
            del self._refs[page]
            self._free.append(page)

    def release(self, slot: int) -> None:
        """Give up every page of ``slot`` and point its table row at page 0."""
        owned = self._owned.pop(slot, [])
        if owned:
            self.table[slot, : len(owned)] = 0
            for page in reversed(owned):
                self.drop(page)

    def read(self, pages: Tensor, slot: int, start: int, stop: int) -> Tensor:
        """Entries ``start:stop`` of ``slot`` in ``pages`` (one compressor's): [1, n, D]."""
        rows = pages.shape[1]
        first, last = start // rows, -(-stop // rows)
        index = self.table[slot, first:last]
        flat = pages.index_select(0, index).flatten(0, 1)
        return flat[start - first * rows : stop - first * rows][None]

    def write(self, pages: Tensor, slot: int, start: int, values: Tensor) -> None:
        """Put ``values`` [1, n, D] at entries ``start..`` of ``slot`` (pages already held):
        a slice of one page, or one indexed copy over every page the entries span (a long
        chunk spans one page per ``128 / ratio`` entries, one entry a page at ratio 128)."""
        rows, n = pages.shape[1], values.shape[1]
        page, row = divmod(start, rows)
        if not n:  # nothing finished (``page`` may not be held yet)
            return
        if row + n <= rows:
            pages[self._owned[slot][page], row : row + n] = values[0]
        else:
            pages.flatten(0, 1).index_copy_(0, self._flat_rows(slot, start, n, pages), values[0])

    def _flat_rows(self, slot: int, start: int, n: int, pages: Tensor) -> Tensor:
        """Rows of ``pages.flatten(0, 1)`` holding entries ``start:start + n`` of ``slot``;
        the last made for each page size is kept, since every compressor of a ratio writes
        the same entries of a chunk."""
        rows = pages.shape[1]
        first, last = start // rows, (start + n - 1) // rows
        key = (start, n, tuple(self._owned[slot][first : last + 1]), pages.device)
        held = self._rows_memo.get(rows)
        if held is None or held[0] != key:
            base = torch.tensor(key[2]) * rows
            flat = (base[:, None] + torch.arange(rows)).flatten()[start - first * rows :][:n]
            held = self._rows_memo[rows] = (key, to_device(flat, pages.device))
        return held[1]

    def rows_view(
        self, pages: Tensor, slots: Tensor, limit: int, counts: Tensor | None = None
    ) -> PagedEntries:
        """Entries ``:limit`` of every slot in ``slots`` [B], left in ``pages`` (device-only);
        ``counts`` [B]: how many of them each slot holds, if known."""
        return PagedEntries(pages, self.row_pages(slots, limit, pages.shape[1]), limit, counts)

    def row_pages(self, slots: Tensor, limit: int, per_page: int) -> Tensor:
        """[B, pages_for(limit)]: the pages holding entries ``:limit`` of each of ``slots``."""
        return self.table[slots, : -(-limit // per_page)]

    def locate(self, slots: Tensor, index: Tensor, per_page: int) -> tuple[Tensor, Tensor]:
        """(page, row in the page) of entries ``index`` of slots ``slots`` (broadcast
        together); ``per_page``: entries a page of the pool holds."""
        return self.table[slots, index // per_page], index % per_page

    def scatter_rows(self, pages: Tensor, slots: Tensor, index: Tensor, values: Tensor) -> None:
        """Put ``values`` at entries ``index`` of slots ``slots`` (broadcast together, e.g.
        [B] with [B] and values [B, D], or [B, 1] with [T] and values [B, T, D]); device-only,
        the pages must be held."""
        page, row = self.locate(slots, index, pages.shape[1])
        pages[page, row] = values.to(pages.dtype)

    def _grow(self, at_least: int) -> None:
        old = self.num_pages
        new = min(max(2 * old, old + at_least - len(self._free)), self.max_pages)
        for pool in self.pools:
            assert pool.pages is not None
            bigger = pool.pages.new_zeros(new + 1, *pool.pages.shape[1:])
            bigger[: old + 1] = pool.pages
            pool.pages = bigger
        self._free = list(range(new, old, -1)) + self._free
        self.num_pages = new
