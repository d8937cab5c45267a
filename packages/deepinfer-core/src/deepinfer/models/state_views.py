"""States as they stood inside a chunk, and copies of states.

The prefix cache records a sequence's state at each 128-token boundary. Rather than cut a chunk
there, the layers copy the ring and the compressors' open windows as they pass the marked
lengths (:func:`set_marks`), and :func:`states_at` rebuilds read-only states from those copies
and the append-only entries after one forward over the whole chunk.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

from deepinfer.models.ring import SWARing
from deepinfer.models.state import CompressorState, LayerState, ModelState


def set_marks(state: ModelState, lengths: Sequence[int]) -> None:
    """Have the next chunk record ``state`` as it stands after each of ``lengths`` tokens
    (strictly inside the chunk): the ring and the compressors' open windows are copied as the
    layers pass those positions, so :func:`states_at` can rebuild the state there after one
    forward over the whole chunk (the prefix cache records its 128-token boundaries so)."""
    for layer in state.layers:
        layer.swa.marks = dict.fromkeys(lengths)
        for comp in (layer.compressor, layer.indexer):
            if comp is not None:
                comp.marks = dict.fromkeys(lengths)


def states_at(state: ModelState, lengths: Sequence[int]) -> list[ModelState]:
    """``state`` as it stood after each of ``lengths`` tokens, from the marks its last chunk
    recorded and its entries (append-only, so final ones serve). The Engram history is the
    caller's to set. Each state is a read-only view for a snapshot, laid out like ``state``."""
    out = [ModelState(layers=[], pos=length) for length in lengths]
    for own_layer in state.layers:
        for view, length in zip(out, lengths, strict=True):
            kv = own_layer.swa.marks[length]
            assert kv is not None, f"no ring was recorded at {length}"
            layer = LayerState(SWARing(kv, length, own_layer.swa.window))
            for part in ("compressor", "indexer"):
                comp: CompressorState | None = getattr(own_layer, part)
                if comp is not None:
                    setattr(layer, part, _compressor_at(comp, length))
            view.layers.append(layer)
    return out


def _compressor_at(own: CompressorState, length: int) -> CompressorState:
    mark = own.marks.get(length)
    if mark is None:  # entries only (V4.1 index keys, no forward of their own): no open window
        kv = score = own.kv_buf[:, :0]
        prev_kv, prev_score = own.prev_kv_buf, own.prev_score_buf
    else:
        kv, score = mark.buf_kv, mark.buf_score
        prev_kv = mark.prev_kv if mark.prev_kv is not None else own.prev_kv_buf
        prev_score = mark.prev_score if mark.prev_score is not None else own.prev_score_buf
    return CompressorState(
        ratio=own.ratio,
        overlap=own.overlap,
        kv_buf=kv,
        score_buf=score,
        entries_buf=own.entries_buf,
        count=length // own.ratio,
        fill=kv.shape[1],
        prev_kv_buf=prev_kv,
        prev_score_buf=prev_score,
        # Entries in pages are read through own's slot (the view writes nothing).
        pool=None if own.entries_buf is not None else own.pool,
        slot=own.slot,
        entries_only=own.entries_only,
    )


def clear_marks(state: ModelState) -> None:
    """Stop recording: later chunks copy nothing."""
    set_marks(state, ())


def clone_state(state: ModelState) -> ModelState:
    """A deep copy (for branching a sequence, e.g. before a speculative draft). A state in
    shared slot tensors is copied with :meth:`~deepinfer.cache.slots.StateSlots.clone`."""
    return copy.deepcopy(state)
