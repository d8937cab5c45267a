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


try:  # Gluon ships with Triton 3.5 and later
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl

    HAVE_GLUON = True
except ImportError:  # pragma: no cover - older Triton: the Triton kernels serve
    HAVE_GLUON = False

if HAVE_GLUON:
    #: a block-wide barrier (named ``barrier`` from Triton 3.7, ``thread_barrier`` before)
    _cta_barrier = gl.barrier if hasattr(gl, "barrier") else gl.thread_barrier

    @gluon.jit
    def split_reduce_gluon(out_ptr, part_ptr, count_ptr, row, t, m, n, SPLITS: gl.constexpr):  # noqa: PLR0917
        """:func:`split_reduce` for :mod:`.fp8_gluon`'s layout (its lanes hold rows ``row``
        and + 8 of tokens 2t and 2t + 1): after every program stored its partial sums, the
        tile's last program to finish adds them in split order and stores them (stores before
        a block barrier and a release at GPU scope; the sums read from L2)."""
        _cta_barrier()
        tile = count_ptr + gl.program_id(0)
        if gl.atomic_add(tile, 1, sem="acq_rel", scope="gpu") == SPLITS - 1:
            size = m.to(gl.int64) * n
            for m0 in range(0, m, 8):
                for c in gl.static_range(4):
                    tok = m0 + 2 * t + c % 2
                    off = tok.to(gl.int64) * n + row + 8 * (c // 2)
                    total = gl.load(part_ptr + off, mask=tok < m, other=0.0, cache_modifier=".cg")
                    for s in gl.static_range(1, SPLITS):
                        more = gl.load(part_ptr + s * size + off, mask=tok < m, other=0.0,
                                       cache_modifier=".cg")  # fmt: skip
                        total = total + more
                    gl.store(out_ptr + off, total.to(out_ptr.dtype.element_ty), mask=tok < m)
            gl.atomic_xchg(tile, 0, sem="relaxed", scope="gpu")
