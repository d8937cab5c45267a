"""FP4 e2m1 weight tiles decoded in registers for the grouped expert kernels (:mod:`.fp4_moe`).

A packed byte holds two e2m1 codes (the low nibble the even element), with one ue8m0 scale
byte b, meaning 2**(b - 127), per ``GROUP`` = 32 consecutive elements along K. An e2m1 value
has at most two significant bits and the scale is a power of two, so every decoded weight is
exact in bf16 and fp32.

The codes are turned into values and multiplied by their group's scale in registers
(:func:`_fp4_tile`), on every target (Hopper has no FP4 tensor cores). A decode step reads
few bytes per weight, so the decoding's instruction count, not the bytes, sets its speed: bf16
tiles on a GPU are decoded by a few lines of inline PTX that move each nibble's bits to their
bf16 places, two weights per 32-bit instruction; fp32 tiles and the interpreter use integer
arithmetic on each code.
``tl.dot_scaled(bf16, e2m1)`` would let Triton do that upcast on sm_100a, but forced on an H200
it gave wrong results with this layout, so it is not used until checked on Blackwell.
Blackwell's native FP4 MMA would need the activations quantised to FP8 with per-32 scales: a
numerics change the reference does not make.
"""

from __future__ import annotations

import triton
import triton.language as tl

from deepinfer_kernels_sm100.fp8_quant import ue8m0_to_fp32
from deepinfer_kernels_sm100.moe import _mma

#: elements per ue8m0 scale along K (the checkpoints' FP4 group)
GROUP = 32
_GROUP = tl.constexpr(GROUP)  # for the kernels: Triton reads constexpr globals only


@triton.jit
def _e2m1_times(code, scale):
    """e2m1 codes (0..15, any int type) times fp32 scales, exactly.

    Code bits: sign, two exponent bits e, one mantissa bit m. Twice the magnitude is the
    integer m for e = 0 (the subnormals 0 and 0.5) and (2 + m) << (e - 1) otherwise (2, 3, 4,
    6, 8, 12), which fp32 holds exactly; halving and a power-of-two scale keep it exact.
    """
    code = code.to(tl.int32)
    e = (code >> 1) & 3
    m = code & 1
    twice = tl.where(e == 0, m, (2 + m) << tl.maximum(e - 1, 0))
    magnitude = twice.to(tl.float32) * 0.5
    return tl.where(code >= 8, -magnitude, magnitude) * scale


