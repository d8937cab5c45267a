"""Lightning-indexer scores of decode rows, reading the index keys in their pages.

A decode row scores its query against every index key it holds: ``sum_h w_h * relu(q_h . k_t)``
for all t. The reference first copies each row's keys out of their pages into a dense
[B, T, c] tensor and then builds a [B, heads, T] fp32 product (with V4.1's ratio-1 layers at
64k tokens and 32 heads: 16 MiB of keys and 8 MiB of products per row, written and read back).
Here one program takes a block of one row's entries, finds their pages through the row's page
index, loads the keys once and reduces over the heads in registers, so only the [B, T] scores
are written. A captured step reads up to its entry bucket (up to 4x a row's entries); entries
past each row's own count are skipped.

Queries and keys of one 16-bit type meet in tensor-core dots as they are
(:func:`~deepinfer_kernels_sm100.attention.native_dot`); otherwise they are upcast to fp32, as in
the reference, and 16-bit ones, exact in TF32, take its dots
(:func:`~deepinfer_kernels_sm100.attention.dot_precision`). Either way the products are exact
and accumulate in fp32; fp32 operands take IEEE dots. The sums run in another order than the
reference's, so scores agree to rounding.

A prefill chunk's queries score their chunk's dense keys (:func:`dense_indexer_scores`): the
reference's [B, S, heads, T] fp32 product is its largest tensor and, built by an fp32 GEMM on
CUDA cores, its slowest op. Here one program takes a block of queries and a block of keys,
loads the keys once and adds each head's weighted, rectified dots into one [S, T] tile, head by
head in a fixed order, so a query's scores do not depend on which block of the chunk it is in.
Key blocks that no query of the block sees are skipped (they score 0).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from deepinfer.paging import PagedEntries
from deepinfer_kernels_sm100.attention import dot_precision, native_dot


@triton.jit(do_not_specialize=["seq", "limit", "index_cols"])
def _paged_scores_kernel(  # noqa: PLR0917 (Triton kernels take positional arguments)
    q_ptr,  # [B*S, heads, dim]
    w_ptr,  # [B*S, heads], any float dtype: widened, times w_scale
    pages_ptr,  # [num_pages + 1, PAGE_ROWS, dim]
    index_ptr,  # [B, index_cols] page of each block
    count_ptr,  # [B] entries each row holds
    out_ptr,  # [B*S, limit] fp32
    seq,
    heads,
    limit,
    index_cols,
    dim,
    w_scale,
    PAGE_ROWS: tl.constexpr,
    NATIVE: tl.constexpr,  # one 16-bit type: dot as they are
    PRECISION: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    row = tl.program_id(0)  # b * seq + s
    b = row // seq
    t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    c = tl.arange(0, BLOCK_C)
    tmask = t < limit
    held = tmask & (t < tl.load(count_ptr + b))  # entries past the row's count stay unread
    cmask = c < dim
    page = tl.load(index_ptr + b * index_cols + t // PAGE_ROWS, mask=held, other=0)
    key_row = page.to(tl.int64) * PAGE_ROWS + t % PAGE_ROWS
    k = tl.load(
        pages_ptr + key_row[:, None] * dim + c[None, :],
        mask=held[:, None] & cmask[None, :],
        other=0.0,
    )
    if not NATIVE:
        k = k.to(tl.float32)
    acc = tl.zeros((BLOCK_T,), dtype=tl.float32)
    for h0 in range(0, heads, BLOCK_H):
        h = h0 + tl.arange(0, BLOCK_H)
        hmask = h < heads
        q = tl.load(
            q_ptr + row * heads * dim + h[:, None] * dim + c[None, :],
            mask=hmask[:, None] & cmask[None, :],
            other=0.0,
        )
        w = tl.load(w_ptr + row * heads + h, mask=hmask, other=0.0).to(tl.float32) * w_scale
        if NATIVE:
            dots = tl.dot(q, tl.trans(k))
        else:
            dots = tl.dot(q.to(tl.float32), tl.trans(k), input_precision=PRECISION)
        acc += tl.sum(tl.maximum(dots, 0.0) * w[:, None], axis=0)
    tl.store(out_ptr + row * limit + t, acc, mask=tmask)


#: Launch shapes: up to BLOCK_H heads per dot (tl.dot needs 16 rows; fewer heads are masked),
#: BLOCK_T entries per program. Chosen from 7 variants timed in CUDA graphs on an H200
#: (``benchmarks/attention_kernels.py``): V4.1's ratio-1 layer at 32k entries and B=32 took
#: 150 us with 16 x 64 blocks and upcast keys, 87 us with these (reading the keys once: 56 us).
BLOCK_H, BLOCK_T, NUM_WARPS = 32, 128, 8


def paged_indexer_scores(
    q: Tensor, keys: PagedEntries, weights: Tensor, weight_scale: float = 1.0
) -> Tensor:
    """[B, S, T] fp32 scores of ``q`` [B, S, h, c] against row b's keys ``:T`` in their pages,
    weighted by ``weights`` [B, S, h] (widened to fp32, times ``weight_scale``); nothing
    masked, but entries past a row's ``keys.counts`` are not read and score 0."""
    b, s, heads, dim = q.shape
    limit = keys.limit
    out = torch.empty(b, s, limit, dtype=torch.float32, device=q.device)
    if b * s * limit == 0:
        return out
    counts = keys.counts
    if counts is None:
        counts = torch.full((b,), limit, dtype=torch.long, device=q.device)
    _paged_scores_kernel[(b * s, triton.cdiv(limit, BLOCK_T))](
        q.contiguous(),
        weights.contiguous(),
        keys.pages,
        keys.index.contiguous(),
        counts.contiguous(),
        out,
        s,
        heads,
        limit,
        keys.index.shape[1],
        dim,
        weight_scale,
        PAGE_ROWS=keys.pages.shape[1],
        NATIVE=native_dot(q, keys.pages),
        PRECISION=dot_precision(q, keys.pages),
        BLOCK_H=min(BLOCK_H, max(16, triton.next_power_of_2(heads))),
        BLOCK_T=BLOCK_T,
        BLOCK_C=max(16, triton.next_power_of_2(dim)),
        num_warps=NUM_WARPS,
    )
    return out


