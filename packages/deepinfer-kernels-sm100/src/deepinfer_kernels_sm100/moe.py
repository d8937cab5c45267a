"""Routed SwiGLU experts as two grouped-matmul kernels, in any float dtype, without host syncs.

The (token, slot) pairs are sorted by expert, stably, as the reference sorts them, so each
expert's rows are one contiguous range of the sorted pairs, ending at ``ends[e]``
(:func:`.moe_group.group_pairs`, one or two launches). The kernels read each sorted pair's
token row of ``x`` in place and write each pair's output at its (token, slot) row, so neither
the gathered inputs nor the un-sorting copy exist.

One program per (expert with pairs, column tile, split) walks its expert's rows in tiles of
``BLOCK_M``. The grid's slot axis has ``min(E, pairs)`` slots, which the experts that have
pairs fill in order (:class:`~.moe_group.PairGroups`), so a decode step of a few tokens starts
programs for its few experts only, not for all E. The split axis divides each expert's row
tiles among ``splits`` programs (tile t to program t mod splits), sized from the mean rows an
expert has and their spread (:func:`launch_for`), so a prefill chunk's thousand rows an expert
are not one program's serial loop, nor a decode batch's busiest expert two tiles in one. Each
row is still computed by one program in the same order, so the split changes no bits. The grid
is laid out (split, column tile, slot), the splits fastest: the GPU starts programs in that
order, so the programs that read one weight tile of an expert run together and the later ones
find it in L2. With the slot fastest, every split of a long chunk read all the experts' weights
from HBM again (a prefill chunk's expert stacks are larger than L2).

The first kernel computes the gate and up projections of a tile together and applies the
clamped SwiGLU and the router weight in its epilogue (the reference's
``silu(min(gate, l)) * clamp(up, -l, l) * weight``); the second multiplies by ``w2``. Row
ranges are read on the device, so nothing waits on the host: where torch's grouped matmul
lacks a kernel (fp32 on Hopper), the reference loops over experts with one host sync per layer
and two launches per expert; here the matmuls of all experts are two launches. fp32 operands
multiply in IEEE fp32 (no TF32), as torch's matmul does by default.
"""

from __future__ import annotations

import math
import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from deepinfer_kernels_sm100.fp8_quant import EMULATE_CAST
from deepinfer_kernels_sm100.fp8_split import store_rounded
from deepinfer_kernels_sm100.moe_group import group_pairs

#: Triton's interpreter (CI, no GPU) multiplies bf16 tiles wrongly, so there the tiles are
#: widened to fp32 first; on a GPU bf16 tiles go to the tensor cores as they are.
_WIDEN = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _mma(a, b, acc, IEEE: tl.constexpr, WIDEN: tl.constexpr):
    """acc + a @ b.T"""
    if WIDEN:
        return tl.dot(a.to(tl.float32), tl.trans(b.to(tl.float32)), acc, input_precision="ieee")
    if IEEE:
        return tl.dot(a, tl.trans(b), acc, input_precision="ieee")
    return tl.dot(a, tl.trans(b), acc)


class ExpertLaunch(NamedTuple):
    """Launch shape of the two grouped kernels for one regime of pairs an expert."""

    block_m: int  # rows a tile
    block_n: int  # most output columns a program (fewer for a narrow matrix)
    block_k: int  # most reduction columns a step
    num_warps: int
    num_stages: int
    tiles: int  # row tiles a program takes on average (sets the splits)


