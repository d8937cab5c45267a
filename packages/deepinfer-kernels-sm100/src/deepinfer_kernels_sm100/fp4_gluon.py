"""The FP4 routed experts' decode-size kernels on Hopper, in Gluon, every register placed by hand.

At decode sizes each decoded weight meets a few tokens, so the instructions a weight costs and
the bytes each warp keeps in flight set the speed. :mod:`.fp4_moe`'s Triton kernels load the
packed bytes in a blocked layout, decode them to bf16, then let Triton move every register into
the tensor-core operand's layout (byte permutes and moves around each dot). Here each thread
holds one element of every tensor (:func:`.gluon_common.lanes`), so a tensor is one register
of a known lane, and the kernels are per-thread code around inline ``mma.sync.m16n8k16``:

* The weights are the A operand (16 output features a warp), the tokens the B operand (8 a
  tile). A K step is 128 elements: lane (g, t) loads bytes [16t, 16t + 16) of the step in rows
  g and g + 8, one 128-bit load each: one ue8m0 group, one scale byte a row.
* Each warp decodes its weights in registers into the MMA's operands, K step by K step, some
  steps of loads in flight (:mod:`.fp4_gluon_loop`); warps may split K (``split_k``), their
  sums added at the end.
* A program's slot is an expert and its pairs, sorted by :func:`.moe_group.group_pairs`; a
  call of one or two tokens skips the grouping and takes a slot per pair (a token's top-k
  experts are distinct), and its down kernel (:mod:`.fp4_gluon_sum`) adds each token's pairs
  and the residual, so no third launch does. One token tile a pass reads a slot's weights
  once for each 8 of its pairs, so a slot of 9 to 16 pairs takes them in one pass of two
  tiles instead (:data:`WIDE_STAGES`).

Gluon kernels do not run in Triton's interpreter: CI compiles these for sm_90a
(``test_aot_compile.py``); the interpreter tests and every other case (fp32 activations,
prefill tiles, scales past 128, other GPUs) run the Triton kernels.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor

from deepinfer_kernels_sm100 import fp4_gluon_sum
from deepinfer_kernels_sm100.devices import sm_count
from deepinfer_kernels_sm100.gluon_support import on_hopper
from deepinfer_kernels_sm100.moe_group import PairGroups

try:  # Gluon ships with Triton 3.5 and later
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl

    HAVE_GLUON = True
except ImportError:  # pragma: no cover - older Triton: the Triton kernels serve
    HAVE_GLUON = False

#: K elements a warp takes per step (one scale group a lane), and output features a warp
STEP_K, WARP_ROWS = 128, 16
#: The hidden activation stored with each 8 columns in the decoding's pair order, so the down
#: kernel takes its B registers as loaded (False: natural order, paired by byte permutes).
PAIRED_HIDDEN = True
#: How a program finds its slot's pairs: a slot per expert, per listed expert (those with
#: pairs, from :func:`.moe_group.group_pairs`), or per (token, expert) pair, ungrouped
BY_EXPERT, LISTED, BY_PAIR = 0, 1, 2
#: Calls of up to this many tokens take a slot per pair (:func:`by_pair`): one token's top-k
#: experts are distinct, so each is read once, and the grouping launch is skipped; two tokens
#: seldom share an expert, and skipping the grouping still pays where one is read twice
#: (``benchmarks/fp4_sum_ab.py``: grouped slots are faster from four tokens).
BY_PAIR_TOKENS = 2
#: A slot per pair: the down kernel launched as a programmatic dependent of gate/up, its
#: programs started as gate/up's finish and asking L2 for their weights before they wait for
#: the hidden activation (with grouped slots the prefetch's registers cost more than it saves:
#: ``benchmarks/gluon_decode_ab.py``).
PDL_DOWN = True
#: Where slots hold at least this many pairs on average (one token tile a pass), a slot of 9
#: to 16 takes them in one pass of two tiles, with WIDE_STAGES K steps of weights in registers
#: (0: in two passes of one tile): below it such slots are rare, and the second K loop makes
#: the kernels slower (``benchmarks/gluon_decode_ab.py``).
WIDE_MIN_PAIRS, WIDE_STAGES = 4, 2
#: A slot per pair: the down kernel also adds each token's pairs and the residual
#: (:mod:`.fp4_gluon_sum`), so no third launch adds them (False: per-pair rows and
#: :func:`.moe.slot_sum`; ``benchmarks/fp4_sum_ab.py``).
SUM_IN_DOWN = True


class Tiles(NamedTuple):
    """A launch shape: ``warps_n`` warps side by side over a program's output features (16
    each) times ``split_k`` warps splitting K; ``n_tiles`` 8-token tiles a pass over K;
    ``stages`` K steps of weights in registers; ``maxnreg`` caps a thread's registers."""

    warps_n: int = 4
    split_k: int = 1
    n_tiles: int = 1
    stages: int = 2
    maxnreg: int | None = None


