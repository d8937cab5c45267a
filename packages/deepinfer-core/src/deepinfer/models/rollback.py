"""Roll a sequence state back to an earlier length, exactly (speculative decoding).

A speculative step feeds k drafted tokens and keeps only the first j that verify; the state must
then be what it would be had only those j run. Everything per-token is cheap to take back if it
was kept: the SWA ring holds ``slack`` rows beyond the window (so the rows the rejected tokens
overwrote are still there), compressed entries are truncated to the complete windows of the new
length, and each compressor's open window (and, with overlap, the previous window's first half)
is rebuilt from the raw projections of its last ``slack + 2 * ratio`` inputs, kept in a ring
like the window's (so the engine's shared passes write them by index). A state built
without slack cannot be rolled back.

The contract is speculative decoding's: a rollback reaches at most ``slack`` tokens back and never
below the target of an earlier rollback (tokens accepted then are final). Under it the rows the
rejected tokens overwrote are never needed again, so ``slack`` extra rows and ``slack + 2 * ratio``
kept projections suffice however the steps interleave.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from deepinfer.models.state import CompressorState, LayerState, ModelState, SlotBuffers
from deepinfer.transfer import to_device


def rollback_states(rollbacks: Sequence[tuple[ModelState, int]]) -> None:
    """Roll each state's main (and MTP) layers and ``pos`` back to its length, every one
    checked before any state changes. The compressor buffers of states in shared slot rows
    are rebuilt together: one gather and one scatter per buffer over every such state, where
    one state at a time costs a verification step a few small ops per compressor per
    rejected row."""
    todo = [(state, length) for state, length in rollbacks if _checked(state, length)]
    rows = _RowCopies()
    for state, length in todo:
        state.fed = max(state.fed, state.pos)
        for layer in state.layers:
            _rollback_layer(layer, length, rows)
        if state.mtp_pos > length:
            for layer in state.mtp:
                _rollback_layer(layer, length, rows)
            state.mtp_pos = length
        state.pos = state.committed = length
    rows.run()


def _checked(state: ModelState, length: int) -> bool:
    """Whether ``state`` has tokens past ``length`` to roll back; raises where the rollback
    is not possible (so no state of a batch changes)."""
    back = state.pos - length
    if length < 0 or back < 0:
        raise ValueError(f"cannot roll a state of {state.pos} tokens back to {length}")
    if back == 0:
        return False
    if back > state.slack:
        raise ValueError(
            f"cannot roll back {back} tokens: the state keeps {state.slack} "
            "(build it with model.new_state(slack=...))"
        )
    if length < state.committed:
        raise ValueError(
            f"cannot roll back to {length}: an earlier rollback made the first "
            f"{state.committed} tokens final"
        )
    fed = max(state.fed, state.pos)
    layers = [(layer, fed) for layer in state.layers]
    if state.mtp_pos > length:  # MTP layers: fed up to mtp_pos, never past it
        layers += [(layer, layer.swa.length) for layer in state.mtp]
    for layer, layer_fed in layers:
        for comp in (layer.compressor, layer.indexer):
            if comp is not None:
                _check_history(comp, length, layer_fed)
    return True


def _check_history(comp: CompressorState, length: int, fed: int) -> None:
    """``fed``: the most tokens the state has held; its history ring holds the projections of
    positions ``max(fed - keep, hist_from) ..`` up to the current length (rows of later
    positions a rollback took back are stale, and overwritten before they are read again)."""
    r = comp.ratio
    n = length // r
    if comp.keep:
        need = (n - 1) * r if comp.overlap and n else n * r
        oldest = max(fed - comp.keep, comp.hist_from)
        if need < oldest:
            raise ValueError(
                f"compressor history starts at position {oldest}, rollback to {length} "
                f"needs {need}: the state's slack is too small, or it was restored without "
                "its history"
            )
    elif comp.buf_kv.shape[1]:
        # Only entry-only states (V4.1 index keys: no buffers) roll back without history.
        raise ValueError("this compressor state kept no history to roll back with")


@dataclass
class _PoolRows:
    """Rows of one slot pool's buffers to copy from its history rings: (slot, buffer row,
    ring row) of open windows and of previous halves, and the slots whose previous half is
    emptied (no complete window left)."""

    pool: SlotBuffers
    dim: int
    open: list[tuple[int, int, int]] = field(default_factory=list)
    prev: list[tuple[int, int, int]] = field(default_factory=list)
    empty: list[int] = field(default_factory=list)


class _RowCopies:
    """The buffer rows a batch of rollbacks rebuilds in shared slot pools, copied at the end
    (:meth:`run`) with one index upload for the lot."""

    def __init__(self) -> None:
        self.pools: dict[int, _PoolRows] = {}

    def add(self, comp: CompressorState, n: int, rows: range, before: range | None) -> bool:
        """Queue ``comp``'s rebuild (see :func:`_rollback_compressor`); False where its
        buffers are not a slot row of a pool (the caller rebuilds them itself)."""
        pool = comp.pool
        if pool is None or comp.slot < 0 or pool.hist_kv_buf is None:
            return False
        todo = self.pools.get(id(pool))
        if todo is None:
            todo = self.pools[id(pool)] = _PoolRows(pool, comp.entry_dim)
        slot, keep = comp.slot, comp.keep
        todo.open += [(slot, j, p % keep) for j, p in enumerate(rows)]
        if before is not None:
            if n:
                todo.prev += [(slot, j, p % keep) for j, p in enumerate(before)]
            else:
                todo.empty.append(slot)
        comp.fill = len(rows)
        return True

    def run(self) -> None:
        """Every queued copy, from one upload of the index rows (each pool's open-window
        triples, previous-half triples and emptied slots, in that order)."""
        todos = list(self.pools.values())
        flat = [i for t in todos for i in (*_flat(t.open), *_flat(t.prev), *t.empty)]
        if not flat:  # nothing queued, or every window rolled back to its start
            return
        device = todos[0].pool.hist_kv_buf.device  # type: ignore[union-attr]
        index = to_device(torch.tensor(flat, dtype=torch.long), device)
        at = 0
        for t in todos:
            pool = t.pool
            ring = (pool.hist_kv_buf, pool.hist_score_buf)
            for triples, dst, dim in (
                (t.open, (pool.kv_buf, pool.score_buf), None),
                (t.prev, (pool.prev_kv_buf, pool.prev_score_buf), t.dim),
            ):
                if triples:
                    where = index[at : at + 3 * len(triples)].view(-1, 3).unbind(1)
                    at += 3 * len(triples)
                    _copy_rows(where, dst, ring, dim)
            if t.empty:
                slots = index[at : at + len(t.empty)]
                at += len(t.empty)
                assert pool.prev_kv_buf is not None and pool.prev_score_buf is not None
                pool.prev_kv_buf[slots] = 0.0
                pool.prev_score_buf[slots] = float("-inf")


def _flat(triples: list[tuple[int, int, int]]) -> list[int]:
    return [i for triple in triples for i in triple]


def _copy_rows(
    where: Sequence[Tensor],
    dst: tuple[Tensor | None, Tensor | None],
    src: tuple[Tensor | None, Tensor | None],
    dim: int | None,
) -> None:
    """``dst[slot, row] = src[slot, ring]`` (its first ``dim`` columns: None, all) for the
    (slot, row, ring) index rows ``where``, kv and score buffers alike."""
    slot, row, ring = where
    for d, s in zip(dst, src, strict=True):
        assert d is not None and s is not None
        d[slot, row] = s[slot, ring] if dim is None else s[slot, ring, :dim]


def _rollback_layer(layer: LayerState, length: int, rows: _RowCopies) -> None:
    layer.swa.length = min(layer.swa.length, length)
    for comp in (layer.compressor, layer.indexer):
        if comp is not None:
            _rollback_compressor(comp, length, rows)


def _rollback_compressor(comp: CompressorState, length: int, copies: _RowCopies) -> None:
    """Rebuild the open window (and, with overlap, the previous half) at ``length`` from the
    history ring (checked by :func:`_check_history`): queued in ``copies`` for a slot row."""
    r = comp.ratio
    n = length // r  # complete windows at the new length
    if comp.keep:
        assert comp.hist_kv_buf is not None and comp.hist_score_buf is not None
        window = range(n * r, length)
        before = range(n * r - r, n * r) if comp.overlap else None
        if not copies.add(comp, n, window, before):
            rows = torch.arange(n * r, length, device=comp.hist_kv_buf.device) % comp.keep
            if comp.overlap:
                dim = comp.entry_dim
                back = torch.arange(n * r - r, n * r, device=rows.device) % comp.keep
                comp.prev_kv = comp.hist_kv_buf[:, back, :dim] if n else None
                comp.prev_score = comp.hist_score_buf[:, back, :dim] if n else None
            comp.buf_kv = comp.hist_kv_buf[:, rows]
            comp.buf_score = comp.hist_score_buf[:, rows]
    comp.count = min(comp.count, n)


def rollback_mtp_layers(state: ModelState, length: int) -> None:
    """Roll the MTP layers alone back to ``length`` positions (a drafter that chained drafts
    through them keeps only the positions it fed with the target's own streams)."""
    if length > state.mtp_pos or length < 0:
        raise ValueError(f"cannot roll MTP layers at {state.mtp_pos} positions to {length}")
    if state.mtp_pos - length > state.slack:
        raise ValueError(
            f"cannot roll MTP layers back {state.mtp_pos - length} positions: the state keeps "
            f"{state.slack}"
        )
    for layer in state.mtp:
        for comp in (layer.compressor, layer.indexer):
            if comp is not None:
                _check_history(comp, length, layer.swa.length)
    rows = _RowCopies()
    for layer in state.mtp:
        _rollback_layer(layer, length, rows)
    rows.run()
    state.mtp_pos = length


def seed_history(comp: CompressorState, length: int) -> None:
    """Write what ``comp``'s buffers hold at ``length`` (the open window's rows and, with
    overlap, the previous window's first half) into its history ring, for a state restored
    without its history (a prefix-cache hit), and mark the ring as holding nothing earlier:
    that is all a rollback to a length from ``length`` on reads."""
    assert comp.hist_kv_buf is not None and comp.hist_score_buf is not None
    r, keep = comp.ratio, comp.keep
    base = length // r * r
    device = comp.hist_kv_buf.device
    rows = torch.arange(base, length, device=device) % keep
    comp.hist_kv_buf[:, rows] = comp.buf_kv
    comp.hist_score_buf[:, rows] = comp.buf_score
    comp.hist_from = base
    if not (comp.overlap and comp.count):
        return
    before = torch.arange(base - r, base, device=device) % keep
    dim = comp.entry_dim
    prev_kv, prev_score = comp.prev_kv, comp.prev_score
    assert prev_kv is not None and prev_score is not None
    comp.hist_kv_buf[:, before, :dim] = prev_kv
    comp.hist_score_buf[:, before, :dim] = prev_score
    comp.hist_from = base - r
