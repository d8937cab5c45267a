"""The FP4 down projection of a call with a slot per pair, each token's pairs added, in one kernel.

The routed experts' output is each token's k pair rows added up (the router weights are
already in the hidden activation h). With a slot a pair (:func:`.fp4_gluon.by_pair`), the
down kernel of :mod:`.fp4_gluon` writes every pair's row and :func:`.moe.slot_sum` adds them in
a third launch. Here a program takes 16 ``warps_n`` output features of one token over all of
its pairs:

* Each warp's K loop walks the pairs one after another (:func:`.fp4_gluon_loop._at`: step i is
  K step i % PER of pair i // PER, at that pair's expert's rows), so the accumulator adds the
  pairs as it goes and the weight stream runs on from one expert into the next.
* Every column of the MMA's token tile reads the same pair's activations at each step, so
  each column holds the sum; lanes of column 0 add the residual and store, rounding once (as
  :func:`.moe.slot_sum` does).
* A pair without an expert (index < 0) reads expert 0's weights against the zero row the
  gate/up kernel leaves it, so it adds nothing (its L2 prefetch is skipped). Such pairs are
  rare here: expert parallelism masks other ranks' experts in calls of single-slot rows, more
  than :data:`.fp4_gluon.BY_PAIR_TOKENS` of them, which take grouped slots.

The sum runs in fp32 in the MMA's accumulators, K step by K step, where :func:`.moe.slot_sum`
adds whole pair rows: the same terms in another order, within the float64 bound of the tests.
Launched as a programmatic dependent of gate/up, its programs ask L2 for their weights before
they wait for h (:mod:`.gluon_common`).
"""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor

try:  # Gluon ships with Triton 3.5 and later
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl

    HAVE_GLUON = True
except ImportError:  # pragma: no cover - older Triton: the Triton kernels serve
    HAVE_GLUON = False

#: K elements a warp takes per step, and output features a warp (as :mod:`.fp4_gluon`'s)
STEP_K, WARP_ROWS = 128, 16
#: Warps the weight stream should have an SM: K is split across a program's warps until the
#: grid's reach this many (or each warp's K is one step a pair)
WARPS_PER_SM = 8


class SumTiles(NamedTuple):
    """A launch shape: ``warps_n`` warps side by side over a program's output features (16
    each) times ``split_k`` warps splitting each pair's K; ``stages`` K steps of weights in
    registers."""

    warps_n: int = 1
    split_k: int = 4
    stages: int = 4


#: A launch shape forced, for sweeps; else :func:`pick_tiles`.
OVERRIDE: SumTiles | None = None


def pick_tiles(inter: int, d_out: int, topk: int, tokens: int, sms: int) -> SumTiles:
    """The launch shape over ``tokens`` tokens of ``topk`` pairs: one warp of output features
    a program, each pair's K halved across more warps while the grid's warps number fewer than
    :data:`WARPS_PER_SM` an SM (up to 8 and while each warp keeps a step a pair); four K steps
    in registers where a warp's steps (over all pairs) divide by four."""
    steps, rows = inter // STEP_K, tokens * d_out // WARP_ROWS
    split = 1
    while split < 8 and rows * split < WARPS_PER_SM * sms and steps % (2 * split) == 0:
        split *= 2
    walk = topk * steps // split
    return SumTiles(1, split, 4 if walk % 4 == 0 else 2 if walk % 2 == 0 else 1)


def checked(tiles: SumTiles, inter: int, d_out: int, topk: int) -> SumTiles:
    """``tiles``, or ValueError where they do not divide the rows or the K steps."""
    steps = inter // STEP_K
    if d_out % (WARP_ROWS * tiles.warps_n) or steps % tiles.split_k:
        raise ValueError(f"{tiles} does not divide {d_out} rows and {steps} K steps")
    if topk * steps // tiles.split_k % tiles.stages:
        raise ValueError(f"{tiles}: {tiles.stages} stages do not divide a warp's steps")
    return tiles


