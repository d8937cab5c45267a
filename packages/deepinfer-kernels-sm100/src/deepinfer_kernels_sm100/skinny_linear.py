"""bf16 linears of a few rows (decode) with K split so that every SM streams the weight.

At decode a projection is a GEMV: up to :data:`MAX_ROWS` rows against an [N, K] weight read
once, so its time is the weight's bytes over the bandwidth the launch reaches. A library GEMM
gives a program 64 output features over the whole of K; config A's 1,024- and 2,048-feature
projections then run on 16 or 32 programs, a fraction of the SMs, each streaming 256 KiB on its
own. Here K is also split across programs, about :data:`PROGRAMS_PER_SM` an SM, each summing
its [rows, K range] slice against its [BLOCK_N, K range] slice of weight in fp32; the tile's last
program to finish adds the partial sums in split order and rounds once
(:func:`.fp8_split.split_reduce`: one launch, the same order whichever program finishes last).

Two bodies, picked per launch shape (:data:`TILES`): tensor-core dots on a 16-row tile (rows
past the batch are zeros) or CUDA-core products summed along K. Products of two bf16 values are
exact in fp32, so either gives the fp32 product up to summation order, which is the reference's
``F.linear`` contract (its library GEMM sums in its own order too). A row's bits depend on the
launch shape, which depends on the batch's row count as a library GEMM's choice does: rows are
batch-invariant only within a shape.

A grouped projection (V4's ``wo_a``: group j of the input through rows j * O .. (j + 1) * O) is
the same launch, a column tile reading its group's slice of the input row (``group_n``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from deepinfer_kernels_sm100.devices import sm_count
from deepinfer_kernels_sm100.fp8_quant import EMULATE_CAST
from deepinfer_kernels_sm100.fp8_split import (
    MAX_SPLIT_TILES,
    split_counters,
    split_reduce,
    store_rounded,
)

#: The most rows a launch takes here; taller batches go to the library GEMM.
MAX_ROWS = 8
#: Whether ``Sm100Backend`` sends decode-sized bf16 linears here (a knob for A/B runs).
ENABLED = True
#: Programs a launch aims at per SM (K is split until about that many run).
PROGRAMS_PER_SM = 4
#: Fewest K steps a split program takes (fewer, and its setup outweighs its streaming).
MIN_SPLIT_STEPS = 2
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


@dataclass(frozen=True)
class Tiles:
    """A launch shape: ``block_n`` output features and ``block_k`` columns a K step,
    ``dot``: tensor-core dots on a 16-row tile (else CUDA-core products)."""

    block_n: int = 64
    block_k: int = 128
    dot: bool = True
    num_warps: int = 4
    num_stages: int = 4


#: The launch shape of every call (benchmarks/skinny_linear.py sweeps others).
TILES = Tiles()


@triton.jit(do_not_specialize=["m", "k_split", "splits"])
def _skinny_kernel(  # noqa: PLR0917 (Triton kernels take positional arguments)
    x_ptr,  # [M, ldx] bf16
    w_ptr,  # [N, K] bf16
    out_ptr,  # [M, N]
    part_ptr,  # [splits, M, N] fp32 partial sums (SPLIT)
    count_ptr,  # int32 per output tile, zero between launches (SPLIT)
    m,
    n,
    k,
    ldx,  # elements between rows of x: K, or groups * K for a grouped linear
    group_n,  # output features per group: feature c reads x from column (c // group_n) * K
    k_split,  # K columns a program sums (a multiple of BLOCK_K)
    splits,  # programs along grid axis 2
    SPLIT: tl.constexpr,
    DOT: tl.constexpr,
    NATIVE: tl.constexpr,  # bf16 dots as they are (False: fp32 ones, Triton's interpreter)
    EMULATE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """out = x @ w.T over this program's K range, in fp32 (BLOCK_N divides N and group_n,
    BLOCK_K divides k_split and K: no mask along N or K)."""
    col0 = tl.program_id(0) * BLOCK_N
    rows = tl.arange(0, BLOCK_M)
    cols = col0 + tl.arange(0, BLOCK_N)
    kk = tl.arange(0, BLOCK_K)
    row_ok = rows < m
    k_lo = tl.program_id(2) * k_split
    k_hi = tl.minimum(k_lo + k_split, k)
    x_tile = x_ptr + rows[:, None].to(tl.int64) * ldx + (col0 // group_n) * k + kk[None, :]
    w_tile = w_ptr + cols[:, None].to(tl.int64) * k + kk[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        x = tl.load(x_tile + k0, mask=row_ok[:, None], other=0.0)
        w = tl.load(w_tile + k0, eviction_policy="evict_first")
        if DOT:
            if NATIVE:
                acc = tl.dot(x, tl.trans(w), acc)
            else:  # products of bf16 values are exact in fp32: the same sums
                acc = tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), acc,
                             input_precision="ieee")  # fmt: skip
        else:
            prod = x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]
            acc += tl.sum(prod, axis=2)
    out = rows[:, None].to(tl.int64) * n + cols[None, :]
    if SPLIT:
        split_reduce(out_ptr, part_ptr, count_ptr, out, acc, row_ok, m, n, splits, EMULATE)
    else:
        store_rounded(out_ptr + out, acc, row_ok[:, None], EMULATE)


def _block_n(n: int, group_n: int, widest: int) -> int:
    """The widest power of two up to ``widest`` (at least 16) dividing both N and a group's
    features, or 0 where none does."""
    b = widest
    while b >= 16:
        if n % b == 0 and group_n % b == 0:
            return b
        b //= 2
    return 0


def fits(x: Tensor, weight: Tensor, groups: int = 1) -> bool:
    """Whether a linear of ``x`` [..., groups * K] (bf16) and ``weight`` [N, K] (bf16) runs here:
    :data:`ENABLED`, on a GPU (or Triton's interpreter), at most :data:`MAX_ROWS` rows, K a
    multiple of the K step and N (and a group's features) of 16."""
    if not ENABLED or not (x.is_cuda or _INTERPRET) or weight.dim() != 2:
        return False
    if x.dtype != torch.bfloat16 or weight.dtype != torch.bfloat16:
        return False
    n, k = weight.shape
    rows = x.numel() // max(x.shape[-1], 1)
    return (
        0 < rows <= MAX_ROWS
        and x.shape[-1] == groups * k
        and k % TILES.block_k == 0
        and n % groups == 0
        and _block_n(n, n // groups, TILES.block_n) > 0
    )


def skinny_linear(
    x: Tensor, weight: Tensor, *, out_dtype: torch.dtype | None = None, groups: int = 1
) -> Tensor:
    """``x`` [..., groups * K] through ``weight`` [N, K] (group j of x against rows
    j * N / groups ... of the weight): [..., N] in ``out_dtype`` (default the weight's), sums in
    fp32. The caller checks :func:`fits`."""
    n, k = weight.shape
    x2 = x.reshape(-1, groups * k)
    if x2.stride(-1) != 1 or x2.stride(0) != groups * k:
        x2 = x2.contiguous()
    m = x2.shape[0]
    out = torch.empty(m, n, dtype=out_dtype or weight.dtype, device=x.device)
    t = TILES
    block_n = _block_n(n, n // groups, t.block_n)
    tiles = n // block_n
    steps = k // t.block_k
    wanted = triton.cdiv(PROGRAMS_PER_SM * sm_count(x.device), tiles)
    most = max(1, steps // MIN_SPLIT_STEPS) if tiles <= MAX_SPLIT_TILES else 1
    splits = min(most, triton.next_power_of_2(wanted))
    k_split = triton.cdiv(steps, splits) * t.block_k
    splits = triton.cdiv(k, k_split)
    part = out
    if splits > 1:
        part = torch.empty(splits, m, n, dtype=torch.float32, device=x.device)
    block_m = 16 if t.dot else triton.next_power_of_2(m)
    _skinny_kernel[(tiles, 1, splits)](
        x2, weight, out, part, split_counters(x.device), m, n, k, groups * k, n // groups,
        k_split, splits, SPLIT=splits > 1, DOT=t.dot, NATIVE=not _INTERPRET,
        EMULATE=EMULATE_CAST, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=t.block_k,
        num_warps=t.num_warps, num_stages=t.num_stages,
    )  # fmt: skip
    return out.view(*x.shape[:-1], n)