@triton.jit(do_not_specialize=["seq", "heads", "limit"])
def _dense_scores_kernel(  # noqa: PLR0917 (Triton kernels take positional arguments)
    q_ptr,  # [B, S, heads, dim], strided over (B, S, heads)
    w_ptr,  # [B, S, heads] contiguous, any float dtype: widened, times w_scale
    k_ptr,  # [B, T, dim], strided over (B, T)
    seen_ptr,  # [B, S] entries each query sees (VISIBLE)
    out_ptr,  # [B, S, T] fp32
    seq,
    heads,
    limit,
    dim,
    q_sb,
    q_ss,
    q_sh,
    k_sb,
    k_st,
    w_scale,
    VISIBLE: tl.constexpr,
    NATIVE: tl.constexpr,  # one 16-bit type: dot as they are
    PRECISION: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    blocks = tl.cdiv(seq, BLOCK_S)
    b = tl.program_id(0) // blocks
    s = (tl.program_id(0) % blocks) * BLOCK_S + tl.arange(0, BLOCK_S)
    t0 = tl.program_id(1) * BLOCK_T
    t = t0 + tl.arange(0, BLOCK_T)
    c = tl.arange(0, BLOCK_C)
    smask = s < seq
    tmask = t < limit
    cmask = c < dim
    row = b * seq + s  # [BLOCK_S] rows of the weights and scores
    acc = tl.zeros((BLOCK_S, BLOCK_T), dtype=tl.float32)
    seen = limit
    if VISIBLE:
        seen = tl.max(tl.load(seen_ptr + row, mask=smask, other=0), axis=0)
    if t0 < seen:
        k = tl.load(
            k_ptr + b.to(tl.int64) * k_sb + t.to(tl.int64)[:, None] * k_st + c[None, :],
            mask=tmask[:, None] & cmask[None, :],
            other=0.0,
        )
        if not NATIVE:
            k = k.to(tl.float32)
        q_rows = q_ptr + b.to(tl.int64) * q_sb + s.to(tl.int64)[:, None] * q_ss + c[None, :]
        for h in range(heads):
            q = tl.load(q_rows + h * q_sh, mask=smask[:, None] & cmask[None, :], other=0.0)
            w = tl.load(w_ptr + row * heads + h, mask=smask, other=0.0).to(tl.float32) * w_scale
            if NATIVE:
                dots = tl.dot(q, tl.trans(k))
            else:
                dots = tl.dot(q.to(tl.float32), tl.trans(k), input_precision=PRECISION)
            acc += tl.maximum(dots, 0.0) * w[:, None]
    tl.store(
        out_ptr + row.to(tl.int64)[:, None] * limit + t[None, :],
        acc,
        mask=smask[:, None] & tmask[None, :],
    )


#: Dense launch shapes: queries and keys per program (untimed on a GPU so far).
DENSE_BLOCK_S, DENSE_BLOCK_T, DENSE_WARPS = 64, 64, 4
#: Largest [B, rows, T] score tensor (elements) a prefill chunk's top-k scores at once.
MAX_DENSE_SCORES = 1 << 26


def dense_indexer_scores(
    q: Tensor,
    keys: Tensor,
    weights: Tensor,
    n_visible: Tensor | None = None,
    weight_scale: float = 1.0,
) -> Tensor:
    """[B, S, T] fp32 scores of ``q`` [B, S, h, c] against dense ``keys`` [B, T, c] (a
    prefill chunk's), weighted by ``weights`` [B, S, h] (widened to fp32, times
    ``weight_scale``). ``n_visible`` ([S] or [B, S]): entries each query may see; blocks of
    keys that no query of a block of queries sees are not computed and score 0 (the picks
    mask them), the rest score as without it."""
    b, s, heads, dim = q.shape
    limit = keys.shape[1]
    out = torch.empty(b, s, limit, dtype=torch.float32, device=q.device)
    if b * s * limit == 0:
        return out
    if q.stride(-1) != 1:
        q = q.contiguous()
    if keys.stride(-1) != 1:
        keys = keys.contiguous()
    seen = out  # unread without n_visible
    if n_visible is not None:
        seen = n_visible.to(device=q.device, dtype=torch.int64).expand(b, s).contiguous()
    grid = (b * triton.cdiv(s, DENSE_BLOCK_S), triton.cdiv(limit, DENSE_BLOCK_T))
    _dense_scores_kernel[grid](
        q,
        weights.contiguous(),
        keys,
        seen,
        out,
        s,
        heads,
        limit,
        dim,
        q.stride(0),
        q.stride(1),
        q.stride(2),
        keys.stride(0),
        keys.stride(1),
        weight_scale,
        VISIBLE=n_visible is not None,
        NATIVE=native_dot(q, keys),
        PRECISION=dot_precision(q, keys),
        BLOCK_S=DENSE_BLOCK_S,
        BLOCK_T=DENSE_BLOCK_T,
        BLOCK_C=max(16, triton.next_power_of_2(dim)),
        num_warps=DENSE_WARPS,
    )
    return out
