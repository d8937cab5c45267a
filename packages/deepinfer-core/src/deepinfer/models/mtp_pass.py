"""An MTP layer over many sequences at once: spans of any length over its slotted rings.

A drafter feeds each sequence's MTP layer the positions verified since its last round (the
target's streams there and the next tokens), then one position per further draft. With the
layers' rings in the engine's slots (:class:`~deepinfer.cache.slots.StateSlots` slots them)
every sequence's span runs in one ragged pass of the layer (:mod:`.ragged`), as the target's
spans do, instead of one forward per sequence.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from deepinfer.models.causal_lm import DeepseekCausalLM
from deepinfer.models.layers.block import ForwardContext
from deepinfer.models.layouts import RaggedRows
from deepinfer.models.ragged import ragged_meta
from deepinfer.models.state import ModelState


def mtp_slotted(states: Sequence[ModelState], depth: int = 0) -> bool:
    """Whether the MTP layer ``depth`` of every state is a row of one shared ring."""
    rings = [s.mtp[depth].swa.pool if len(s.mtp) > depth else None for s in states]
    return rings[0] is not None and all(r is rings[0] for r in rings)


@torch.no_grad()
def mtp_forward_ragged(
    model: DeepseekCausalLM,
    states: Sequence[ModelState],
    streams: Tensor,
    next_ids: Tensor,
    lengths: Sequence[int],
    *,
    depth: int = 0,
) -> tuple[Tensor, Tensor]:
    """``mtp_forward`` for many sequences (:func:`mtp_slotted`): span i feeds ``lengths[i]``
    positions from ``states[i].mtp_pos`` on, ``streams`` [N, hc, d] the target's streams
    there and ``next_ids`` [N] the tokens one position later, all spans one after the other.
    Returns (fp32 logits [n, V] at each span's last position, the layer's output streams
    [N, hc, d]); each state's MTP layer advances by its span (``mtp_pos`` with the last
    depth)."""
    if not mtp_slotted(states, depth):
        raise ValueError("mtp_forward_ragged needs every state's MTP ring in one slot tensor")
    rings = [s.mtp[depth].swa for s in states]
    starts = [s.mtp_pos for s in states]
    meta = ragged_meta(model.device, [r.slot for r in rings], starts, list(lengths))
    pool = rings[0].pool
    assert pool is not None
    ids = next_ids.to(model.device)[None]
    ctx = ForwardContext(model.ops, meta.positions, ids, model.rotary)
    rows = RaggedRows(pool, meta)
    hidden, out = model.mtp[depth].predict(streams[None], model.embed(ids), ctx, rows)
    last = torch.tensor(meta.offsets) + torch.tensor(list(lengths)) - 1
    logits = model.head(model.ops, hidden[0, last.to(hidden.device)])
    for ring, state, start, n in zip(rings, states, starts, lengths, strict=True):
        ring.length = start + n
        if depth == len(state.mtp) - 1:
            state.mtp_pos = start + n
    return logits, out[0]
