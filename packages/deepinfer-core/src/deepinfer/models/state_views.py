"""States as they stood inside a chunk, and single rows of lockstep batches.

The prefix cache records a sequence's state at each 128-token boundary. Rather than cut a chunk
there, the layers copy the ring and the compressors' open windows as they pass the marked
lengths (:func:`set_marks`), and :func:`states_at` rebuilds read-only states from those copies
and the append-only entries after one forward over the whole chunk.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

from torch import Tensor

from deepinfer.models.ring import SWARing
from deepinfer.models.state import BUFFERS, CompressorState, LayerState, ModelState
from deepinfer.models.state_rows import ring_layout


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


def states_at(
    src: ModelState, own: ModelState, lengths: Sequence[int], row: int = 0
) -> list[ModelState]:
    """``own`` as it stood after each of ``lengths`` tokens, from the marks a chunk recorded in
    ``src`` (``own`` itself, or the lockstep batch it ran in, row ``row``) and ``own``'s
    entries (append-only, so final ones serve). The Engram history is the caller's to set.
    Each state is a read-only view for a snapshot, laid out like ``own``."""
    out = [ModelState(layers=[], pos=length) for length in lengths]
    for src_layer, own_layer in zip(src.layers, own.layers, strict=True):
        for state, length in zip(out, lengths, strict=True):
            kv = src_layer.swa.marks[length]
            assert kv is not None, f"no ring was recorded at {length}"
            if kv.shape[1] != own_layer.swa.capacity:  # a batch with slack: every row at once
                ring = SWARing(kv, length, src_layer.swa.window)
                kv = src_layer.swa.marks[length] = ring_layout(ring, own_layer.swa.capacity)
            layer = LayerState(SWARing(kv[row : row + 1], length, own_layer.swa.window))
            for part in ("compressor", "indexer"):
                comp: CompressorState | None = getattr(own_layer, part)
                if comp is not None:
                    setattr(
                        layer, part, _compressor_at(getattr(src_layer, part), comp, length, row)
                    )
            state.layers.append(layer)
    return out


def _compressor_at(
    src: CompressorState, own: CompressorState, length: int, row: int
) -> CompressorState:
    mark = src.marks.get(length)
    if mark is None:  # entries only (V4.1 index keys, no forward of their own): no open window
        kv = score = own.kv_buf[:, :0]
        prev_kv, prev_score = own.prev_kv_buf, own.prev_score_buf
    else:
        kv, score = mark.buf_kv[row : row + 1], mark.buf_score[row : row + 1]
        prev_kv = mark.prev_kv[row : row + 1] if mark.prev_kv is not None else own.prev_kv_buf
        prev_score = (
            mark.prev_score[row : row + 1] if mark.prev_score is not None else own.prev_score_buf
        )
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


def select_row(state: ModelState, row: int) -> ModelState:
    """Row ``row`` of a lockstep state as a single-sequence state whose tensors are views of
    the batch's (so it can be rolled back and scattered on its own)."""

    def cut(t: Tensor | None) -> Tensor | None:
        return None if t is None else t[row : row + 1]

    def layer(ls: LayerState) -> LayerState:
        out = LayerState(swa=SWARing(ls.swa.kv[row : row + 1], ls.swa.length, ls.swa.window))
        for part in ("compressor", "indexer"):
            comp: CompressorState | None = getattr(ls, part)
            if comp is not None:
                assert comp.entries_buf is not None, "a lockstep state holds its own entries"
                names = (*BUFFERS, "entries_buf", "hist_kv", "hist_score")
                fields = {name: cut(getattr(comp, name)) for name in names}
                setattr(
                    out,
                    part,
                    CompressorState(
                        ratio=comp.ratio,
                        overlap=comp.overlap,
                        count=comp.count,
                        fill=comp.fill,
                        keep=comp.keep,
                        entries_only=comp.entries_only,
                        **fields,  # type: ignore[arg-type]
                    ),
                )
        return out

    return ModelState(
        layers=[layer(ls) for ls in state.layers],
        mtp=[layer(ls) for ls in state.mtp],
        pos=state.pos,
        slack=state.slack,
        committed=state.committed,
        mtp_pos=state.mtp_pos,
        history_buf=cut(state.history_buf),
    )