#: Launch shapes by the mean pairs an expert has (``rows``): (the most rows of a tier, its
#: shape), in increasing order. Measured on an H100 at config A's and V4-Flash's widths
#: (``benchmarks/moe_tiles.py``): a batch-1 step's single rows stream the weights through
#: narrow column tiles with long K steps; 32-row tiles serve a batch of 64; up to 64 rows an
#: expert 64 x 64 tiles on four warps, four stages deep (twice the programs of 64 x 128 ones,
#: so the SMs share a batch of 256's weight tiles more evenly: ``results/moe_tiles_h200.json``);
#: past that 128-row tiles on eight warps.
TIERS: tuple[tuple[int, ExpertLaunch], ...] = (
    (1, ExpertLaunch(16, 32, 128, 4, 4, 4)),
    (16, ExpertLaunch(32, 64, 64, 4, 3, 2)),
    (64, ExpertLaunch(64, 64, 64, 4, 4, 1)),
)
#: Past the last tier: a prefill chunk's thousand rows an expert.
LARGE = ExpertLaunch(128, 128, 64, 8, 3, 1)
#: fp32 weights multiply in IEEE dots on the FMA units, whose operands sit in registers: their
#: tiles stay at most 64 x 64 on four warps (16-row tiles up to 64 rows an expert).
FP32_TIERS: tuple[tuple[int, ExpertLaunch], ...] = ((64, ExpertLaunch(16, 64, 64, 4, 3, 4)),)
FP32_LARGE = ExpertLaunch(64, 64, 64, 4, 3, 1)


#: Most row tiles (of the routed experts' launch shape) the shared expert's rows may take for it
#: to run as the grids' last slot: past that a dense GEMM's tiles run it faster beside the
#: grouped kernels than the routed experts' tiles do inside them, by more than the launches the
#: fusion saves (``benchmarks/shared_expert.py`` at config A's and V4-Flash's widths:
#: ``results/moe_grid_order_ab_h100.json``).
SHARED_TILES = 16


#: The splits are sized for an expert with this many standard deviations more rows than the
#: mean (routing's binomial spread, about sqrt(mean) rows): the busiest expert, not the mean
#: one, sets when the kernel ends, and a split with no tile of its expert returns at once
#: (``benchmarks/moe_tiles.py``'s ``*_h`` variants).
SPLIT_HEADROOM = 4.0


def launch_for(pairs: int, slots: int, ieee: bool = False) -> tuple[ExpertLaunch, int]:
    """(the launch shape, the splits of each expert's row tiles) for ``pairs`` sorted pairs in
    ``slots`` expert slots (``ieee``: fp32 weights): enough programs that a long chunk's
    experts are not serial loops."""
    rows = triton.cdiv(pairs, max(slots, 1))
    tiers, large = (FP32_TIERS, FP32_LARGE) if ieee else (TIERS, LARGE)
    shape = next((tier for most, tier in tiers if rows <= most), large)
    busiest = rows + math.ceil(SPLIT_HEADROOM * math.sqrt(rows))
    return shape, max(1, triton.cdiv(busiest, shape.block_m * shape.tiles))


def fuses_shared(tokens: int, top_k: int, num_experts: int, dtype: torch.dtype) -> bool:
    """Whether :func:`moe_experts` runs a step's shared expert (``tokens`` rows, ``top_k`` of
    ``num_experts`` routed experts each, weights in ``dtype``) as its grids' last slot: where
    its rows fit :data:`SHARED_TILES` row tiles of the routed experts' launch shape."""
    pairs = tokens * top_k
    shape, _ = launch_for(pairs, min(num_experts, pairs), dtype == torch.float32)
    return triton.cdiv(tokens, shape.block_m) <= SHARED_TILES


@triton.jit
def _expert_range(ends_ptr, e):
    start = tl.load(ends_ptr + e - 1, mask=e > 0, other=0)
    return start, tl.load(ends_ptr + e)


@triton.jit
def _slot_range(experts_ptr, ends_ptr, slot, LISTED: tl.constexpr):
    """(expert, start, end) of grid slot ``slot``: its expert (int64) and sorted-pair range,
    empty for a slot past the experts that have pairs (expert -1, read as 0). Without
    ``LISTED`` (a slot per expert) slot e is expert e, read without the list's load."""
    if not LISTED:
        expert = slot.to(tl.int64)
        start, end = _expert_range(ends_ptr, expert)
        return expert, start, end
    e = tl.load(experts_ptr + slot)
    expert = tl.maximum(e, 0).to(tl.int64)
    start, end = _expert_range(ends_ptr, expert)
    return expert, start, tl.where(e >= 0, end, start)


