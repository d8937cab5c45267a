"""A step's (token, slot) pairs grouped by expert, on the device, in a launch or two.

The grouped expert kernels (:mod:`.moe`, :mod:`.fp4_moe`) read each expert's pairs as one
contiguous range of the pairs sorted stably by expert, exactly the reference's order
(:func:`deepinfer.backends.moe_ref.group_by_expert`: a stable argsort, a binary search for the
ends, gathers; with the list of experts that have pairs, about twenty launches, a multi-pass
radix sort among them). Here:

* up to ``GROUP_MAX_PAIRS`` pairs (every decode batch), a counting sort with a program per
  expert (and one for the pairs without one): each counts every expert's pairs (a histogram)
  and places its own after those of the experts before it, in pair order (a prefix sum over
  its matches): a few short steps in parallel programs. With more than ``EXPERTS_PER_PAIR``
  experts a pair (a few pairs among many experts, where E + 1 programs would each histogram
  E bins for them), one program sorts unique (expert, pair) keys in registers instead (a
  bitonic network, whose dependent steps grow with the pairs);
* past it (prefill chunks), a stable counting sort in two launches over chunks of
  ``CHUNK_PAIRS`` pairs: the first counts each chunk's pairs an expert; the second places each
  chunk's pairs at its expert's start plus the pairs of that expert in earlier chunks plus its
  rank among its chunk's pairs of that expert (a sort of the chunk's keys in registers).

Neither waits on the host, so both are captured in CUDA graphs.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor

#: pairs the programs of one launch hold whole (registers); more take the chunked counting sort
GROUP_MAX_PAIRS = 4096
#: experts a pair past which one program sorts the pairs rather than a program an expert
#: counting them (``benchmarks/moe_grouping.py``: V4-Flash's 256 experts at 8 tokens of 6 pairs)
EXPERTS_PER_PAIR = 4
#: pairs a program of the chunked sort counts and places
CHUNK_PAIRS = 1024


class PairGroups(NamedTuple):
    """A step's (token, slot) pairs sorted stably by expert (:func:`group_pairs`)."""

    rows: Tensor  # [P] int32: token row of each sorted pair
    order: Tensor  # [P] int32: (token, slot) pair of each sorted pair
    scale: Tensor  # [P] fp32: router weight of each sorted pair
    ends: Tensor  # [E] int32: end of each expert's sorted pairs
    experts: Tensor  # [min(E, P)] int32: the experts with pairs in order, then -1


@triton.jit
def _sort_keys(idx_ptr, first, pairs, num_experts, SIZE: tl.constexpr):
    """(the pairs ``first .. first + SIZE`` sorted by (expert, pair): their keys, with "none"
    (-1) as expert E and past ``pairs`` as E + 1, and their offsets from ``first``)."""
    p = tl.arange(0, SIZE)
    valid = first + p < pairs
    e = tl.load(idx_ptr + first + p, mask=valid, other=-1).to(tl.int64)
    key = tl.where(e >= 0, e, num_experts)  # "none" after every expert
    key = tl.where(valid, key, num_experts + 1)
    ranked = tl.sort((key << 32) | p.to(tl.int64))
    return (ranked >> 32).to(tl.int32), (ranked & 0xFFFFFFFF).to(tl.int32)


