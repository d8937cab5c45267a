"""FP8 e4m3 block-scaled linear layers computed on the stored format, in Triton.

DeepSeek-V4 stores its attention and dense weights as e4m3 with one scale per block of
128 x 128 elements (32 x 32 in V4.1); the scales are fp32 (V4-Flash-Base) or ue8m0 exponent
bytes, 2**(b - 127) (the instruct releases). Dequantising them to bf16 at load doubles their
memory and the bytes each decode step streams. Here the weights stay e4m3 and meet e4m3
activations in the tensor cores' fp8 dots, as DeepGEMM does on Hopper:

* activations are quantised per token and per group of ``ACT_GROUP`` = 128 along K
  (:mod:`.fp8_quant`, which also holds the interpreter's rounding emulation);
* K is walked in steps no wider than one activation group or one weight block, so each step's
  fp32 partial product has one activation scale per row and one weight scale per column; it
  is multiplied by their product and added to an fp32 accumulator. This also bounds what a
  Hopper fp8 MMA chain, which keeps fewer bits than fp32 in its accumulator, sums before the
  sum reaches a full fp32 register: one step.

Two launch shapes (:func:`_tiles`). Up to ``SMALL_M`` rows (decode), row tiles just cover the
batch; a projection with few outputs (V4-Flash's wkv has 512) would give only a few programs the
whole weight to stream, so K is split across programs; each writes its fp32 partial sums, and
they are added in split order, so every run adds them alike (:mod:`.fp8_split`): for row tiles
of up to 16 by the last of a tile's programs to finish (saving a launch), for taller ones by a
second kernel, which spreads the additions over many programs. :mod:`.fp8_gluon` holds a
Hopper decode kernel (``mma.sync`` on the e4m3 registers as loaded, launch shape fixed by N
and K, so batch invariant), which by default (:data:`DECODE_KERNEL`) runs batches of up to
:data:`GLUON_MAX_M` rows on Hopper, where it is the faster of the two. Larger
batches (prefill) run 64-row tiles that reuse each weight tile, their operands brought in by
the copy engine (:mod:`.fp8_prefill`). Both read activations that
:func:`quantize_act_fp8` quantised once ahead of the GEMM. The kernel can also quantise a
decode batch's tile in registers right before the dot (``FUSE_DECODE_QUANT``), saving a launch,
but every column program then redoes the IEEE divisions, which on an H200 costs more than the
launch (``benchmarks/results/low_precision_h200.json``). Both use the one quantiser body
(:func:`quantize_tile`), so they give the same bits.

:func:`fp8_block_grouped_linear` runs V4's grouped output projection (``wo_a``: each of 8 head
groups against its own 1024 rows) as one launch: a column tile reads its group's slice of the
activation row.

ue8m0 scales are decoded in the kernel from their bytes (exactly as
:func:`deepinfer.models.quant.decode_ue8m0` does), so a call does no host-side work on them
and stays capturable in a CUDA graph.

"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from deepinfer.models.quant import is_ue8m0_dtype
from deepinfer_kernels_sm100 import fp8_gluon
from deepinfer_kernels_sm100.devices import sm_count
from deepinfer_kernels_sm100.fp8_prefill import fp8_prefill_gemm
from deepinfer_kernels_sm100.fp8_quant import (
    ACT_GROUP,
    EMULATE_CAST,
    IN_DTYPES,
    quantize_act_fp8,
    quantize_tile,
    ue8m0_to_fp32,
)
from deepinfer_kernels_sm100.fp8_split import (
    MAX_SPLIT_TILES,
    split_counters,
    split_reduce,
    split_sum_kernel,
    store_rounded,
)

#: N and K must be multiples of this (the V4 weight blocks; no kernel masks along N or K)
DIM_MULTIPLE = 128
#: the most rows that take decode tiles (K split across programs)
SMALL_M = 64
#: narrowest K step of an fp8 tensor-core dot
MIN_BLOCK_K = 32
_OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@triton.jit(do_not_specialize=["m"])
def _fp8_gemm_kernel(  # noqa: PLR0917 (Triton kernels take positional arguments)
    a_ptr,  # [M, lda]: bf16 / fp16 / fp32 activations (FUSED) or their e4m3 values
    as_ptr,  # [M, lda / GROUP] fp32 activation scales (read unless FUSED)
    w_ptr,  # [N, K] e4m3 weight
    ws_ptr,  # [ceil(N / W_BN), ceil(K / W_BK)] weight scales: fp32, or ue8m0 bytes
    out_ptr,  # [M, N] out
    part_ptr,  # [splits, M, N] fp32 partial sums (SPLIT)
    count_ptr,  # int32 per output tile: its split programs done so far (SPLIT; left zero)
    m,
    n,
    k,
    lda,  # elements between rows of A: K, or groups * K for a grouped linear
    group_n,  # output columns per group: column c reads A's columns from (c // group_n) * K
    k_split,  # K columns per program along grid axis 2 (a multiple of BLOCK_K)
    splits,  # programs along grid axis 2
    FUSED: tl.constexpr,  # quantise the activation tiles here
    EMULATE: tl.constexpr,
    SCALE_UE8M0: tl.constexpr,
    SPLIT: tl.constexpr,  # K split across programs: each writes its fp32 partial sums
    REDUCE: tl.constexpr,  # ... and the tile's last program adds them (else a second kernel)
    GROUP: tl.constexpr,
    W_BN: tl.constexpr,
    W_BK: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """out = sum over K steps of dot(a, w.T) * a_scale[:, None] * w_scale[None, :], in fp32.

    BLOCK_K divides GROUP and W_BK (equals GROUP when FUSED), and BLOCK_N divides N and
    group_n: a step has one scale per row and one per column, a tile lies in one group, and
    nothing along N or K needs a mask. The weight tile is read [BLOCK_N, BLOCK_K] and
    transposed in the dot, so B reaches the MMA K-major, as Hopper's fp8 wgmma requires.
    """
    tl.static_assert(GROUP % BLOCK_K == 0 and W_BK % BLOCK_K == 0)
    tl.static_assert(not FUSED or BLOCK_K == GROUP)
    col0 = tl.program_id(0) * BLOCK_N
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = col0 + tl.arange(0, BLOCK_N)
    k_lo = tl.program_id(2) * k_split
    k_hi = tl.minimum(k_lo + k_split, k)
    kk = tl.arange(0, BLOCK_K)
    row_ok = rows < m
    a_col0 = (col0 // group_n) * k
    a_tile = a_ptr + rows[:, None].to(tl.int64) * lda + a_col0 + kk[None, :]
    w_tile = w_ptr + cols[:, None].to(tl.int64) * k + kk[None, :]
    a_scales = as_ptr + rows.to(tl.int64) * (lda // GROUP) + a_col0 // GROUP
    w_scales = ws_ptr + (cols // W_BN) * tl.cdiv(k, W_BK)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        x = tl.load(a_tile + k0, mask=row_ok[:, None], other=0.0)
        if FUSED:
            a, a_scale = quantize_tile(x.to(tl.float32), EMULATE)
        else:
            a = x
            a_scale = tl.load(a_scales + k0 // GROUP, mask=row_ok, other=0.0)
        w = tl.load(w_tile + k0)
        w_scale = tl.load(w_scales + k0 // W_BK)
        if SCALE_UE8M0:
            w_scale = ue8m0_to_fp32(w_scale)
        part = tl.dot(a, tl.trans(w))
        acc += part * (a_scale[:, None] * w_scale[None, :])
    out = rows[:, None].to(tl.int64) * n + cols[None, :]
    if REDUCE:
        split_reduce(out_ptr, part_ptr, count_ptr, out, acc, row_ok, m, n, splits, EMULATE)
    elif SPLIT:
        tl.store(part_ptr + tl.program_id(2).to(tl.int64) * m * n + out, acc, mask=row_ok[:, None])
    else:
        store_rounded(out_ptr + out, acc, row_ok[:, None], EMULATE)


@dataclass(frozen=True)
class _Tiles:
    """One launch configuration of :func:`_fp8_gemm_kernel`."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    fused: bool
    #: programs along K, each summing ``k_split`` columns (1: no split)
    splits: int = 1
    k_split: int = 0
    #: the tile's last split program adds the partial sums (rather than a second kernel)
    reduce_in_kernel: bool = False


