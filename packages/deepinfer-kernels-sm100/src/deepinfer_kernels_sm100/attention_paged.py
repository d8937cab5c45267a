"""Decode attention's keys read where they are: each row's ring and its entries' pages.

A decode step's keys are a row's sliding-window ring and the compressed entries it sees (all of
an HCA layer's visible ones, a top-k layer's picks). Copying them into one key tensor per layer
took a gather of the ring, one of the picked entries and two concatenations (keys and mask), and
at large batches those copies moved more bytes than attention itself reads. Instead the kernel
takes two paged pools (:class:`deepinfer.paging.KeyPages`) and these helpers turn a key column
into its pool row: the first ``keys_a`` columns list entries of pool a, the rest of pool b.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from deepinfer.paging import KeyPages


@triton.jit
def paged_rows(  # noqa: PLR0917 (a jit helper takes positional arguments)
    entry_a_ptr,  # [B, keys_a] entries of pool a, -1 = none
    entry_b_ptr,  # [B, keys - keys_a] entries of pool b, -1 = none
    pages_a_ptr,  # [B, n_pages_a] the page of each block of per_a entries
    pages_b_ptr,
    b,
    lk,
    lmask,
    keys_a,
    keys_b,
    n_pages_a,
    n_pages_b,
    per_a,
    per_b,
):
    """(row of its pool, visible, in pool a) of key columns ``lk`` of batch row ``b``: the
    first ``keys_a`` columns list entries of pool a, the rest of pool b; entry e of a row is
    row ``pages[b, e // per] * per + e % per`` of its pool."""
    in_a = lk < keys_a
    ea = tl.load(entry_a_ptr + b * keys_a + lk, mask=lmask & in_a, other=-1).to(tl.int64)
    eb = tl.load(entry_b_ptr + b * keys_b + lk - keys_a, mask=lmask & (lk >= keys_a), other=-1)
    entry = tl.where(in_a, ea, eb.to(tl.int64))
    visible = entry >= 0
    entry = tl.maximum(entry, 0)
    per = tl.where(in_a, per_a, per_b).to(tl.int64)
    pa = tl.load(pages_a_ptr + b * n_pages_a + entry // per, mask=visible & in_a, other=0)
    pb = tl.load(pages_b_ptr + b * n_pages_b + entry // per, mask=visible & ~in_a, other=0)
    page = tl.where(in_a, pa.to(tl.int64), pb.to(tl.int64))
    return page * per + entry % per, visible, in_a


@triton.jit
def key_tile(  # noqa: PLR0917 (a jit helper takes positional arguments)
    kv_base, kv2_ptr, key_row, cols, row_ok, col_ok, in_a, dim, POOLS: tl.constexpr
):
    """[BLOCK_L, cols] of the listed key rows: of one tensor (``POOLS`` 0), or of pool a where
    ``in_a``, else of pool b in pool a's dtype (the rounding the copy into one key tensor did).
    Pools of one dtype (1) take one load through a pointer picked per row: two masked loads
    and a select (2) hold two tiles in registers, which a 512-column tile cannot spare."""
    at = key_row[:, None] * dim + cols[None, :]
    mask = row_ok[:, None] & col_ok[None, :]
    if POOLS == 1:
        return tl.load(tl.where(in_a[:, None], kv_base + at, kv2_ptr + at), mask=mask, other=0.0)
    if POOLS == 2:
        a = tl.load(kv_base + at, mask=mask & in_a[:, None], other=0.0)
        b = tl.load(kv2_ptr + at, mask=mask & ~in_a[:, None], other=0.0)
        return tl.where(in_a[:, None], a, b.to(a.dtype))
    return tl.load(kv_base + at, mask=mask, other=0.0)


class KeyPool(NamedTuple):
    """One paged key source as the kernel reads it."""

    rows: Tensor  # [pages * per_page, D]
    entries: Tensor  # [B, K] int64, -1 = none
    pages: Tensor  # [B, n]
    per_page: int

    @classmethod
    def of(cls, source: KeyPages) -> KeyPool:
        pool = source.pool
        rows, entries = pool.flatten(0, 1), source.entries[:, 0].to(torch.int64).contiguous()
        return cls(rows, entries, source.pages.contiguous(), pool.shape[1])
