"""The FP4 routed experts' decode-size kernels on Hopper, in Gluon, every register placed by hand.

At decode sizes each decoded weight meets a few tokens, so the instructions a weight costs and
the bytes each warp keeps in flight set the speed. :mod:`.fp4_moe`'s Triton kernels load the
packed bytes in a blocked layout, decode them to bf16, then let Triton move every register into
the tensor-core operand's layout (byte permutes and moves around each dot). Here each thread
holds one element of every tensor (:func:`_lanes`), so a tensor is one register of a known
lane, and the kernels are per-thread code around inline ``mma.sync.m16n8k16``:

* The weights are the A operand (16 output features a warp), the tokens the B operand (8 a
  tile). A K step is 128 elements: lane (g, t) loads bytes [16t, 16t + 16) of the step in rows
  g and g + 8, one 128-bit load each: one ue8m0 group, one scale byte a row.
* A dot over K is the same under any permutation of K applied to both operands. Word q of the
  16 bytes holds nibbles n0..n7 (elements 8q .. 8q + 7 of the lane's group); :data:`_DECODE`
  turns it into four bf16x2 registers pairing n_i with n_(i+4) (a mask, one multiply that puts
  the magnitude and sign bits in place, a mask, a bf16x2 product with the scale): the A
  registers of two k16 blocks. Their B registers pair the activations alike (a byte permute
  each, :data:`_PAIRS`); the down kernel reads a hidden activation stored in that order.
* The decoding is exact, as :mod:`.fp4_decode`'s: the nibble's bits in a bf16 are the e2m1
  value times 2**-126, and ``scales_fit`` (no scale byte above 128) makes 2**(b - 1) a normal
  bf16 that carries the 2**126, so one product per two weights gives each weight.
* Latency: a warp holds ``stages`` K steps of weights in registers, the next ones' loads in
  flight while one is decoded, and the activations one step ahead (:func:`_k_loop`); warps may
  split K (``split_k``), their sums added at the end. Weights are read with an L2 prefetch
  hint and past L1; activations, which every warp reads, through L1.

Gluon kernels do not run in Triton's interpreter: CI compiles these for sm_90a
(``test_aot_compile.py``); the interpreter tests and every other case (fp32 activations,
prefill tiles, scales past 128, other GPUs) run the Triton kernels.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor

from deepinfer_kernels_sm100.devices import sm_count
from deepinfer_kernels_sm100.gluon_support import on_hopper

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
    #: 16 bytes of weights: streamed once, so prefetched into L2 and not kept in L1
    _LD_W = gl.constexpr("ld.global.nc.L1::no_allocate.L2::256B.v4.b32 {$0, $1, $2, $3}, [$4];")
    #: 16 bytes of activations, which every warp of a program reads: through L1
    _LD_X = gl.constexpr("ld.global.nc.v4.b32 {$0, $1, $2, $3}, [$4];")
    #: word $4 (nibbles n0..n7) times bf16x2 scale $5 -> (n0, n4), (n1, n5), (n2, n6), (n3, n7)
    #: as bf16x2. A nibble z in a 16-bit half times 4160 is z << 6 | z << 12: magnitude bits
    #: at 6..8, sign at 15; the mask keeps those.
    _DECODE = gl.constexpr(
        "{ .reg .b32 z, v;\n"
        "and.b32 z, $4, 0x000F000F; mul.lo.u32 z, z, 4160; and.b32 z, z, 0x81C081C0;\n"
        "mul.rn.bf16x2 $0, z, $5;\n"
        "and.b32 z, $4, 0x00F000F0; mul.lo.u32 z, z, 260; and.b32 z, z, 0x81C081C0;\n"
        "mul.rn.bf16x2 $1, z, $5;\n"
        "shr.u32 v, $4, 8;\n"
        "and.b32 z, v, 0x000F000F; mul.lo.u32 z, z, 4160; and.b32 z, z, 0x81C081C0;\n"
        "mul.rn.bf16x2 $2, z, $5;\n"
        "and.b32 z, v, 0x00F000F0; mul.lo.u32 z, z, 260; and.b32 z, z, 0x81C081C0;\n"
        "mul.rn.bf16x2 $3, z, $5; }"
    )
    #: bf16 pairs (x0 x1), (x2 x3), (x4 x5), (x6 x7) -> (x0 x4), (x1 x5), (x2 x6), (x3 x7)
    _PAIRS = gl.constexpr(
        "prmt.b32 $0, $4, $6, 0x5410; prmt.b32 $1, $4, $6, 0x7632; "
        "prmt.b32 $2, $5, $7, 0x5410; prmt.b32 $3, $5, $7, 0x7632;"
    )
    _MMA = gl.constexpr(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};"
    )

    @gluon.constexpr_function
    def _lanes(split_k: Any, warps_n: Any) -> Any:
        """[split_k, 32 warps_n], one element a thread: warp (ks, wn) lane l holds
        (ks, 32 wn + l)."""
        return gl.BlockedLayout([1, 1], [1, 32], [split_k, warps_n], [1, 0])

    @gluon.jit
    def _asm4(asm: gl.constexpr, constraints: gl.constexpr, args, dtype: gl.constexpr):
        """Four registers from one PTX block per thread (one element a thread, no packing)."""
        ty = dtype  # the dtype itself, not its constexpr
        return gl.inline_asm_elementwise(
            asm, constraints, args, dtype=(ty, ty, ty, ty), is_pure=True, pack=1
        )

    @gluon.jit
    def _mma2(acc, i: gl.constexpr, a, lo: gl.constexpr, b):
        """Both k16 blocks of one word into accumulators acc[i:i + 4]; a[lo:lo + 4] and
        a[lo + 4:lo + 8] are the word's four registers for rows g and g + 8."""
        args = (a[lo], a[lo + 4], a[lo + 1], a[lo + 5], b[0], b[1]) + acc[i : i + 4]  # noqa: RUF005
        c = _asm4(_MMA, "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f", args, gl.float32)
        args = (a[lo + 2], a[lo + 6], a[lo + 3], a[lo + 7], b[2], b[3]) + c  # noqa: RUF005
        return _asm4(_MMA, "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f", args, gl.float32)

    @gluon.jit
    def _load_w(wp, sp, i, G: gl.constexpr):
        """K step ``i``'s weight registers: 4 words and a scale byte for each of 2G rows."""
        words = ()
        scales = ()
        for r in gl.static_range(2 * G):
            words = words + (_asm4(_LD_W, "=r,=r,=r,=r,l", (wp[r] + 64 * i,), gl.int32),)  # noqa: RUF005
            scales = scales + (gl.load(sp[r] + 4 * i).to(gl.int32),)  # noqa: RUF005
        return words, scales

    @gluon.jit
    def _load_x(xp, i, T: gl.constexpr):
        """K step ``i``'s activation registers: 16 words for each of the T token tiles."""
        xs = ()
        for j in gl.static_range(T):
            for v in gl.static_range(4):
                xs = xs + _asm4(_LD_X, "=r,=r,=r,=r,l", (xp[j] + (128 * i + 8 * v),), gl.int32)
        return xs

    @gluon.jit
    def _step(acc, w, xs, G: gl.constexpr, T: gl.constexpr, PAIRED: gl.constexpr):  # noqa: PLR0917
        """acc + one K step; acc[(j G + set) * 4 : + 4] is token tile j of row set ``set``
        (gate, up), as a ``mma`` C fragment."""
        words, scales = w
        s2 = ()
        for r in gl.static_range(2 * G):  # 2**(b - 1) in both halves: bits (b + 126) << 7
            s2 = s2 + (scales[r] * 0x00800080 + 0x3F003F00,)  # noqa: RUF005
        for q in gl.static_range(4):
            a = ()
            for r in gl.static_range(2 * G):
                a = a + _asm4(_DECODE, "=r,=r,=r,=r,r,r", (words[r][q], s2[r]), gl.int32)
            new = ()
            for j in gl.static_range(T):
                b = xs[16 * j + 4 * q : 16 * j + 4 * q + 4]
                if not PAIRED:
                    b = _asm4(_PAIRS, "=r,=r,=r,=r,r,r,r,r", b, gl.int32)
                for st in gl.static_range(G):
                    new = new + _mma2(acc, (j * G + st) * 4, a, 8 * st, b)
            acc = new
        return acc

    @gluon.jit
    def _k_loop(acc, wp, sp, xp, steps, G: gl.constexpr, T: gl.constexpr,  # noqa: PLR0917
                STAGES: gl.constexpr, PAIRED: gl.constexpr):  # fmt: skip
        """acc + the warp's ``steps`` K steps: STAGES steps of weights in registers, each
        refilled with the step STAGES on once decoded (the loop unrolled STAGES times: no
        register copies on its back edge), and the activations (L1, L2) one step on."""
        bufs = ()
        for s in gl.static_range(STAGES):
            bufs = bufs + (_load_w(wp, sp, s, G),)  # noqa: RUF005
        xs = _load_x(xp, 0, T)
        for i0 in range(0, steps - STAGES, STAGES):
            for s in gl.static_range(STAGES):
                ahead = _load_x(xp, i0 + s + 1, T)
                acc = _step(acc, bufs[s], xs, G, T, PAIRED)
                refill = _load_w(wp, sp, i0 + s + STAGES, G)
                bufs = bufs[:s] + (refill,) + bufs[s + 1 :]  # noqa: RUF005
                xs = ahead
        for s in gl.static_range(STAGES):
            if s + 1 < STAGES:
                ahead = _load_x(xp, steps - STAGES + s + 1, T)
            acc = _step(acc, bufs[s], xs, G, T, PAIRED)
            if s + 1 < STAGES:
                xs = ahead
        return acc

    @gluon.jit
    def _slot_range(experts_ptr, ends_ptr, LISTED: gl.constexpr):
        """(expert, start, end) of this program's slot, as :func:`.moe._slot_range`."""
        if LISTED:
            e = gl.load(experts_ptr + gl.program_id(0))
            expert = gl.maximum(e, 0).to(gl.int64)
        else:
            e = gl.program_id(0)
            expert = e.to(gl.int64)
        start = gl.load(ends_ptr + expert - 1, mask=expert > 0, other=0)
        end = gl.load(ends_ptr + expert)
        return expert, start, gl.where(e >= 0, end, start)

    @gluon.jit
    def _lane_ids(k_dim, WARPS_N: gl.constexpr, SPLIT_K: gl.constexpr):
        """(feature of row g, g, t over [32 WARPS_N]; first K element of each warp
        [SPLIT_K, 1]; K steps a warp)."""
        layout: gl.constexpr = _lanes(SPLIT_K, WARPS_N)
        lane = gl.arange(0, 32 * WARPS_N, layout=gl.SliceLayout(0, layout))
        ks = gl.arange(0, SPLIT_K, layout=gl.SliceLayout(1, layout))
        g = (lane % 32) // 4
        feat = gl.program_id(1) * (16 * WARPS_N) + (lane // 32) * 16 + g
        steps = k_dim // (128 * SPLIT_K)
        return feat, g, lane % 4, (ks * steps * 128)[:, None], steps

    @gluon.jit
    def _row_ptrs(w_ptr, ws_ptr, row, t, k_first, k_dim):  # noqa: PLR0917
        """Pointers to the lane's first packed and scale bytes in rows ``row``, ``row`` + 8."""
        w = w_ptr + (row * (k_dim // 2) + 16 * t)[None, :] + k_first // 2
        s = ws_ptr + (row * (k_dim // 32) + t)[None, :] + k_first // 32
        return (w, w + 8 * (k_dim // 2)), (s, s + 8 * (k_dim // 32))

    @gluon.jit
    def _tile_ptrs(x_ptr, rows_ptr, m0, end, g, t, k_first, k_dim, T: gl.constexpr):  # noqa: PLR0917
        """Pointers to the lane's first activations in each token tile: column g of tile j is
        sorted pair m0 + 8j + g, whose row of x is rows_ptr's entry (the pair itself where
        rows_ptr is None); columns past ``end`` read the last pair and are never stored."""
        xp = ()
        for j in gl.static_range(T):
            p = gl.minimum(m0 + 8 * j + g, end - 1)
            row = p.to(gl.int64) if rows_ptr is None else gl.load(rows_ptr + p).to(gl.int64)
            xp = xp + (x_ptr + (row * k_dim + 32 * t)[None, :] + k_first,)  # noqa: RUF005
        return xp

    @gluon.jit
    def _zeros(n: gl.constexpr, WARPS_N: gl.constexpr, SPLIT_K: gl.constexpr):
        zero = gl.zeros([SPLIT_K, 32 * WARPS_N], gl.float32, _lanes(SPLIT_K, WARPS_N))
        return (zero,) * n

    @gluon.jit
    def _fp4_gate_up_gluon(  # noqa: PLR0917 (Gluon kernels take positional arguments)
        x_ptr,  # [N, K] bf16 token inputs
        token_ptr,  # [P] token row of each sorted pair
        w_ptr,  # [E, 2I, K / 2] packed e2m1, gate rows over up rows
        ws_ptr,  # [E, 2I, K / 32] ue8m0 bytes, each at most 128
        scale_ptr,  # [P] router weights (fp32)
        ends_ptr,  # [E] int32
        experts_ptr,  # [slots] int32
        h_ptr,  # [P, I] bf16 out (each 8 columns in _PAIRS' order where PAIRED)
        inter,
        k_dim,
        limit,
        CLAMP: gl.constexpr,
        LISTED: gl.constexpr,  # fewer slots than experts: each slot's expert read from the list
        PAIRED: gl.constexpr,
        WARPS_N: gl.constexpr,
        SPLIT_K: gl.constexpr,
        N_TILES: gl.constexpr,
        STAGES: gl.constexpr,
    ):
        """h = silu(min(gate, l)) * clamp(up, -l, l) * router weight for one (slot, 16
        WARPS_N features): each warp's 16 gate and 16 up rows against the same tiles."""
        e, start, end = _slot_range(experts_ptr, ends_ptr, LISTED)
        feat, g, t, k_first, steps = _lane_ids(k_dim, WARPS_N, SPLIT_K)
        row = e * 2 * inter + feat.to(gl.int64)
        wg, sg = _row_ptrs(w_ptr, ws_ptr, row, t, k_first, k_dim)
        wu, su = _row_ptrs(w_ptr, ws_ptr, row + inter, t, k_first, k_dim)
        col = feat
        if PAIRED:  # feature 8c + i stored at 8c + 2i for i < 4, at 8c + 2(i - 4) + 1 past
            col = feat - g + gl.where(g < 4, 2 * g, 2 * g - 7)
        for m0 in range(start, end, 8 * N_TILES):
            xp = _tile_ptrs(x_ptr, token_ptr, m0, end, g, t, k_first, k_dim, N_TILES)
            acc = _zeros(8 * N_TILES, WARPS_N, SPLIT_K)
            acc = _k_loop(acc, wg + wu, sg + su, xp, steps, 2, N_TILES, STAGES, False)
            for j in gl.static_range(N_TILES):
                for c in gl.static_range(4):  # rows g, g + 8 (c // 2) of columns 2t, 2t + 1
                    gate = gl.sum(acc[8 * j + c], axis=0)
                    up = gl.sum(acc[8 * j + 4 + c], axis=0)
                    if CLAMP:
                        gate = gl.minimum(gate, limit)
                        up = gl.minimum(gl.maximum(up, -limit), limit)
                    p = m0 + 8 * j + 2 * t + c % 2
                    r = gl.load(scale_ptr + p, mask=p < end, other=0.0)
                    h = gate * (1.0 / (1.0 + gl.exp(-gate))) * up * r
                    out = h_ptr + p.to(gl.int64) * inter + col + 8 * (c // 2)
                    gl.store(out, h.to(gl.bfloat16), mask=p < end)

    @gluon.jit
    def _fp4_down_gluon(  # noqa: PLR0917 (Gluon kernels take positional arguments)
        h_ptr,  # [P, I] bf16 (each 8 columns in _PAIRS' order where PAIRED)
        w_ptr,  # [E, D, I / 2] packed e2m1
        ws_ptr,  # [E, D, I / 32] ue8m0 bytes, each at most 128
        ends_ptr,  # [E] int32
        experts_ptr,  # [slots] int32
        order_ptr,  # [P] (token, slot) pair of each sorted pair
        y_ptr,  # [P, D] fp32 out, by (token, slot) pair
        d_out,
        inter,
        LISTED: gl.constexpr,
        PAIRED: gl.constexpr,
        WARPS_N: gl.constexpr,
        SPLIT_K: gl.constexpr,
        N_TILES: gl.constexpr,
        STAGES: gl.constexpr,
    ):
        """y = h @ w2.T for one (slot, 16 WARPS_N output features), at each pair's own row."""
        e, start, end = _slot_range(experts_ptr, ends_ptr, LISTED)
        feat, g, t, k_first, steps = _lane_ids(inter, WARPS_N, SPLIT_K)
        wp, sp = _row_ptrs(w_ptr, ws_ptr, e * d_out + feat.to(gl.int64), t, k_first, inter)
        for m0 in range(start, end, 8 * N_TILES):
            xp = _tile_ptrs(h_ptr, None, m0, end, g, t, k_first, inter, N_TILES)
            acc = _zeros(4 * N_TILES, WARPS_N, SPLIT_K)
            acc = _k_loop(acc, wp, sp, xp, steps, 1, N_TILES, STAGES, PAIRED)
            for j in gl.static_range(N_TILES):
                for c in gl.static_range(4):
                    p = m0 + 8 * j + 2 * t + c % 2
                    pair = gl.load(order_ptr + p, mask=p < end, other=0).to(gl.int64)
                    out = y_ptr + pair * d_out + feat + 8 * (c // 2)
                    gl.store(out, gl.sum(acc[4 * j + c], axis=0), mask=p < end)


def launch(  # noqa: PLR0917
    x: Tensor,
    groups: Any,
    w13: Tensor,
    w13_s: Tensor,
    w2: Tensor,
    w2_s: Tensor,
    h: Tensor,
    y: Tensor,
    swiglu_limit: float,
) -> None:
    """Both kernels for :func:`.fp4_moe.moe_experts_fp4` (``groups``: its
    :class:`.moe.PairGroups`; ``h``, ``y``: its hidden and per-pair outputs); :func:`usable`
    must hold."""
    experts, two_inter, d = w13.shape[0], w13.shape[1], x.shape[1]
    inter, pairs, slots = two_inter // 2, groups.rows.shape[0], groups.experts.shape[0]
    sms, common = sm_count(x.device), {"LISTED": slots < experts, "PAIRED": PAIRED_HIDDEN}
    up = _checked(OVERRIDE.get("gate_up") or pick_tiles(d, inter, pairs, slots, 2, sms), d, inter)
    _fp4_gate_up_gluon[(slots, inter // (WARP_ROWS * up.warps_n))](
        x, groups.rows, w13, w13_s, groups.scale, groups.ends, groups.experts, h, inter, d,
        float(swiglu_limit), CLAMP=swiglu_limit > 0, **common, **_flags(up),
    )  # fmt: skip
    down = _checked(OVERRIDE.get("down") or pick_tiles(inter, d, pairs, slots, 1, sms), inter, d)
    _fp4_down_gluon[(slots, d // (WARP_ROWS * down.warps_n))](
        h, w2, w2_s, groups.ends, groups.experts, groups.order, y, d, inter, **common,
        **_flags(down),
    )  # fmt: skip


def _flags(tiles: Tiles) -> dict[str, Any]:
    """A launch's constexprs and options for ``tiles``."""
    flags = {"WARPS_N": tiles.warps_n, "SPLIT_K": tiles.split_k, "N_TILES": tiles.n_tiles,
             "STAGES": tiles.stages, "num_warps": tiles.warps_n * tiles.split_k}  # fmt: skip
    if tiles.maxnreg is not None:
        flags["maxnreg"] = tiles.maxnreg
    return flags
