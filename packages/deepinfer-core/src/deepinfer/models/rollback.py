"""Roll a sequence state back to an earlier length, exactly (speculative decoding).

A speculative step feeds k drafted tokens and keeps only the first j that verify; the state must
then be what it would be had only those j run. Everything per-token is cheap to take back if it
was kept: the SWA ring holds ``slack`` rows beyond the window (so the rows the rejected tokens
overwrote are still there), compressed entries are truncated to the complete windows of the new
length, and each compressor's open window (and, with overlap, the previous window's first half)
is rebuilt from the raw projections of its last ``slack + 2 * ratio`` inputs. A state built
without slack cannot be rolled back.

The contract is speculative decoding's: a rollback reaches at most ``slack`` tokens back and never
below the target of an earlier rollback (tokens accepted then are final). Under it the rows the
rejected tokens overwrote are never needed again, so ``slack`` extra rows and ``slack + 2 * ratio``
kept projections suffice however the steps interleave.
"""

from __future__ import annotations

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
    for layer in state.layers:
        _rollback_layer(layer, length)
    if state.mtp_pos > length:
        for layer in state.mtp:
            _rollback_layer(layer, length)
        state.mtp_pos = length
    state.pos = state.committed = length


def _rollback_layer(layer: LayerState, length: int) -> None:
    fed = layer.swa.length  # every token this layer has seen also went through its compressors
    layer.swa.length = min(fed, length)
    for comp in (layer.compressor, layer.indexer):
        if comp is not None:
            _rollback_compressor(comp, length, fed)


def _rollback_compressor(comp: CompressorState, length: int, fed: int) -> None:
    r = comp.ratio
    n = length // r  # complete windows at the new length
    if comp.keep:
        assert comp.hist_kv is not None and comp.hist_score is not None
        first = fed - comp.hist_kv.shape[1]  # position of the oldest kept projection
        need = (n - 1) * r if comp.overlap and n else n * r
        if need < first:
            raise ValueError(
                f"compressor history starts at position {first}, rollback to {length} needs "
                f"{need}: the state's slack is too small"
            )
        start, stop = n * r - first, length - first
        if comp.overlap:
            dim = comp.entry_dim
            comp.prev_kv = comp.hist_kv[:, start - r : start, :dim].clone() if n else None
            comp.prev_score = comp.hist_score[:, start - r : start, :dim].clone() if n else None
        comp.buf_kv = comp.hist_kv[:, start:stop]
        comp.buf_score = comp.hist_score[:, start:stop]
        comp.hist_kv = comp.hist_kv[:, :stop]
        comp.hist_score = comp.hist_score[:, :stop]
    elif comp.buf_kv.shape[1]:
        # Only entry-only states (V4.1 index keys: no buffers) roll back without history.
        raise ValueError("this compressor state kept no history to roll back with")
    comp.count = min(comp.count, n)
