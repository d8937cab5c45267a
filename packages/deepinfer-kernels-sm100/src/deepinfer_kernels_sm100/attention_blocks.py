"""Sparse MQA attention for prefill chunks of few heads: a program per block of queries.

:func:`~.attention.sparse_mqa_sink_attention` gives each query row a program that walks the
key rows it lists. With 16 heads (config A) that program's tensor-core dots have 16 rows, and
every query reads its keys on its own: a 4096-token chunk of a ratio-4 layer reads about 2.6 M
key rows of 1 KiB (twice: for the logits and for the values), which the L2 cache's bandwidth,
not the dots, bounds. Neighbouring queries list mostly the same rows (their windows overlap in
all but one row, and a causal top-k early in a chunk lists every entry there is).

Here a program takes ``QUERIES`` consecutive queries with all their heads as its dots' rows
(64 = 4 x 16), and walks the union of their key rows once; a row of the union carries a bit per
query that lists it, and a query's logits at the rows it does not list are masked, so each
query's softmax is over its own keys, as before. :func:`block_keys` forms the unions: each
block's (row, query) codes sorted, then one program a block makes the run of a row one entry
with the OR of its queries' bits.

A query's keys are met in ascending row order and in key tiles that its block-mates' keys also
fill, so its output rounds differently from the per-query kernel's (within fp32's rounding of
the same sums); it does not depend on anything but its block's index rows.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from deepinfer_kernels_sm100.attention import (
    PV_PARTS,
    dot_precision,
    native_dot,
    wide_block_dv,
)
from deepinfer_kernels_sm100.attention_combine import pv_accumulate

#: An empty slot of a block's sorted (row, query) codes: above every real code.
NONE = tl.constexpr(2**31 - 1)


@triton.jit(do_not_specialize=["seq", "blocks", "keys", "width"])
def _block_codes_kernel(  # noqa: PLR0917 (Triton kernels take positional arguments)
    index_ptr,  # [B, seq, keys] int64, -1 = none
    codes_ptr,  # [B * blocks, width] int32: row x QUERIES + query, NONE where none
    seq,
    blocks,
    keys,
    width,  # QUERIES * keys
    QUERIES: tl.constexpr,
    BLOCK: tl.constexpr,
):
    blk = tl.program_id(0)
    i = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    j = i // keys  # the block's query this slot comes from
    s = (blk % blocks) * QUERIES + j
    ok = (i < width) & (s < seq)
    at = ((blk // blocks) * seq + s).to(tl.int64) * keys + i % keys
    row = tl.load(index_ptr + at, mask=ok, other=-1)
    code = tl.where(row >= 0, row.to(tl.int32) * QUERIES + j, NONE)
    tl.store(codes_ptr + blk.to(tl.int64) * width + i, code, mask=i < width)


@triton.jit(do_not_specialize=["width"])
def _block_keys_kernel(  # noqa: PLR0917 (Triton kernels take positional arguments)
    codes_ptr,  # [B * blocks, width] int32: each block's (row, query) codes, ascending
    rows_ptr,  # [B * blocks, width] int32: the union's key rows, ascending
    bits_ptr,  # [B * blocks, width] int32: bit j set where the block's query j lists the row
    count_ptr,  # [B * blocks] int32: rows in the union
    width,
    QUERIES: tl.constexpr,
    WIDTH_POW2: tl.constexpr,
):
    blk = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, WIDTH_POW2)
    codes = codes_ptr + blk * width
    code = tl.load(codes + i, mask=i < width, other=NONE)
    prev = tl.load(codes + i - 1, mask=(i > 0) & (i < width), other=NONE)
    valid = code != NONE
    row = code // QUERIES
    start = valid & ((i == 0) | (prev // QUERIES != row))
    # a row's run holds at most one code per query, in query order: a run start ORs the bits
    # of the QUERIES codes from it on that have its row
    bits = tl.zeros_like(code)
    for t in tl.static_range(QUERIES):
        ahead = tl.load(codes + i + t, mask=start & (i + t < width), other=NONE)
        same = (ahead != NONE) & (ahead // QUERIES == row)
        bits |= tl.where(same, 1 << (ahead % QUERIES), 0)
    at = tl.cumsum(start.to(tl.int32), 0) - 1
    tl.store(rows_ptr + blk * width + at, row, mask=start)
    tl.store(bits_ptr + blk * width + at, bits, mask=start)
    tl.store(count_ptr + blk, tl.sum(start.to(tl.int32), 0))


def block_keys(index: Tensor, queries: int) -> tuple[Tensor, Tensor, Tensor]:
    """The key rows each block of ``queries`` consecutive queries of ``index`` [B, S, K] lists
    (-1 = none): (rows, bits) [B * blocks, queries * K] int32, the union's rows ascending and
    bit j of a row's bits set where the block's query j lists it (the slots past the count
    are unset), and count [B * blocks] int32, the union's size.

    Each block's (row x queries + query) codes are written by one kernel and sorted by torch,
    so the runs of one row are adjacent; one program a block then makes each run one entry."""
    b, s, k = index.shape
    blocks = triton.cdiv(s, queries)
    width = queries * k
    codes = torch.empty(b * blocks, width, dtype=torch.int32, device=index.device)
    rows, bits = torch.empty_like(codes), torch.empty_like(codes)
    count = torch.empty(b * blocks, dtype=torch.int32, device=index.device)  # every one written
    if codes.numel() == 0:
        return rows, bits, count.zero_()
    _block_codes_kernel[(b * blocks, triton.cdiv(width, CODES_BLOCK))](
        index.to(torch.int64).contiguous(), codes, s, blocks, k, width,
        QUERIES=queries, BLOCK=CODES_BLOCK,
    )  # fmt: skip
    _block_keys_kernel[(b * blocks,)](
        codes.sort(dim=-1).values, rows, bits, count, width,
        QUERIES=queries, WIDTH_POW2=triton.next_power_of_2(width), num_warps=KEYS_WARPS,
    )  # fmt: skip
    return rows, bits, count


@triton.jit(do_not_specialize=["seq", "blocks", "width", "kv_rows"])
def _block_attention_kernel(  # noqa: PLR0917
    q_ptr,  # [B, seq, heads, dim]
    kv_ptr,  # [B, kv_rows, dim]
    rows_ptr,  # block_keys' rows, bits and count
    bits_ptr,
    count_ptr,
    sink_ptr,  # [heads] fp32
    out_ptr,  # [B, seq, heads, dim]
    seq,
    blocks,
    width,
    heads,
    kv_rows,
    dim,
    scale,
    QK_NATIVE: tl.constexpr,
    QK_PRECISION: tl.constexpr,
    PV_PARTS: tl.constexpr,
    QUERIES: tl.constexpr,
    HEADS: tl.constexpr,  # a power of two >= heads: QUERIES * HEADS dot rows
    BLOCK_L: tl.constexpr,
    BLOCK_DK: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    blk = tl.program_id(0)
    b = blk // blocks
    r = tl.arange(0, QUERIES * HEADS)
    j = r // HEADS  # the block's query of each dot row
    h = r % HEADS
    s = (blk % blocks) * QUERIES + j
    rmask = (h < heads) & (s < seq)
    dv = tl.program_id(1) * BLOCK_DV + tl.arange(0, BLOCK_DV)
    dvmask = dv < dim
    q_rows = q_ptr + ((b * seq + s).to(tl.int64) * heads + h) * dim
    kv_base = kv_ptr + b.to(tl.int64) * kv_rows * dim
    listed = rows_ptr + blk.to(tl.int64) * width
    listers = bits_ptr + blk.to(tl.int64) * width
    top = tl.load(sink_ptr + h, mask=rmask, other=0.0).to(tl.float32)
    denom = tl.full((QUERIES * HEADS,), 1.0, dtype=tl.float32)  # the sink's own term
    acc = tl.zeros((QUERIES * HEADS, BLOCK_DV), dtype=tl.float32)
    n = tl.load(count_ptr + blk)
    for l0 in range(0, n, BLOCK_L):
        lk = l0 + tl.arange(0, BLOCK_L)
        lmask = lk < n
        key_row = tl.load(listed + lk, mask=lmask, other=0)
        who = tl.load(listers + lk, mask=lmask, other=0)
        visible = ((who[None, :] >> j[:, None]) & 1) != 0
        logits = tl.zeros((QUERIES * HEADS, BLOCK_L), dtype=tl.float32)
        for d0 in range(0, dim, BLOCK_DK):
            dk = d0 + tl.arange(0, BLOCK_DK)
            dkmask = dk < dim
            q = tl.load(
                q_rows[:, None] + dk[None, :], mask=rmask[:, None] & dkmask[None, :], other=0.0
            )
            k = tl.load(
                kv_base + key_row[:, None] * dim + dk[None, :],
                mask=lmask[:, None] & dkmask[None, :],
                other=0.0,
            )
            if QK_NATIVE:
                logits += tl.dot(q, tl.trans(k))
            else:
                logits += tl.dot(
                    q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision=QK_PRECISION
                )
        logits = tl.where(visible, logits * scale, float("-inf"))
        new_top = tl.maximum(top, tl.max(logits, axis=1))
        p = tl.exp(logits - new_top[:, None])
        keep = tl.exp(top - new_top)
        denom = denom * keep + tl.sum(p, axis=1)
        v = tl.load(
            kv_base + key_row[:, None] * dim + dv[None, :],
            mask=lmask[:, None] & dvmask[None, :],
            other=0.0,
        )
        acc = pv_accumulate(acc, p, v, keep, PV_PARTS)
        top = new_top
    tl.store(
        out_ptr + ((b * seq + s).to(tl.int64) * heads + h)[:, None] * dim + dv[None, :],
        (acc / denom[:, None]).to(out_ptr.dtype.element_ty),
        mask=rmask[:, None] & dvmask[None, :],
    )


#: Dot rows of a program (queries x padded heads): 64, so 16 heads take 4 queries.
ROWS = 64
#: Queries a chunk needs before it takes this kernel: shorter chunks (verify rows, decode-sized
#: steps) keep the per-query kernel, which the unions would not pay for.
MIN_QUERIES = 64
#: Widest union a block may list (queries x keys per query): one program holds its codes in
#: registers.
MAX_WIDTH = 8192
#: Launch shapes: keys per tile, head-dim slice of the logits, warps
#: (``benchmarks/block_attention.py`` compares others). A program's output columns are
#: ``attention.wide_block_dv``'s for :data:`ROWS` rows: 256 (a 64 x 512 fp32 accumulator does
#: not fit beside the rest, so two programs split the columns, each recomputing the logits),
#: 128 for bf16 values on Blackwell (its tensor memory).
BLOCK_L, BLOCK_DK, NUM_WARPS = 64, 64, 4
#: Warps of the union kernel; codes a program of the coding kernel writes.
KEYS_WARPS, CODES_BLOCK = 4, 1024


def queries_per_block(heads: int) -> int:
    """Queries a program takes: :data:`ROWS` over the heads padded to a power of two."""
    return max(1, ROWS // max(16, triton.next_power_of_2(heads)))


def fits(q: Tensor, index: Tensor) -> bool:
    """Whether a chunk's sparse attention takes this kernel: enough queries, heads few enough
    that a block holds two or more, and codes few enough for one program to merge."""
    per_block = queries_per_block(q.shape[2])
    return q.shape[1] >= MIN_QUERIES and per_block > 1 and per_block * index.shape[-1] <= MAX_WIDTH


def block_sparse_attention(
    q: Tensor, kv: Tensor, index: Tensor, sinks: Tensor, scale: float
) -> Tensor:
    """As :func:`~.attention.sparse_mqa_sink_attention`: output [B, S, H, D] for ``q``
    [B, S, H, D], ``kv`` [B, L, D] and ``index`` [B, S, K] (int, -1 = none, distinct per
    query), a program per block of :func:`queries_per_block` queries."""
    b, s, h, dim = q.shape
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if out.numel() == 0:
        return out
    per_block = queries_per_block(h)
    rows, bits, count = block_keys(index.expand(b, s, -1), per_block)
    width = max(16, triton.next_power_of_2(dim))
    pv_parts = PV_PARTS if native_dot(kv, kv) and kv.dtype == torch.bfloat16 else 0
    dv = min(width, wide_block_dv(q.device, pv_parts, ROWS))
    _block_attention_kernel[(rows.shape[0], triton.cdiv(dim, dv))](
        q.contiguous(), kv.contiguous(), rows, bits, count, sinks.float().contiguous(), out,
        s, triton.cdiv(s, per_block), rows.shape[1], h, kv.shape[1], dim, scale,
        QK_NATIVE=native_dot(q, kv), QK_PRECISION=dot_precision(q, kv), PV_PARTS=pv_parts,
        QUERIES=per_block, HEADS=ROWS // per_block, BLOCK_L=BLOCK_L,
        BLOCK_DK=min(width, BLOCK_DK), BLOCK_DV=dv, num_warps=NUM_WARPS,
    )  # fmt: skip
    return out
