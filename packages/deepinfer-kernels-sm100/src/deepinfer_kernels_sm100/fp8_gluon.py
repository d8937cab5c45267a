"""The FP8 block-scaled linear's decode kernel on Hopper, in Gluon, every register placed by hand.

At decode sizes (up to :data:`.fp8_linear.SMALL_M` rows) each weight byte meets a few tokens,
so the linear streams its weight: the bytes each warp keeps in flight and the instructions a
byte costs set the speed. As :mod:`.fp4_gluon` does for the FP4 experts, each thread holds one
element of every tensor (:func:`.gluon_common.lanes`), so a tensor is one register of a known
lane, and the kernel is per-thread code around inline ``mma.sync.m16n8k32`` on e4m3 operands
(sm_89 on):

* The weights are the A operand (16 output features a warp), the e4m3 activation codes
  (:func:`.fp8_quant.quantize_act_fp8`, or the fused RMSNorm / SwiGLU's ``quantized=`` codes)
  the B operand (8 tokens a tile), both as loaded. Hopper runs no e4m3 ``mma.sync`` itself:
  ptxas widens the operands to f16 (exactly: every e4m3 value is one) for two f16 MMAs with
  fp32 sums, which costs conversions but no bits.
* A dot over K is the same under any permutation of K applied to both operands. Lane (g, t)
  loads bytes [16t, 16t + 16) and [64 + 16t, 80 + 16t) of a 128-wide K step in rows g and
  g + 8 and of token g, two 16-byte loads each that together cover whole 32-byte sectors;
  words 2j and 2j + 1 are its A (and B) registers of the step's MMA j. Weight blocks 32 wide
  (V4.1) need each MMA inside one block: lanes then load 8 bytes at [32j + 8t) instead.
* Numerics as :func:`.fp8_linear._fp8_gemm_kernel`'s: the MMAs of one weight block's part of
  a step (at most 128 K) are chained from zero, and their fp32 sum is multiplied by the
  activation scale times the weight scale and added to an fp32 accumulator (one fused
  multiply-add), so the MMA chain sums at most one step before the sum reaches fp32.
* Latency: a warp holds ``stages`` K steps of weights (and their scales) in registers, the
  next ones' loads in flight while one is consumed, and the activations one step ahead. K is
  split across a program's warps (``split_k``, added in a fixed tree by ``gl.sum``) and, for
  projections with few outputs, across ``splits`` programs, whose fp32 partial sums the
  tile's last program adds in split order (as :func:`.fp8_split.split_reduce`): no atomics
  on the output, so every run gives the same bits.
* Batch invariance: the launch shape depends on N and K alone (:func:`pick_tiles`), and each
  token column goes through the same instructions in whichever tile and pass it lands, so a
  row's output bits do not depend on M or on the other rows (:func:`n_tiles`).

Gluon kernels do not run in Triton's interpreter: CI compiles this one for sm_90a
(``test_aot_compile.py``); the interpreter, other GPUs, prefill batches and odd shapes run the
Triton kernels of :mod:`.fp8_linear`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor

from deepinfer_kernels_sm100.fp8_split import MAX_SPLIT_TILES, split_counters
from deepinfer_kernels_sm100.gluon_support import on_hopper

try:  # Gluon ships with Triton 3.5 and later
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl

    HAVE_GLUON = True
except ImportError:  # pragma: no cover - older Triton: the Triton kernels serve
    HAVE_GLUON = False

#: K elements a warp takes per step (one activation group), output features a warp, the
#: narrowest weight block along K (one MMA's K), the most 8-token tiles a pass takes, and the
#: warps a GPU should have streaming the weight, an SM
STEP_K, WARP_ROWS, MMA_K, MAX_TILES, WARPS_PER_SM = 128, 16, 32, 4, 4


class Tiles(NamedTuple):
    """A launch shape: ``warps_n`` warps side by side over a program's output features (16
    each) times ``split_k`` warps splitting K; ``splits`` programs splitting K further (their
    partial sums added by the last); ``stages`` K steps of weights in registers; ``maxnreg``
    caps a thread's registers (None: as the compiler allocates)."""

    warps_n: int = 1
    split_k: int = 8
    splits: int = 1
    stages: int = 2
    maxnreg: int | None = None


#: Weights of up to PDL_MAX_BYTES launch as a programmatic dependent of the kernel before
#: (:mod:`.gluon_common`): their launch latency is most of their time. Larger ones run faster
#: without (the prefetch's instructions and registers; ``benchmarks/gluon_decode_ab.py``).
PDL, PDL_MAX_BYTES = True, 8 << 20
#: Launch shapes forced by weight shape (N, K), for sweeps; else :func:`pick_tiles`.
OVERRIDE: dict[tuple[int, int], Tiles] = {}


