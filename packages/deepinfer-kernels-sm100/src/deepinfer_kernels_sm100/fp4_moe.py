"""Routed SwiGLU experts computed from the stored FP4 e2m1 weights, as two grouped kernels.

DeepSeek-V4's instruct checkpoints store each routed expert's w1 (gate), w3 (up) and w2 (down)
as FP4 e2m1 codes, two per byte (the low nibble holds the even element), with one ue8m0 scale
byte b, meaning 2**(b - 127), per 32 consecutive elements along the input (K) dim. Dequantised
to bf16 they take nearly four times the memory, and a decode step streams as many more bytes. Here
the packed bytes stay as they are and each weight tile is decoded in registers right before
its dot, so the experts' weights cost half a byte per element on the device and in each step.

Layout (:func:`moe_experts_fp4`), mirroring :func:`deepinfer_kernels_sm100.moe.moe_experts`:
``w13_packed`` [E, 2I, d / 2] uint8 stacks each expert's w1 rows over its w3 rows (the
checkpoint's ``w1.weight`` and ``w3.weight``, [I, d / 2] each, concatenated along rows, as
transformers' ``gate_up_proj`` and vLLM's ``w13`` stack them), ``w13_scale`` [E, 2I, d / 32]
their ue8m0 bytes; ``w2_packed`` [E, d, I / 2] and ``w2_scale`` [E, d, I / 32] the down
projections. One tensor for both halves lets a program read the gate and up rows of the same
output columns against the same activation tile.

The maths is that of :func:`moe.moe_experts` on weights dequantised to the activations' dtype,
and so are the kernels' structure and the pair grouping (:func:`moe.group_pairs`, no host
syncs). An e2m1 value has at most two significant bits and the scale is a power of two, so
every dequantised weight is exact in bf16 (whose exponent range is fp32's): decoding adds no
rounding, and bf16 activations meet the weights in the bf16 tensor-core dots, accumulated in
fp32; fp32 activations meet them in IEEE fp32 dots, as the fp32 reference's do. The hidden
activation is rounded to the activations' dtype before w2, as the reference rounds it to the
weights' dtype.

Decoding: the codes are turned into values and multiplied by their group's scale in registers
(:func:`_fp4_tile`), on every target (Hopper has no FP4 tensor cores). A decode step reads
few bytes per weight, so the decoding's instruction count, not the bytes, sets its speed: bf16
tiles on a GPU are decoded by a few lines of inline PTX that move each nibble's bits to their
bf16 places, two weights per 32-bit instruction; fp32 tiles and the interpreter use integer
arithmetic on each code.
``tl.dot_scaled(bf16, e2m1)`` would let Triton do that upcast on sm_100a, but forced on an H200
it gave wrong results with this layout, so it is not used until checked on Blackwell.
Blackwell's native FP4 MMA would need the activations quantised to FP8 with per-32 scales: a
numerics change the reference does not make.

Under the interpreter (CI, no GPU) tiles are widened to fp32 before the dots (``moe._WIDEN``:
its bf16 dots are wrong) and the fp32 -> bf16 rounding of the hidden activation is done in
fp32 first (``fp8_linear._round_to_grid``: its conversion truncates).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from deepinfer.models.quant import is_ue8m0_dtype
from deepinfer_kernels_sm100.fp8_linear import _round_to_grid, _ue8m0_to_fp32
from deepinfer_kernels_sm100.moe import _WIDEN, _expert_range, _mma, _tile, group_pairs

#: elements per ue8m0 scale along K (the checkpoints' FP4 group)
GROUP = 32
_GROUP = tl.constexpr(GROUP)  # for the kernels: Triton reads constexpr globals only
#: up to this many pairs per expert on average, row tiles of 16; past it 64 (as moe.py)
SMALL_PAIRS_PER_EXPERT = 64
_ACT_DTYPES = (torch.bfloat16, torch.float32)
_PACKED_DTYPES = tuple(
    dt for dt in (torch.uint8, torch.int8, getattr(torch, "float4_e2m1fn_x2", None)) if dt
)


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


#: bf16 values of the low (``lo``) or high nibbles of 4 packed bytes ($2) times their scales
#: ($3, $4: two bf16 each), into $0 and $1 (two bf16 each). A nibble's sign, exponent and
#: mantissa bits are moved to their bf16 places: the bf16 number they make is the e2m1 value
#: times 2**-126 (a subnormal for e2m1's own subnormal 0.5 and for 0), so multiplying by
#: 2**126 and then by the power-of-two scale gives the weight exactly (bf16 arithmetic keeps
#: subnormals; the product leaves bf16's range only where it leaves fp32's). Two bf16 per
#: 32-bit register: about four instructions per weight.
_E2M1_BF16_ASM = """
{{
.reg .b32 lo, hi, t, big;
mov.b32 big, 0x7E807E80;
prmt.b32 lo, $2, 0, 0x4140;
prmt.b32 hi, $2, 0, 0x4342;
{decode_lo}
{decode_hi}
mul.rn.bf16x2 lo, lo, big;
mul.rn.bf16x2 hi, hi, big;
mul.rn.bf16x2 $0, lo, $3;
mul.rn.bf16x2 $1, hi, $4;
}}
"""
#: per register of two bytes (one in each 16-bit half): nibble bits to bf16 bits
_NIBBLE_TO_BF16 = {
    "lo": "and.b32 t, {r}, 0x00080008; and.b32 {r}, {r}, 0x00070007; "
    "shl.b32 t, t, 12; shl.b32 {r}, {r}, 6; or.b32 {r}, {r}, t;",
    "hi": "and.b32 t, {r}, 0x00800080; and.b32 {r}, {r}, 0x00700070; "
    "shl.b32 t, t, 8; shl.b32 {r}, {r}, 2; or.b32 {r}, {r}, t;",
}
_ASM_LO = tl.constexpr(
    _E2M1_BF16_ASM.format(
        decode_lo=_NIBBLE_TO_BF16["lo"].format(r="lo"),
        decode_hi=_NIBBLE_TO_BF16["lo"].format(r="hi"),
    )
)
_ASM_HI = tl.constexpr(
    _E2M1_BF16_ASM.format(
        decode_lo=_NIBBLE_TO_BF16["hi"].format(r="lo"),
        decode_hi=_NIBBLE_TO_BF16["hi"].format(r="hi"),
    )
)


@triton.jit
def _nibbles_bf16(packed, scale):
    """bf16 weights of the packed bytes' low and high nibbles, times ``scale`` (bf16, the
    bytes' shape), through the inline PTX above."""
    lo = tl.inline_asm_elementwise(
        _ASM_LO, "=r,=r,r,r,r", [packed, scale], dtype=tl.bfloat16, is_pure=True, pack=4
    )
    hi = tl.inline_asm_elementwise(
        _ASM_HI, "=r,=r,r,r,r", [packed, scale], dtype=tl.bfloat16, is_pure=True, pack=4
    )
    return lo, hi


