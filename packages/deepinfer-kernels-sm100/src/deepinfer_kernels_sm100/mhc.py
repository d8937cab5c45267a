"""mHC kernels at a sublayer's entry: the mixer's projection and the streams' collapse.

In plain torch each of these is several launches on a token's few numbers and its n streams
(n = ``hc_mult`` = 4), in every sublayer of every step. The mixer (:func:`hc_mix`, and
:func:`hc_mix_parts` for :mod:`~deepinfer_kernels_sm100.mhc_fused`, which adds the gates and
the Sinkhorn mix in the kernel that sums its splits) folds the flattened streams' RMSNorm into
the projection; :func:`mhc_collapse` is one launch. The exit (the post mix) is in
:mod:`~deepinfer_kernels_sm100.mhc_exit`.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor

Grid = tuple[int, int]


@triton.jit
def _dot_bf16_part(x, part, acc, NATIVE: tl.constexpr):
    """``acc + x @ part`` for bf16 ``x`` and a bf16 ``part`` of fn: a tensor-core dot, whose
    products are exact and whose sums are fp32, or (``NATIVE`` off) the same exact products in
    an IEEE fp32 dot."""
    if NATIVE:
        out = tl.dot(x, part, acc)
    else:
        out = tl.dot(x.to(tl.float32), part.to(tl.float32), acc, input_precision="ieee")
    return out


@triton.jit
def mix_block(x, f, acc, squares, BF16_PARTS: tl.constexpr, NATIVE: tl.constexpr):  # noqa: PLR0917
    """One K block of the mixer: ``(acc + x @ f, squares + the rows' sums of x^2)`` for a
    [BLOCK_R, BLOCK_K] tile of streams and the [BLOCK_K, BLOCK_W] block of fn.T. Every kernel
    that makes mixer products goes through it, so theirs are the same bits."""
    xf = x.to(tl.float32)
    squares += tl.sum(xf * xf, axis=1)
    if BF16_PARTS:
        # f = f1 + f2 + f3 exactly: each part takes the next 8 significant bits of what
        # the parts before it leave, and three carry all 24 of an fp32. A bf16 x times a
        # bf16 part is exact, so only the fp32 sums round, as in an IEEE fp32 dot.
        f1 = f.to(tl.bfloat16)
        rest = f - f1.to(tl.float32)
        f2 = rest.to(tl.bfloat16)
        f3 = (rest - f2.to(tl.float32)).to(tl.bfloat16)
        # Tensor cores' fp32 additions truncate: an accumulator passed through every dot
        # of the split would gather that bias toward zero, so the block's dots start from
        # zero, smallest part first, and the block joins acc in one round-to-nearest add.
        block = _dot_bf16_part(x, f3, tl.zeros_like(acc), NATIVE)
        block = _dot_bf16_part(x, f2, block, NATIVE)
        acc += _dot_bf16_part(x, f1, block, NATIVE)
    else:
        acc += tl.dot(xf, f, input_precision="ieee")
    return acc, squares


@triton.jit(do_not_specialize=["rows"])
def _hc_mix_kernel(  # noqa: PLR0917 (Triton kernels take positional arguments)
    x_ptr,
    fn_ptr,
    out_ptr,  # [splits, rows, width]: each split's partial product
    squares_ptr,  # [splits, rows]: each split's partial sum of squares
    rows,
    k_dim,
    width,
    norm_eps,
    SPLIT: tl.constexpr,  # columns of x per program along k
    BLOCK_R: tl.constexpr,
    BLOCK_W: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BF16_PARTS: tl.constexpr,  # bf16 x: fn as three bf16 parts in 16-bit dots (else IEEE fp32)
    NATIVE: tl.constexpr,  # the parts' dots in bf16 (off: upcast, for the interpreter)
):
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    split = tl.program_id(1)
    w = tl.arange(0, BLOCK_W)
    acc = tl.zeros((BLOCK_R, BLOCK_W), dtype=tl.float32)
    squares = tl.zeros((BLOCK_R,), dtype=tl.float32)
    for k0 in range(split * SPLIT, split * SPLIT + SPLIT, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(
            x_ptr + r[:, None] * k_dim + k[None, :],
            mask=(r[:, None] < rows) & (k[None, :] < k_dim),
            other=0.0,
        )
        f = tl.load(
            fn_ptr + w[None, :] * k_dim + k[:, None],
            mask=(w[None, :] < width) & (k[:, None] < k_dim),
            other=0.0,
        )
        acc, squares = mix_block(x, f, acc, squares, BF16_PARTS, NATIVE)
    base = split * rows
    tl.store(
        out_ptr + (base + r[:, None]) * width + w[None, :],
        acc,
        mask=(r[:, None] < rows) & (w[None, :] < width),
    )
    tl.store(squares_ptr + base + r, squares, mask=r < rows)


@triton.jit(do_not_specialize=["rows", "splits"])
def _hc_mix_finish_kernel(  # noqa: PLR0917 (Triton kernels take positional arguments)
    part_ptr,  # [splits, rows, width]
    squares_ptr,  # [splits, rows]
    out_ptr,  # [rows, width]
    rows,
    splits,
    k_dim,
    width,
    norm_eps,
    BLOCK_S: tl.constexpr,
    BLOCK_W: tl.constexpr,
):
    """Add one row's partial products and sums of squares, then normalise: RMSNorm of the
    flattened streams is a per-row scale, so it can follow the projection. All of the row's
    splits are loaded at once (a loop over them waited on each load in turn) and summed in a
    tree whose shape depends on the split count alone, not on the batch."""
    r = tl.program_id(0)
    s = tl.arange(0, BLOCK_S)
    w = tl.arange(0, BLOCK_W)
    smask = s < splits
    part = tl.load(
        part_ptr + (s[:, None] * rows + r) * width + w[None, :],
        mask=smask[:, None] & (w[None, :] < width),
        other=0.0,
    )
    squares = tl.sum(tl.load(squares_ptr + s * rows + r, mask=smask, other=0.0), axis=0)
    acc = tl.sum(part, axis=0) * tl.rsqrt(squares / k_dim + norm_eps)
    tl.store(out_ptr + r * width + w, acc, mask=w < width)


#: Columns of the flattened streams one program reduces: a decode batch has a few rows, so the
#: n x hidden columns (16k for V4-Flash) are split over programs, whose partial sums are then
#: added in a fixed order. Each program's loads wait on memory one after another, so short
#: ranges serve a few rows best; longer ones would write fewer partials in a long prefill.
HC_MIX_SPLIT = 128
#: bf16 streams meet fn cut into three bf16 parts on tensor cores (exact products, fp32 sums,
#: as in the IEEE fp32 dots on CUDA cores that fp16 and fp32 streams keep). A program takes
#: HC_MIX_BLOCK_R rows, so that many rows share its work of cutting fn, and HC_MIX_BLOCK_K
#: columns a step (at most HC_MIX_SPLIT), with HC_MIX_WARPS warps. The tiles, like the split,
#: are fixed rather than chosen by the row count: the dots a row's sums go through, and so its
#: logits, do not depend on the batch. Large tiles serve long prefills; a decode step's few
#: rows wait on memory latency, which the tile size changes little.
HC_MIX_BLOCK_R = 128
HC_MIX_BLOCK_K = 64
HC_MIX_WARPS = 8
#: (rows, columns a step, warps) of the IEEE fp32 dots of fp16 and fp32 streams.
HC_MIX_IEEE_TILES = (16, 64, 4)
#: Triton's CPU interpreter (3.7) multiplies bf16 tensors as their raw 16-bit integers: there
#: the parts are upcast to fp32 for an IEEE dot, the same exact products.
HC_MIX_NATIVE = os.environ.get("TRITON_INTERPRET") != "1"


def mix_launch(
    dtype: torch.dtype, rows: int, k_dim: int, width: int
) -> tuple[Grid, dict[str, Any]]:
    """The grid and launch parameters of a kernel making the mixer's split products of
    ``rows`` rows of ``k_dim`` flattened stream values in ``dtype`` (:func:`mix_block`): one
    choice for every such kernel, so their products are the same bits."""
    parts = dtype == torch.bfloat16
    if parts:
        block_r, block_k, warps = HC_MIX_BLOCK_R, HC_MIX_BLOCK_K, HC_MIX_WARPS
    else:
        block_r, block_k, warps = HC_MIX_IEEE_TILES
    grid = (triton.cdiv(rows, block_r), triton.cdiv(k_dim, HC_MIX_SPLIT))
    meta = {
        "SPLIT": HC_MIX_SPLIT,
        "BLOCK_R": block_r,
        "BLOCK_W": max(16, triton.next_power_of_2(width)),
        "BLOCK_K": min(block_k, HC_MIX_SPLIT),
        "BF16_PARTS": parts,
        "NATIVE": HC_MIX_NATIVE,
        "num_warps": warps,
    }
    return grid, meta


def mix_buffers(rows: int, k_dim: int, width: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Each split's partial products [splits, rows, width] and sums of squares [splits, rows]."""
    splits = triton.cdiv(k_dim, HC_MIX_SPLIT)
    out = torch.empty(splits, rows, width, dtype=torch.float32, device=device)
    return out, torch.empty(splits, rows, dtype=torch.float32, device=device)


def hc_mix_parts(x: Tensor, fn: Tensor, norm_eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """The mixer's first kernel: (the streams flattened [rows, n * d], each split's partial
    products [splits, rows, W] and partial sums of squares [splits, rows])."""
    flat = x.reshape(-1, x.shape[-2] * x.shape[-1]).contiguous()
    rows, k_dim = flat.shape
    width = fn.shape[0]
    out, squares = mix_buffers(rows, k_dim, width, x.device)
    if rows:
        grid, meta = mix_launch(flat.dtype, rows, k_dim, width)
        _hc_mix_kernel[grid](
            flat, fn.float().contiguous(), out, squares, rows, k_dim, width, norm_eps, **meta
        )
    return flat, out, squares


def hc_mix(x: Tensor, fn: Tensor, norm_eps: float) -> Tensor:
    """``rms_norm(flatten(x)) @ fn.T`` in fp32: the mixer logits [..., W] of streams [..., n, d]."""
    flat, out, squares = hc_mix_parts(x, fn, norm_eps)
    (rows, k_dim), (splits, _, width) = flat.shape, out.shape
    mix = torch.empty(rows, width, dtype=torch.float32, device=x.device)
    if rows:
        _hc_mix_finish_kernel[(rows,)](
            out,
            squares,
            mix,
            rows,
            splits,
            k_dim,
            width,
            norm_eps,
            BLOCK_S=triton.next_power_of_2(splits),
            BLOCK_W=max(16, triton.next_power_of_2(width)),
        )
    return mix.view(*x.shape[:-2], width)


@triton.jit
def _stream_tile(x_ptr, dim, N: tl.constexpr, NP: tl.constexpr, BLOCK_D: tl.constexpr):
    """This program's (row, columns, stream ids, [NP, BLOCK_D] tile of the row's n streams,
    zero past n and dim) for a grid of (rows, column blocks)."""
    row = tl.program_id(0)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    j = tl.arange(0, NP)
    mask = (j[:, None] < N) & (d < dim)[None, :]
    x = tl.load(x_ptr + row * N * dim + j[:, None] * dim + d[None, :], mask=mask, other=0.0)
    return row, d, j, x


@triton.jit
def _mhc_collapse_kernel(  # noqa: PLR0917 (Triton kernels take positional arguments)
    x_ptr,
    pre_ptr,
    out_ptr,
    dim,
    N: tl.constexpr,
    NP: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    row, d, j, x = _stream_tile(x_ptr, dim, N, NP, BLOCK_D)
    pre = tl.load(pre_ptr + row * N + j, mask=j < N, other=0.0)
    out = tl.sum(pre[:, None] * x.to(tl.float32), axis=0)
    tl.store(out_ptr + row * dim + d, out.to(x.dtype), mask=d < dim)


def mhc_collapse(x: Tensor, pre: Tensor) -> Tensor:
    """mHC entry ``sum_j pre[j] * X[j]`` (fp32 sums, in ``x``'s dtype) of streams [..., n, d]."""
    n, dim = x.shape[-2:]
    flat_x = x.reshape(-1, n, dim).contiguous()
    rows = flat_x.shape[0]
    out = torch.empty(rows, dim, dtype=x.dtype, device=x.device)
    if rows:
        block_d = min(triton.next_power_of_2(dim), 512)
        _mhc_collapse_kernel[(rows, triton.cdiv(dim, block_d))](
            flat_x,
            pre.reshape(rows, n).float().contiguous(),
            out,
            dim,
            N=n,
            NP=triton.next_power_of_2(n),
            BLOCK_D=block_d,
        )
    return out.view(*x.shape[:-2], dim)