@triton.jit
def _fp4_bytes(  # noqa: PLR0917 (Triton helpers take positional arguments)
    w_rows, s_rows, k0, k_dim, col_ok, EVEN: tl.constexpr, BLOCK_K: tl.constexpr
):
    """A tile's packed bytes [BLOCK_N, BLOCK_K / 2] and ue8m0 bytes [BLOCK_N, BLOCK_K / GROUP].

    Past k_dim (a multiple of GROUP) whole groups are masked: code 0 with scale 1 is zero.
    ``EVEN`` tiles (every column in range, K a multiple of BLOCK_K) load without masks, whose
    per-byte predicates would cost about as much as decoding the byte.
    """
    kb = tl.arange(0, BLOCK_K // 2)
    kg = tl.arange(0, BLOCK_K // _GROUP)
    if EVEN:
        packed = tl.load(w_rows + k0 // 2 + kb[None, :])
        raw = tl.load(s_rows + k0 // _GROUP + kg[None, :])
    else:
        packed = tl.load(
            w_rows + k0 // 2 + kb[None, :],
            mask=col_ok[:, None] & (k0 + 2 * kb < k_dim)[None, :],
            other=0,
        )
        raw = tl.load(
            s_rows + k0 // _GROUP + kg[None, :],
            mask=col_ok[:, None] & (k0 + kg * _GROUP < k_dim)[None, :],
            other=127,
        )
    return packed, raw


#: bf16 values of the low (``lo``) or high nibbles of 4 packed bytes ($2) times their
#: multipliers ($3, $4: two bf16 each), into $0 and $1 (two bf16 each). A nibble's sign,
#: exponent and mantissa bits are moved to their bf16 places: the bf16 number they make is the
#: e2m1 value times 2**-126 (a subnormal for e2m1's own subnormal 0.5 and for 0), so
#: multiplying by 2**126 and by the power-of-two scale gives the weight exactly (bf16
#: arithmetic keeps subnormals; the product leaves bf16's range only where it leaves fp32's).
#: Two bf16 per 32-bit register. ``{bias}``: the 2**126 product, left out where the multiplier
#: already holds it (``SCALES_FIT``: 2**(b - 1), one bf16x2 product per two weights fewer).
_E2M1_BF16_ASM = """
{{
.reg .b32 lo, hi, t, big;
mov.b32 big, 0x7E807E80;
prmt.b32 lo, $2, 0, 0x4140;
prmt.b32 hi, $2, 0, 0x4342;
{decode_lo}
{decode_hi}
{bias}
mul.rn.bf16x2 $0, lo, $3;
mul.rn.bf16x2 $1, hi, $4;
}}
"""
_BIAS = "mul.rn.bf16x2 lo, lo, big;\nmul.rn.bf16x2 hi, hi, big;"
#: per register of two bytes (one in each 16-bit half): nibble bits to bf16 bits
_NIBBLE_TO_BF16 = {
    "lo": "and.b32 t, {r}, 0x00080008; and.b32 {r}, {r}, 0x00070007; "
    "shl.b32 t, t, 12; shl.b32 {r}, {r}, 6; or.b32 {r}, {r}, t;",
    "hi": "and.b32 t, {r}, 0x00800080; and.b32 {r}, {r}, 0x00700070; "
    "shl.b32 t, t, 8; shl.b32 {r}, {r}, 2; or.b32 {r}, {r}, t;",
}


def _asm(nibble: str, bias: bool) -> tl.constexpr:
    decode = _NIBBLE_TO_BF16[nibble]
    return tl.constexpr(
        _E2M1_BF16_ASM.format(
            decode_lo=decode.format(r="lo"),
            decode_hi=decode.format(r="hi"),
            bias=_BIAS if bias else "",
        )
    )


_ASM_LO, _ASM_HI = _asm("lo", bias=True), _asm("hi", bias=True)
_ASM_LO_FIT, _ASM_HI_FIT = _asm("lo", bias=False), _asm("hi", bias=False)


@triton.jit
def _nibbles_bf16(packed, mult, SCALES_FIT: tl.constexpr):
    """bf16 weights of the packed bytes' low and high nibbles, times ``mult`` (bf16, the
    bytes' shape: the scales, or with ``SCALES_FIT`` the scales times 2**126), through the
    inline PTX above."""
    if SCALES_FIT:
        lo = tl.inline_asm_elementwise(
            _ASM_LO_FIT, "=r,=r,r,r,r", [packed, mult], dtype=tl.bfloat16, is_pure=True, pack=4
        )
        hi = tl.inline_asm_elementwise(
            _ASM_HI_FIT, "=r,=r,r,r,r", [packed, mult], dtype=tl.bfloat16, is_pure=True, pack=4
        )
    else:
        lo = tl.inline_asm_elementwise(
            _ASM_LO, "=r,=r,r,r,r", [packed, mult], dtype=tl.bfloat16, is_pure=True, pack=4
        )
        hi = tl.inline_asm_elementwise(
            _ASM_HI, "=r,=r,r,r,r", [packed, mult], dtype=tl.bfloat16, is_pure=True, pack=4
        )
    return lo, hi


@triton.jit
def _fp4_tile(  # noqa: PLR0917 (Triton helpers take positional arguments)
    packed,
    raw,
    DTYPE: tl.constexpr,
    NATIVE: tl.constexpr,
    SCALES_FIT: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """[BLOCK_N, BLOCK_K] weights in DTYPE (exact) from their packed and scale bytes.

    ``SCALES_FIT`` (the caller's promise that no scale byte exceeds 128) lets bf16 tiles on a
    GPU fold the decoding's 2**126 into each scale: one bf16x2 product per two weights fewer.

    Both nibbles of a byte lie in the same group of 32, so each group's scale is spread over
    its 16 bytes; the low and high values are interleaved back into K order with a join.
    bf16 tiles on a GPU (``NATIVE``) are decoded by inline PTX, two weights per 32-bit
    instruction; fp32 tiles, and every tile under the interpreter, with integer arithmetic.
    """
    native: tl.constexpr = NATIVE and tl.bfloat16 == DTYPE
    if native and SCALES_FIT:
        # 2**126 * 2**(b - 127) = 2**(b - 1), a normal bf16 for b <= 128: bits (b + 126) << 7
        scale = ((raw.to(tl.int32) + 126) << 7).to(tl.int16).to(tl.bfloat16, bitcast=True)
    elif native:  # exact: a power of two in fp32's range is a bf16 value
        scale = ue8m0_to_fp32(raw).to(tl.bfloat16)
    else:
        scale = ue8m0_to_fp32(raw)
    scale = tl.broadcast_to(scale[:, :, None], (BLOCK_N, BLOCK_K // _GROUP, _GROUP // 2))
    scale = tl.reshape(scale, (BLOCK_N, BLOCK_K // 2))
    if native:
        lo, hi = _nibbles_bf16(packed, scale, SCALES_FIT)
    else:
        lo = _e2m1_times(packed & 0xF, scale).to(DTYPE)
        hi = _e2m1_times(packed >> 4, scale).to(DTYPE)
    return tl.reshape(tl.join(lo, hi), (BLOCK_N, BLOCK_K))


@triton.jit
def fp4_step(  # noqa: PLR0917 (Triton helpers take positional arguments)
    acc,
    x,
    w_rows,
    s_rows,
    k0,
    k_dim,
    col_ok,
    IEEE: tl.constexpr,
    WIDEN: tl.constexpr,
    EVEN: tl.constexpr,
    SCALES_FIT: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """acc + x @ W[:, k0:k0 + BLOCK_K].T for the FP4 rows W at w_rows (scales at s_rows)."""
    packed, raw = _fp4_bytes(w_rows, s_rows, k0, k_dim, col_ok, EVEN, BLOCK_K)
    w = _fp4_tile(packed, raw, x.dtype, not WIDEN, SCALES_FIT, BLOCK_N, BLOCK_K)
    return _mma(x, w, acc, IEEE, WIDEN)
