"""K split across programs (the FP8 linear's decode tiles): fp32 partial sums, added in split
order so every run adds them alike, and rounded once to the output's dtype.

Two ways to add them (:mod:`.fp8_linear` picks by row-tile height): the last of an output tile's
programs to finish adds them itself (:func:`split_reduce`, no second launch, through a counter per
tile in :func:`split_counters`), or a second kernel spreads the additions over many programs
(:func:`split_sum_kernel`).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from torch import Tensor

from deepinfer_kernels_sm100.fp8_quant import round_to_grid

#: output tiles a split launch may have (one counter each)
MAX_SPLIT_TILES = 1 << 16


@functools.cache
def split_counters(device: torch.device) -> Tensor:
    """The split launches' per-tile counters on ``device``, zero between launches.

    One buffer serves every launch: launches on a device run one after another on the
    engine's stream (and in its CUDA graphs, which must not allocate it), and each leaves the
    counters it used at zero.
    """
    return torch.zeros(MAX_SPLIT_TILES, dtype=torch.int32, device=device)


@triton.jit
def split_reduce(  # noqa: PLR0917 (Triton helpers take positional arguments)
    out_ptr, part_ptr, count_ptr, out, acc, row_ok, m, n, splits, EMULATE: tl.constexpr
):
    """Store this program's partial sums; the tile's last program to finish adds all of them
    in split order (the same order whichever finishes last) and stores the result.

    The partials go out before the tile's counter is raised (a block barrier, then a release
    at GPU scope), and the last program acquires the counter before it reads them from L2
    (``.cg``: not from its own L1, which other SMs' stores do not reach). It leaves the
    counter at zero for the next launch.
    """
    mask = row_ok[:, None]
    size = m.to(tl.int64) * n
    tl.store(part_ptr + tl.program_id(2).to(tl.int64) * size + out, acc, mask=mask)
    tl.debug_barrier()
    tile = count_ptr + tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)
    if tl.atomic_add(tile, 1, sem="acq_rel", scope="gpu") == splits - 1:
        total = tl.load(part_ptr + out, mask=mask, other=0.0, cache_modifier=".cg")
        for s in range(1, splits):
            total += tl.load(part_ptr + s * size + out, mask=mask, other=0.0, cache_modifier=".cg")
        store_rounded(out_ptr + out, total, mask, EMULATE)
        tl.atomic_xchg(tile, 0, sem="relaxed", scope="gpu")


@triton.jit
def store_rounded(ptrs, acc, mask, EMULATE: tl.constexpr):
    """Store fp32 values rounded to the nearest value of the pointers' dtype."""
    out_ty: tl.constexpr = ptrs.dtype.element_ty
    if EMULATE and out_ty == tl.bfloat16:
        acc = round_to_grid(acc, 7, -119)
    if EMULATE and out_ty == tl.float16:
        acc = round_to_grid(acc, 10, -14)
    tl.store(ptrs, acc.to(out_ty), mask=mask)


@triton.jit(do_not_specialize=["size"])
def split_sum_kernel(  # noqa: PLR0917 (Triton kernels take positional arguments)
    part_ptr,  # [splits, size] fp32 partial sums
    out_ptr,  # [size]
    size,
    SPLITS: tl.constexpr,
    EMULATE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """out = the partial sums added in split order (so every run adds them alike), rounded
    once to out's dtype."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < size
    acc = tl.load(part_ptr + offs, mask=ok, other=0.0)
    for s in tl.static_range(1, SPLITS):
        acc += tl.load(part_ptr + s * size + offs, mask=ok, other=0.0)
    store_rounded(out_ptr + offs, acc, ok, EMULATE)
