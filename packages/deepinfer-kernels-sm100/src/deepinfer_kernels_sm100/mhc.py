"""mHC kernels around a sublayer: the mixer's projection, the streams' collapse and the post mix.

In plain torch each of these is several launches on a token's few numbers and its n streams
(n = ``hc_mult`` = 4), in every sublayer of every step. The mixer (:func:`hc_mix`, and
:func:`hc_mix_parts` for :mod:`~deepinfer_kernels_sm100.mhc_fused`, which adds the gates and
the Sinkhorn mix in the kernel that sums its splits) folds the flattened streams' RMSNorm into
the projection; :func:`mhc_collapse` and :func:`mhc_post` are one launch each.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from torch import Tensor


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
            block = _dot_bf16_part(x, f3, tl.zeros((BLOCK_R, BLOCK_W), tl.float32), NATIVE)
            block = _dot_bf16_part(x, f2, block, NATIVE)
            acc += _dot_bf16_part(x, f1, block, NATIVE)
        else:
            acc += tl.dot(xf, f, input_precision="ieee")
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


def hc_mix_parts(x: Tensor, fn: Tensor, norm_eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """The mixer's first kernel: (the streams flattened [rows, n * d], each split's partial
    products [splits, rows, W] and partial sums of squares [splits, rows])."""
    flat = x.reshape(-1, x.shape[-2] * x.shape[-1]).contiguous()
    rows, k_dim = flat.shape
    width = fn.shape[0]
    splits = triton.cdiv(k_dim, HC_MIX_SPLIT)
    out = torch.empty(splits, rows, width, dtype=torch.float32, device=x.device)
    squares = torch.empty(splits, rows, dtype=torch.float32, device=x.device)
    parts = flat.dtype == torch.bfloat16
    if parts:
        block_r, block_k, warps = HC_MIX_BLOCK_R, HC_MIX_BLOCK_K, HC_MIX_WARPS
    else:
        block_r, block_k, warps = HC_MIX_IEEE_TILES
    if rows:
        _hc_mix_kernel[(triton.cdiv(rows, block_r), splits)](
            flat,
            fn.float().contiguous(),
            out,
            squares,
            rows,
            k_dim,
            width,
            norm_eps,
            SPLIT=HC_MIX_SPLIT,
            BLOCK_R=block_r,
            BLOCK_W=max(16, triton.next_power_of_2(width)),
            BLOCK_K=min(block_k, HC_MIX_SPLIT),
            BF16_PARTS=parts,
            NATIVE=HC_MIX_NATIVE,
            num_warps=warps,
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
def _mhc_post_kernel(  # noqa: PLR0917 (Triton kernels take positional arguments)
    y_ptr,
    x_ptr,
    post_ptr,
    comb_ptr,
    out_ptr,
    dim,
    N: tl.constexpr,
    NP: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    row, d, j, x = _stream_tile(x_ptr, dim, N, NP, BLOCK_D)
    dmask = d < dim
    smask = (j[:, None] < N) & dmask[None, :]
    out_ty = x.dtype
    # The reference rounds the weights and the sublayer output to the residual dtype first.
    y = tl.load(y_ptr + row * dim + d, mask=dmask, other=0.0).to(out_ty).to(tl.float32)
    post = tl.load(post_ptr + row * N + j, mask=j < N, other=0.0).to(out_ty).to(tl.float32)
    cmask = (j[:, None] < N) & (j[None, :] < N)
    comb = tl.load(comb_ptr + row * N * N + j[:, None] * N + j[None, :], mask=cmask, other=0.0)
    comb = comb.to(out_ty).to(tl.float32)
    # out[k] = post[k] * y + sum_j comb[j, k] * x[j]
    mixed = tl.sum(comb[:, :, None] * x.to(tl.float32)[:, None, :], axis=0)
    out = post[:, None] * y[None, :] + mixed
    tl.store(out_ptr + row * N * dim + j[:, None] * dim + d[None, :], out.to(out_ty), mask=smask)


def mhc_post(y: Tensor, x: Tensor, post: Tensor, comb: Tensor) -> Tensor:
    """mHC exit ``X'[k] = post[k] * y + sum_j comb[j, k] * X[j]`` for streams ``x`` [..., n, d]."""
    n, dim = x.shape[-2:]
    flat_x = x.reshape(-1, n, dim).contiguous()
    rows = flat_x.shape[0]
    out = torch.empty_like(flat_x)
    if rows:
        block_d = min(triton.next_power_of_2(dim), 256)
        _mhc_post_kernel[(rows, triton.cdiv(dim, block_d))](
            y.reshape(rows, dim).contiguous(),
            flat_x,
            post.reshape(rows, n).contiguous(),
            comb.reshape(rows, n, n).contiguous(),
            out,
            dim,
            N=n,
            NP=triton.next_power_of_2(n),
            BLOCK_D=block_d,
        )
    return out.view(x.shape)


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
