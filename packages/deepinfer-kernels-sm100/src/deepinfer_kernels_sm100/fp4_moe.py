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
and so are the kernels' structure and the pair grouping (:func:`moe_group.group_pairs`, no host
syncs). An e2m1 value has at most two significant bits and the scale is a power of two, so
every dequantised weight is exact in bf16 (whose exponent range is fp32's): decoding adds no
rounding, and bf16 activations meet the weights in the bf16 tensor-core dots, accumulated in
fp32; fp32 activations meet them in IEEE fp32 dots, as the fp32 reference's do. The hidden
activation is rounded to the activations' dtype before w2, as the reference rounds it to the
weights' dtype.

Decoding: each weight tile is decoded in registers right before its dot (:mod:`.fp4_decode`).
Under the interpreter (CI, no GPU) tiles are widened to fp32 before the dots (``moe._WIDEN``:
its bf16 dots are wrong) and the fp32 -> bf16 rounding of the hidden activation is done in
fp32 first (``fp8_quant.round_to_grid``: its conversion truncates).

On Hopper, decode batches of bf16 activations with ``scales_fit`` run :mod:`.fp4_gluon`'s
kernels instead: the same sums (up to the order of the K products) with every register placed
by hand; the ``kernel`` argument forces either.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from deepinfer.models.quant import is_ue8m0_dtype
from deepinfer_kernels_sm100 import fp4_gluon
from deepinfer_kernels_sm100.fp4_decode import _GROUP, GROUP, fp4_step
from deepinfer_kernels_sm100.fp8_quant import round_to_grid
from deepinfer_kernels_sm100.moe import _WIDEN, _slot_range, _tile, slot_sum
from deepinfer_kernels_sm100.moe_group import PairGroups, group_pairs

#: up to this many pairs per expert on average, row tiles of 16; past it the prefill tiles.
#: Decode tiles cost in proportion to their count, prefill tiles about the same from one row
#: to 128: on the H200 (benchmarks/results/low_precision_h200.json, fp4_prefill_tiles_5934eae)
#: the 16-row tiles win at 36 pairs an expert and lose at 48.
SMALL_PAIRS_PER_EXPERT = 40
#: up to this many (token, expert) pairs, gate/up takes 32-column tiles, four K steps in flight
FEW_PAIRS = 8
_ACT_DTYPES = (torch.bfloat16, torch.float32)
_PACKED_DTYPES = tuple(
    dt for dt in (torch.uint8, torch.int8, getattr(torch, "float4_e2m1fn_x2", None)) if dt
)


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
    experts_ptr,  # [slots] int32
    h_ptr,  # [P, I] out, in x's dtype
    inter,
    k_dim,
    limit,
    CLAMP: tl.constexpr,
    IEEE: tl.constexpr,
    WIDEN: tl.constexpr,
    LISTED: tl.constexpr,  # fewer slots than experts: each slot's expert read from the list
    EVEN: tl.constexpr,  # K a multiple of BLOCK_K and I of BLOCK_N: no masks along them
    SCALES_FIT: tl.constexpr,  # no scale byte above 128 (fp4_decode._fp4_tile)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """h = silu(min(gate, l)) * clamp(up, -l, l) * router weight for one (slot, column tile)."""
    # e is int64: E * 2I * K / 2 bytes pass 2**31 at V4-Flash's shapes
    e, start, end = _slot_range(experts_ptr, ends_ptr, tl.program_id(0), LISTED)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < inter
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
            gate = fp4_step(
                gate, x, w_gate, s_gate, k0, k_dim, col_ok, IEEE, WIDEN, EVEN, SCALES_FIT,
                BLOCK_N, BLOCK_K,
            )  # fmt: skip
            up = fp4_step(
                up, x, w_up, s_up, k0, k_dim, col_ok, IEEE, WIDEN, EVEN, SCALES_FIT,
                BLOCK_N, BLOCK_K,
            )  # fmt: skip
        if CLAMP:
            gate = tl.minimum(gate, limit)
            up = tl.minimum(tl.maximum(up, -limit), limit)
        scale = tl.load(scale_ptr + rows, mask=row_ok, other=0.0)
        h = gate * tl.sigmoid(gate) * up * scale[:, None]
        if WIDEN and not IEEE:
            h = round_to_grid(h, 7, -119)  # bf16, rounded as the GPU's conversion rounds
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
    experts_ptr,  # [slots] int32
    order_ptr,  # [P] (token, slot) pair of each sorted pair
    y_ptr,  # [P, D] fp32 out, by (token, slot) pair
    d_out,
    inter,
    IEEE: tl.constexpr,
    WIDEN: tl.constexpr,
    LISTED: tl.constexpr,  # fewer slots than experts: each slot's expert read from the list
    EVEN: tl.constexpr,  # I a multiple of BLOCK_K and D of BLOCK_N: no masks along them
    SCALES_FIT: tl.constexpr,  # no scale byte above 128 (fp4_decode._fp4_tile)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """y = h @ w2.T for one (slot, output column tile), written at each pair's own row."""
    e, start, end = _slot_range(experts_ptr, ends_ptr, tl.program_id(0), LISTED)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < d_out
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
            acc = fp4_step(
                acc, h, w_rows, s_rows, k0, inter, col_ok, IEEE, WIDEN, EVEN, SCALES_FIT,
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
    scales_fit: bool = False,
    kernel: str = "auto",
    residual: Tensor | None = None,
    out_dtype: torch.dtype = torch.float32,
) -> Tensor:
    """The backend's ``moe_experts`` on FP4 experts: fp32 [N, d] weighted sum of each token's
    experts, for ``x`` [N, d] bf16 or fp32 and routing ``weights``/``indices`` [N, k] (an
    index < 0 is "no expert").

    Weights as the module doc lays them out: ``w13_packed`` [E, 2I, d / 2], ``w13_scale``
    [E, 2I, d / 32], ``w2_packed`` [E, d, I / 2], ``w2_scale`` [E, d, I / 32]; packed bytes as
    uint8, int8 or float4_e2m1fn_x2, scales as uint8, int8 or float8_e8m0fnu; d and I multiples
    of 32. The dots run in x's dtype (module doc). Bad shapes or dtypes raise ValueError.
    ``scales_fit`` promises that no scale byte exceeds 128 (scales of at most 2, weights of at
    most 12): bf16 decoding on a GPU then takes one bf16x2 product per two weights fewer. Not
    checked here (that would read every scale byte each call): a byte above 128 then gives
    wrong weights. The caller checks once, when the weights are loaded.
    ``residual``/``out_dtype``: as the backend op's (:func:`.moe.slot_sum`).
    ``kernel``: "auto" takes :mod:`.fp4_gluon`'s kernels where they apply (decode batches on
    Hopper, bf16, ``scales_fit``), else the Triton kernels; "triton" or "gluon" forces one
    (ValueError where the Gluon kernels do not apply).
    """
    _check_routing(x, weights, indices)
    w13, w13_s, w2, w2_s = _operands(x, w13_packed, w13_scale, w2_packed, w2_scale)
    num_experts, d_in = w13.shape[0], x.shape[1]
    inter, d_out = w13.shape[1] // 2, d_in
    x, pairs = x.contiguous(), indices.numel()
    decode = pairs <= SMALL_PAIRS_PER_EXPERT * num_experts
    gluon = fp4_gluon.usable(x, w13, w2, scales_fit=scales_fit, decode=decode)
    if kernel not in {"auto", "triton", "gluon"} or (kernel == "gluon" and not gluon):
        raise ValueError(f"kernel {kernel!r}: not 'auto', 'triton' or a usable 'gluon'")
    gluon = gluon and kernel != "triton"
    ungrouped = gluon and fp4_gluon.by_pair(x)
    groups = None if ungrouped else group_pairs(weights, indices, num_experts)
    h = torch.empty(pairs, inter, dtype=x.dtype, device=x.device)
    if gluon and fp4_gluon.sums_pairs(x):  # the down kernel adds the pairs and the residual
        out = torch.empty(x.shape[0], d_out, dtype=out_dtype, device=x.device)
        if pairs:
            fp4_gluon.launch(x, (weights, indices), groups, w13, w13_s, w2, w2_s, h, out,
                             swiglu_limit, residual)  # fmt: skip
        return out
    # Pairs without an expert are never computed: slot_sum skips their rows.
    y = torch.empty(pairs, d_out, dtype=torch.float32, device=x.device)
    if pairs and gluon:
        fp4_gluon.launch(x, (weights, indices), groups, w13, w13_s, w2, w2_s, h, y, swiglu_limit)
    elif pairs:
        assert groups is not None
        _triton_experts(x, groups, (w13, w13_s, w2, w2_s), h, y, swiglu_limit, scales_fit)
    return slot_sum(y, indices, residual, out_dtype)


def _triton_experts(  # noqa: PLR0917
    x: Tensor,
    groups: PairGroups,
    operands: tuple[Tensor, Tensor, Tensor, Tensor],
    h: Tensor,
    y: Tensor,
    swiglu_limit: float,
    scales_fit: bool,
) -> None:
    """Both Triton kernels over the pairs of ``groups``, into ``h`` and ``y``."""
    w13, w13_s, w2, w2_s = operands
    num_experts, d_in, inter = w13.shape[0], x.shape[1], h.shape[1]
    pairs, slots, d_out = groups.rows.shape[0], groups.experts.shape[0], d_in
    ieee = x.dtype == torch.float32
    decode = pairs <= SMALL_PAIRS_PER_EXPERT * num_experts
    # Prefill tiles: bf16 reuses each decoded weight tile over 128 rows on 8 warps (the
    # accumulators need the registers of two warp groups); fp32 dots keep 64 rows.
    block_m = 16 if decode else 64 if ieee else 128
    warps = 8 if block_m == 128 else 4
    flags = {"IEEE": ieee, "WIDEN": _WIDEN, "BLOCK_M": block_m, "LISTED": slots < num_experts,
             "SCALES_FIT": scales_fit}  # fmt: skip
    # fp32 dots run on the FMA units, whose operands all sit in registers: one group per
    # K step keeps them there; bf16 tiles go to the tensor cores four groups at a time.
    # Decode (16-row tiles) streams each expert's weight through 64-column tiles; prefill
    # reuses each decoded tile over its rows. With a handful of pairs (one token's experts)
    # few programs have work, so gate/up splits its columns finer, four K steps in flight.
    most_k = GROUP if ieee else 4 * GROUP
    most_n = 64 if ieee or block_m == 16 else 128
    few = not ieee and pairs <= FEW_PAIRS
    bn, bk = _tile(inter, most_n // 2 if few else most_n), _tile(d_in, most_k)
    _fp4_gate_up_kernel[(slots, triton.cdiv(inter, bn))](
        x,
        groups.rows,
        w13,
        w13_s,
        groups.scale,
        groups.ends,
        groups.experts,
        h,
        inter,
        d_in,
        float(swiglu_limit),
        CLAMP=swiglu_limit > 0,
        EVEN=d_in % bk == 0 and inter % bn == 0,
        BLOCK_N=bn,
        BLOCK_K=bk,
        num_stages=4 if few else 3,
        num_warps=warps,
        **flags,
    )
    bn, bk = _tile(d_out, most_n), _tile(inter, most_k)
    even = inter % bk == 0 and d_out % bn == 0
    _fp4_down_kernel[(slots, triton.cdiv(d_out, bn))](
        h,
        w2,
        w2_s,
        groups.ends,
        groups.experts,
        groups.order,
        y,
        d_out,
        inter,
        EVEN=even,
        BLOCK_N=bn,
        BLOCK_K=bk,
        num_warps=warps,
        **flags,
    )