@triton.jit
def _rows_and_weights(  # noqa: PLR0917 (a jit helper takes positional arguments)
    w_ptr, shared_ptr, experts_ptr, ends_ptr, pairs, tokens, expert_size,
    LISTED: tl.constexpr, SHARED: tl.constexpr,
):  # fmt: skip
    """(this program's expert's weights, its sorted rows' range). With ``SHARED`` the grid's
    last slot is the shared expert (weights at ``shared_ptr``), whose rows follow the ``pairs``
    sorted pairs, one a token: row ``pairs + t`` is token t, at weight 1."""
    slot = tl.program_id(2)
    if not SHARED:
        e, start, end = _slot_range(experts_ptr, ends_ptr, slot, LISTED)
        return w_ptr + e * expert_size, start, end
    mine = slot == tl.num_programs(2) - 1
    # the shared slot reads slot 0's entries (in bounds), then takes its own
    e, start, end = _slot_range(experts_ptr, ends_ptr, tl.where(mine, 0, slot), LISTED)
    w = tl.where(mine, shared_ptr, w_ptr + e * expert_size)
    return w, tl.where(mine, pairs, start), tl.where(mine, pairs + tokens, end)


@triton.jit
def _gate_up_kernel(  # noqa: PLR0917 (Triton kernels take positional arguments)
    x_ptr,  # [N, K] token inputs
    token_ptr,  # [P] token row of each sorted pair
    w_ptr,  # [E, 2I, K] gate rows over up rows
    scale_ptr,  # [P] router weights (fp32)
    ends_ptr,  # [E] int32
    experts_ptr,  # [slots] int32
    h_ptr,  # [P (+ N with SHARED), I] out
    shared_ptr,  # [2I, K] the shared expert's gate rows over its up rows (SHARED)
    pairs,  # P
    tokens,  # N
    inter,
    k_dim,
    limit,
    CLAMP: tl.constexpr,
    IEEE: tl.constexpr,
    WIDEN: tl.constexpr,
    LISTED: tl.constexpr,  # fewer slots than experts: each slot's expert read from the list
    SHARED: tl.constexpr,  # the last slot is the shared expert (_rows_and_weights)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    # An expert's offset passes 2**31 elements at V4-Flash shapes (256 x 4096 x 4096): int64.
    w_e, start, end = _rows_and_weights(w_ptr, shared_ptr, experts_ptr, ends_ptr, pairs,
                                        tokens, 2 * inter * k_dim, LISTED, SHARED)  # fmt: skip
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    w_gate = w_e + cols[:, None] * k_dim
    w_up = w_gate + inter * k_dim
    kk = tl.arange(0, BLOCK_K)
    split, splits = tl.program_id(0), tl.num_programs(0)
    for m0 in range(start + split * BLOCK_M, end, splits * BLOCK_M):
        rows = m0 + tl.arange(0, BLOCK_M)
        row_ok = rows < end
        routed = row_ok & (rows < pairs)  # with SHARED, rows past the pairs are its tokens'
        token = tl.load(token_ptr + rows, mask=routed, other=0).to(tl.int64)
        if SHARED:
            token = tl.where(rows >= pairs, rows - pairs, token)
        gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, k_dim, BLOCK_K):
            k_ok = (k0 + kk) < k_dim
            x = tl.load(
                x_ptr + token[:, None] * k_dim + k0 + kk[None, :],
                mask=row_ok[:, None] & k_ok[None, :],
                other=0.0,
            ).to(w_ptr.dtype.element_ty)  # as the reference rounds the inputs to the weights'
            w_mask = (cols[:, None] < inter) & k_ok[None, :]
            wg = tl.load(w_gate + k0 + kk[None, :], mask=w_mask, other=0.0)
            wu = tl.load(w_up + k0 + kk[None, :], mask=w_mask, other=0.0)
            gate = _mma(x, wg, gate, IEEE, WIDEN)
            up = _mma(x, wu, up, IEEE, WIDEN)
        if CLAMP:
            gate = tl.minimum(gate, limit)
            up = tl.minimum(tl.maximum(up, -limit), limit)
        scale = tl.load(scale_ptr + rows, mask=routed, other=1.0)
        h = gate * tl.sigmoid(gate) * up * scale[:, None]
        tl.store(
            h_ptr + rows[:, None] * inter + cols[None, :],
            h.to(h_ptr.dtype.element_ty),
            mask=row_ok[:, None] & (cols[None, :] < inter),
        )