if HAVE_GLUON:
    from deepinfer_kernels_sm100.fp4_gluon_loop import _k_loop, _lane_ids, _row_ptrs, _zeros
    from deepinfer_kernels_sm100.gluon_common import grid_dependency, prefetch_rows

    @gluon.jit
    def _fp4_down_sum_gluon(  # noqa: PLR0917 (Gluon kernels take positional arguments)
        h_ptr,  # [N k, I] bf16 (each 8 columns in _PAIRS' order where PAIRED), a row a pair
        w_ptr,  # [E, D, I / 2] packed e2m1
        ws_ptr,  # [E, D, I / 32] ue8m0 bytes, each at most 128
        idx_ptr,  # [N, k] each pair's expert (< 0: none; its h row zero)
        res_ptr,  # [N, D] residual, widened (None: none)
        out_ptr,  # [N, D] out
        d_out,
        inter,
        TOPK: gl.constexpr,
        PER: gl.constexpr,  # K steps a warp takes of each pair
        PAIRED: gl.constexpr,
        WARPS_N: gl.constexpr,
        SPLIT_K: gl.constexpr,
        STAGES: gl.constexpr,
        PDL: gl.constexpr = False,
    ):
        """out = residual + the sum over the token's pairs of h @ w2.T, for token
        ``program_id(0)`` and 16 WARPS_N output features (``program_id(1)``)."""
        token = gl.program_id(0).to(gl.int64)
        feat, _, t, k_first, _ = _lane_ids(inter, WARPS_N, SPLIT_K)
        wp, sp = _row_ptrs(w_ptr, ws_ptr, feat.to(gl.int64), t, k_first, inter)
        experts = idx_ptr + token * TOPK
        w_stride, s_stride = d_out * (inter // 2), d_out * (inter // 32)
        if PDL:
            for p in gl.static_range(TOPK):
                e = gl.load(experts + p)
                if e >= 0:  # a pair without an expert reads nothing worth warming
                    at = e.to(gl.int64) * w_stride - 16 * t
                    prefetch_rows((wp[0] + at[None, :], wp[1] + at[None, :]), t, 64 * PER)
            grid_dependency(t, True)
        xp = (h_ptr + (token * TOPK * inter + 32 * t)[None, :] + k_first,)
        route = (experts, w_stride, s_stride, inter)
        acc = _k_loop(_zeros(4, WARPS_N, SPLIT_K), wp, sp, xp, TOPK * PER, 1, 1, STAGES, PAIRED,
                      route, PER)  # fmt: skip
        for c in gl.static_range(0, 4, 2):  # rows g, g + 8 of column 2t (each column the sum)
            off = token * d_out + feat + 8 * (c // 2)
            total = gl.sum(acc[c], axis=0)
            if res_ptr is not None:
                total = total + gl.load(res_ptr + off, mask=t == 0, other=0.0).to(gl.float32)
            gl.store(out_ptr + off, total.to(out_ptr.dtype.element_ty), mask=t == 0)


def launch(  # noqa: PLR0917
    h: Tensor,
    w2: Tensor,
    w2_s: Tensor,
    indices: Tensor,
    residual: Tensor | None,
    out: Tensor,
    *,
    paired: bool,
    pdl: bool,
    sms: int,
) -> None:
    """out [N, D] = ``residual`` + each token's pairs' down projections of ``h`` [N k, I]
    (:mod:`.fp4_gluon`'s gate/up output, a zero row for each pair without an expert) with the
    packed ``w2`` [E, D, I / 2] and its scales, added; ``indices`` [N, k] contiguous."""
    (tokens, topk), d_out, inter = indices.shape, w2.shape[1], h.shape[1]
    tiles = checked(OVERRIDE or pick_tiles(inter, d_out, topk, tokens, sms), inter, d_out, topk)
    res = None if residual is None else residual.contiguous()
    _fp4_down_sum_gluon[(tokens, d_out // (WARP_ROWS * tiles.warps_n))](
        h, w2, w2_s, indices, res, out, d_out, inter, TOPK=topk,
        PER=inter // (STEP_K * tiles.split_k), PAIRED=paired, WARPS_N=tiles.warps_n,
        SPLIT_K=tiles.split_k, STAGES=tiles.stages, PDL=pdl,
        num_warps=tiles.warps_n * tiles.split_k, launch_pdl=pdl,
    )  # fmt: skip
