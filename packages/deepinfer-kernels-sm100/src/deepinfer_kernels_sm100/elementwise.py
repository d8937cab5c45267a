"""RMSNorm, interleaved RoPE and the clamped SwiGLU as one kernel each.

In plain torch they are 6-12 small ops per call (upcast, square, mean, rsqrt, multiplies, strided
even/odd views, stack, concatenate), and a decode step calls them a few dozen times: on a GPU each
op is a launch, and launches, not arithmetic, set the step time. Both keep the reference's maths:
fp32 statistics and rotation, results cast back to the input dtype, the un-rotated channels
copied unchanged.

RMSNorm and SwiGLU can also quantise their output for the FP8 projection that reads it
(:func:`rms_norm_fp8`, :func:`swiglu_fp8`), while the values are in registers: the same codes
and scales as :func:`.fp8_quant.quantize_act_fp8` on the stored output, without its launch and
its read of the activations.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from deepinfer_kernels_sm100.fp8_quant import ACT_GROUP, EMULATE_CAST, quantize_tile, round_to_grid

_ACT_GROUP = tl.constexpr(ACT_GROUP)  # what a kernel can read of a global


@triton.jit
def store_fp8(  # noqa: PLR0917 (Triton helpers take positional arguments)
    v,
    q_ptr,
    s_ptr,
    row,
    cols,
    first_group,
    width,
    EMULATE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Quantise ``v`` [BLOCK], columns ``cols`` of a row of ``width`` (whole groups from
    ``first_group`` on), per group of ``ACT_GROUP`` as :func:`.fp8_quant.quantize_act_fp8`
    does, and store the codes and the groups' scales; columns past ``width`` are not stored."""
    groups: tl.constexpr = BLOCK // _ACT_GROUP
    q, scale = quantize_tile(tl.reshape(v, (groups, _ACT_GROUP)), EMULATE)
    tl.store(q_ptr + row * width + cols, tl.reshape(q, (BLOCK,)), mask=cols < width)
    g = first_group + tl.arange(0, groups)
    tl.store(s_ptr + row * (width // _ACT_GROUP) + g, scale, mask=g < width // _ACT_GROUP)


@triton.jit
def normed(  # noqa: PLR0917 (Triton helpers take positional arguments)
    x, inv, w_ptr, cols, mask, out_ptr, HAS_WEIGHT: tl.constexpr, EMULATE: tl.constexpr
):
    """RMSNorm's output in ``out_ptr``'s dtype from fp32 ``x`` and its rows' ``inv`` (1 / rms,
    broadcast against ``x``), weighted by ``w_ptr`` at ``cols``: one rounding, as the
    reference's cast of its fp32 result."""
    y = x * inv
    if HAS_WEIGHT:
        y = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32) * y
    if EMULATE and out_ptr.dtype.element_ty == tl.bfloat16:
        y = round_to_grid(y, 7, -119)  # the interpreter's conversion truncates (fp8_quant)
    return y.to(out_ptr.dtype.element_ty)


@triton.jit
def _rms_norm_kernel(  # noqa: PLR0917 (Triton kernels take positional arguments)
    x_ptr,
    w_ptr,
    out_ptr,
    q_ptr,  # QUANT: [rows, dim] e4m3 codes of the output
    s_ptr,  # QUANT: [rows, dim / ACT_GROUP] fp32 scales
    dim,
    x_stride,  # elements between rows of x (a row slice of a wider tensor: more than dim)
    eps,
    HAS_WEIGHT: tl.constexpr,
    QUANT: tl.constexpr,
    EMULATE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < dim
    x = tl.load(x_ptr + row.to(tl.int64) * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
    y = normed(x, tl.rsqrt(tl.sum(x * x, axis=0) / dim + eps), w_ptr, cols, mask, out_ptr,
                HAS_WEIGHT, EMULATE)  # fmt: skip
    if QUANT:  # the values the output holds are the ones quantised, as a later pass would
        store_fp8(y.to(tl.float32), q_ptr, s_ptr, row.to(tl.int64), cols, 0, dim, EMULATE, BLOCK)
    tl.store(out_ptr + row.to(tl.int64) * dim + cols, y, mask=mask)


def _rows(t: Tensor) -> Tensor:
    """``t`` as [rows, width] with unit column stride; rows may be slices of wider ones (a
    fused projection's), which stay views."""
    flat = t.reshape(-1, t.shape[-1])
    return flat if flat.stride(-1) == 1 else flat.contiguous()


def fp8_codes(flat: Tensor) -> tuple[Tensor, Tensor]:
    """Empty e4m3 codes and fp32 scales for ``flat`` [rows, width] quantised per group."""
    q = torch.empty(flat.shape, dtype=torch.float8_e4m3fn, device=flat.device)
    s = torch.empty(
        flat.shape[0], flat.shape[1] // ACT_GROUP, dtype=torch.float32, device=flat.device
    )
    return q, s


def _launch_norm(
    flat: Tensor,
    weight: Tensor | None,
    eps: float,
    out: Tensor,
    quant: tuple[Tensor, Tensor] | None,
) -> None:
    dim = flat.shape[1]
    if not flat.shape[0]:
        return
    w = weight.contiguous() if weight is not None else flat  # unused when HAS_WEIGHT=False
    q, s = quant if quant is not None else (out, out)  # unused when QUANT=False
    _rms_norm_kernel[(flat.shape[0],)](
        flat,
        w,
        out,
        q,
        s,
        dim,
        flat.stride(0),
        eps,
        HAS_WEIGHT=weight is not None,
        QUANT=quant is not None,
        EMULATE=EMULATE_CAST,
        BLOCK=max(triton.next_power_of_2(dim), ACT_GROUP if quant is not None else 1),
    )


def rms_norm(x: Tensor, weight: Tensor | None, eps: float) -> Tensor:
    """RMSNorm over the last dim of ``x``; fp32 statistics, output in ``x``'s dtype."""
    flat = _rows(x)
    out = torch.empty(flat.shape, dtype=x.dtype, device=x.device)
    _launch_norm(flat, weight, eps, out, None)
    return out.view(x.shape)


def rms_norm_fp8(x: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`rms_norm`, and its output quantised per token and group of ``ACT_GROUP`` as
    :func:`.fp8_quant.quantize_act_fp8` quantises it (same bits), in the one launch: (output,
    e4m3 codes, fp32 scales). The last dim must be a multiple of ``ACT_GROUP``."""
    dim = x.shape[-1]
    if dim % ACT_GROUP:
        raise ValueError(f"rms_norm_fp8: the last dim ({dim}) is not a multiple of {ACT_GROUP}")
    flat = _rows(x)
    out = torch.empty(flat.shape, dtype=x.dtype, device=x.device)
    q, s = fp8_codes(flat)
    _launch_norm(flat, weight, eps, out, (q, s))
    lead = x.shape[:-1]
    return out.view(x.shape), q.view(x.shape), s.view(*lead, dim // ACT_GROUP)


@triton.jit
def rope_pairs(d, rot_start):
    """(rotated, pair, odd, partner) of columns ``d`` whose rope channels start at
    ``rot_start``: whether each is rotated, its channel pair, whether it is the pair's odd
    channel and the column of the other."""
    rotated = d >= rot_start
    rel = tl.where(rotated, d - rot_start, 0)
    is_odd = (rel % 2) == 1
    partner = tl.where(rotated, tl.where(is_odd, d - 1, d + 1), d)
    return rotated, rel // 2, is_odd, partner


@triton.jit
def turn(x, xp, cos_ptr, sin_ptr, at, pair, rotated, is_odd, sign):  # noqa: PLR0917
    """``x`` [H, D] with its rotated channels turned by the angles at ``at + pair`` (``sign``
    -1: inverse), ``xp`` holding each channel's partner: fp32 rotation, cast back to ``x``'s
    dtype; the other channels unchanged."""
    c = tl.load(cos_ptr + at + pair, mask=rotated, other=0.0).to(tl.float32)
    s = sign * tl.load(sin_ptr + at + pair, mask=rotated, other=0.0).to(tl.float32)
    xf = x.to(tl.float32)
    xpf = xp.to(tl.float32)
    # even channel e, odd channel o of a pair: (e*c - o*s, e*s + o*c)
    turned = tl.where(
        is_odd[None, :], xpf * s[None, :] + xf * c[None, :], xf * c[None, :] - xpf * s[None, :]
    )
    return tl.where(rotated[None, :], turned.to(x.dtype), x)


@triton.jit
def _rope_kernel(  # noqa: PLR0917 (Triton kernels take positional arguments)
    x_ptr,
    cos_ptr,
    sin_ptr,
    out_ptr,
    heads,
    dim,
    rot_start,
    half,
    sign,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    row = tl.program_id(0)  # one token row: all its heads
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    mask = (h[:, None] < heads) & (d[None, :] < dim)
    base = x_ptr + row * heads * dim + h[:, None] * dim
    x = tl.load(base + d[None, :], mask=mask, other=0.0)
    rotated, pair, is_odd, partner = rope_pairs(d, rot_start)
    xp = tl.load(base + partner[None, :], mask=mask & rotated[None, :], other=0.0)
    y = turn(x, xp, cos_ptr, sin_ptr, row * half, pair, rotated, is_odd, sign)
    tl.store(out_ptr + row * heads * dim + h[:, None] * dim + d[None, :], y, mask=mask)


def rope_rows(x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(``x`` [..., H, D] as [rows, H, D] with contiguous heads, rows possibly strided; the
    angles ``cos``/``sin`` [..., r/2], broadcast to every row, as [rows, r/2])."""
    *lead, heads, dim = x.shape
    half = cos.shape[-1]
    rows = 1
    for n in lead:
        rows *= n
    flat = x.reshape(rows, heads, dim)
    if flat.stride(2) != 1 or flat.stride(1) != dim:
        flat = flat.contiguous()
    c = cos.expand(*lead, half).reshape(rows, half).contiguous()
    s = sin.expand(*lead, half).reshape(rows, half).contiguous()
    return flat, c, s


def rope(x: Tensor, cos: Tensor, sin: Tensor, inverse: bool = False) -> Tensor:
    """Interleaved RoPE on the trailing ``2 * cos.shape[-1]`` channels of ``x`` [..., S, H, D].

    ``cos``/``sin`` [..., S, r/2] broadcast over the heads (and over leading dims they lack).
    """
    flat, c, s = rope_rows(x, cos, sin)
    flat = flat.contiguous()
    rows, heads, dim = flat.shape
    half = c.shape[-1]
    out = torch.empty_like(flat)
    if rows:
        block_h = min(triton.next_power_of_2(heads), 16)
        _rope_kernel[(rows, triton.cdiv(heads, block_h))](
            flat,
            c,
            s,
            out,
            heads,
            dim,
            dim - 2 * half,
            half,
            -1.0 if inverse else 1.0,
            BLOCK_H=block_h,
            BLOCK_D=triton.next_power_of_2(dim),
        )
    return out.view(x.shape)


@triton.jit
def _swiglu_kernel(  # noqa: PLR0917 (Triton kernels take positional arguments)
    gate_ptr,
    up_ptr,
    out_ptr,
    q_ptr,  # QUANT: [rows, width] e4m3 codes of the output
    s_ptr,  # QUANT: [rows, width / ACT_GROUP] fp32 scales
    width,
    gate_stride,  # elements between rows of gate / up (row slices of a fused gate/up output)
    up_stride,
    limit,
    CLAMP: tl.constexpr,
    QUANT: tl.constexpr,
    EMULATE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """One program per (row, BLOCK columns); a quantised block holds whole groups."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < width
    gate = tl.load(gate_ptr + row * gate_stride + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(up_ptr + row * up_stride + cols, mask=mask, other=0.0).to(tl.float32)
    if CLAMP:
        gate = tl.minimum(gate, limit)
        up = tl.minimum(tl.maximum(up, -limit), limit)
    h = gate * tl.sigmoid(gate) * up
    if EMULATE and out_ptr.dtype.element_ty == tl.bfloat16:
        h = round_to_grid(h, 7, -119)  # the interpreter's conversion truncates (fp8_quant)
    h = h.to(out_ptr.dtype.element_ty)
    if QUANT:  # the values the output holds are the ones quantised, as a later pass would
        first = tl.program_id(1) * (BLOCK // _ACT_GROUP)
        store_fp8(h.to(tl.float32), q_ptr, s_ptr, row, cols, first, width, EMULATE, BLOCK)
    tl.store(out_ptr + row * width + cols, h, mask=mask)


SWIGLU_BLOCK = 1024


def _launch_swiglu(
    gate: Tensor, up: Tensor, limit: float, out: Tensor, quant: tuple[Tensor, Tensor] | None
) -> None:
    rows, width = gate.shape
    if not rows or not width:
        return
    block = min(SWIGLU_BLOCK, max(triton.next_power_of_2(width), ACT_GROUP))
    q, s = quant if quant is not None else (out, out)  # unused when QUANT=False
    _swiglu_kernel[(rows, triton.cdiv(width, block))](
        gate, up, out, q, s, width, gate.stride(0), up.stride(0), float(limit),
        CLAMP=limit > 0, QUANT=quant is not None, EMULATE=EMULATE_CAST, BLOCK=block,
    )  # fmt: skip


def _check_pair(gate: Tensor, up: Tensor) -> None:
    if gate.shape != up.shape:
        raise ValueError(f"swiglu: gate {tuple(gate.shape)} and up {tuple(up.shape)} differ")


def swiglu(gate: Tensor, up: Tensor, limit: float, out_dtype: torch.dtype) -> Tensor:
    """``silu(min(gate, limit)) * clamp(up, -limit, limit)`` in fp32 (no clamp when ``limit``
    <= 0), stored as ``out_dtype``: the reference's two upcasts, two clamps, SiLU, product and
    downcast (seven launches for the shared expert of every MoE layer) in one. ``gate`` and
    ``up`` may be row slices of one tensor (the halves of a fused gate/up projection)."""
    _check_pair(gate, up)
    g, u = _rows(gate), _rows(up)
    out = torch.empty(g.shape, dtype=out_dtype, device=g.device)
    _launch_swiglu(g, u, limit, out, None)
    return out.view(gate.shape)


def swiglu_fp8(
    gate: Tensor, up: Tensor, limit: float, out_dtype: torch.dtype
) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`swiglu`, and its output quantised per token and group of ``ACT_GROUP`` as
    :func:`.fp8_quant.quantize_act_fp8` quantises it (same bits), in the one launch: (output,
    e4m3 codes, fp32 scales). The width must be a multiple of ``ACT_GROUP``."""
    _check_pair(gate, up)
    width = gate.shape[-1]
    if width % ACT_GROUP:
        raise ValueError(f"swiglu_fp8: the width ({width}) is not a multiple of {ACT_GROUP}")
    g, u = _rows(gate), _rows(up)
    out = torch.empty(g.shape, dtype=out_dtype, device=g.device)
    q, s = fp8_codes(g)
    _launch_swiglu(g, u, limit, out, (q, s))
    lead = gate.shape[:-1]
    return out.view(gate.shape), q.view(gate.shape), s.view(*lead, width // ACT_GROUP)
