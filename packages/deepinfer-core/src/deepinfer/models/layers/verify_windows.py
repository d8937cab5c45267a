"""A compressor's windows in a verification pass: up to T new tokens a row over shared buffers.

A verification row feeds its last token and its drafts ([B, T], :mod:`deepinfer.models.verify`).
Which windows each row's tokens close, and where their entries go, is the same for every
compressor of a ratio: :func:`verify_plan` makes it once a pass, one backend op
(:class:`~deepinfer.backends.compress_verify_ref.VerifyPlan`), each compressor's windows are
pooled by one backend op (:meth:`~deepinfer.backends.base.Backend.compress_verify`), and the
entries of the windows that close are written here (the others, and padding rows', to the
padding slot). Nothing depends on the host, so the pass is capturable.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from deepinfer.backends.compress_verify_ref import VerifyPlan
from deepinfer.models.layouts import CompressorRows
from deepinfer.paging import PagedEntries

if TYPE_CHECKING:
    from deepinfer.backends.base import Backend
    from deepinfer.models.layers.rope import Rotary


def verify_plan(rows: CompressorRows, ops: Backend) -> VerifyPlan:
    """The pass's :class:`VerifyPlan` for ``rows``' ratio (memoised in the pass)."""
    tokens, r = rows.tokens, rows.ratio
    assert tokens is not None
    key = ("verify plan", r)
    return rows.step_memo.get(
        key, lambda: ops.verify_plan(tokens.positions, tokens.slots, tokens.lengths, r)
    )


def verify_entry_angles(
    rows: CompressorRows, plan: VerifyPlan, rotary: Rotary
) -> tuple[Tensor, Tensor]:
    """(cos, sin) of each candidate window's entry position [B, W]: the same for every layer of
    the ratio (the plan is), so made once a pass and shared by compressors and KV sources."""
    key = ("verify entry angles", rows.ratio, id(rotary))
    return rows.step_memo.get(key, lambda: rotary.cos_sin(plan.entry * rows.ratio))


def verify_entry_targets(rows: CompressorRows, plan: VerifyPlan) -> tuple[Tensor, PagedEntries]:
    """(the flattened pages' row [B, W] where each candidate window's entry goes: the padding
    slot's first entry for a window that does not close; every row's entries ``:entry_limit``,
    in their pages). The same for every layer of the ratio: memoised in the pass."""
    pages, table, tokens = rows.pool.pages, rows.pool.page_table, rows.tokens
    assert pages is not None and table is not None and tokens is not None
    per_page = pages.shape[1]

    def locate() -> tuple[Tensor, Tensor, Tensor]:
        slots = torch.where(plan.closes, rows.slots[:, None], 0)
        page, row = table.locate(slots, torch.where(plan.closes, plan.entry, 0), per_page)
        last = tokens.positions[:, 0] + tokens.lengths - 1  # the row's last real position
        counts = torch.where(tokens.lengths > 0, last // rows.ratio + 1, 0)
        held = table.row_pages(rows.slots, rows.entry_limit, per_page)
        return page * per_page + row, held, counts

    key = ("verify pages", id(table), rows.ratio, per_page, rows.entry_limit)
    target, held, counts = rows.step_memo.get(key, locate)
    return target, PagedEntries(pages, held, rows.entry_limit, counts)


def write_verify_entries(rows: CompressorRows, plan: VerifyPlan, new: Tensor) -> PagedEntries:
    """Write the entries ``new`` [B, W, D] of the windows that close (the others to the
    padding slot's first entry, :func:`verify_entry_targets`); returns every row's entries
    ``:entry_limit``, in their pages."""
    target, entries = verify_entry_targets(rows, plan)
    entries.pages.flatten(0, 1)[target] = new.to(entries.pages.dtype)
    return entries