#: fewest K steps a split program takes (fewer and its setup outweighs its streaming)
MIN_SPLIT_STEPS = 2
#: row tiles up to this tall add their split partial sums in the GEMM's last program; taller
#: ones leave them to a second kernel, as one program adding all of them would take longer
MAX_REDUCE_ROWS = 16


def _tiles(m: int, n: int, k: int, block_k_weight: int, programs: int, *, fused: bool) -> _Tiles:
    """Tile shape by batch size, and how far to split K so ``programs`` programs run.

    Decode batches read every weight byte for a few rows: row tiles just cover the batch (16 to
    64, the narrowest an MMA takes is 16) and 64-column programs stream the weight. A
    projection of 512 or 1024 outputs has only 8 or 16 such programs, far fewer than the SMs
    that must share its bytes, so K is split until about ``programs`` run; the fp32 partial
    sums are added in a fixed order (by the tile's last program for short row tiles).
    Prefill batches reuse each weight tile over 64 rows, in 64 x 128 tiles on one warpgroup
    (64 x 64 below 1024 rows, for more programs), several programs to an SM. The K step is
    one activation group, or one weight block where blocks are narrower (V4.1's 32); only
    whole-group steps can quantise their activations in the GEMM (``fused``).
    """
    block_k = min(ACT_GROUP, block_k_weight)
    steps = k // block_k
    if m > SMALL_M:
        block_n = 128 if m >= 1024 else 64
        return _Tiles(64, block_n, block_k, 4, 4, fused=False, k_split=k)
    block_m = max(16, triton.next_power_of_2(m))
    tiles = n // 64 * triton.cdiv(m, block_m)
    most = max(1, steps // MIN_SPLIT_STEPS) if tiles <= MAX_SPLIT_TILES else 1
    splits = min(most, triton.next_power_of_2(triton.cdiv(programs, tiles)))
    k_split = triton.cdiv(steps, splits) * block_k
    splits = triton.cdiv(k, k_split)
    fused = fused and block_k == ACT_GROUP
    reduce_in_kernel = splits > 1 and block_m <= MAX_REDUCE_ROWS
    return _Tiles(block_m, 64, block_k, 4, 3, fused, splits, k_split, reduce_in_kernel)


def _programs(device: torch.device) -> int:
    """Programs a decode GEMM launch should have to keep every SM streaming: four per SM
    (an H100/H200's off a GPU, so the interpreter runs the split path)."""
    return 4 * sm_count(device)


#: the decode batches' kernel: "auto" (:mod:`.fp8_gluon` up to :data:`GLUON_MAX_M` rows where
#: its ``usable`` holds, Hopper; else :func:`_fp8_gemm_kernel`), "triton" (always
#: :func:`_fp8_gemm_kernel`) or "gluon" (every decode batch; ValueError where it cannot run)
DECODE_KERNEL = "auto"
#: rows up to which "auto" takes the Gluon kernel: on an H200 it is faster at V4-Flash's
#: projection shapes with 1 and 8 rows and slower in most of them from 16 rows on
#: (``gemm_gluon`` in ``benchmarks/results/low_precision_h200.json``)
GLUON_MAX_M = 8


def _gluon_decode(a: Tensor, w: Tensor, block: tuple[int, int], group_n: int) -> bool:
    """Whether :data:`DECODE_KERNEL` and the operands send a decode batch to the Gluon kernel."""
    if DECODE_KERNEL == "triton" or (DECODE_KERNEL == "auto" and a.shape[0] > GLUON_MAX_M):
        return False
    usable = fp8_gluon.usable(a, w, block, group_n)
    if DECODE_KERNEL == "gluon" and not usable:
        raise ValueError("the Gluon decode kernel cannot run these operands on this device")
    return usable


#: quantise decode activations inside the GEMM (each column program redoes it) rather than
#: once ahead of it
FUSE_DECODE_QUANT = False


def _check_multiple(name: str, value: int) -> None:
    if value <= 0 or value % DIM_MULTIPLE:
        raise ValueError(f"{name} must be a positive multiple of {DIM_MULTIPLE}, got {value}")


def _weight_operands(
    weight: Tensor, weight_scale: Tensor, block: tuple[int, int]
) -> tuple[Tensor, Tensor, bool]:
    """(e4m3 weight, scales as the kernel reads them, whether they are ue8m0 bytes), checked.

    ue8m0 scales (uint8, int8 or float8_e8m0fnu) are bit-viewed as bytes, never converted; other
    floating scales are taken as fp32.
    """
    if weight.dtype in (torch.uint8, torch.int8):
        weight = weight.view(torch.float8_e4m3fn)
    if weight.dtype != torch.float8_e4m3fn or weight.dim() != 2:
        raise ValueError(
            f"weight must be a 2-D float8_e4m3fn tensor, got {weight.dtype} {tuple(weight.shape)}"
        )
    n, k = weight.shape
    _check_multiple("N (weight rows)", n)
    _check_multiple("K (weight columns)", k)
    bn, bk = block
    if bn <= 0 or bk < MIN_BLOCK_K or (bk % ACT_GROUP and ACT_GROUP % bk):
        raise ValueError(
            f"block {block}: rows must be positive and columns at least {MIN_BLOCK_K}, and "
            f"divide or be a multiple of {ACT_GROUP}"
        )
    grid = (triton.cdiv(n, bn), triton.cdiv(k, bk))
    if weight_scale.dim() != 2 or tuple(weight_scale.shape) != grid:
        raise ValueError(
            f"weight_scale shape {tuple(weight_scale.shape)} does not match weight {(n, k)} "
            f"with block {block}: expected {grid}"
        )
    ue8m0 = is_ue8m0_dtype(weight_scale.dtype)
    if ue8m0:
        scale = weight_scale.contiguous().view(torch.uint8)
    elif weight_scale.is_floating_point():
        scale = weight_scale.to(torch.float32).contiguous()
    else:
        raise ValueError(f"weight_scale must be fp32 or ue8m0 bytes, got {weight_scale.dtype}")
    return weight.contiguous(), scale.to(weight.device), ue8m0


def fp8_block_linear(
    x: Tensor,
    weight: Tensor,
    weight_scale: Tensor,
    block: tuple[int, int] = (128, 128),
    out_dtype: torch.dtype = torch.bfloat16,
    *,
    quantized: tuple[Tensor, Tensor] | None = None,
) -> Tensor:
    """y = x @ (weight * block scales).T on the stored e4m3 weight: x [..., K] -> [..., N].

    ``weight`` is [N, K] float8_e4m3fn (or its bytes), ``weight_scale`` [ceil(N / bn),
    ceil(K / bk)] fp32 or ue8m0 for ``block`` = (bn, bk). x is quantised per token and group of
    128 (:func:`quantize_act_fp8`), unless ``quantized`` holds its e4m3 codes and fp32 scales
    already (from a fused RMSNorm or SwiGLU); the sums run in fp32 and are rounded once to
    ``out_dtype``. N and K must be multiples of 128; anything else raises ValueError.
    """
    w, ws, ue8m0 = _weight_operands(weight, weight_scale, block)
    n, k = w.shape
    if x.shape[-1] != k:
        raise ValueError(f"x has {x.shape[-1]} features, the weight takes K = {k}")
    x2 = x.reshape(-1, k)
    pre = None
    if quantized is not None:
        pre = (quantized[0].reshape(-1, k), quantized[1].reshape(-1, k // ACT_GROUP))
        if pre[0].shape[0] != x2.shape[0] or pre[0].dtype != torch.float8_e4m3fn:
            raise ValueError("quantized activations must be e4m3 codes of x's shape")
    out = _gemm(x2, w, ws, ue8m0=ue8m0, block=block, out_dtype=out_dtype, groups=1, pre=pre)
    return out.view(*x.shape[:-1], n)


def fp8_block_grouped_linear(
    x: Tensor,
    weight: Tensor,
    weight_scale: Tensor,
    block: tuple[int, int] = (128, 128),
    out_dtype: torch.dtype = torch.bfloat16,
) -> Tensor:
    """Per-group linears in one launch: x [..., g, K] and weight [g * O, K] (group j's rows
    j * O .. (j + 1) * O, whose scales start on a block row) -> [..., g, O], group j's output
    x[..., j, :] @ W_j.T, each as :func:`fp8_block_linear` computes it. V4's grouped output
    projection (``wo_a``) is this shape; O must be a multiple of 128.
    """
    w, ws, ue8m0 = _weight_operands(weight, weight_scale, block)
    n, k = w.shape
    groups = x.shape[-2] if x.dim() >= 2 else 0
    if x.dim() < 2 or x.shape[-1] != k or n % groups or (n // groups) % DIM_MULTIPLE:
        raise ValueError(
            f"x {tuple(x.shape)} must be [..., g, {k}] with the weight's {n} rows split into g "
            f"groups of a multiple of {DIM_MULTIPLE}"
        )
    x2 = x.reshape(-1, groups * k)
    out = _gemm(x2, w, ws, ue8m0=ue8m0, block=block, out_dtype=out_dtype, groups=groups)
    return out.view(*x.shape[:-1], n // groups)


def _gemm(
    x2: Tensor,
    w: Tensor,
    ws: Tensor,
    *,
    ue8m0: bool,
    block: tuple[int, int],
    out_dtype: torch.dtype,
    groups: int,
    pre: tuple[Tensor, Tensor] | None = None,
) -> Tensor:
    """[M, groups * K] activations times the [N, K] weight, group j of x against rows
    j * N / groups ... of the weight: the launch behind both linears. ``pre``: x's codes and
    scales, quantised already."""
    if out_dtype not in _OUT_DTYPES:
        raise ValueError(f"out_dtype must be one of {_OUT_DTYPES}, got {out_dtype}")
    if x2.dtype not in IN_DTYPES:
        raise ValueError(f"activations must be one of {IN_DTYPES}, got {x2.dtype}")
    x2 = x2.contiguous()
    (n, k), m = w.shape, x2.shape[0]
    out = torch.empty(m, n, dtype=out_dtype, device=x2.device)
    if not m:
        return out
    fuse = FUSE_DECODE_QUANT and pre is None
    t = _tiles(m, n, k, block[1], _programs(x2.device), fused=fuse)
    # Fused, the kernel reads x itself and no activation scales: the weight stands in for
    # them, so the pointer types, and the compiled kernel, are the same on every call.
    if pre is not None:
        a, a_scale = pre[0].contiguous(), pre[1].contiguous()
    else:
        a, a_scale = (x2, w) if t.fused else quantize_act_fp8(x2)
    if m <= SMALL_M and _gluon_decode(a, w, block, n // groups):
        sms = sm_count(x2.device)
        fp8_gluon.launch(a, a_scale, w, ws, out, block, groups, ue8m0=ue8m0, sms=sms)
        return out
    if m > SMALL_M:
        tile = (t.block_m, t.block_n, t.block_k)
        fp8_prefill_gemm(
            a, a_scale, w, ws, out, block, tile, groups,
            ue8m0=ue8m0, num_warps=t.num_warps, num_stages=t.num_stages,
        )  # fmt: skip
        return out
    part = out
    if t.splits > 1:
        part = torch.empty(t.splits, m, n, dtype=torch.float32, device=x2.device)
    _fp8_gemm_kernel[(n // t.block_n, triton.cdiv(m, t.block_m), t.splits)](
        a, a_scale, w, ws, out, part, split_counters(x2.device), m, n, k, groups * k,
        n // groups, t.k_split, t.splits, FUSED=t.fused, EMULATE=EMULATE_CAST,
        SCALE_UE8M0=ue8m0, SPLIT=t.splits > 1, REDUCE=t.reduce_in_kernel, GROUP=ACT_GROUP,
        W_BN=block[0], W_BK=block[1], BLOCK_M=t.block_m, BLOCK_N=t.block_n,
        BLOCK_K=t.block_k, num_warps=t.num_warps, num_stages=t.num_stages,
    )  # fmt: skip
    if t.splits > 1 and not t.reduce_in_kernel:
        block_size = 1024
        split_sum_kernel[(triton.cdiv(m * n, block_size),)](
            part, out, m * n, SPLITS=t.splits, EMULATE=EMULATE_CAST, BLOCK=block_size
        )
    return out


__all__ = ["ACT_GROUP", "fp8_block_grouped_linear", "fp8_block_linear", "quantize_act_fp8"]
