"""Per-token, per-group e4m3 quantisation of activations, and the bit-exact helpers the FP8 and
FP4 kernels share (ue8m0 scale decoding, rounding onto a narrower float's grid).

Activations are quantised per token and per group of ``ACT_GROUP`` = 128 along K, with an fp32
scale amax / 448 each (1 for an all-zero group), so every value uses e4m3's full range
(DeepGEMM's recipe; the V4 checkpoints' FP8 GEMMs take their activations so).

Triton 3.7.1's interpreter (CI, no GPU) converts fp32 to e4m3 by dropping mantissa bits and
adding the first dropped one without carrying into the exponent (7.8 becomes 4.0), and does not
saturate; it converts fp32 to bf16 by truncation. Under it (``EMULATE_CAST``) values are first
rounded in fp32 onto the narrower format's grid (:func:`round_to_grid`, ties to even, as the
GPU's ``cvt.rn`` conversions round), so the conversions only see values they represent
exactly. Its fp8 dots are exact products summed in fp32, so they need no such path.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from torch import Tensor

#: activation quantisation group along K (DeepGEMM's and the V4 checkpoints' recipe)
ACT_GROUP = 128
IN_DTYPES = (torch.bfloat16, torch.float16, torch.float32)

#: the interpreter's fp32 -> e4m3 / bf16 conversions round wrongly: round in fp32 first (module doc)
EMULATE_CAST = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def round_to_grid(v, MANT: tl.constexpr, MIN_EXP: tl.constexpr):
    """fp32 values rounded, ties to even, to a narrower float format's values, exactly in fp32
    (range permitting: no saturation or overflow here).

    A format with MANT mantissa bits spaces its values in the binade [2**e, 2**(e + 1)) by
    2**(e - MANT), and by 2**(MIN_EXP - MANT) below its smallest normal 2**MIN_EXP. The spacing
    is built from v's exponent bits (so it must be an fp32 normal: for bf16 MIN_EXP = -119,
    which rounds values under 2**-119 more coarsely than bf16's subnormals would); v divided by
    it is exact and under 2**(MANT + 1), and adding then subtracting 1.5 * 2**23 rounds it to
    an integer with the fp32 adder's own ties-to-even.
    """
    biased = (v.to(tl.int32, bitcast=True) >> 23) & 0xFF
    step = ((tl.maximum(biased, 127 + MIN_EXP) - MANT) << 23).to(tl.float32, bitcast=True)
    return ((v / step + 12582912.0) - 12582912.0) * step


@triton.jit
def quantize_tile(x, EMULATE: tl.constexpr):
    """[R, G] fp32 -> (e4m3 [R, G], fp32 scale [R]): per row, scale = amax / 448 (1 when the
    row is all zeros, so padding rows and zero groups stay finite) and x / scale rounded to
    the nearest e4m3 value, saturating at +-448 (e4m3's largest finite value).

    Both quotients are IEEE-rounded (``div_rn``): Triton's ``/`` is an approximate division on
    NVIDIA GPUs, which would move scales and values by an ulp from what torch computes.
    """
    amax = tl.max(tl.abs(x), axis=1)
    scale = tl.where(amax > 0, tl.math.div_rn(amax, 448.0), 1.0)
    v = tl.math.div_rn(x, scale[:, None])
    v = tl.minimum(tl.maximum(v, -448.0), 448.0)
    if EMULATE:
        v = round_to_grid(v, 3, -6)  # e4m3: 3 mantissa bits, smallest normal 2**-6
    return v.to(tl.float8e4nv, fp_downcast_rounding="rtne"), scale


@triton.jit
def ue8m0_to_fp32(b):
    """2**(b - 127) from exponent bytes, bit-built: b = 0 is the subnormal 2**-127 and b = 255
    NaN, as :func:`deepinfer.models.quant.decode_ue8m0` decodes them."""
    b = b.to(tl.int32)
    bits = tl.where(b == 0, 0x00400000, b << 23)
    bits = tl.where(b == 255, 0x7FC00000, bits)
    return bits.to(tl.float32, bitcast=True)


@triton.jit(do_not_specialize=["m"])
def _quant_act_kernel(  # noqa: PLR0917 (Triton kernels take positional arguments)
    x_ptr,  # [M, K] bf16 / fp16 / fp32
    q_ptr,  # [M, K] e4m3 out
    s_ptr,  # [M, K / GROUP] fp32 out
    m,
    k,
    EMULATE: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    """One program per (block of BLOCK_R rows, group of GROUP columns)."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    group = tl.program_id(1)
    row_ok = rows < m
    offs = rows[:, None].to(tl.int64) * k + group * GROUP + tl.arange(0, GROUP)[None, :]
    x = tl.load(x_ptr + offs, mask=row_ok[:, None], other=0.0).to(tl.float32)
    q, scale = quantize_tile(x, EMULATE)
    tl.store(q_ptr + offs, q, mask=row_ok[:, None])
    tl.store(s_ptr + rows.to(tl.int64) * (k // GROUP) + group, scale, mask=row_ok)


def quantize_act_fp8(x: Tensor, group: int = ACT_GROUP) -> tuple[Tensor, Tensor]:
    """Per-token, per-group e4m3 quantisation of activations: x [..., K] -> (e4m3 [..., K],
    fp32 scales [..., K / group]) with x ~= q * scale broadcast over each group.

    A scale is its group's amax / 448, rounded to fp32 (1 for an all-zero group); values are
    x / scale rounded to the nearest e4m3 value, ties to even. fp32 scales rather than ue8m0
    powers of two keep up to one more bit of each value; the GEMM multiplies them in fp32.
    """
    if x.dtype not in IN_DTYPES:
        raise ValueError(f"activations must be one of {IN_DTYPES}, got {x.dtype}")
    k = x.shape[-1]
    if group < 16 or group & (group - 1):
        raise ValueError(f"group must be a power of two of at least 16, got {group}")
    if k == 0 or k % group:
        raise ValueError(f"K = {k} is not a positive multiple of the group size {group}")
    x2 = x.reshape(-1, k).contiguous()
    m = x2.shape[0]
    q = torch.empty(m, k, dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty(m, k // group, dtype=torch.float32, device=x.device)
    if m:
        block_r = 16
        _quant_act_kernel[(triton.cdiv(m, block_r), k // group)](
            x2, q, scale, m, k, EMULATE=EMULATE_CAST, GROUP=group, BLOCK_R=block_r
        )
    lead = x.shape[:-1]
    return q.view(*lead, k), scale.view(*lead, k // group)
