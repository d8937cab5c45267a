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

A head as wide as V4's (512 columns) does not fit in one program's registers beside a block of
keys (the first version of this kernel spilled: 2 ms per layer for 8 decode rows). The logits
are accumulated over 64-column slices of the head, and each program writes 128 of the output
columns, recomputing the logits its neighbours also compute, which costs less than the spills
and gives the GPU four times the programs. 16-bit queries and keys meet in TF32 tensor-core
dots (exact products, fp32 sums).

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
    QK_PRECISION: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_L: tl.constexpr,
    BLOCK_DK: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    row = tl.program_id(0)  # b * seq + s
    b = row // seq
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    dv = tl.program_id(2) * BLOCK_DV + tl.arange(0, BLOCK_DV)  # this program's output columns
    hmask = h < heads
    dvmask = dv < dim
    q_rows = q_ptr + row * heads * dim + h[:, None] * dim
    kv_base = kv_ptr + b * kv_rows * dim
    top = tl.load(sink_ptr + h, mask=hmask, other=0.0).to(tl.float32)
    denom = tl.full((BLOCK_H,), 1.0, dtype=tl.float32)
    acc = tl.zeros((BLOCK_H, BLOCK_DV), dtype=tl.float32)
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
        load_row = lmask & visible
        # logits over the whole head dim, a slice of it at a time (a 512-wide kv row does not
        # fit in registers next to everything else)
        logits = tl.zeros((BLOCK_H, BLOCK_L), dtype=tl.float32)
        for d0 in range(0, dim, BLOCK_DK):
            dk = d0 + tl.arange(0, BLOCK_DK)
            dkmask = dk < dim
            q = tl.load(q_rows + dk[None, :], mask=hmask[:, None] & dkmask[None, :], other=0.0).to(
                tl.float32
            )
            k = tl.load(
                kv_base + key_row[:, None] * dim + dk[None, :],
                mask=load_row[:, None] & dkmask[None, :],
                other=0.0,
            ).to(tl.float32)
            logits += tl.dot(q, tl.trans(k), input_precision=QK_PRECISION)
        logits = tl.where(visible[None, :], logits * scale, float("-inf"))
        new_top = tl.maximum(top, tl.max(logits, axis=1))
        p = tl.exp(logits - new_top[:, None])
        keep = tl.exp(top - new_top)
        denom = denom * keep + tl.sum(p, axis=1)
        v = tl.load(
            kv_base + key_row[:, None] * dim + dv[None, :],
            mask=load_row[:, None] & dvmask[None, :],
            other=0.0,
        ).to(tl.float32)
        acc = acc * keep[:, None] + tl.dot(p, v, input_precision="ieee")
        top = new_top
    out = acc / denom[:, None]
    tl.store(
        out_ptr + row * heads * dim + h[:, None] * dim + dv[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=hmask[:, None] & dvmask[None, :],
    )


#: Launch shapes: heads per program (tl.dot needs 16 rows; fewer heads are masked), keys per
#: block, head-dim slice for the logits and output columns per program (a 512-wide head is
#: split over programs, which each recompute the logits: cheaper than spilling registers).
BLOCK_H, BLOCK_L, BLOCK_DK, BLOCK_DV, NUM_WARPS = 16, 64, 64, 128, 4


def dot_precision(*operands: Tensor) -> str:
    """``tl.dot``'s input precision for products of ``operands`` (upcast to fp32 in the kernel):
    TF32 when all are 16-bit floats, whose 8 (bf16) or 11 (fp16) significant bits fit TF32's 11,
    so its tensor cores form the products exactly; IEEE fp32 otherwise."""
    sixteen = (torch.bfloat16, torch.float16)
    return "tf32" if all(t.dtype in sixteen for t in operands) else "ieee"


def _launch(q: Tensor, kv: Tensor, select: Tensor, sinks: Tensor, scale: float) -> Tensor:
    b, s, h, dim = q.shape
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if b * s * h == 0:
        return out
    width = max(16, triton.next_power_of_2(dim))
    block_dk, block_dv = min(width, BLOCK_DK), min(width, BLOCK_DV)
    # The probabilities are fp32 and keep IEEE dots (TF32 there was up to a fifth faster on
    # an H200 but moved bf16 outputs by two ulps against fp32 dots).
    grid = (b * s, triton.cdiv(h, BLOCK_H), triton.cdiv(dim, block_dv))
    _mqa_sink_kernel[grid](
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
        QK_PRECISION=dot_precision(q, kv),
        BLOCK_H=BLOCK_H,
        BLOCK_L=BLOCK_L,
        BLOCK_DK=block_dk,
        BLOCK_DV=block_dv,
        num_warps=NUM_WARPS,
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