@triton.jit
def _store_pairs(  # noqa: PLR0917
    weight_ptr, token_ptr, order_ptr, scale_ptr, at, src, mask, k
):
    """Sorted position ``at`` of each pair ``src``: its pair, token row and router weight."""
    tl.store(order_ptr + at, src, mask=mask)
    tl.store(token_ptr + at, src // k, mask=mask)
    w = tl.load(weight_ptr + src, mask=mask, other=0.0).to(tl.float32)
    tl.store(scale_ptr + at, w, mask=mask)


@triton.jit
def _store_ends(  # noqa: PLR0917
    ends_ptr, experts_ptr, counts, num_experts, slots, E_PAD: tl.constexpr
):
    """Each expert's end from the pairs an expert (``counts`` [E_PAD]), and the experts with
    pairs in slots 0 .. n - 1 in order, -1 in the rest (disjoint stores)."""
    bins = tl.arange(0, E_PAD)
    expert = bins < num_experts
    tl.store(ends_ptr + bins, tl.cumsum(tl.where(expert, counts, 0), 0), mask=expert)
    busy = (counts > 0) & expert
    tl.store(experts_ptr + tl.cumsum(busy.to(tl.int32), 0) - 1, bins, mask=busy)
    tl.store(experts_ptr + bins, -1, mask=(bins >= tl.sum(busy.to(tl.int32), 0)) & (bins < slots))


@triton.jit
def _place_group(  # noqa: PLR0917 (a jit helper takes positional arguments)
    idx_ptr, weight_ptr, token_ptr, order_ptr, scale_ptr, ends_ptr, experts_ptr, pairs, k,
    num_experts, slots, P_PAD: tl.constexpr, E_PAD: tl.constexpr,
):  # fmt: skip
    """Program g places group g's pairs (expert g; g = E: the pairs without one, last): after
    the pairs of the groups before it, in pair order, so the result is the stable sort's."""
    g = tl.program_id(0)
    p = tl.arange(0, P_PAD)
    valid = p < pairs
    e = tl.load(idx_ptr + p, mask=valid, other=-1)
    key = tl.where(e >= 0, e, num_experts).to(tl.int32)
    counts = tl.histogram(key, E_PAD, mask=valid)
    bins = tl.arange(0, E_PAD)
    start = tl.sum(tl.where(bins < g, counts, 0), 0)
    mine = (key == g) & valid
    at = start + tl.cumsum(mine.to(tl.int32), 0) - 1
    _store_pairs(weight_ptr, token_ptr, order_ptr, scale_ptr, at, p, mine, k)
    if g < num_experts:
        n = tl.sum(mine.to(tl.int32), 0)
        tl.store(ends_ptr + g, start + n)
        busy = ((counts > 0) & (bins < num_experts)).to(tl.int32)
        # the busy experts in order, then -1 up to the slots: disjoint stores
        tl.store(experts_ptr + tl.sum(tl.where(bins < g, busy, 0), 0), g, mask=n > 0)
        tl.store(experts_ptr + g, -1, mask=(g >= tl.sum(busy, 0)) & (g < slots))


@triton.jit(do_not_specialize=["pairs", "k", "num_experts", "slots"])
def _group_kernel(  # noqa: PLR0917 (Triton kernels take positional arguments)
    idx_ptr,  # [P] expert of each (token, slot) pair, -1 = none
    weight_ptr,  # [P] router weights
    token_ptr,  # [P] out: token row of each sorted pair
    order_ptr,  # [P] out: (token, slot) pair of each sorted pair
    scale_ptr,  # [P] out: router weight of each sorted pair (fp32)
    ends_ptr,  # [E] out: end of each expert's sorted pairs (int32)
    experts_ptr,  # [slots] out: the experts with pairs in order, then -1 (int32)
    pairs,
    k,
    num_experts,
    slots,
    P_PAD: tl.constexpr,
    E_PAD: tl.constexpr,  # BY_EXPERT: > num_experts (bin E counts the pairs without one)
    BY_EXPERT: tl.constexpr,  # a program a group (_place_group), else one sorting them all
):
    """A stable sort of the pairs by expert: a program an expert counting, or one program
    sorting unique (expert, pair) keys."""
    if BY_EXPERT:
        _place_group(idx_ptr, weight_ptr, token_ptr, order_ptr, scale_ptr, ends_ptr,
                     experts_ptr, pairs, k, num_experts, slots, P_PAD, E_PAD)  # fmt: skip
    else:
        key, src = _sort_keys(idx_ptr, 0, pairs, num_experts, P_PAD)
        p = tl.arange(0, P_PAD)
        _store_pairs(weight_ptr, token_ptr, order_ptr, scale_ptr, p, src, p < pairs, k)
        expert = key < num_experts
        counts = tl.histogram(tl.where(expert, key, 0), E_PAD, mask=expert)
        _store_ends(ends_ptr, experts_ptr, counts, num_experts, slots, E_PAD)


@triton.jit(do_not_specialize=["pairs", "num_experts"])
def _chunk_counts_kernel(  # noqa: PLR0917 (Triton kernels take positional arguments)
    idx_ptr, counts_ptr, pairs, num_experts, CHUNK: tl.constexpr, E_PAD: tl.constexpr
):
    """counts[c, e]: chunk c's pairs of expert e (e = E: without an expert)."""
    c = tl.program_id(0)
    p = c * CHUNK + tl.arange(0, CHUNK)
    valid = p < pairs
    e = tl.load(idx_ptr + p, mask=valid, other=-1)
    key = tl.where(e >= 0, e, num_experts).to(tl.int32)
    counts = tl.histogram(key, E_PAD, mask=valid)
    tl.store(counts_ptr + c * E_PAD + tl.arange(0, E_PAD), counts)


@triton.jit(do_not_specialize=["pairs", "k", "num_experts", "chunks"])
def _chunk_place_kernel(  # noqa: PLR0917 (Triton kernels take positional arguments)
    idx_ptr,
    weight_ptr,
    counts_ptr,  # [chunks, E_PAD] int32: _chunk_counts_kernel's
    base_ptr,  # [chunks, E_PAD] int32 scratch: each chunk's sorted position -> pair position
    token_ptr,
    order_ptr,
    scale_ptr,
    ends_ptr,
    experts_ptr,
    pairs,
    k,
    num_experts,
    slots,
    chunks,
    CHUNK: tl.constexpr,
    E_PAD: tl.constexpr,
):
    """Places chunk c's pairs: the j-th of its sorted pairs, of expert e, goes to e's start
    plus e's pairs in chunks before c plus (j - chunk c's pairs of experts before e)."""
    c = tl.program_id(0)
    bins = tl.arange(0, E_PAD)
    total = tl.zeros((E_PAD,), dtype=tl.int32)
    before = tl.zeros((E_PAD,), dtype=tl.int32)
    for j in range(0, chunks):
        row = tl.load(counts_ptr + j * E_PAD + bins)
        total += row
        before += tl.where(j < c, row, 0)
    mine = tl.load(counts_ptr + c * E_PAD + bins)
    start = tl.cumsum(total, 0) - total
    tl.store(base_ptr + c * E_PAD + bins, start + before - (tl.cumsum(mine, 0) - mine))
    tl.debug_barrier()  # the bases are read back by key below
    key, local = _sort_keys(idx_ptr, c * CHUNK, pairs, num_experts, CHUNK)
    real = key <= num_experts
    at = tl.load(base_ptr + c * E_PAD + key, mask=real, other=0) + tl.arange(0, CHUNK)
    _store_pairs(weight_ptr, token_ptr, order_ptr, scale_ptr, at, c * CHUNK + local, real, k)
    if c == 0:
        _store_ends(ends_ptr, experts_ptr, total, num_experts, slots, E_PAD)


def group_pairs(weights: Tensor, indices: Tensor, num_experts: int) -> PairGroups:
    """The pairs sorted stably by expert, in ``group_by_expert``'s order, and the experts that
    have pairs (the grouped kernels' slots)."""
    pairs = indices.numel()
    slots = min(num_experts, pairs)
    dev = indices.device
    rows = torch.empty(pairs, dtype=torch.int32, device=dev)
    order = torch.empty(pairs, dtype=torch.int32, device=dev)
    scale = torch.empty(pairs, dtype=torch.float32, device=dev)
    ends = torch.empty(num_experts, dtype=torch.int32, device=dev)
    experts = torch.empty(slots, dtype=torch.int32, device=dev)
    out = (rows, order, scale, ends, experts)
    idx, w, k = (
        indices.reshape(-1).contiguous(),
        weights.reshape(-1).contiguous(),
        indices.shape[-1],
    )
    if not pairs:
        ends.zero_()
    elif pairs <= GROUP_MAX_PAIRS:
        by_expert = pairs * EXPERTS_PER_PAIR >= num_experts
        _group_kernel[(num_experts + 1 if by_expert else 1,)](
            idx,
            w,
            *out,
            pairs,
            k,
            num_experts,
            slots,
            P_PAD=max(16, triton.next_power_of_2(pairs)),
            E_PAD=max(16, triton.next_power_of_2(num_experts + by_expert)),
            BY_EXPERT=by_expert,
            num_warps=4 if pairs <= 1024 else 8,
        )
    else:
        chunks, e_pad = (
            triton.cdiv(pairs, CHUNK_PAIRS),
            max(16, triton.next_power_of_2(num_experts + 1)),
        )
        scratch = torch.empty(2, chunks, e_pad, dtype=torch.int32, device=dev)
        sizes = {"CHUNK": CHUNK_PAIRS, "E_PAD": e_pad}
        _chunk_counts_kernel[(chunks,)](idx, scratch[0], pairs, num_experts, **sizes)
        _chunk_place_kernel[(chunks,)](
            idx, w, scratch[0], scratch[1], *out, pairs, k, num_experts, slots, chunks, **sizes
        )
    return PairGroups(*out)