#: Launch shapes forced by kernel ("gate_up", "down"), for sweeps; else :func:`pick_tiles`.
OVERRIDE: dict[str, Tiles] = {}


def usable(x: Tensor, w13: Tensor, w2: Tensor, *, scales_fit: bool, decode: bool) -> bool:
    """Whether these kernels run the experts: on a Hopper GPU with Gluon
    (:func:`.gluon_support.on_hopper`), bf16 activations, scale bytes known to fit, the
    decode batches' 16-row tiles, d and I multiples of a K step, and 16-byte aligned
    operands."""
    if not decode or not scales_fit or x.dtype != torch.bfloat16 or not on_hopper(x.device):
        return False
    if x.shape[1] % STEP_K or 2 * w2.shape[2] % STEP_K:
        return False
    return all(t.data_ptr() % 16 == 0 for t in (x, w13, w2))


def pick_tiles(k_dim: int, rows: int, pairs: int, slots: int, sets: int, sms: int) -> Tiles:  # noqa: PLR0917
    """The launch shape for ``sets`` row sets (gate and up: 2) of ``rows`` output features
    over ``k_dim``, at ``pairs`` pairs on ``slots`` experts: one token tile a pass up to 8
    pairs an expert on average, two past; two K steps of weights in registers, gate/up's
    registers capped for three programs of four warps an SM; K split in two where the warps
    would be fewer than 8 an SM (``low_precision.py --parts experts_sweep`` on the H200)."""
    steps, tiles = k_dim // STEP_K, 1 if pairs <= 8 * slots else 2
    cap = 168 if sets == 2 else None
    if slots * rows // WARP_ROWS < 8 * sms and steps % 4 == 0:
        return Tiles(2, 2, tiles, 2, cap)
    return Tiles(4, 1, tiles, 2 if steps % 2 == 0 else 1, cap)


def _checked(tiles: Tiles, k_dim: int, rows: int) -> Tiles:
    """``tiles``, or ValueError where they do not divide the rows or the K steps."""
    steps = k_dim // STEP_K
    if rows % (WARP_ROWS * tiles.warps_n) or steps % (tiles.split_k * tiles.stages):
        raise ValueError(f"{tiles} does not divide {rows} rows and {steps} K steps")
    return tiles