@triton.jit
def _fp4_tile(  # noqa: PLR0917 (Triton helpers take positional arguments)
    packed,
    raw,
    DTYPE: tl.constexpr,
    NATIVE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """[BLOCK_N, BLOCK_K] weights in DTYPE (exact) from their packed and scale bytes.

    Both nibbles of a byte lie in the same group of 32, so each group's scale is spread over
    its 16 bytes; the low and high values are interleaved back into K order with a join.
    bf16 tiles on a GPU (``NATIVE``) are decoded by inline PTX, two weights per 32-bit
    instruction; fp32 tiles, and every tile under the interpreter, with integer arithmetic.
    """
    scale = _ue8m0_to_fp32(raw)
    native: tl.constexpr = NATIVE and tl.bfloat16 == DTYPE
    if native:  # exact: a power of two in fp32's range is a bf16 value
        scale = scale.to(tl.bfloat16)
    scale = tl.broadcast_to(scale[:, :, None], (BLOCK_N, BLOCK_K // _GROUP, _GROUP // 2))
    scale = tl.reshape(scale, (BLOCK_N, BLOCK_K // 2))
    if native:
        lo, hi = _nibbles_bf16(packed, scale)
    else:
        lo = _e2m1_times(packed & 0xF, scale).to(DTYPE)
        hi = _e2m1_times(packed >> 4, scale).to(DTYPE)
    return tl.reshape(tl.join(lo, hi), (BLOCK_N, BLOCK_K))


@triton.jit
def _fp4_step(  # noqa: PLR0917 (Triton helpers take positional arguments)
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
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """acc + x @ W[:, k0:k0 + BLOCK_K].T for the FP4 rows W at w_rows (scales at s_rows)."""
    packed, raw = _fp4_bytes(w_rows, s_rows, k0, k_dim, col_ok, EVEN, BLOCK_K)
    w = _fp4_tile(packed, raw, x.dtype, not WIDEN, BLOCK_N, BLOCK_K)
    return _mma(x, w, acc, IEEE, WIDEN)


@triton.jit
def _act_tile(rows, row_ok, k0, kk, k_dim, EVEN: tl.constexpr):  # noqa: PLR0917
    """Activation rows' columns k0 + kk (zero past k_dim, unless ``EVEN`` says none are)."""
    if EVEN:
        return tl.load(rows + k0, mask=row_ok[:, None], other=0.0)
    return tl.load(rows + k0, mask=row_ok[:, None] & ((k0 + kk) < k_dim)[None, :], other=0.0)


@triton.jit
def _fp4_gate_up_kernel(  # noqa: PLR0917 (Triton kernels take positional arguments)
    x_ptr,  # [N, K] bf16 / fp32 token inputs
    token_ptr,  # [P] token row of each sorted pair
    w_ptr,  # [E, 2I, K / 2] packed e2m1, gate rows over up rows
    ws_ptr,  # [E, 2I, K / GROUP] ue8m0 bytes
    scale_ptr,  # [P] router weights (fp32)
    ends_ptr,  # [E] int32
    h_ptr,  # [P, I] out, in x's dtype
    inter,
    k_dim,
    limit,
    CLAMP: tl.constexpr,
    IEEE: tl.constexpr,
    WIDEN: tl.constexpr,
    EVEN: tl.constexpr,  # K a multiple of BLOCK_K and I of BLOCK_N: no masks along them
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """h = silu(min(gate, l)) * clamp(up, -l, l) * router weight for one (expert, column tile)."""
    e = tl.program_id(0).to(tl.int64)  # E * 2I * K / 2 bytes pass 2**31 at V4-Flash's shapes
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < inter
    start, end = _expert_range(ends_ptr, e)
    gate_rows = e * 2 * inter + cols
    w_gate = w_ptr + gate_rows[:, None] * (k_dim // 2)
    w_up = w_gate + inter * (k_dim // 2)
    s_gate = ws_ptr + gate_rows[:, None] * (k_dim // _GROUP)
    s_up = s_gate + inter * (k_dim // _GROUP)
    kk = tl.arange(0, BLOCK_K)
    for m0 in range(start, end, BLOCK_M):
        rows = m0 + tl.arange(0, BLOCK_M)
        row_ok = rows < end
        token = tl.load(token_ptr + rows, mask=row_ok, other=0).to(tl.int64)
        gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, k_dim, BLOCK_K):
            x = _act_tile(x_ptr + token[:, None] * k_dim + kk[None, :], row_ok, k0, kk, k_dim, EVEN)
            gate = _fp4_step(
                gate, x, w_gate, s_gate, k0, k_dim, col_ok, IEEE, WIDEN, EVEN,
                BLOCK_N, BLOCK_K,
            )  # fmt: skip
            up = _fp4_step(
                up, x, w_up, s_up, k0, k_dim, col_ok, IEEE, WIDEN, EVEN, BLOCK_N, BLOCK_K
            )
        if CLAMP:
            gate = tl.minimum(gate, limit)
            up = tl.minimum(tl.maximum(up, -limit), limit)
        scale = tl.load(scale_ptr + rows, mask=row_ok, other=0.0)
        h = gate * tl.sigmoid(gate) * up * scale[:, None]
        if WIDEN and not IEEE:
            h = _round_to_grid(h, 7, -119)  # bf16, rounded as the GPU's conversion rounds
        tl.store(
            h_ptr + rows[:, None].to(tl.int64) * inter + cols[None, :],
            h.to(h_ptr.dtype.element_ty),
            mask=row_ok[:, None] & col_ok[None, :],
        )


@triton.jit
def _fp4_down_kernel(  # noqa: PLR0917 (Triton kernels take positional arguments)
    h_ptr,  # [P, I] bf16 / fp32
    w_ptr,  # [E, D, I / 2] packed e2m1
    ws_ptr,  # [E, D, I / GROUP] ue8m0 bytes
    ends_ptr,  # [E] int32
    order_ptr,  # [P] (token, slot) pair of each sorted pair
    y_ptr,  # [P, D] fp32 out, by (token, slot) pair
    d_out,
    inter,
    IEEE: tl.constexpr,
    WIDEN: tl.constexpr,
    EVEN: tl.constexpr,  # I a multiple of BLOCK_K and D of BLOCK_N: no masks along them
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """y = h @ w2.T for one (expert, output column tile), written at each pair's own row."""
    e = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < d_out
    start, end = _expert_range(ends_ptr, e)
    w_rows = w_ptr + (e * d_out + cols)[:, None] * (inter // 2)
    s_rows = ws_ptr + (e * d_out + cols)[:, None] * (inter // _GROUP)
    kk = tl.arange(0, BLOCK_K)
    for m0 in range(start, end, BLOCK_M):
        rows = m0 + tl.arange(0, BLOCK_M)
        row_ok = rows < end
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, inter, BLOCK_K):
            h_rows = h_ptr + rows[:, None].to(tl.int64) * inter + kk[None, :]
            h = _act_tile(h_rows, row_ok, k0, kk, inter, EVEN)
            acc = _fp4_step(
                acc, h, w_rows, s_rows, k0, inter, col_ok, IEEE, WIDEN, EVEN,
                BLOCK_N, BLOCK_K,
            )  # fmt: skip
        pair = tl.load(order_ptr + rows, mask=row_ok, other=0).to(tl.int64)
        tl.store(
            y_ptr + pair[:, None] * d_out + cols[None, :],
            acc,
            mask=row_ok[:, None] & col_ok[None, :],
        )


def _packed(name: str, t: Tensor, shape: tuple[int, ...]) -> Tensor:
    """A packed e2m1 tensor of ``shape`` as uint8 bytes (bit-viewed), else ValueError."""
    if t.dtype not in _PACKED_DTYPES or tuple(t.shape) != shape:
        raise ValueError(
            f"{name} must be packed e2m1 bytes {shape} (uint8, int8 or float4_e2m1fn_x2), "
            f"got {t.dtype} {tuple(t.shape)}"
        )
    return t.contiguous().view(torch.uint8)


def _scales(name: str, t: Tensor, shape: tuple[int, ...]) -> Tensor:
    """ue8m0 scales of ``shape`` as uint8 bytes (bit-viewed, never converted), else ValueError."""
    if not is_ue8m0_dtype(t.dtype) or tuple(t.shape) != shape:
        raise ValueError(
            f"{name} must be ue8m0 bytes {shape} (uint8, int8 or float8_e8m0fnu), "
            f"got {t.dtype} {tuple(t.shape)}"
        )
    return t.contiguous().view(torch.uint8)


def _check_routing(x: Tensor, weights: Tensor, indices: Tensor) -> None:
    if x.dim() != 2 or x.dtype not in _ACT_DTYPES:
        raise ValueError(f"x must be [N, d] bf16 or fp32, got {x.dtype} {tuple(x.shape)}")
    if indices.dim() != 2 or indices.shape[0] != x.shape[0] or indices.is_floating_point():
        raise ValueError(
            f"indices must be integer [N, k] with N = {x.shape[0]}, got "
            f"{indices.dtype} {tuple(indices.shape)}"
        )
    if weights.shape != indices.shape or not weights.is_floating_point():
        raise ValueError(
            f"weights must be float {tuple(indices.shape)} like indices, got "
            f"{weights.dtype} {tuple(weights.shape)}"
        )


def _operands(
    x: Tensor, w13_packed: Tensor, w13_scale: Tensor, w2_packed: Tensor, w2_scale: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The four weight tensors as uint8 bytes, their shapes checked against x's d."""
    d = x.shape[1]
    if w13_packed.dim() != 3 or w2_packed.dim() != 3:
        raise ValueError(
            f"w13_packed and w2_packed must be [E, rows, cols / 2], got "
            f"{tuple(w13_packed.shape)} and {tuple(w2_packed.shape)}"
        )
    experts, two_inter = w13_packed.shape[:2]
    inter = two_inter // 2
    if d <= 0 or d % GROUP or inter <= 0 or inter % GROUP or two_inter % 2:
        raise ValueError(
            f"d (x's features) and I (half of w13_packed's rows) must be positive multiples "
            f"of {GROUP}, got d = {d}, 2I = {two_inter}"
        )
    return (
        _packed("w13_packed", w13_packed, (experts, 2 * inter, d // 2)),
        _scales("w13_scale", w13_scale, (experts, 2 * inter, d // GROUP)),
        _packed("w2_packed", w2_packed, (experts, d, inter // 2)),
        _scales("w2_scale", w2_scale, (experts, d, inter // GROUP)),
    )


def moe_experts_fp4(
    x: Tensor,
    weights: Tensor,
    indices: Tensor,
    *,
    w13_packed: Tensor,
    w13_scale: Tensor,
    w2_packed: Tensor,
    w2_scale: Tensor,
    swiglu_limit: float,
) -> Tensor:
    """The backend's ``moe_experts`` on FP4 experts: fp32 [N, d] weighted sum of each token's
    experts, for ``x`` [N, d] bf16 or fp32 and routing ``weights``/``indices`` [N, k] (an
    index < 0 is "no expert").

    Weights as the module doc lays them out: ``w13_packed`` [E, 2I, d / 2], ``w13_scale``
    [E, 2I, d / 32], ``w2_packed`` [E, d, I / 2], ``w2_scale`` [E, d, I / 32]; packed bytes as
    uint8, int8 or float4_e2m1fn_x2, scales as uint8, int8 or float8_e8m0fnu; d and I multiples
    of 32. The dots run in x's dtype (module doc). Bad shapes or dtypes raise ValueError.
    """
    _check_routing(x, weights, indices)
    w13, w13_s, w2, w2_s = _operands(x, w13_packed, w13_scale, w2_packed, w2_scale)
    num_experts, d_in = w13.shape[0], x.shape[1]
    inter, d_out = w13.shape[1] // 2, d_in
    rows, order, scale, ends = group_pairs(weights, indices, num_experts)
    pairs = rows.shape[0]
    ieee = x.dtype == torch.float32
    h = torch.empty(pairs, inter, dtype=x.dtype, device=x.device)
    # Pairs without an expert are never computed: their rows stay zero.
    y = torch.zeros(pairs, d_out, dtype=torch.float32, device=x.device)
    if pairs:
        block_m = 16 if pairs <= SMALL_PAIRS_PER_EXPERT * num_experts else 64
        flags = {"IEEE": ieee, "WIDEN": _WIDEN, "BLOCK_M": block_m}
        # fp32 dots run on the FMA units, whose operands all sit in registers: one group per
        # K step keeps them there; bf16 tiles go to the tensor cores four groups at a time.
        # Decode (16-row tiles) streams each expert's weight through narrow column tiles, so
        # more programs share the decoding; prefill reuses each decoded tile over 64 rows.
        most_k = GROUP if ieee else 4 * GROUP
        most_n = 64 if ieee else (32 if block_m == 16 else 128)
        bn, bk = _tile(inter, most_n), _tile(d_in, most_k)
        _fp4_gate_up_kernel[(num_experts, triton.cdiv(inter, bn))](
            x.contiguous(),
            rows,
            w13,
            w13_s,
            scale,
            ends,
            h,
            inter,
            d_in,
            float(swiglu_limit),
            CLAMP=swiglu_limit > 0,
            EVEN=d_in % bk == 0 and inter % bn == 0,
            BLOCK_N=bn,
            BLOCK_K=bk,
            **flags,
        )
        bn, bk = _tile(d_out, most_n), _tile(inter, most_k)
        even = inter % bk == 0 and d_out % bn == 0
        _fp4_down_kernel[(num_experts, triton.cdiv(d_out, bn))](
            h, w2, w2_s, ends, order, y, d_out, inter, EVEN=even, BLOCK_N=bn, BLOCK_K=bk, **flags
        )
    # Each token's k slots summed in slot order, as the reference's combine does.
    return y.view(-1, indices.shape[-1], d_out).sum(dim=1)
