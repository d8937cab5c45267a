"""Shared-KV (MQA) attention with a per-head sink logit, as one kernel.

The reference builds the [B, H, S, L] scores, masks them, appends the sink column, runs a softmax
and a second einsum: a dozen launches a layer and an S x L buffer. Here a program takes a query
row's block of heads through the keys with an online softmax whose running maximum and
denominator start at the sink, so the sink joins the denominator only and a row whose keys are
all masked comes out zero.

The keys a query sees come as a mask over all L keys, as a list of key rows per query (prefill:
the window plus the top-k entries, a few hundred of the whole chunk's keys), or (decode) as each
row's entries in one or two paged pools: its ring and its compressed entries' pages, read where
they are, so a decode step copies no key. The sparse and paged forms load the rows they list and
never touch the others.

A head as wide as V4's (512 columns) does not fit in one program's registers beside a block of
keys. The logits are accumulated over 64-column slices of the head, and a program writes some
of the output columns, recomputing the logits its neighbours also compute, which costs less than
spills and gives the GPU more programs. 16-bit queries and keys meet in tensor-core dots (exact
products, fp32 sums); the fp32 probabilities meet bf16 values as :data:`PV_PARTS` bf16 parts in
tensor-core dots, fp32 values in IEEE fp32 dots.

Many decode rows of few heads go to :mod:`.attention_decode` (the key rows on the dots' long
side). A decode batch of a few rows gives the GPU only a few such programs, each walking every key
(flash-decoding's problem): there the keys are cut into ranges, each program keeps its range's
running maximum, denominator and unnormalised output, and a second kernel merges the ranges in
order, adding the sink once.

The query and key counts change every step, and Triton would compile a variant for each
divisibility class of them (mid-run compiles of a second or more): they are not specialised.

A decode step's output rope channels are rotated back at the query position (``DEROTATE``) by
the program that writes them (or merges the splits): it stores the output, reloads its rope
channels and turns them as the RoPE kernel does: the bits of ``rope(inverse=True)`` after it.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence

import torch
import triton
import triton.language as tl
from torch import Tensor

from deepinfer.paging import KeyPages
from deepinfer_kernels_sm100 import attention_decode
from deepinfer_kernels_sm100.attention_combine import (
    combine_splits,
    derotate,
    pv_accumulate,
    rope_angles,
    split_buffers,
)
from deepinfer_kernels_sm100.attention_paged import KeyPool, key_tile, paged_rows


@triton.jit(
    do_not_specialize=[
        "seq",
        "keys",
        "kv_rows",
        "split_keys",
        "splits",
        "keys_a",
        "n_pages",
        "n_pages2",
    ]
)
def _mqa_sink_kernel(  # noqa: PLR0917 (Triton kernels take positional arguments)
    q_ptr,
    kv_ptr,  # [B, L, D]; paged: pool a, [rows, D]
    select_ptr,  # [B*S, keys]: visibility bytes (dense), key rows (sparse), -1 = none
    sink_ptr,
    out_ptr,
    part_ptr,  # [B*S, splits, heads, dim] fp32: each split's unnormalised output (SPLIT)
    stat_ptr,  # [B*S, splits, 2, heads] fp32: each split's running max and denominator (SPLIT)
    seq,
    heads,
    keys,  # keys per query: L (dense) or K (sparse)
    kv_rows,  # L, the rows of kv per batch row
    dim,
    scale,
    split_keys,  # keys per split, a multiple of BLOCK_L
    splits,
    kv2_ptr,  # paged: pool b [rows, D]
    select2_ptr,  # paged: [B, keys - keys_a] entries of pool b (select_ptr: of pool a)
    pages_ptr,  # paged: [B, n_pages] pool a's page of each block of per_page entries
    pages2_ptr,  # paged: [B, n_pages2] pool b's
    keys_a,
    n_pages,
    n_pages2,
    per_page,
    per_page2,
    cos_ptr,  # [B*S, half] fp32: the query rows' angles (DEROTATE)
    sin_ptr,
    rot_start,  # the first rope channel (DEROTATE)
    half,
    MODE: tl.constexpr,  # 0 dense, 1 sparse, 2 paged
    POOLS: tl.constexpr,  # key sources (key_tile): 0 one, 1 two pools of one dtype, 2 of two
    SPLIT: tl.constexpr,  # splits > 1: write partial results for combine_splits
    DEROTATE: tl.constexpr,  # rotate the output's rope channels back (unsplit: here)
    QK_NATIVE: tl.constexpr,  # queries and keys of one 16-bit type: dot them as they are
    QK_PRECISION: tl.constexpr,
    PV_PARTS: tl.constexpr,  # bf16 values: the probabilities as that many bf16 parts (0: fp32)
    BLOCK_H: tl.constexpr,
    BLOCK_L: tl.constexpr,
    BLOCK_DK: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    row = tl.program_id(0)  # b * seq + s
    b = row // seq
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    split = tl.program_id(2) % splits
    dv_block = tl.program_id(2) // splits
    dv = dv_block * BLOCK_DV + tl.arange(0, BLOCK_DV)  # this program's output columns
    hmask = h < heads
    dvmask = dv < dim
    q_rows = q_ptr + row * heads * dim + h[:, None] * dim
    kv_base = kv_ptr + b * kv_rows * dim
    top = tl.load(sink_ptr + h, mask=hmask, other=0.0).to(tl.float32)
    # The sink joins the denominator once: here, or where the splits are combined.
    denom = tl.full((BLOCK_H,), 0.0 if SPLIT else 1.0, dtype=tl.float32)
    acc = tl.zeros((BLOCK_H, BLOCK_DV), dtype=tl.float32)
    first = split * split_keys
    for l0 in range(first, first + split_keys, BLOCK_L):
        lk = l0 + tl.arange(0, BLOCK_L)
        lmask = lk < keys
        in_a = lmask
        if MODE == 2:
            key_row, visible, in_a = paged_rows(
                select_ptr, select2_ptr, pages_ptr, pages2_ptr, b, lk, lmask, keys_a,
                keys - keys_a, n_pages, n_pages2, per_page, per_page2,
            )  # fmt: skip
        elif MODE == 1:
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
            q = tl.load(q_rows + dk[None, :], mask=hmask[:, None] & dkmask[None, :], other=0.0)
            k = key_tile(kv_base, kv2_ptr, key_row, dk, load_row, dkmask, in_a, dim, POOLS)
            if QK_NATIVE:
                logits += tl.dot(q, tl.trans(k))
            else:
                logits += tl.dot(
                    q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision=QK_PRECISION
                )
        logits = tl.where(visible[None, :], logits * scale, float("-inf"))
        new_top = tl.maximum(top, tl.max(logits, axis=1))
        p = tl.exp(logits - new_top[:, None])
        keep = tl.exp(top - new_top)
        denom = denom * keep + tl.sum(p, axis=1)
        v = key_tile(kv_base, kv2_ptr, key_row, dv, load_row, dvmask, in_a, dim, POOLS)
        acc = pv_accumulate(acc, p, v, keep, PV_PARTS)
        top = new_top
    if SPLIT:
        part = row * splits + split
        tl.store(
            part_ptr + (part * heads + h[:, None]) * dim + dv[None, :],
            acc,
            mask=hmask[:, None] & dvmask[None, :],
        )
        if dv_block == 0:
            tl.store(stat_ptr + part * 2 * heads + h, top, mask=hmask)
            tl.store(stat_ptr + (part * 2 + 1) * heads + h, denom, mask=hmask)
    else:
        tl.store(
            out_ptr + row * heads * dim + h[:, None] * dim + dv[None, :],
            (acc / denom[:, None]).to(out_ptr.dtype.element_ty),
            mask=hmask[:, None] & dvmask[None, :],
        )
        if DEROTATE and dv_block * BLOCK_DV + BLOCK_DV > rot_start:
            derotate(out_ptr, cos_ptr, sin_ptr, row, h, hmask, dv, heads, dim, rot_start, half)


#: Launch shapes: up to BLOCK_H heads per program (all of a 64-head MQA layer, so each key is
#: read once per query row; tl.dot needs 16 rows, so fewer heads are masked), keys per block,
#: head-dim slice for the logits and output columns per program (a 512-wide head is split over
#: programs, which each recompute the logits: cheaper than spilling registers); warps for a
#: full 64-head block (smaller blocks take 4). Timed in CUDA graphs (benchmarks/README.md).
BLOCK_H, BLOCK_L, BLOCK_DK, BLOCK_DV, NUM_WARPS = 64, 64, 64, 128, 8
#: Output columns per program when the launch has at least WIDE_ROWS (query row, head block)
#: pairs: each program recomputes half as many logits, and there are programs enough (faster
#: from 32 rows of 64 heads on, slower at 1 or 8: ``benchmarks/README.md``).
WIDE_BLOCK_DV, WIDE_ROWS = 256, 32
#: Accumulator cells (heads x columns) of a wide program of fewer than BLOCK_H heads: 16 heads
#: (config A) take all 512 columns, so no second program re-reads their keys and logits, where
#: that leaves TARGET_PROGRAMS programs (``benchmarks/prefill_attention.py``). 64 heads: 256.
WIDE_CELLS = 16 * 512
#: Warps of a program of fewer than BLOCK_H heads: sparse or dense, and paged (decode rows).
SMALL_WARPS, PAGED_WARPS = 4, 8
#: Programs a launch should give the GPU before its keys are split (flash-decoding): a decode
#: batch of a few rows has a handful of (row, head block, column block) programs, each walking
#: all keys. Splitting past this lost more to the merge than it gained (``benchmarks/README``).
TARGET_PROGRAMS = 128
#: Queries and keys of one 16-bit type meet in their own tensor-core dots (exact products, fp32
#: sums) rather than upcast; Triton's CPU interpreter gets 16-bit dots wrong, so there not.
QK_NATIVE = os.environ.get("TRITON_INTERPRET") != "1"
#: bf16 values meet the fp32 probabilities in tensor-core dots of the probabilities cut into
#: this many bf16 parts, each product exact and summed in fp32. Three carry all 24 bits of an
#: fp32 probability (an IEEE fp32 dot's products); two carry 16, so a product is off by at most
#: 2^-17 of itself, below what the fp32 sums over a row's keys already round away. Two measured
#: the same error against float64 as three at config A's shapes, in less time
#: (``results/attention_pv_parts_h100.json``); one part (a bf16 probability) more error.
PV_PARTS = 2
#: Blackwell (compute capability 10) holds tensor-core accumulators in tensor memory, 512
#: columns an SM. Triton gives the PV_PARTS bf16 dots into a 64 x 256 fp32 accumulator 544 of
#: them and refuses the launch, so there wide programs keep BLOCK_DV columns (found by
#: compiling for sm_100a on the CPU, ``tests/test_aot_compile.py``; not yet timed there).
TENSOR_MEMORY_MAJOR = 10


@functools.cache
def _capability_major(index: int) -> int:
    return torch.cuda.get_device_capability(index)[0]


def wide_block_dv(device: torch.device, pv_parts: int, block_h: int = BLOCK_H) -> int:
    """Output columns of a wide program of ``block_h`` heads on ``device`` (:data:`WIDE_CELLS`,
    :data:`TENSOR_MEMORY_MAJOR`); fp32 values (``pv_parts`` 0) keep WIDE_BLOCK_DV."""
    if pv_parts and device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        if _capability_major(index) >= TENSOR_MEMORY_MAJOR:
            return BLOCK_DV
    return max(WIDE_BLOCK_DV, WIDE_CELLS // block_h) if pv_parts else WIDE_BLOCK_DV


def native_dot(a: Tensor, b: Tensor) -> bool:
    """Whether ``a`` and ``b`` meet in a tensor-core dot as they are (one 16-bit type)."""
    return QK_NATIVE and a.dtype == b.dtype and a.dtype in (torch.bfloat16, torch.float16)


def dot_precision(*operands: Tensor) -> str:
    """``tl.dot``'s input precision for products of ``operands`` (upcast to fp32 in the kernel):
    TF32 when all are 16-bit floats, whose 8 (bf16) or 11 (fp16) significant bits fit TF32's 11,
    so its tensor cores form the products exactly; IEEE fp32 otherwise."""
    sixteen = (torch.bfloat16, torch.float16)
    return "tf32" if all(t.dtype in sixteen for t in operands) else "ieee"


def num_splits(programs: int, keys: int, target: int | None = None) -> int:
    """How many key ranges each (row, head block, column block) is cut into: enough to give the
    GPU ``TARGET_PROGRAMS`` programs, never a range shorter than one key block."""
    target = TARGET_PROGRAMS if target is None else target
    if programs >= target or keys <= BLOCK_L:
        return 1
    return min(triton.cdiv(target, programs), triton.cdiv(keys, BLOCK_L))


def _launch(
    q: Tensor,
    kv: Tensor,
    select: Tensor,
    sinks: Tensor,
    scale: float,
    *,
    splits: int | None,
    pools: tuple[KeyPool, KeyPool] | None = None,
    angles: tuple[Tensor, Tensor] | None = None,
) -> Tensor:
    """The kernel over ``kv`` [B, L, D] and ``select`` (mask bytes: dense, key rows: sparse),
    or over two paged ``pools`` (``kv`` and ``select`` are then the first's rows and entries);
    ``angles`` (cos, sin [B, S, r/2]): the output's trailing r channels rotated back."""
    b, s, h, dim = q.shape
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if b * s * h == 0:
        return out
    width = max(16, triton.next_power_of_2(dim))
    keys = select.shape[-1]
    mode, kv_rows, sources = int(select.dtype != torch.uint8), kv.shape[1], 0
    paged: tuple[object, ...] = (kv, select, select, select, 0, 0, 0, 1, 1)  # unused
    if pools is not None:
        one, two = pools
        keys += two.entries.shape[-1]
        mode, kv_rows, sources = 2, 0, 1 if one.rows.dtype == two.rows.dtype else 2
        paged = (two.rows, two.entries, one.pages, two.pages, one.entries.shape[-1])
        paged += (one.pages.shape[1], two.pages.shape[1], one.per_page, two.per_page)
    block_h = min(BLOCK_H, max(16, triton.next_power_of_2(h)))
    pv_parts = PV_PARTS if native_dot(kv, kv) and kv.dtype == torch.bfloat16 else 0
    rows = b * s * triton.cdiv(h, block_h)  # (query row, head block) pairs
    paged_wide = pools is not None and dim > BLOCK_DV
    wide_dv = wide_block_dv(kv.device, pv_parts, block_h) if rows >= WIDE_ROWS else BLOCK_DV
    if rows * triton.cdiv(dim, wide_dv) < TARGET_PROGRAMS:  # too few programs to keep whole
        wide_dv = min(wide_dv, WIDE_BLOCK_DV)
    block_dk, block_dv = min(width, BLOCK_DK), min(width, wide_dv)
    blocks = (b * s, triton.cdiv(h, block_h), triton.cdiv(dim, block_dv))
    cos, sin, rot_start, half = rope_angles(angles, b, s, dim, sinks)
    if splits is None:
        splits = num_splits(blocks[0] * blocks[1] * blocks[2], keys)
    split_keys, splits, part, stat = split_buffers(out, b * s, keys, splits, BLOCK_L)
    sinks = sinks.float().contiguous()
    # The probabilities are fp32 and keep IEEE dots (TF32 moved bf16 outputs by two ulps).
    _mqa_sink_kernel[(blocks[0], blocks[1], blocks[2] * splits)](
        q.contiguous(),
        kv.contiguous(),
        select,
        sinks,
        out,
        part,
        stat,
        s,
        h,
        keys,
        kv_rows,
        dim,
        scale,
        split_keys,
        splits,
        *paged,
        cos,
        sin,
        rot_start,
        half,
        MODE=mode,
        POOLS=sources,
        SPLIT=splits > 1,
        DEROTATE=angles is not None,
        QK_NATIVE=native_dot(q, kv),
        QK_PRECISION=dot_precision(q, kv),
        PV_PARTS=pv_parts,
        BLOCK_H=block_h,
        BLOCK_L=BLOCK_L,
        BLOCK_DK=block_dk,
        BLOCK_DV=block_dv,
        num_warps=NUM_WARPS if block_h == BLOCK_H else PAGED_WARPS if paged_wide else SMALL_WARPS,
    )
    if splits > 1:
        derotation = (cos, sin, rot_start, half)
        combine_splits(
            part, stat, sinks, out, blocks, derotation, derotate=angles is not None,
            block_h=block_h, block_dv=block_dv,
        )  # fmt: skip
    return out


def mqa_sink_attention(
    q: Tensor, kv: Tensor, mask: Tensor, sinks: Tensor, scale: float, *, splits: int | None = None
) -> Tensor:
    """Attention output [B, S, H, D] for ``q`` [B, S, H, D], ``kv`` [B, L, D] (keys and values),
    ``mask`` [B, S, L] bool (True = visible) and ``sinks`` [H]. ``splits``: key ranges per
    query row, merged afterwards (default: :func:`num_splits`)."""
    b, s = q.shape[:2]
    select = mask.expand(b, s, kv.shape[1]).contiguous().view(torch.uint8)
    return _launch(q, kv, select, sinks, scale, splits=splits)


def sparse_mqa_sink_attention(
    q: Tensor, kv: Tensor, index: Tensor, sinks: Tensor, scale: float, *, splits: int | None = None
) -> Tensor:
    """As :func:`mqa_sink_attention`, each query seeing the rows of ``kv`` that ``index``
    [B, S, K] (int, -1 = none, distinct per query) lists."""
    b, s = q.shape[:2]
    select = index.expand(b, s, -1).to(torch.int64).contiguous()
    return _launch(q, kv, select, sinks, scale, splits=splits)


def paged_mqa_sink_attention(
    q: Tensor,
    sources: Sequence[KeyPages],
    sinks: Tensor,
    scale: float,
    derotate: tuple[Tensor, Tensor] | None = None,
    *,
    splits: int | None = None,
) -> Tensor:
    """As :func:`mqa_sink_attention` for decode rows (``q`` [B, 1, H, D]) over one or two
    paged key sources read in place (:class:`deepinfer.paging.KeyPages`): the keys are the
    sources' listed entries in order, as if copied into one key tensor of the first's dtype.
    ``derotate`` (cos, sin [B, 1, r/2]): the output's trailing r channels rotated back there
    (``Backend.paged_attention``)."""
    if q.shape[1] != 1 or not 1 <= len(sources) <= 2:
        raise ValueError("paged attention takes one query a row and one or two key sources")
    one = KeyPool.of(sources[0])
    two = KeyPool.of(sources[1]) if len(sources) == 2 else one._replace(entries=one.entries[:, :0])
    if attention_decode.fits(q, one, two):  # many rows of few heads: a program a row
        args = (sinks, scale, derotate, splits, QK_NATIVE, PV_PARTS if QK_NATIVE else 0)
        return attention_decode.decode_attention(q, one, two, *args)
    return _launch(
        q, one.rows, one.entries, sinks, scale, splits=splits, pools=(one, two), angles=derotate
    )