def usable(a: Tensor, w: Tensor, block: tuple[int, int], group_n: int) -> bool:
    """Whether this kernel runs a decode linear: on a Hopper GPU with Gluon
    (:func:`.gluon_support.on_hopper`), e4m3 activation codes, weight blocks of whole 16-row
    warps and one MMA's K or more (dividing a step or made of steps), column groups of whole
    warps, and 16-byte aligned operands."""
    if a.dtype != torch.float8_e4m3fn or not on_hopper(a.device):
        return False
    bn, bk = block
    if bn % WARP_ROWS or group_n % WARP_ROWS or bk % MMA_K or (bk % STEP_K and STEP_K % bk):
        return False
    if w.shape[1] % STEP_K or a.shape[1] % STEP_K:
        return False
    return a.data_ptr() % 16 == 0 and w.data_ptr() % 16 == 0


def pick_tiles(n: int, k: int, sms: int) -> Tiles:
    """The launch shape for an [N, K] weight, from N and K alone (so a row's sums never depend
    on the batch): K halved across more warps of a program, up to 8, while the warps of 16
    rows number fewer than :data:`WARPS_PER_SM` an SM and each keeps two steps of its own;
    programs of fewer than 4 warps take more rows instead; four K steps of weights in
    registers where a warp's steps divide by four (``low_precision.py --parts gemm_gluon
    --gluon-sweep``: K split across programs, or 8 warps on K where 4 give 4 an SM, and two
    steps in registers were each slower at every V4-Flash projection). No register cap:
    three 4-warp programs an SM at 168 registers were slower than two uncapped ones
    (``benchmarks/fp8_regs_ab.py``)."""
    steps, rows = k // STEP_K, n // WARP_ROWS
    split = 1
    while split < 8 and rows * split < WARPS_PER_SM * sms and steps % (4 * split) == 0:
        split *= 2
    warps_n = 1
    while warps_n * split < 4 and rows % (2 * warps_n) == 0:
        warps_n *= 2
    own = steps // split
    return Tiles(warps_n, split, 1, 4 if own % 4 == 0 else 2 if own % 2 == 0 else 1)


def _checked(tiles: Tiles, n: int, k: int, group_n: int) -> Tiles:
    """``tiles``, or ValueError where they do not divide the rows, the groups or the K steps."""
    rows, steps = WARP_ROWS * tiles.warps_n, k // STEP_K
    split = tiles.split_k * tiles.splits
    if n % rows or group_n % WARP_ROWS or steps % (split * tiles.stages):
        raise ValueError(f"{tiles} does not divide {n} rows and {steps} K steps")
    if tiles.splits > 1 and n // rows > MAX_SPLIT_TILES:
        raise ValueError(f"{n // rows} split tiles: more than the {MAX_SPLIT_TILES} counters")
    return tiles


