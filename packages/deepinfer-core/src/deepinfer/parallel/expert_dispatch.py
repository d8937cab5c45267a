"""The routed experts of one MoE layer across expert-parallel ranks: all-to-all out and back.

Each rank has routed its own tokens (any number, zero included) to ``k`` global experts each.
Its (token, slot) pairs go to the ranks owning those experts, grouped by owner rank in
(token, slot) order; the owners run the received pairs through their local experts as one batch
of single-slot rows; the outputs come back by the reverse all-to-all; and each token's ``k``
outputs are summed in slot order, as
:func:`~deepinfer.backends.moe_ref.combine_slots` sums them in a single process. Every pair's
output is computed from the same input, weight and router weight as it would be there, so the
layer's result does not depend on the world size beyond the reassociation inside the experts'
matmuls (rows batched differently).

Two exchanges, picked per forward by what the ranks agreed on before it
(:meth:`~deepinfer.parallel.expert_parallel.ExpertParallel.agree`):

* the all-to-all (any number of tokens): four ``all_to_all_single`` per layer, the pair counts
  (so every rank knows its receive split sizes), the pairs' inputs, their (local expert,
  router weight) and the outputs. The counts are read on the host, a sync per layer.
* the fixed-shape exchange (every rank feeds at most ``rows`` tokens, small steps): every rank
  pads its tokens to ``rows`` and gathers every rank's inputs and routing
  (``all_gather_single``), runs the pairs its experts own among all of them, zeros for
  the rest, and a ``reduce_scatter`` adds each rank's tokens' per-pair outputs back to it.
  Exactly one rank computes each pair, so the sum adds zeros to it and changes no bit. Its
  shapes depend on ``rows`` alone and it reads nothing on the host, so a CUDA graph can hold it;
  its outputs move per pair from every rank, ``k * world`` times the all-to-all's bytes, which
  is why only small steps take it.

Tensors travel as bytes where no arithmetic is done on them, so any dtype goes through any
``torch.distributed`` backend.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import Tensor

from deepinfer.parallel.expert_parallel import ExpertParallel, ExpertShard

#: The owner's experts on received pairs: (inputs [M, d], router weights [M, 1] fp32, local
#: expert ids [M, 1]) -> weighted outputs [M, d] fp32.
LocalExperts = Callable[[Tensor, Tensor, Tensor], Tensor]


def exchange(
    t: Tensor, send: list[int], recv: list[int], group: dist.ProcessGroup | None
) -> Tensor:
    """Rows of ``t`` split ``send`` over the ranks -> the rows the ranks sent us, ``recv``
    split; moved as bytes (a view, no conversion), so every dtype travels the same way."""
    row_bytes = math.prod(t.shape[1:]) * t.element_size()
    raw = t.contiguous().view(torch.uint8).view(t.shape[0], row_bytes)
    out = raw.new_empty(sum(recv), row_bytes)
    dist.all_to_all_single(out, raw, recv, send, group=group)
    return out.view(t.dtype).view(sum(recv), *t.shape[1:])


def dispatch_experts(
    ep: ExpertParallel,
    shard: ExpertShard,
    x: Tensor,
    *,
    weights: Tensor,
    indices: Tensor,
    local_experts: LocalExperts,
) -> Tensor:
    """The routed experts' fp32 weighted sum [N, d] for this rank's tokens ``x`` [N, d],
    routed to global experts ``indices`` [N, k] with ``weights`` [N, k]; every rank of
    ``ep`` must call this for the same layer at the same time. An index < 0 is "no expert"
    and contributes zero, as in :meth:`~deepinfer.backends.base.Backend.moe_experts`. The
    exchange is the fixed-shape one when the ranks agreed on a row count for this forward
    (``ep.step.rows``), else the all-to-all (see the module)."""
    if ep.step.rows is not None:
        return _gathered(ep, shard, x, weights, indices, local_experts, ep.step.rows)
    n, k = indices.shape
    world = ep.world_size
    flat = indices.reshape(-1)
    owner = torch.where(flat >= 0, flat // shard.count, world)  # "no expert" sorts last
    order = owner.argsort(stable=True)  # by owner, (token, slot) order within each
    send_counts = torch.bincount(owner, minlength=world + 1)[:world]
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts, group=ep.group)
    send, recv = send_counts.tolist(), recv_counts.tolist()
    sent = order[: sum(send)]

    local = (flat[sent] - owner[sent] * shard.count).to(torch.int32)
    scale = weights.reshape(-1)[sent].float().view(torch.int32)
    meta = exchange(torch.stack([local, scale], dim=-1), send, recv, ep.group)
    inputs = exchange(x[sent // k], send, recv, ep.group)
    got = local_experts(inputs, meta[:, 1:].view(torch.float32), meta[:, :1].long())
    back = exchange(got.float(), recv, send, ep.group)

    per_slot = x.new_zeros(n * k, x.shape[-1], dtype=torch.float32)
    per_slot.index_copy_(0, sent, back)
    return per_slot.view(n, k, x.shape[-1]).sum(dim=1)


#: ``all_gather_single`` / ``reduce_scatter_single`` where torch has them (their new names),
#: else ``all_gather_into_tensor`` / ``reduce_scatter_tensor``
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def gather_rows(t: Tensor, group: dist.ProcessGroup | None) -> Tensor:
    """Every rank's ``t`` (the same shape on each) stacked along dim 0, in rank order; moved
    as bytes."""
    world = dist.get_world_size(group)
    raw = t.contiguous().view(torch.uint8).view(t.shape[0], -1)
    out = raw.new_empty(world * raw.shape[0], raw.shape[1])
    _all_gather(out, raw, group=group)
    return out.view(t.dtype).view(world * t.shape[0], *t.shape[1:])


def _gathered(  # noqa: PLR0917
    ep: ExpertParallel,
    shard: ExpertShard,
    x: Tensor,
    weights: Tensor,
    indices: Tensor,
    local_experts: LocalExperts,
    rows: int,
) -> Tensor:
    """The fixed-shape exchange (see the module) with every rank's tokens padded to ``rows``."""
    n, k = indices.shape
    if n > rows:
        raise ValueError(f"{n} tokens do not fit the {rows} rows the ranks agreed on")
    pad = rows - n
    ids = torch.cat((indices.to(torch.int32), indices.new_full((pad, k), -1, dtype=torch.int32)))
    scales = torch.cat((weights.float(), weights.new_zeros((pad, k), dtype=torch.float32)))
    routing = torch.stack((ids, scales.view(torch.int32)), dim=-1)  # made on the device
    inputs = gather_rows(torch.cat((x, x.new_zeros(pad, x.shape[-1]))), ep.group)
    routing = gather_rows(routing, ep.group).view(-1, 2)
    expert = routing[:, 0].long()
    mine = (expert >= shard.first) & (expert < shard.stop)
    local = torch.where(mine, expert - shard.first, -1)
    scale = routing[:, 1].contiguous().view(torch.float32)
    per_pair = inputs[:, None].expand(-1, k, -1).reshape(-1, x.shape[-1])  # (token, slot) order
    got = local_experts(per_pair, scale[:, None], local[:, None])
    per_slot = got.new_empty(rows * k, x.shape[-1], dtype=torch.float32)
    _reduce_scatter(per_slot, got.float().contiguous(), group=ep.group)
    return per_slot[: n * k].view(n, k, x.shape[-1]).sum(dim=1)
