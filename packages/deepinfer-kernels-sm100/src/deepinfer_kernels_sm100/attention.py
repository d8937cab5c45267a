"""Shared-KV (MQA) attention with a per-head sink logit, as one kernel.

The reference builds the [B, H, S, L] score tensor, masks it, appends the sink column, runs a
softmax and a second einsum: a dozen launches per layer call and an S x L buffer. Here one program
takes a query row's block of heads through the keys block by block with an online softmax whose
running maximum and denominator start at the sink (``exp(sink - sink) = 1``), so the sink joins
the denominator only, as in the reference, and a row whose keys are all masked comes out zero.

The keys a query sees come either as a mask over all L keys (decode: the ring and the picked
entries, all of which matter) or as a list of key rows per query (prefill: the window plus the
top-k entries, a few hundred of the whole chunk's keys): the sparse form gathers those rows and
never touches the others.

The query and key counts change every step, and Triton would compile a variant for each
divisibility class of them (mid-run compiles of a second or more): they are not specialised.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor


@triton.jit(do_not_specialize=["seq", "keys", "kv_rows"])
def _mqa_sink_kernel(  # noqa: PLR0917 (Triton kernels take positional arguments)
    q_ptr,
    kv_ptr,
    select_ptr,  # [B*S, keys]: visibility bytes (dense) or key rows, -1 = none (sparse)
    sink_ptr,
    out_ptr,
    seq,
    heads,
    keys,  # keys per query: L (dense) or K (sparse)
    kv_rows,  # L, the rows of kv per batch row
    dim,
    scale,
    SPARSE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_L: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    row = tl.program_id(0)  # b * seq + s
    b = row // seq
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    hmask = h < heads
    dmask = d < dim
    q = tl.load(
        q_ptr + row * heads * dim + h[:, None] * dim + d[None, :],
        mask=hmask[:, None] & dmask[None, :],
        other=0.0,
    ).to(tl.float32)
    top = tl.load(sink_ptr + h, mask=hmask, other=0.0).to(tl.float32)
    denom = tl.full((BLOCK_H,), 1.0, dtype=tl.float32)
    acc = tl.zeros((BLOCK_H, BLOCK_D), dtype=tl.float32)
    for l0 in range(0, keys, BLOCK_L):
        lk = l0 + tl.arange(0, BLOCK_L)
        lmask = lk < keys
        if SPARSE:
            key_row = tl.load(select_ptr + row * keys + lk, mask=lmask, other=-1)
            visible = key_row >= 0
            key_row = tl.maximum(key_row, 0)
        else:
            key_row = lk
            visible = tl.load(select_ptr + row * keys + lk, mask=lmask, other=0) != 0
        kv = tl.load(
            kv_ptr + b * kv_rows * dim + key_row[:, None] * dim + d[None, :],
            mask=(lmask & visible)[:, None] & dmask[None, :],
            other=0.0,
        ).to(tl.float32)
        logits = tl.dot(q, tl.trans(kv), input_precision="ieee") * scale
        logits = tl.where(visible[None, :], logits, float("-inf"))
        new_top = tl.maximum(top, tl.max(logits, axis=1))
        p = tl.exp(logits - new_top[:, None])
        keep = tl.exp(top - new_top)
        denom = denom * keep + tl.sum(p, axis=1)
        acc = acc * keep[:, None] + tl.dot(p, kv, input_precision="ieee")
        top = new_top
    out = acc / denom[:, None]
    tl.store(
        out_ptr + row * heads * dim + h[:, None] * dim + d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=hmask[:, None] & dmask[None, :],
    )


def _launch(q: Tensor, kv: Tensor, select: Tensor, sinks: Tensor, scale: float) -> Tensor:
    b, s, h, dim = q.shape
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if b * s * h == 0:
        return out
    block_h = 16  # tl.dot needs 16 rows; fewer heads are masked
    _mqa_sink_kernel[(b * s, triton.cdiv(h, block_h))](
        q.contiguous(),
        kv.contiguous(),
        select,
        sinks.float().contiguous(),
        out,
        s,
        h,
        select.shape[-1],
        kv.shape[1],
        dim,
        scale,
        SPARSE=select.dtype != torch.uint8,
        BLOCK_H=block_h,
        BLOCK_L=32,
        BLOCK_D=max(16, triton.next_power_of_2(dim)),
    )
    return out


def mqa_sink_attention(q: Tensor, kv: Tensor, mask: Tensor, sinks: Tensor, scale: float) -> Tensor:
    """Attention output [B, S, H, D] for ``q`` [B, S, H, D], ``kv`` [B, L, D] (keys and values),
    ``mask`` [B, S, L] bool (True = visible) and ``sinks`` [H]."""
    b, s = q.shape[:2]
    return _launch(
        q, kv, mask.expand(b, s, kv.shape[1]).contiguous().view(torch.uint8), sinks, scale
    )


def sparse_mqa_sink_attention(
    q: Tensor, kv: Tensor, index: Tensor, sinks: Tensor, scale: float
) -> Tensor:
    """As :func:`mqa_sink_attention`, each query seeing the rows of ``kv`` that ``index``
    [B, S, K] (int, -1 = none, distinct per query) lists."""
    b, s = q.shape[:2]
    return _launch(q, kv, index.expand(b, s, -1).to(torch.int64).contiguous(), sinks, scale)
