"""RMSNorm, interleaved RoPE and the clamped SwiGLU as one kernel each.

In plain torch they are 6-12 small ops per call (upcast, square, mean, rsqrt, multiplies, strided
even/odd views, stack, concatenate), and a decode step calls them a few dozen times: on a GPU each
op is a launch, and launches, not arithmetic, set the step time. Both keep the reference's maths:
fp32 statistics and rotation, results cast back to the input dtype, the un-rotated channels
copied unchanged.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor


@triton.jit
def _rms_norm_kernel(  # noqa: PLR0917 (Triton kernels take positional arguments)
    x_ptr,
    w_ptr,
    out_ptr,
    dim,
    x_stride,  # elements between rows of x (a row slice of a wider tensor: more than dim)
    eps,
    HAS_WEIGHT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < dim
    x = tl.load(x_ptr + row.to(tl.int64) * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
    y = x * tl.rsqrt(tl.sum(x * x, axis=0) / dim + eps)
    if HAS_WEIGHT:
        y = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32) * y
    tl.store(out_ptr + row * dim + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(x: Tensor, weight: Tensor | None, eps: float) -> Tensor:
    """RMSNorm over the last dim of ``x``; fp32 statistics, output in ``x``'s dtype."""
    dim = x.shape[-1]
    flat = x.reshape(-1, dim)  # rows may be slices of wider ones (a fused projection's)
    if flat.stride(-1) != 1:
        flat = flat.contiguous()
    out = torch.empty(flat.shape, dtype=x.dtype, device=x.device)
    if flat.shape[0]:
        w = weight.contiguous() if weight is not None else flat  # unused when HAS_WEIGHT=False
        _rms_norm_kernel[(flat.shape[0],)](
            flat,
            w,
            out,
            dim,
            flat.stride(0),
            eps,
            HAS_WEIGHT=weight is not None,
            BLOCK=triton.next_power_of_2(dim),
        )
    return out.view(x.shape)


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
    rotated = d >= rot_start
    rel = tl.where(rotated, d - rot_start, 0)
    pair = rel // 2
    is_odd = (rel % 2) == 1
    partner = tl.where(rotated, tl.where(is_odd, d - 1, d + 1), d)
    xp = tl.load(base + partner[None, :], mask=mask & rotated[None, :], other=0.0)
    c = tl.load(cos_ptr + row * half + pair, mask=rotated, other=0.0).to(tl.float32)
    s = sign * tl.load(sin_ptr + row * half + pair, mask=rotated, other=0.0).to(tl.float32)
    xf = x.to(tl.float32)
    xpf = xp.to(tl.float32)
    # even channel e, odd channel o of a pair: (e*c - o*s, e*s + o*c)
    turned = tl.where(
        is_odd[None, :], xpf * s[None, :] + xf * c[None, :], xf * c[None, :] - xpf * s[None, :]
    )
    y = tl.where(rotated[None, :], turned.to(x.dtype), x)
    tl.store(out_ptr + row * heads * dim + h[:, None] * dim + d[None, :], y, mask=mask)


def rope(x: Tensor, cos: Tensor, sin: Tensor, inverse: bool = False) -> Tensor:
    """Interleaved RoPE on the trailing ``2 * cos.shape[-1]`` channels of ``x`` [..., S, H, D].

    ``cos``/``sin`` [..., S, r/2] broadcast over the heads (and over leading dims they lack).
    """
    *lead, heads, dim = x.shape
    half = cos.shape[-1]
    rows = 1
    for n in lead:
        rows *= n
    flat = x.reshape(rows, heads, dim).contiguous()
    c = cos.expand(*lead, half).reshape(rows, half).contiguous()
    s = sin.expand(*lead, half).reshape(rows, half).contiguous()
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
    n,
    limit,
    CLAMP: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    gate = tl.load(gate_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(up_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if CLAMP:
        gate = tl.minimum(gate, limit)
        up = tl.minimum(tl.maximum(up, -limit), limit)
    h = gate * tl.sigmoid(gate) * up
    tl.store(out_ptr + offs, h.to(out_ptr.dtype.element_ty), mask=mask)


SWIGLU_BLOCK = 1024


def swiglu(gate: Tensor, up: Tensor, limit: float, out_dtype: torch.dtype) -> Tensor:
    """``silu(min(gate, limit)) * clamp(up, -limit, limit)`` in fp32 (no clamp when ``limit``
    <= 0), stored as ``out_dtype``: the reference's two upcasts, two clamps, SiLU, product and
    downcast (seven launches for the shared expert of every MoE layer) in one."""
    if gate.shape != up.shape:
        raise ValueError(f"swiglu: gate {tuple(gate.shape)} and up {tuple(up.shape)} differ")
    g, u = gate.contiguous(), up.contiguous()
    out = torch.empty(g.shape, dtype=out_dtype, device=g.device)
    n = g.numel()
    if n:
        _swiglu_kernel[(triton.cdiv(n, SWIGLU_BLOCK),)](
            g, u, out, n, float(limit), CLAMP=limit > 0, BLOCK=SWIGLU_BLOCK
        )
    return out
