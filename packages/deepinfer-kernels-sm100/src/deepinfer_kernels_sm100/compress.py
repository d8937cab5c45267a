"""The compressor's softmax pooling of windows into entries, as one kernel.

The reference concatenates the previous window's first halves to the current ones (overlapping
ratios), runs a softmax over the window's positions, multiplies and sums: four to eight launches,
and the softmax over a strided dimension is slow in torch (a V4 decode step spent ~25 us in each
ratio-128 layer's softmax, at one row as at 32). Here one program takes one window's block of
channels: it loads the window's scores and values (and, with overlap, the previous window's or the
carried ``prev`` halves), and writes the pooled entry.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor


@triton.jit(do_not_specialize=["n", "r", "dim"])
def _softmax_pool_kernel(  # noqa: PLR0917 (Triton kernels take positional arguments)
    kv_ptr,
    score_ptr,  # [B, n, r, c * dim] fp32, last dimension contiguous, the strides below
    prev_kv_ptr,
    prev_score_ptr,  # [B, r, dim], contiguous: window -1's first halves (HAS_PREV)
    out_ptr,  # [B, n, dim] fp32
    n,
    r,
    dim,
    stride_b,
    stride_n,
    stride_r,
    OVERLAP: tl.constexpr,
    HAS_PREV: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    row = tl.program_id(0)  # b * n + i
    b = row // n
    i = row % n
    c = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    j = tl.arange(0, BLOCK_R)
    mask = (j < r)[:, None] & (c < dim)[None, :]
    base = b * stride_b + i * stride_n + j[:, None] * stride_r
    # this window's values: its second halves with overlap
    at = base + (c + dim if OVERLAP else c)[None, :]
    s = tl.load(score_ptr + at, mask=mask, other=float("-inf")).to(tl.float32)
    v = tl.load(kv_ptr + at, mask=mask, other=0.0).to(tl.float32)
    s = tl.where((c < dim)[None, :], s, 0.0)  # columns past the entry: finite, never stored
    top = tl.max(s, axis=0)
    if OVERLAP:
        # the first halves of window i - 1: in this tensor, or the carried ones for i = 0
        before = base - stride_n + c[None, :]
        inside = mask & (i > 0)
        s0 = tl.load(score_ptr + before, mask=inside, other=float("-inf")).to(tl.float32)
        v0 = tl.load(kv_ptr + before, mask=inside, other=0.0).to(tl.float32)
        if HAS_PREV:
            carried = (b * r + j[:, None]) * dim + c[None, :]
            first = mask & (i == 0)
            s0 = tl.where(
                first, tl.load(prev_score_ptr + carried, mask=first, other=0.0).to(tl.float32), s0
            )
            v0 = tl.where(
                first, tl.load(prev_kv_ptr + carried, mask=first, other=0.0).to(tl.float32), v0
            )
        top = tl.maximum(top, tl.max(s0, axis=0))
        e0 = tl.exp(s0 - top[None, :])
        e = tl.exp(s - top[None, :])
        denom = tl.sum(e0, axis=0) + tl.sum(e, axis=0)
        total = tl.sum(e0 * v0, axis=0) + tl.sum(e * v, axis=0)
    else:
        e = tl.exp(s - top[None, :])
        denom = tl.sum(e, axis=0)
        total = tl.sum(e * v, axis=0)
    tl.store(out_ptr + row * dim + c, total / denom, mask=c < dim)


def softmax_pool(
    kv: Tensor,
    score: Tensor,
    prev_kv: Tensor | None,
    prev_score: Tensor | None,
    overlap: bool,
) -> Tensor:
    """:meth:`deepinfer.backends.base.Backend.compress`: ``kv``/``score`` [B, n, r, c * D] fp32
    (c = 2 with ``overlap``), ``prev_kv``/``prev_score`` [B, r, D] or None -> [B, n, D] fp32."""
    b, n, r, width = kv.shape
    dim = width // 2 if overlap else width
    out = torch.empty(b, n, dim, dtype=torch.float32, device=kv.device)
    if out.numel() == 0:
        return out
    if kv.stride() != score.stride() or kv.stride(-1) != 1:
        kv, score = kv.contiguous(), score.contiguous()
    has_prev = overlap and prev_kv is not None and prev_score is not None
    if has_prev:
        assert prev_kv is not None and prev_score is not None
        prev_kv, prev_score = prev_kv.contiguous(), prev_score.contiguous()
    else:
        prev_kv, prev_score = kv, score  # never read
    block_r = max(16, triton.next_power_of_2(r))
    # two [r, block_d] tiles (four with overlap) in one program's registers
    block_d = max(16, min(128, triton.next_power_of_2(dim), 4096 // block_r))
    _softmax_pool_kernel[(b * n, triton.cdiv(dim, block_d))](
        kv,
        score,
        prev_kv,
        prev_score,
        out,
        n,
        r,
        dim,
        kv.stride(0),
        kv.stride(1),
        kv.stride(2),
        OVERLAP=overlap,
        HAS_PREV=has_prev,
        BLOCK_R=block_r,
        BLOCK_D=block_d,
    )
    return out