if HAVE_GLUON:
    from deepinfer_kernels_sm100.fp4_gluon_loop import _k_loop, _lane_ids, _row_ptrs, _zeros
    from deepinfer_kernels_sm100.gluon_common import grid_dependency, prefetch_rows

    @gluon.jit
    def _slot_range(experts_ptr, ends_ptr, SLOTS: gl.constexpr):
        """(expert, start, end) of this program's slot, as :func:`.moe._slot_range`; SLOTS
        :data:`BY_EXPERT` (0), :data:`LISTED` (1: the experts with pairs) or :data:`BY_PAIR`
        (2: ``experts_ptr`` the routing's indices, slot p is pair p alone)."""
        if SLOTS == 2:
            e = gl.load(experts_ptr + gl.program_id(0))
            start = gl.program_id(0)
            end = start + 1
        else:
            e = gl.load(experts_ptr + gl.program_id(0)) if SLOTS == 1 else gl.program_id(0)
            start = gl.load(ends_ptr + gl.maximum(e, 0) - 1, mask=e > 0, other=0)
            end = gl.load(ends_ptr + gl.maximum(e, 0))
        return gl.maximum(e, 0).to(gl.int64), start, gl.where(e >= 0, end, start)

    @gluon.jit
    def _tile_ptrs(x_ptr, rows_ptr, m0, end, g, t, k_first, k_dim, T: gl.constexpr,  # noqa: PLR0917
                   PER_ROW: gl.constexpr = 1):  # fmt: skip
        """Pointers to the lane's first activations in each token tile: column g of tile j is
        sorted pair m0 + 8j + g, whose row of x is rows_ptr's entry (the pair over PER_ROW
        where rows_ptr is None); columns past ``end`` read the last pair and are never stored."""
        xp = ()
        for j in gl.static_range(T):
            p = gl.minimum(m0 + 8 * j + g, end - 1)
            if rows_ptr is None:
                row = (p // PER_ROW).to(gl.int64)
            else:
                row = gl.load(rows_ptr + p).to(gl.int64)
            xp = xp + (x_ptr + (row * k_dim + 32 * t)[None, :] + k_first,)  # noqa: RUF005
        return xp

    @gluon.jit
    def _passes(start, end, N_TILES: gl.constexpr, WIDE: gl.constexpr):
        """Where the slot's passes of N_TILES token tiles start: with WIDE, a slot of more
        than 8 N_TILES pairs takes them all in passes of twice the tiles (9 to 16 pairs: one
        pass, which reads the weights once where two passes read them twice)."""
        return gl.where(end - start > 8 * N_TILES, end, start) if WIDE else start

    @gluon.jit
    def _gate_up_pass(m0, end, x_ptr, token_ptr, w, s, scale_ptr, h_ptr, col, lane,  # noqa: PLR0917
                      dims, limit, CLAMP: gl.constexpr, PER_ROW: gl.constexpr,
                      WARPS_N: gl.constexpr, SPLIT_K: gl.constexpr, T: gl.constexpr,
                      STAGES: gl.constexpr):  # fmt: skip
        """h of sorted pairs m0 .. m0 + 8T (those before ``end``) over a pass of K."""
        g, t, k_first, steps = lane
        inter, k_dim = dims
        xp = _tile_ptrs(x_ptr, token_ptr, m0, end, g, t, k_first, k_dim, T, PER_ROW)
        acc = _zeros(8 * T, WARPS_N, SPLIT_K)
        acc = _k_loop(acc, w, s, xp, steps, 2, T, STAGES, False)
        for j in gl.static_range(T):
            for c in gl.static_range(4):  # rows g, g + 8 (c // 2) of columns 2t, 2t + 1
                gate = gl.sum(acc[8 * j + c], axis=0)
                up = gl.sum(acc[8 * j + 4 + c], axis=0)
                if CLAMP:
                    gate = gl.minimum(gate, limit)
                    up = gl.minimum(gl.maximum(up, -limit), limit)
                p = m0 + 8 * j + 2 * t + c % 2
                r = gl.load(scale_ptr + p, mask=p < end, other=0.0).to(gl.float32)
                h = gate * (1.0 / (1.0 + gl.exp(-gate))) * up * r
                out = h_ptr + p.to(gl.int64) * inter + col + 8 * (c // 2)
                gl.store(out, h.to(gl.bfloat16), mask=p < end)

    @gluon.jit
    def _fp4_gate_up_gluon(  # noqa: PLR0917 (Gluon kernels take positional arguments)
        x_ptr,  # [N, K] bf16 token inputs
        token_ptr,  # [P] token row of each sorted pair (None: pair over PER_ROW)
        w_ptr,  # [E, 2I, K / 2] packed e2m1, gate rows over up rows
        ws_ptr,  # [E, 2I, K / 32] ue8m0 bytes, each at most 128
        scale_ptr,  # [P] router weights
        ends_ptr,  # [E] int32
        experts_ptr,  # [slots] int32 (BY_PAIR: the routing's [P] indices)
        h_ptr,  # [P, I] bf16 out (each 8 columns in _PAIRS' order where PAIRED)
        inter,
        k_dim,
        limit,
        CLAMP: gl.constexpr,
        SLOTS: gl.constexpr,
        PAIRED: gl.constexpr,
        WARPS_N: gl.constexpr,
        SPLIT_K: gl.constexpr,
        N_TILES: gl.constexpr,
        STAGES: gl.constexpr,
        WIDE: gl.constexpr = 0,
        PER_ROW: gl.constexpr = 1,
    ):
        """h = silu(min(gate, l)) * clamp(up, -l, l) * router weight for one (slot, 16
        WARPS_N features): each warp's 16 gate and 16 up rows against the same tiles."""
        e, start, end = _slot_range(experts_ptr, ends_ptr, SLOTS)
        feat, g, t, k_first, steps = _lane_ids(k_dim, WARPS_N, SPLIT_K)
        grid_dependency(t, False)  # (down's programs may start as these finish)
        row = e * 2 * inter + feat.to(gl.int64)
        wg, sg = _row_ptrs(w_ptr, ws_ptr, row, t, k_first, k_dim)
        wu, su = _row_ptrs(w_ptr, ws_ptr, row + inter, t, k_first, k_dim)
        col = feat
        if PAIRED:  # feature 8c + i stored at 8c + 2i for i < 4, at 8c + 2(i - 4) + 1 past
            col = feat - g + gl.where(g < 4, 2 * g, 2 * g - 7)
        lane, dims = (g, t, k_first, steps), (inter, k_dim)
        narrow = _passes(start, end, N_TILES, WIDE)
        if WIDE:
            for m0 in range(start, narrow, 16 * N_TILES):
                _gate_up_pass(m0, end, x_ptr, token_ptr, wg + wu, sg + su, scale_ptr, h_ptr, col,
                              lane, dims, limit, CLAMP, PER_ROW, WARPS_N, SPLIT_K, 2 * N_TILES,
                              WIDE)  # fmt: skip
        for m0 in range(narrow, end, 8 * N_TILES):
            _gate_up_pass(m0, end, x_ptr, token_ptr, wg + wu, sg + su, scale_ptr, h_ptr, col,
                          lane, dims, limit, CLAMP, PER_ROW, WARPS_N, SPLIT_K, N_TILES,
                          STAGES)  # fmt: skip
        if SLOTS == 2:  # noqa: SIM102 (a constexpr test: the other modes compile no store)
            if end == start:  # no expert: h zero, as :mod:`.fp4_gluon_sum` reads every pair's
                empty = h_ptr + start.to(gl.int64) * inter + col
                zero = gl.zeros_like(feat).to(h_ptr.dtype.element_ty)
                gl.store(empty, zero, mask=t == 0)
                gl.store(empty + 8, zero, mask=t == 0)

    @gluon.jit
    def _down_pass(m0, end, h_ptr, wp, sp, order_ptr, y_ptr, feat, lane, dims,  # noqa: PLR0917
                   PAIRED: gl.constexpr, WARPS_N: gl.constexpr, SPLIT_K: gl.constexpr,
                   T: gl.constexpr, STAGES: gl.constexpr):  # fmt: skip
        """y of sorted pairs m0 .. m0 + 8T (those before ``end``) over a pass of K."""
        g, t, k_first, steps = lane
        d_out, inter = dims
        xp = _tile_ptrs(h_ptr, None, m0, end, g, t, k_first, inter, T)
        acc = _zeros(4 * T, WARPS_N, SPLIT_K)
        acc = _k_loop(acc, wp, sp, xp, steps, 1, T, STAGES, PAIRED)
        for j in gl.static_range(T):
            for c in gl.static_range(4):
                p = m0 + 8 * j + 2 * t + c % 2
                if order_ptr is None:
                    pair = p.to(gl.int64)
                else:
                    pair = gl.load(order_ptr + p, mask=p < end, other=0).to(gl.int64)
                out = y_ptr + pair * d_out + feat + 8 * (c // 2)
                gl.store(out, gl.sum(acc[4 * j + c], axis=0), mask=p < end)

    @gluon.jit
    def _fp4_down_gluon(  # noqa: PLR0917 (Gluon kernels take positional arguments)
        h_ptr,  # [P, I] bf16 (each 8 columns in _PAIRS' order where PAIRED)
        w_ptr,  # [E, D, I / 2] packed e2m1
        ws_ptr,  # [E, D, I / 32] ue8m0 bytes, each at most 128
        ends_ptr,  # [E] int32
        experts_ptr,  # [slots] int32 (BY_PAIR: the routing's [P] indices)
        order_ptr,  # [P] (token, slot) pair of each sorted pair (None: the pair itself)
        y_ptr,  # [P, D] fp32 out, by (token, slot) pair
        d_out,
        inter,
        SLOTS: gl.constexpr,
        PAIRED: gl.constexpr,
        WARPS_N: gl.constexpr,
        SPLIT_K: gl.constexpr,
        N_TILES: gl.constexpr,
        STAGES: gl.constexpr,
        WIDE: gl.constexpr = 0,
        PDL: gl.constexpr = False,
    ):
        """y = h @ w2.T for one (slot, 16 WARPS_N output features), at each pair's own row.
        With PDL (launched as a programmatic dependent of gate/up) the weights are asked of L2
        before the wait for h."""
        e, start, end = _slot_range(experts_ptr, ends_ptr, SLOTS)
        feat, g, t, k_first, steps = _lane_ids(inter, WARPS_N, SPLIT_K)
        wp, sp = _row_ptrs(w_ptr, ws_ptr, e * d_out + feat.to(gl.int64), t, k_first, inter)
        if PDL:
            if end > start:
                prefetch_rows((wp[0] - (16 * t)[None, :], wp[1] - (16 * t)[None, :]), t, 64 * steps)
            grid_dependency(t, True)
        lane, dims = (g, t, k_first, steps), (d_out, inter)
        narrow = _passes(start, end, N_TILES, WIDE)
        if WIDE:
            for m0 in range(start, narrow, 16 * N_TILES):
                _down_pass(m0, end, h_ptr, wp, sp, order_ptr, y_ptr, feat, lane, dims, PAIRED,
                           WARPS_N, SPLIT_K, 2 * N_TILES, WIDE)  # fmt: skip
        for m0 in range(narrow, end, 8 * N_TILES):
            _down_pass(m0, end, h_ptr, wp, sp, order_ptr, y_ptr, feat, lane, dims, PAIRED,
                       WARPS_N, SPLIT_K, N_TILES, STAGES)  # fmt: skip


def by_pair(x: Tensor) -> bool:
    """Whether a call of ``x``'s tokens takes a slot per (token, expert) pair, ungrouped
    (:data:`BY_PAIR_TOKENS`)."""
    return x.shape[0] <= BY_PAIR_TOKENS


def sums_pairs(x: Tensor) -> bool:
    """Whether a call of ``x``'s tokens adds its pairs in the down kernel
    (:mod:`.fp4_gluon_sum`, :data:`SUM_IN_DOWN`): then :func:`launch`'s ``y`` is its output."""
    return by_pair(x) and SUM_IN_DOWN


def launch(  # noqa: PLR0917
    x: Tensor,
    routing: tuple[Tensor, Tensor],
    groups: PairGroups | None,
    w13: Tensor,
    w13_s: Tensor,
    w2: Tensor,
    w2_s: Tensor,
    h: Tensor,
    y: Tensor,
    swiglu_limit: float,
    residual: Tensor | None = None,
) -> None:
    """Both kernels for :func:`.fp4_moe.moe_experts_fp4`: ``routing`` its (weights, indices),
    ``groups`` its :class:`.moe_group.PairGroups` (None where :func:`by_pair`: a slot a
    pair); ``h``: its hidden activation; ``y``: its per-pair outputs, or where
    :func:`sums_pairs` its output (``residual`` added). :func:`usable` must hold."""
    experts, two_inter, d = w13.shape[0], w13.shape[1], x.shape[1]
    inter, pairs = two_inter // 2, routing[1].numel()
    if groups is None:
        scale, idx = (t.reshape(-1).contiguous() for t in routing)
        rows, order, ends, listed, slots = None, None, idx, idx, pairs
        common = {"SLOTS": BY_PAIR, "PAIRED": PAIRED_HIDDEN}
    else:
        rows, order, scale, ends, listed = groups
        slots = listed.shape[0]
        common = {"SLOTS": LISTED if slots < experts else BY_EXPERT, "PAIRED": PAIRED_HIDDEN}
    sms = sm_count(x.device)
    up = _checked(OVERRIDE.get("gate_up") or pick_tiles(d, inter, pairs, slots, 2, sms), d, inter)
    per_row = {"PER_ROW": routing[1].shape[1]} if groups is None else {}
    pdl = PDL_DOWN and groups is None
    _fp4_gate_up_gluon[(slots, inter // (WARP_ROWS * up.warps_n))](
        x, rows, w13, w13_s, scale, ends, listed, h, inter, d, float(swiglu_limit),
        CLAMP=swiglu_limit > 0, **common, **_flags(up, pairs, slots), **per_row,
    )  # fmt: skip
    if groups is None and SUM_IN_DOWN:
        fp4_gluon_sum.launch(h, w2, w2_s, routing[1].contiguous(), residual, y,
                             paired=PAIRED_HIDDEN, pdl=pdl, sms=sms)  # fmt: skip
        return
    down = _checked(OVERRIDE.get("down") or pick_tiles(inter, d, pairs, slots, 1, sms), inter, d)
    _fp4_down_gluon[(slots, d // (WARP_ROWS * down.warps_n))](
        h, w2, w2_s, ends, listed, order, y, d, inter, **common, **_flags(down, pairs, slots),
        PDL=pdl, launch_pdl=pdl,
    )  # fmt: skip


def _flags(tiles: Tiles, pairs: int, slots: int) -> dict[str, Any]:
    """A launch's constexprs and options for ``tiles`` over ``pairs`` on ``slots`` (one token
    tile a pass: slots of 9 to 16 pairs take two tiles, :data:`WIDE_MIN_PAIRS`)."""
    wide = 0
    if tiles.n_tiles == 1 and pairs >= WIDE_MIN_PAIRS * slots:
        wide = min(WIDE_STAGES, tiles.stages)  # (divides the K steps, as ``stages`` does)
    flags = {"WARPS_N": tiles.warps_n, "SPLIT_K": tiles.split_k, "N_TILES": tiles.n_tiles,
             "STAGES": tiles.stages, "num_warps": tiles.warps_n * tiles.split_k,
             "WIDE": wide}  # fmt: skip
    if tiles.maxnreg is not None:
        flags["maxnreg"] = tiles.maxnreg
    return flags
