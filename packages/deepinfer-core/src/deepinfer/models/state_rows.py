"""Lockstep batches of sequences: load single-sequence states into one, and land them back.

Sequences at one position can run a chunk as the rows of one [G, S] lockstep batch; the batch
state is loaded from theirs (:func:`gather_rows`) and each row lands back in its sequence's
state afterwards (:func:`scatter_rows`), with one indexed write per tensor when the states are
rows of the same slot tensors.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from deepinfer.models.ring import SWARing
from deepinfer.models.state import BUFFERS, CompressorState, ModelState
from deepinfer.transfer import to_device


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