@triton.jit
def _down_kernel(  # noqa: PLR0917 (Triton kernels take positional arguments)
    h_ptr,  # [P, I]
    w_ptr,  # [E, D, I]
    ends_ptr,
    experts_ptr,  # [slots] int32
    order_ptr,  # [P] (token, slot) pair of each sorted pair
    y_ptr,  # [P (+ N with SHARED), D] fp32 out, by (token, slot) pair (then by token)
    shared_ptr,  # [D, I] the shared expert's down projection (SHARED)
    pairs,  # P
    tokens,  # N
    d_out,
    inter,
    IEEE: tl.constexpr,
    WIDEN: tl.constexpr,
    LISTED: tl.constexpr,  # fewer slots than experts: each slot's expert read from the list
    SHARED: tl.constexpr,  # the last slot is the shared expert (_rows_and_weights)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    w_e, start, end = _rows_and_weights(w_ptr, shared_ptr, experts_ptr, ends_ptr, pairs,
                                        tokens, d_out * inter, LISTED, SHARED)  # fmt: skip
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    w = w_e + cols[:, None] * inter
    kk = tl.arange(0, BLOCK_K)
    split, splits = tl.program_id(0), tl.num_programs(0)
    for m0 in range(start + split * BLOCK_M, end, splits * BLOCK_M):
        rows = m0 + tl.arange(0, BLOCK_M)
        row_ok = rows < end
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, inter, BLOCK_K):
            k_ok = (k0 + kk) < inter
            h = tl.load(
                h_ptr + rows[:, None] * inter + k0 + kk[None, :],
                mask=row_ok[:, None] & k_ok[None, :],
                other=0.0,
            )
            wt = tl.load(w + k0 + kk[None, :], mask=(cols[:, None] < d_out) & k_ok[None, :])
            acc = _mma(h, wt, acc, IEEE, WIDEN)
        pair = tl.load(order_ptr + rows, mask=row_ok & (rows < pairs), other=0).to(tl.int64)
        if SHARED:  # the shared expert's rows stay where they are: after the pairs
            pair = tl.where(rows >= pairs, rows, pair)
        tl.store(
            y_ptr + pair[:, None] * d_out + cols[None, :],
            acc,
            mask=row_ok[:, None] & (cols[None, :] < d_out),
        )


def _tile(n: int, most: int) -> int:
    return max(16, min(most, triton.next_power_of_2(n)))


def moe_experts(
    x: Tensor,
    weights: Tensor,
    indices: Tensor,
    *,
    w13: Tensor,
    w2: Tensor,
    swiglu_limit: float,
    residual: Tensor | None = None,
    out_dtype: torch.dtype = torch.float32,
    shared: tuple[Tensor, Tensor] | None = None,
) -> Tensor:
    """The backend's ``moe_experts``: [N, d] weighted sum of each token's experts (fp32),
    plus ``residual``, in ``out_dtype`` (:func:`slot_sum`). ``shared`` (gate over up [2I, d],
    down [d, I], held as the stacks are): one more expert every token takes at weight 1, as
    the grids' last slot (``moe_experts_shared``), its fp32 output added after the slots."""
    num_experts, two_inter, d_in = w13.shape
    inter, d_out = two_inter // 2, w2.shape[1]
    groups = group_pairs(weights, indices, num_experts)
    pairs, slots = groups.rows.shape[0], groups.experts.shape[0]
    tokens = x.shape[0] if shared is not None else 0
    ieee = w13.dtype == torch.float32
    # The hidden activation is rounded to the weights' dtype before w2, as in the reference.
    h = torch.empty(pairs + tokens, inter, dtype=w2.dtype, device=x.device)
    # Pairs without an expert are never computed: slot_sum skips their rows.
    y = torch.empty(pairs + tokens, d_out, dtype=torch.float32, device=x.device)
    if pairs:
        shape, splits = launch_for(pairs, slots, ieee)
        # one row tile of the shared expert's N rows a program: no fewer than the busiest
        # routed expert's program walks, so the shared slot does not end the kernel last
        splits = max(splits, triton.cdiv(tokens, shape.block_m))
        launch = {
            "IEEE": ieee,
            "WIDEN": _WIDEN,
            "LISTED": slots < num_experts,
            "SHARED": shared is not None,
            "BLOCK_M": shape.block_m,
            "num_warps": shape.num_warps,
            "num_stages": shape.num_stages,
        }
        grid = slots + (shared is not None)
        s13, s2 = shared if shared is not None else (w13, w2)  # unread without SHARED
        bn, bk = _tile(inter, shape.block_n), _tile(d_in, shape.block_k)
        _gate_up_kernel[(splits, triton.cdiv(inter, bn), grid)](
            x.contiguous(), groups.rows, w13.contiguous(), groups.scale, groups.ends,
            groups.experts, h, s13.contiguous(), pairs, tokens, inter, d_in,
            float(swiglu_limit), CLAMP=swiglu_limit > 0, BLOCK_N=bn, BLOCK_K=bk, **launch,
        )  # fmt: skip
        bn, bk = _tile(d_out, shape.block_n), _tile(inter, shape.block_k)
        _down_kernel[(splits, triton.cdiv(d_out, bn), grid)](
            h, w2.contiguous(), groups.ends, groups.experts, groups.order, y, s2.contiguous(),
            pairs, tokens, d_out, inter, BLOCK_N=bn, BLOCK_K=bk, **launch,
        )  # fmt: skip
    return slot_sum(y, indices, residual, out_dtype, shared=shared is not None)


