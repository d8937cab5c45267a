"""The mHC exit, alone or with the next sublayer's mixer products in the same kernel.

A sublayer's exit writes its streams ``X'[k] = post[k] * y + sum_j comb[j, k] * X[j]``
(:func:`mhc_post`); the next sublayer's entry starts by reading them all back for the mixer's
split products (``mhc._hc_mix_kernel``). At decode sizes both are launches for a few
microseconds' work, in every sublayer of every step, so :func:`mhc_post_mix` writes the streams
and makes their products in one. Both exits compute a stream value with :func:`_exit_value`,
and the fused one makes its products with ``mhc.mix_block`` on ``mhc.mix_launch``'s tiles, as
the mixer does: the streams and the products are the same bits either way, so which path runs
may follow the row count without a row's bits depending on its batch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from deepinfer_kernels_sm100.mhc import HC_MIX_SPLIT, mix_block, mix_buffers, mix_launch

#: Rows up to which :func:`mhc_post_mix` runs as one kernel. Its programs each write one stream
#: of a split's columns and so read all n input streams there: n times the exit's reads of
#: them, which a decode batch's few rows take from the cache, and a long prefill chunk's may
#: not; there the exit and the mixer run as two kernels (the same bits).
POST_MIX_MAX_ROWS = 1024


@triton.jit
def _exit_value(y, post, x_ptr, comb_ptr, mask, cmask, dim, N: tl.constexpr):  # noqa: PLR0917
    """One output stream of the exit at a tile's positions, in the streams' dtype:
    ``post * y + sum_i comb[i] * X[i]``, the products added in stream order in fp32.

    ``y`` and ``post`` come loaded and rounded to the streams' dtype (as the reference rounds
    them); ``x_ptr`` points at input stream 0 at the tile's positions (stream i is ``i * dim``
    further) and ``comb_ptr`` at the tile rows' ``comb[0, k]`` (``comb[i, k]`` is ``i * N``
    further)."""
    x = tl.load(x_ptr, mask=mask, other=0.0)
    out_ty = x.dtype
    c = tl.load(comb_ptr, mask=cmask, other=0.0).to(out_ty).to(tl.float32)
    mixed = c * x.to(tl.float32)
    for i in tl.static_range(1, N):
        c = tl.load(comb_ptr + i * N, mask=cmask, other=0.0).to(out_ty).to(tl.float32)
        mixed += c * tl.load(x_ptr + i * dim, mask=mask, other=0.0).to(tl.float32)
    return (post * y + mixed).to(out_ty)


@triton.jit
def _mhc_post_kernel(  # noqa: PLR0917 (Triton kernels take positional arguments)
    y_ptr,
    x_ptr,
    post_ptr,
    comb_ptr,
    out_ptr,
    dim,
    N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """One row's ``BLOCK_D`` columns of every output stream."""
    row = tl.program_id(0)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    dmask = d < dim
    out_ty = x_ptr.dtype.element_ty
    y = tl.load(y_ptr + row * dim + d, mask=dmask, other=0.0).to(out_ty).to(tl.float32)
    x_row = x_ptr + row * N * dim + d
    for k in tl.static_range(N):
        post = tl.load(post_ptr + row * N + k).to(out_ty).to(tl.float32)
        comb = comb_ptr + row * N * N + k
        out = _exit_value(y, post, x_row, comb, dmask, row >= 0, dim, N)
        tl.store(out_ptr + row * N * dim + k * dim + d, out, mask=dmask)


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
            BLOCK_D=block_d,
        )
    return out.view(x.shape)


