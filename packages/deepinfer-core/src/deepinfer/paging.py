"""How compressed entries are addressed in pages: the types models, backends and the cache share.

The cache (:mod:`deepinfer.cache.pages`) hands out pages and keeps the page tables; a model's
state reads and writes its entries through a table, and a decode step reads them in place
(:class:`PagedEntries`). These types sit below all three, so none of them imports another's
internals.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import torch
from torch import Tensor

#: Tokens whose entries one page holds: the prefix cache's block size.
PAGE_TOKENS = 128


def pages_for(num_tokens: int) -> int:
    """Pages that hold the entries of ``num_tokens`` tokens (one per started block)."""
    return -(-num_tokens // PAGE_TOKENS)


def page_size(ratio: int) -> int:
    """Entries of one compressor in a page."""
    if PAGE_TOKENS % ratio:
        raise NotImplementedError(
            f"paged entries need compression ratios that divide {PAGE_TOKENS}, got {ratio}"
        )
    return PAGE_TOKENS // ratio


class PageMap(Protocol):
    """The page table as a state sees it (:class:`deepinfer.cache.pages.PageTable`)."""

    table: Tensor  # [rows, pages_per_slot] each slot's pages, on the device
    pages_per_slot: int

    def ensure(self, slot: int, num_tokens: int) -> None:
        """Give ``slot`` pages for the entries of its first ``num_tokens`` tokens."""
        ...

    def ensure_all(self, slots: Sequence[int], num_tokens: Sequence[int]) -> None:
        """:meth:`ensure` for each of ``slots``, in one go."""
        ...

    def read(self, pages: Tensor, slot: int, start: int, stop: int) -> Tensor:
        """Entries ``start:stop`` of ``slot`` in ``pages``: [1, n, D]."""
        ...

    def write(self, pages: Tensor, slot: int, start: int, values: Tensor) -> None:
        """Put ``values`` [1, n, D] at entries ``start..`` of ``slot``."""
        ...

    def row_pages(self, slots: Tensor, limit: int, per_page: int) -> Tensor:
        """[B, pages_for(limit)]: the pages holding entries ``:limit`` of each of ``slots``."""
        ...

    def locate(self, slots: Tensor, index: Tensor, per_page: int) -> tuple[Tensor, Tensor]:
        """(page, row in the page) of entries ``index`` of ``slots``."""
        ...

    def scatter_rows(self, pages: Tensor, slots: Tensor, index: Tensor, values: Tensor) -> None:
        """Put ``values`` at entries ``index`` of ``slots`` (device-only)."""
        ...


@dataclass
class PagedEntries:
    """Entries ``:limit`` of each row of a decode batch, read in place from their pages.

    A decode step used to copy every row's entries into a dense [B, limit, D] tensor per
    layer, although a top-k layer attends to only ``index_topk`` of them: with V4.1's ratio-1
    layers at 64k tokens that is 64 MiB a row in bf16, written and read again each step. A
    top-k layer now gathers just its picked rows (:meth:`take`), a backend may score keys in
    their pages directly, and the rest (dense attention over HCA entries, the reference
    scoring) asks for the copy (:meth:`dense`).
    """

    pages: Tensor  # [num_pages + 1, rows, D]: one compressor's pages
    index: Tensor  # [B, pages_for(limit)]: the page of each row's blocks
    limit: int
    #: [B] entries each row holds (at most ``limit``; None: unknown). A captured step's
    #: ``limit`` is its entry bucket's, up to 4x a row's own count: readers may skip the rest.
    counts: Tensor | None = None

    @property
    def shape(self) -> torch.Size:
        """The dense copy's shape, [B, limit, D]."""
        return torch.Size((self.index.shape[0], self.limit, self.pages.shape[-1]))

    def dense(self) -> Tensor:
        """[B, limit, D]: row i's entries ``:limit`` (past its own count: whatever its pages
        hold there, zeros or provisional entries; callers mask by each row's count)."""
        return self.pages[self.index].flatten(1, 2)[:, : self.limit]


class KeyPages(NamedTuple):
    """Keys of decode rows read in place (:meth:`deepinfer.backends.base.Backend.paged_attention`):
    entry e of batch row b is ``pool[pages[b, e // per_page], e % per_page]``. A ring is one
    page a row (``pages``: the rows' slots); compressed entries are their pages
    (:attr:`PagedEntries.index`)."""

    pool: Tensor  # [num_pages, per_page, D]
    pages: Tensor  # [B, n] int: each row's pages
    entries: Tensor  # [B, 1, K] int64: the entries each row's query sees, -1 = none

    def rows(self) -> Tensor:
        """[B, K] int64: each listed entry's row of the flattened pool (0 where none)."""
        per_page = self.pool.shape[1]
        entry = self.entries[:, 0].clamp(min=0)
        return self.pages.gather(1, entry // per_page).long() * per_page + entry % per_page


def dense_entries(entries: Tensor | PagedEntries) -> Tensor:
    """``entries`` as a dense [B, T, D] tensor (a paged view is copied out)."""
    return entries.dense() if isinstance(entries, PagedEntries) else entries