@triton.jit
def _slot_sum_kernel(  # noqa: PLR0917 (Triton kernels take positional arguments)
    y_ptr,
    idx_ptr,
    res_ptr,  # [N, D]: added after the pairs, widened (RESIDUAL)
    out_ptr,  # [N, D]: fp32, or the sum rounded once to its dtype
    d_out,
    K: tl.constexpr,
    RESIDUAL: tl.constexpr,
    SHARED: tl.constexpr,  # y's rows past the N * K pairs: each token's shared expert's
    EMULATE: tl.constexpr,  # the interpreter's casts truncate: round in fp32 first
    BLOCK: tl.constexpr,
):
    """One token's k pair rows added in slot order, then its shared expert's row, then its
    residual row; a pair without an expert adds nothing."""
    n = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    cmask = cols < d_out
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for j in tl.static_range(K):
        live = tl.load(idx_ptr + n * K + j) >= 0
        acc += tl.load(y_ptr + (n * K + j) * d_out + cols, mask=cmask & live, other=0.0)
    if SHARED:
        shared_row = tl.num_programs(0).to(tl.int64) * K + n
        acc += tl.load(y_ptr + shared_row * d_out + cols, mask=cmask, other=0.0)
    if RESIDUAL:
        acc += tl.load(res_ptr + n * d_out + cols, mask=cmask, other=0.0).to(tl.float32)
    store_rounded(out_ptr + n * d_out + cols, acc, cmask, EMULATE)


def slot_sum(
    y: Tensor,
    indices: Tensor,
    residual: Tensor | None = None,
    out_dtype: torch.dtype = torch.float32,
    *,
    shared: bool = False,
) -> Tensor:
    """[N, D] in ``out_dtype``: each token's k pair rows of ``y`` [N * k, D] added in slot
    order, as the reference's combine adds them, skipping the pairs whose expert index is
    negative, then ``residual`` [N, D] widened, the fp32 sum rounded once (the reference's
    ``add_residual``). Unlisted pairs are never computed, so ``y`` needs no zeroing first,
    and the shared expert's output joins here: one launch where zeroing, a sum and an add
    were three. ``shared``: ``y`` [N * k + N, D] also holds each token's shared expert
    output after the pairs, added after its slots."""
    n, k = indices.shape
    d_out = y.shape[1]
    out = torch.empty(n, d_out, dtype=out_dtype, device=y.device)
    if n:
        block = min(1024, triton.next_power_of_2(d_out))
        res = out if residual is None else residual.contiguous()
        _slot_sum_kernel[(n, triton.cdiv(d_out, block))](
            y, indices.contiguous(), res, out, d_out, K=k, RESIDUAL=residual is not None,
            SHARED=shared, EMULATE=EMULATE_CAST, BLOCK=block,
        )  # fmt: skip
    return out
