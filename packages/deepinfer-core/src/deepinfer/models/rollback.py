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

import torch

from deepinfer.models.state import CompressorState, LayerState, ModelState


def rollback_layers(state: ModelState, length: int) -> None:
    """Roll every main (and MTP) layer state and ``pos`` back to ``length`` tokens."""
    back = state.pos - length
    if length < 0 or back < 0:
        raise ValueError(f"cannot roll a state of {state.pos} tokens back to {length}")
    if back == 0:
        return
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
    state.fed = fed = max(state.fed, state.pos)
    for layer in state.layers:
        _rollback_layer(layer, length, fed)
    if state.mtp_pos > length:
        for layer in state.mtp:  # fed up to mtp_pos, never past it
            _rollback_layer(layer, length, layer.swa.length)
        state.mtp_pos = length
    state.pos = state.committed = length


def _rollback_layer(layer: LayerState, length: int, fed: int) -> None:
    layer.swa.length = min(layer.swa.length, length)
    for comp in (layer.compressor, layer.indexer):
        if comp is not None:
            _rollback_compressor(comp, length, fed)


def _rollback_compressor(comp: CompressorState, length: int, fed: int) -> None:
    """``fed``: the most tokens the state has held; its history ring holds the projections of
    positions ``max(fed - keep, hist_from) ..`` up to the current length (rows of later
    positions a rollback took back are stale, and overwritten before they are read again)."""
    r = comp.ratio
    n = length // r  # complete windows at the new length
    if comp.keep:
        assert comp.hist_kv_buf is not None and comp.hist_score_buf is not None
        need = (n - 1) * r if comp.overlap and n else n * r
        oldest = max(fed - comp.keep, comp.hist_from)
        if need < oldest:
            raise ValueError(
                f"compressor history starts at position {oldest}, rollback to {length} "
                f"needs {need}: the state's slack is too small, or it was restored without "
                "its history"
            )
        rows = torch.arange(n * r, length, device=comp.hist_kv_buf.device) % comp.keep
        if comp.overlap:
            dim = comp.entry_dim
            before = torch.arange(n * r - r, n * r, device=rows.device) % comp.keep
            comp.prev_kv = comp.hist_kv_buf[:, before, :dim] if n else None
            comp.prev_score = comp.hist_score_buf[:, before, :dim] if n else None
        comp.buf_kv = comp.hist_kv_buf[:, rows]
        comp.buf_score = comp.hist_score_buf[:, rows]
    elif comp.buf_kv.shape[1]:
        # Only entry-only states (V4.1 index keys: no buffers) roll back without history.
        raise ValueError("this compressor state kept no history to roll back with")
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
        _rollback_layer(layer, length, layer.swa.length)
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
