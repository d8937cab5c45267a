"""The K loop of :mod:`.fp4_gluon`'s kernels: a warp's weights decoded in registers into
``mma.sync.m16n8k16`` operands, each thread holding one element of every tensor.

* A dot over K is the same under any permutation of K applied to both operands. Word q of a
  lane's 16 bytes of a K step holds nibbles n0..n7 (elements 8q .. 8q + 7 of its group);
  :data:`_DECODE` turns it into four bf16x2 registers pairing n_i with n_(i+4) (a mask, one
  multiply that puts the magnitude and sign bits in place, a mask, a bf16x2 product with the
  scale): the A registers of two k16 blocks. Their B registers pair the activations alike (a
  byte permute each, :data:`_PAIRS`); the down kernel reads a hidden activation stored in
  that order.
* The decoding is exact, as :mod:`.fp4_decode`'s: the nibble's bits in a bf16 are the e2m1
  value times 2**-126, and ``scales_fit`` (no scale byte above 128) makes 2**(b - 1) a normal
  bf16 that carries the 2**126, so one product per two weights gives each weight.
* Latency: a warp holds ``stages`` K steps of weights in registers, the next ones' loads in
  flight while one is decoded, and the activations one step ahead (:func:`_k_loop`). Weights
  are read with an L2 prefetch hint and past L1; activations, which every warp reads, through
  L1.
* A loop may run over several pairs' weights in turn (:func:`_at`: step i of the walk is K
  step i % PER of pair i // PER): :mod:`.fp4_gluon_sum` adds a token's pairs that way, its
  loads running on from one expert's rows into the next.
"""

from __future__ import annotations

try:  # Gluon ships with Triton 3.5 and later
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl

    HAVE_GLUON = True
except ImportError:  # pragma: no cover - older Triton: the Triton kernels serve
    HAVE_GLUON = False

if HAVE_GLUON:
    from deepinfer_kernels_sm100.gluon_common import lanes

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
    def _at(i, route, PER: gl.constexpr):
        """K step ``i``'s offsets from the loop's first pointers: (weight bytes, scale bytes,
        activation elements). PER 0: step i of the warp's own K. Else ``route`` is (the
        token's expert indices, bytes between experts' weights and scales, elements between
        pairs' activations), and step i is step i % PER of pair i // PER, at its expert's rows
        and its own activations (an index < 0 reads expert 0, against a zero activation)."""
        if PER == 0:
            w, s, x = 64 * i, 4 * i, 128 * i
        else:
            experts, w_stride, s_stride, x_stride = route
            pair, step = i // PER, i % PER
            e = gl.maximum(gl.load(experts + pair), 0).to(gl.int64)
            w, s = e * w_stride + 64 * step, e * s_stride + 4 * step
            x = pair * x_stride + 128 * step
        return w, s, x

    @gluon.jit
    def _load_w(wp, sp, at, G: gl.constexpr):
        """The weight registers of the K step at offsets ``at`` (:func:`_at`): 4 words and a
        scale byte for each of 2G rows."""
        words = ()
        scales = ()
        for r in gl.static_range(2 * G):
            words = words + (_asm4(_LD_W, "=r,=r,=r,=r,l", (wp[r] + at[0],), gl.int32),)  # noqa: RUF005
            scales = scales + (gl.load(sp[r] + at[1]).to(gl.int32),)  # noqa: RUF005
        return words, scales

    @gluon.jit
    def _load_x(xp, at, T: gl.constexpr):
        """The activation registers of the K step at offsets ``at``: 16 words for each of the
        T token tiles."""
        xs = ()
        for j in gl.static_range(T):
            for v in gl.static_range(4):
                xs = xs + _asm4(_LD_X, "=r,=r,=r,=r,l", (xp[j] + (at[2] + 8 * v),), gl.int32)
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
                STAGES: gl.constexpr, PAIRED: gl.constexpr, route=None,
                PER: gl.constexpr = 0):  # fmt: skip
        """acc + the warp's ``steps`` K steps (``route``, PER: as :func:`_at` walks them):
        STAGES steps of weights in registers, each refilled with the step STAGES on once
        decoded (the loop unrolled STAGES times: no register copies on its back edge), and
        the activations (L1, L2) one step on."""
        bufs = ()
        for s in gl.static_range(STAGES):
            bufs = bufs + (_load_w(wp, sp, _at(s, route, PER), G),)  # noqa: RUF005
        xs = _load_x(xp, _at(0, route, PER), T)
        for i0 in range(0, steps - STAGES, STAGES):
            for s in gl.static_range(STAGES):
                ahead = _load_x(xp, _at(i0 + s + 1, route, PER), T)
                acc = _step(acc, bufs[s], xs, G, T, PAIRED)
                refill = _load_w(wp, sp, _at(i0 + s + STAGES, route, PER), G)
                bufs = bufs[:s] + (refill,) + bufs[s + 1 :]  # noqa: RUF005
                xs = ahead
        for s in gl.static_range(STAGES):
            if s + 1 < STAGES:
                ahead = _load_x(xp, _at(steps - STAGES + s + 1, route, PER), T)
            acc = _step(acc, bufs[s], xs, G, T, PAIRED)
            if s + 1 < STAGES:
                xs = ahead
        return acc

    @gluon.jit
    def _lane_ids(k_dim, WARPS_N: gl.constexpr, SPLIT_K: gl.constexpr):
        """(feature of row g, g, t over [32 WARPS_N]; first K element of each warp
        [SPLIT_K, 1]; K steps a warp)."""
        layout: gl.constexpr = lanes(SPLIT_K, WARPS_N)
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
    def _zeros(n: gl.constexpr, WARPS_N: gl.constexpr, SPLIT_K: gl.constexpr):
        zero = gl.zeros([SPLIT_K, 32 * WARPS_N], gl.float32, lanes(SPLIT_K, WARPS_N))
        return (zero,) * n
