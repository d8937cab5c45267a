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

Four collectives per layer, all ``all_to_all_single``: the pair counts (so every rank knows its
receive split sizes), the pairs' inputs, their (local expert, router weight) and the outputs.
Tensors travel as bytes, so any dtype goes through any ``torch.distributed`` backend. The
counts are read on the host, a sync that CUDA graph capture cannot contain (see the docs).
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
    and contributes zero, as in :meth:`~deepinfer.backends.base.Backend.moe_experts`."""
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