if HAVE_GLUON:
    #: weights: streamed once, so prefetched into L2 and not kept in L1
    _LD_W4 = gl.constexpr("ld.global.nc.L1::no_allocate.L2::256B.v4.b32 {$0, $1, $2, $3}, [$4];")
    _LD_W2 = gl.constexpr("ld.global.nc.L1::no_allocate.L2::256B.v2.b32 {$0, $1}, [$2];")
    #: activations, which every warp of a program reads: through L1
    _LD_X4 = gl.constexpr("ld.global.nc.v4.b32 {$0, $1, $2, $3}, [$4];")
    _LD_X2 = gl.constexpr("ld.global.nc.v2.b32 {$0, $1}, [$2];")
    _STEP = gl.constexpr(STEP_K)
    _MMA = gl.constexpr(
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 "
        "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};"
    )
    from deepinfer_kernels_sm100.fp8_split import split_reduce_gluon
    from deepinfer_kernels_sm100.gluon_common import grid_dependency, lanes, prefetch_rows

    @gluon.constexpr_function
    def _chains(w_bk: Any) -> Any:
        """Weight blocks a K step spans: their MMAs are summed and scaled apart."""
        return max(1, 128 // w_bk)

    @gluon.constexpr_function
    def _vec(w_bk: Any) -> Any:
        """Words a lane loads at once: 4, or 2 where an MMA's K is a whole weight block."""
        return 2 if w_bk < 64 else 4

    @gluon.jit
    def _asm(asm: gl.constexpr, constraints: gl.constexpr, args, n: gl.constexpr,
             dtype: gl.constexpr):  # fmt: skip
        """``n`` (2 or 4) registers from one PTX block per thread (one element a thread)."""
        ty = dtype  # the dtype itself, not its constexpr
        if n == 2:
            out = gl.inline_asm_elementwise(asm, constraints, args, (ty, ty), True, 1)
        else:
            out = gl.inline_asm_elementwise(asm, constraints, args, (ty, ty, ty, ty), True, 1)
        return out

    @gluon.jit
    def _load8(p, LD4: gl.constexpr, LD2: gl.constexpr, VEC: gl.constexpr):
        """The lane's 8 words of one row in a K step from ``p`` (its first byte): two 16-byte
        loads 64 bytes apart (VEC 4), or four 8-byte loads 32 bytes apart (VEC 2)."""
        if VEC == 4:
            words = _asm(LD4, "=r,=r,=r,=r,l", (p,), 4, gl.int32)
            words = words + _asm(LD4, "=r,=r,=r,=r,l", (p + 64,), 4, gl.int32)
        else:
            words = ()
            for h in gl.static_range(4):
                words = words + _asm(LD2, "=r,=r,l", (p + 32 * h,), 2, gl.int32)
        return words

    @gluon.jit
    def _load_w(wp, sp, k_first, i, VEC: gl.constexpr, W_BK: gl.constexpr):  # noqa: PLR0917
        """K step ``i``'s weights: 8 words of rows g and g + 8, and the raw scale of each
        weight block the step spans (one, or 128 / W_BK)."""
        words = (_load8(wp[0] + _STEP * i, _LD_W4, _LD_W2, VEC),
                 _load8(wp[1] + _STEP * i, _LD_W4, _LD_W2, VEC))  # fmt: skip
        scales = ()
        for c in gl.static_range(_chains(W_BK)):
            kb = (k_first + _STEP * i + c * W_BK) // W_BK
            scales = scales + (gl.load(sp + kb),)  # noqa: RUF005
        return words, scales

    @gluon.jit
    def _load_x(xp, asp, i, T: gl.constexpr, VEC: gl.constexpr):
        """K step ``i``'s activations: each token tile's 8 words of token g, and the scales of
        tokens 2t and 2t + 1 (the C fragment's columns)."""
        xs = ()
        for j in gl.static_range(T):
            words = _load8(xp[j] + _STEP * i, _LD_X4, _LD_X2, VEC)
            xs = xs + ((words, gl.load(asp[j][0] + i), gl.load(asp[j][1] + i)),)  # noqa: RUF005
        return xs

    @gluon.jit
    def _w_scale(raw, UE8M0: gl.constexpr):
        """A weight scale as fp32: ue8m0 bytes decoded as :func:`.fp8_quant.ue8m0_to_fp32`."""
        if UE8M0:
            b = raw.to(gl.int32)
            bits = gl.where(b == 0, 0x00400000, b << 23)
            bits = gl.where(b == 255, 0x7FC00000, bits)
            out = bits.to(gl.float32, bitcast=True)
        else:
            out = raw
        return out

    @gluon.jit
    def _mma(c, wg, wh, xw, p: gl.constexpr):
        """c + the MMA on words p and p + 1 of rows g (``wg``), g + 8 (``wh``), token g."""
        args = (wg[p], wh[p], wg[p + 1], wh[p + 1], xw[p], xw[p + 1]) + c  # noqa: RUF005
        return _asm(_MMA, "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f", args, 4, gl.float32)

    @gluon.jit
    def _step(acc, w, xs, T: gl.constexpr, CHAINS: gl.constexpr, UE8M0: gl.constexpr):  # noqa: PLR0917
        """acc + one K step; acc[4j : 4j + 4] is token tile j's C fragment (rows g, g + 8 of
        tokens 2t, 2t + 1). Each of the CHAINS weight blocks' MMAs sum from zero; the sum
        times its two scales goes into acc by one fused multiply-add."""
        wg, wh, raw = w[0][0], w[0][1], w[1]
        zero = gl.zeros_like(acc[0])
        per: gl.constexpr = 4 // CHAINS
        new = ()
        for j in gl.static_range(T):
            words, s0, s1 = xs[j]
            a = acc[4 * j : 4 * j + 4]
            for c in gl.static_range(CHAINS):
                part = (zero, zero, zero, zero)
                for q in gl.static_range(per):
                    part = _mma(part, wg, wh, words, 2 * (c * per + q))
                ws = _w_scale(raw[c], UE8M0)
                f0 = s0 * ws
                f1 = s1 * ws
                a = (gl.fma(part[0], f0, a[0]), gl.fma(part[1], f1, a[1]),
                     gl.fma(part[2], f0, a[2]), gl.fma(part[3], f1, a[3]))  # fmt: skip
            new = new + a
        return new

    @gluon.jit
    def _k_loop(acc, wp, sp, xp, asp, k_first, steps, T: gl.constexpr,  # noqa: PLR0917
                STAGES: gl.constexpr, VEC: gl.constexpr, W_BK: gl.constexpr,
                UE8M0: gl.constexpr):  # fmt: skip
        """acc + the warp's ``steps`` K steps: STAGES steps of weights in registers, each
        refilled with the step STAGES on once consumed (the loop unrolled STAGES times: no
        register copies on its back edge), and the activations (L1, L2) one step on."""
        chains: gl.constexpr = _chains(W_BK)
        bufs = ()
        for s in gl.static_range(STAGES):
            bufs = bufs + (_load_w(wp, sp, k_first, s, VEC, W_BK),)  # noqa: RUF005
        xs = _load_x(xp, asp, 0, T, VEC)
        for i0 in range(0, steps - STAGES, STAGES):
            for s in gl.static_range(STAGES):
                ahead = _load_x(xp, asp, i0 + s + 1, T, VEC)
                acc = _step(acc, bufs[s], xs, T, chains, UE8M0)
                refill = _load_w(wp, sp, k_first, i0 + s + STAGES, VEC, W_BK)
                bufs = bufs[:s] + (refill,) + bufs[s + 1 :]  # noqa: RUF005
                xs = ahead
        for s in gl.static_range(STAGES):
            if s + 1 < STAGES:
                ahead = _load_x(xp, asp, steps - STAGES + s + 1, T, VEC)
            acc = _step(acc, bufs[s], xs, T, chains, UE8M0)
            if s + 1 < STAGES:
                xs = ahead
        return acc

    @gluon.jit
    def _tile_ptrs(a_ptr, as_ptr, m0, m, lane, k_first, lda, T: gl.constexpr,  # noqa: PLR0917
                   VEC: gl.constexpr):  # fmt: skip
        """Per token tile j: the lane's first activation byte of token m0 + 8j + g, and its
        first scales of tokens m0 + 8j + 2t and + 1; ``lane`` holds (g, t, the warp's first
        column of A). Tokens past m read the last one and are never stored."""
        g, t, a_col = lane
        xp = ()
        asp = ()
        for j in gl.static_range(T):
            tok = gl.minimum(m0 + 8 * j + g, m - 1).to(gl.int64)
            xp = xp + (a_ptr + (tok * lda + a_col + 4 * VEC * t)[None, :] + k_first,)  # noqa: RUF005
            s = ()
            for c in gl.static_range(2):
                tok = gl.minimum(m0 + 8 * j + 2 * t + c, m - 1).to(gl.int64)
                off = tok * (lda // _STEP) + a_col // _STEP
                s = s + (as_ptr + off[None, :] + k_first // _STEP,)  # noqa: RUF005
            asp = asp + (s,)  # noqa: RUF005
        return xp, asp

    @gluon.jit(do_not_specialize=["m"])
    def _fp8_decode_gluon(  # noqa: PLR0917 (Gluon kernels take positional arguments)
        a_ptr,  # [M, lda] e4m3 activation codes
        as_ptr,  # [M, lda / 128] fp32 activation scales
        w_ptr,  # [N, K] e4m3 weight
        ws_ptr,  # [ceil(N / W_BN), ceil(K / W_BK)] weight scales: fp32, or ue8m0 bytes
        out_ptr,  # [M, N] out
        part_ptr,  # [SPLITS, M, N] fp32 partial sums (SPLITS > 1)
        count_ptr,  # int32 per program column: its split programs done so far (left zero)
        m,
        n,
        k_dim,
        lda,  # elements between rows of A: K, or groups * K for a grouped linear
        group_n,  # output features per group: feature f reads A's columns from (f // group_n) K
        SCALE_UE8M0: gl.constexpr,
        W_BN: gl.constexpr,
        W_BK: gl.constexpr,
        WARPS_N: gl.constexpr,
        SPLIT_K: gl.constexpr,
        SPLITS: gl.constexpr,
        N_TILES: gl.constexpr,
        STAGES: gl.constexpr,
        PDL: gl.constexpr = False,
    ):
        """out = a @ w.T with block scales for 16 WARPS_N output features, K split over
        SPLIT_K warps and SPLITS programs (grid axis 1), every token in tiles of 8. With PDL
        (a programmatic dependent launch) the weight rows are asked of L2 before the wait."""
        layout: gl.constexpr = lanes(SPLIT_K, WARPS_N)
        VEC: gl.constexpr = _vec(W_BK)
        lane = gl.arange(0, 32 * WARPS_N, layout=gl.SliceLayout(0, layout))
        ks = gl.arange(0, SPLIT_K, layout=gl.SliceLayout(1, layout))
        g, t = (lane % 32) // 4, lane % 4
        first = gl.program_id(0) * (16 * WARPS_N) + (lane // 32) * 16  # the warp's first row
        row = first + g
        steps = k_dim // (_STEP * SPLIT_K * SPLITS)
        k_first = ((gl.program_id(1) * SPLIT_K + ks) * (steps * _STEP))[:, None]
        wp = w_ptr + (row.to(gl.int64) * k_dim + 4 * VEC * t)[None, :] + k_first
        wp = (wp, wp + 8 * k_dim)
        sp = ws_ptr + ((first // W_BN) * ((k_dim + W_BK - 1) // W_BK))[None, :]
        ids = (g, t, (first // group_n).to(gl.int64) * k_dim)
        grid_dependency(t, False)  # (a dependent launch may start as these programs finish)
        if PDL:
            lead = (4 * VEC * t)[None, :]
            prefetch_rows((wp[0] - lead, wp[1] - lead), t, steps * _STEP)
            grid_dependency(t, True)
        for m0 in range(0, m, 8 * N_TILES):
            xp, asp = _tile_ptrs(a_ptr, as_ptr, m0, m, ids, k_first, lda, N_TILES, VEC)
            zero = gl.zeros([SPLIT_K, 32 * WARPS_N], gl.float32, layout)
            acc = (zero,) * (4 * N_TILES)
            acc = _k_loop(acc, wp, sp, xp, asp, k_first, steps, N_TILES, STAGES, VEC, W_BK,
                          SCALE_UE8M0)  # fmt: skip
            for j in gl.static_range(N_TILES):
                for c in gl.static_range(4):  # rows g, g + 8 (c // 2) of tokens 2t, 2t + 1
                    tok = m0 + 8 * j + 2 * t + c % 2
                    off = tok.to(gl.int64) * n + row + 8 * (c // 2)
                    total = gl.sum(acc[4 * j + c], axis=0)
                    if SPLITS == 1:
                        gl.store(out_ptr + off, total.to(out_ptr.dtype.element_ty), mask=tok < m)
                    else:
                        dst = part_ptr + gl.program_id(1) * (m.to(gl.int64) * n) + off
                        gl.store(dst, total, mask=tok < m)
        if SPLITS > 1:
            split_reduce_gluon(out_ptr, part_ptr, count_ptr, row, t, m, n, SPLITS)


def n_tiles(m: int) -> int:
    """8-token tiles a pass over K takes for ``m`` rows: as many as cover them, up to
    :data:`MAX_TILES` (more rows take more passes). Each token's sums are the same either way."""
    return 1 if m <= 8 else 2 if m <= 16 else MAX_TILES


def launch(  # noqa: PLR0917
    a: Tensor,
    a_scale: Tensor,
    w: Tensor,
    ws: Tensor,
    out: Tensor,
    block: tuple[int, int],
    groups: int,
    *,
    ue8m0: bool,
    sms: int,
) -> None:
    """out = the block-scaled linear of the e4m3 codes ``a`` [M, groups K] (scales
    ``a_scale`` [M, groups K / 128]) with the [N, K] weight ``w`` (scales ``ws``), group j of
    ``a`` against rows j N / groups ...; :func:`usable` must hold."""
    (n, k), m = w.shape, a.shape[0]
    group_n = n // groups
    tiles = _checked(OVERRIDE.get((n, k)) or pick_tiles(n, k, sms), n, k, group_n)
    part = out
    if tiles.splits > 1:
        part = torch.empty(tiles.splits, m, n, dtype=torch.float32, device=a.device)
    grid = (n // (WARP_ROWS * tiles.warps_n), tiles.splits)
    pdl = PDL and w.numel() <= PDL_MAX_BYTES
    _fp8_decode_gluon[grid](
        a, a_scale, w, ws, out, part, split_counters(a.device), m, n, k, groups * k, group_n,
        SCALE_UE8M0=ue8m0, W_BN=block[0], W_BK=block[1], WARPS_N=tiles.warps_n,
        SPLIT_K=tiles.split_k, SPLITS=tiles.splits, N_TILES=n_tiles(m), STAGES=tiles.stages,
        PDL=pdl, num_warps=tiles.warps_n * tiles.split_k, launch_pdl=pdl,
        **({} if tiles.maxnreg is None else {"maxnreg": tiles.maxnreg}),
    )  # fmt: skip
