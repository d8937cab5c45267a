"""Lightning-indexer scores, ``sum_h w[s, h] * relu(q[s, h] . k[t])``, as one kernel.

The reference materialises the per-head dots, a [B, S, heads, T] fp32 tensor (V4-Flash's 64
index heads make it 64x the scores it reduces to), then the ReLU, the weighting and the sum over
heads: four passes over the largest tensor of a long prefill. Here a program takes a tile of
queries and entries through the heads, one ``tl.dot`` each, and keeps the weighted sum in
registers, so only the [B, S, T] scores are written. Exact zeros (every head's dot <= 0) stay
exact zeros, which the top-k's tie rule relies on.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor


@triton.jit(do_not_specialize=["seq", "entries"])
def _indexer_scores_kernel(  # noqa: PLR0917 (Triton kernels take positional arguments)
    q_ptr,  # [B, S, H, C]
    k_ptr,  # [B, T, C]
    w_ptr,  # [B, S, H] fp32
    out_ptr,  # [B, S, T] fp32
    seq,
    entries,
    heads,
    dim,
    BLOCK_S: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    b = tl.program_id(2)
    s = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    c = tl.arange(0, BLOCK_C)
    smask, tmask, cmask = s < seq, t < entries, c < dim
    keys = tl.load(
        k_ptr + (b * entries + t[:, None]) * dim + c[None, :],
        mask=tmask[:, None] & cmask[None, :],
        other=0.0,
    ).to(tl.float32)
    acc = tl.zeros((BLOCK_S, BLOCK_T), dtype=tl.float32)
    for h in range(heads):
        row = (b * seq + s) * heads + h
        q = tl.load(
            q_ptr + row[:, None] * dim + c[None, :], mask=smask[:, None] & cmask[None, :], other=0.0
        ).to(tl.float32)
        w = tl.load(w_ptr + row, mask=smask, other=0.0)
        dots = tl.dot(q, tl.trans(keys), input_precision="ieee")
        acc += tl.maximum(dots, 0.0) * w[:, None]
    tl.store(
        out_ptr + (b * seq + s[:, None]) * entries + t[None, :],
        acc,
        mask=smask[:, None] & tmask[None, :],
    )


def indexer_scores(q: Tensor, keys: Tensor, weights: Tensor) -> Tensor:
    """[B, S, T] fp32 scores for ``q`` [B, S, H, C], ``keys`` [B, T, C] and ``weights``
    [B, S, H] (scales folded in), as :meth:`TorchBackend.indexer_scores`."""
    b, s, h, c = q.shape
    t = keys.shape[1]
    out = torch.empty(b, s, t, dtype=torch.float32, device=q.device)
    if out.numel() == 0:
        return out
    block_s, block_t = 16, 64  # tl.dot wants at least 16 rows
    _indexer_scores_kernel[(triton.cdiv(s, block_s), triton.cdiv(t, block_t), b)](
        q.contiguous(),
        keys.contiguous(),
        weights.float().contiguous(),
        out,
        s,
        t,
        h,
        c,
        BLOCK_S=block_s,
        BLOCK_T=block_t,
        BLOCK_C=max(16, triton.next_power_of_2(c)),
    )
    return out