@triton.jit(do_not_specialize=["rows"])
def _mhc_post_mix_kernel(  # noqa: PLR0917 (Triton kernels take positional arguments)
    y_ptr,  # [rows, dim]: the sublayer's output
    x_ptr,  # [rows, N, dim]: the streams it came from
    post_ptr,  # [rows, N]
    comb_ptr,  # [rows, N, N]
    out_ptr,  # [rows, N, dim]: the new streams
    fn_ptr,  # [width, N * dim] fp32: the next sublayer's mixer
    part_ptr,  # [splits, rows, width]: each split's partial products of the new streams
    squares_ptr,  # [splits, rows]: and their partial sums of squares
    rows,
    dim,
    width,
    N: tl.constexpr,
    SPLIT: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_W: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BF16_PARTS: tl.constexpr,
    NATIVE: tl.constexpr,
):
    """``mhc._hc_mix_kernel``'s program over a split's columns of the flattened streams,
    computing those columns of the exit first: a split lies in one stream (dim is a multiple
    of SPLIT), whose values take all N input streams at the same columns."""
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    split = tl.program_id(1)
    rmask = r < rows
    k_dim = N * dim
    stream = split * SPLIT // dim
    first = split * SPLIT - stream * dim
    out_ty = x_ptr.dtype.element_ty
    w = tl.arange(0, BLOCK_W)
    post = tl.load(post_ptr + r * N + stream, mask=rmask, other=0.0).to(out_ty).to(tl.float32)
    comb = comb_ptr + r[:, None] * (N * N) + stream
    acc = tl.zeros((BLOCK_R, BLOCK_W), dtype=tl.float32)
    squares = tl.zeros((BLOCK_R,), dtype=tl.float32)
    for k0 in range(0, SPLIT, BLOCK_K):
        d = first + k0 + tl.arange(0, BLOCK_K)
        mask = rmask[:, None] & (d < dim)[None, :]
        y = tl.load(y_ptr + r[:, None] * dim + d[None, :], mask=mask, other=0.0)
        y = y.to(out_ty).to(tl.float32)
        x_at = x_ptr + r[:, None] * k_dim + d[None, :]
        x = _exit_value(y, post[:, None], x_at, comb, mask, rmask[:, None], dim, N)
        tl.store(out_ptr + r[:, None] * k_dim + stream * dim + d[None, :], x, mask=mask)
        k = stream * dim + d
        f = tl.load(fn_ptr + w[None, :] * k_dim + k[:, None], mask=w[None, :] < width, other=0.0)
        acc, squares = mix_block(x, f, acc, squares, BF16_PARTS, NATIVE)
    base = split * rows
    tl.store(part_ptr + (base + r[:, None]) * width + w[None, :], acc,
             mask=rmask[:, None] & (w[None, :] < width))  # fmt: skip
    tl.store(squares_ptr + base + r, squares, mask=rmask)


def mhc_post_mix(
    y: Tensor, x: Tensor, post: Tensor, comb: Tensor, fn: Tensor
) -> tuple[Tensor, tuple[Tensor, Tensor, Tensor] | None]:
    """:func:`mhc_post`, and the next mixer's split products of the new streams as
    ``mhc.hc_mix_parts`` makes them (flattened streams, products, sums of squares) for
    ``mhc_fused.mhc_entry``, in one kernel. Where the fused kernel does not apply (a hidden size
    that is no multiple of the mixer's split, or more than :data:`POST_MIX_MAX_ROWS` rows) the
    exit runs alone and the products are None."""
    n, dim = x.shape[-2:]
    flat_x = x.reshape(-1, n, dim).contiguous()
    rows = flat_x.shape[0]
    if dim % HC_MIX_SPLIT or not 0 < rows <= POST_MIX_MAX_ROWS:
        return mhc_post(y, x, post, comb), None
    out = torch.empty_like(flat_x)
    k_dim, width = n * dim, fn.shape[0]
    parts, squares = mix_buffers(rows, k_dim, width, x.device)
    grid, meta = mix_launch(x.dtype, rows, k_dim, width)
    _mhc_post_mix_kernel[grid](
        y.reshape(rows, dim).contiguous(),
        flat_x,
        post.reshape(rows, n).contiguous(),
        comb.reshape(rows, n, n).contiguous(),
        out,
        fn.float().contiguous(),
        parts,
        squares,
        rows,
        dim,
        width,
        N=n,
        **meta,
    )
    return out.view(x.shape), (out.view(rows, k_dim), parts, squares)
