"""fp32 projections on bf16 tensor cores, to fp32's own error bound.

The head, the router gate and the compressors' projections are computed in fp32 (model
reference §3: ``x.float() @ w.float().T``) from weights the checkpoint stores in bf16. Widened
to fp32 they are read at twice their bytes and multiplied on CUDA cores. Held in bf16 they give
an fp32 result on tensor cores:

* a bf16 input (the router gate's and compressors' hidden states): every product of two bf16
  values is exact in fp32, and the GEMM accumulates in fp32, so the result is the fp32 product
  up to summation order;
* an fp32 input (the head's normed hidden state) is first split into bf16 parts, each the
  rounding of what the parts before it left (``x = hi + mid + lo`` to fp32's 24-bit
  significand with three), stacked as rows of one GEMM, so the weight is read once; the parts'
  products are then added smallest first, in one kernel that reads each product once (at a
  batch of decode rows the head's products are each [B, vocab] fp32, and two torch adds would
  read and write them twice).

How many parts (:func:`parts_for`): an fp32 GEMM's result may itself be off by up to
``(K + 3) 2**-24 sum |x||w|`` (the dot-product bound, summation order unknown). Two parts carry
16 of the input's 24 significand bits; what they drop moves the product by at most
``2**-16 sum |x||w|``, which for ``K >= 253`` is within that bound again, so the result stays
within twice fp32's worst case (``benchmarks/fp32_projections.py`` measures the error of each
part count against the bound, and the time). A third part would cost a third more of the
GEMM's rows, and of the products summed, at every decode batch large enough to be bound by
them, for bits an fp32 GEMM does not promise. Narrow inputs keep three parts.
"""

from __future__ import annotations

import functools
import os

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import Tensor

#: bf16 parts an fp32 value is split into: 3 x 8 significand bits cover fp32's 24.
PARTS = 3
#: The input width from which :func:`linear_fp32` splits an fp32 input into two parts (see the
#: module): 2**-16 <= (K + 3) 2**-24 from K = 253 on.
TWO_PARTS_MIN_K = 253
_SUM_BLOCK = 2048
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _sum_parts_kernel(p_ptr, out_ptr, n, PARTS: tl.constexpr, BLOCK: tl.constexpr):
    """``out = (p[PARTS-1] + p[PARTS-2]) + ... + p[0]`` over flat [PARTS, n] fp32 products:
    the smallest first, each addition rounded as a torch add rounds it."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    acc = tl.load(p_ptr + (PARTS - 1) * n + offs, mask=mask)
    for j in tl.static_range(1, PARTS):
        acc = acc + tl.load(p_ptr + (PARTS - 1 - j) * n + offs, mask=mask)
    tl.store(out_ptr + offs, acc, mask=mask)


def sum_parts(products: Tensor) -> Tensor:
    """The parts' products [parts, ...] summed smallest first (the last part first) in fp32."""
    parts = products.shape[0]
    if not (products.is_cuda or _INTERPRET):
        out = products[parts - 1]
        for i in range(parts - 2, -1, -1):
            out = out + products[i]
        return out
    flat = products.contiguous()
    out = torch.empty(flat.shape[1:], dtype=flat.dtype, device=flat.device)
    n = out.numel()
    if n:
        _sum_parts_kernel[(triton.cdiv(n, _SUM_BLOCK),)](
            flat, out, n, PARTS=parts, BLOCK=_SUM_BLOCK
        )
    return out


def bf16_parts(x: Tensor, parts: int = PARTS) -> Tensor:
    """[parts, *x.shape] bf16 parts of ``x`` whose fp32 sum is ``x`` to fp32's precision (with
    :data:`PARTS`; fewer drop the last bits): each part is the bf16 rounding of what the
    previous parts left (an exact fp32 difference)."""
    out = []
    rest = x.float()
    for _ in range(parts):
        part = rest.to(torch.bfloat16)
        out.append(part)
        rest = rest - part.float()
    return torch.stack(out)


@functools.cache
def _mm_out_dtype(device: torch.device) -> bool:
    """Whether ``torch.mm`` takes bf16 operands to an fp32 result (``out_dtype``) on
    ``device``: a CUDA feature of recent torch; elsewhere the operands are widened."""
    if device.type != "cuda":
        return False
    a = torch.zeros(1, 1, dtype=torch.bfloat16, device=device)
    try:
        torch.mm(a, a, out_dtype=torch.float32)
    except (TypeError, RuntimeError):
        return False
    return True


def mm_fp32(a: Tensor, weight: Tensor) -> Tensor:
    """``a @ weight.T`` of bf16 ``a`` [M, K] and ``weight`` [N, K] with fp32 accumulation
    and an fp32 result [M, N]."""
    if _mm_out_dtype(a.device):
        return torch.mm(a, weight.t(), out_dtype=torch.float32)
    return F.linear(a.float(), weight.float())


def parts_for(k: int) -> int:
    """bf16 parts of an fp32 input of width ``k`` (see the module): two from
    :data:`TWO_PARTS_MIN_K` on, else :data:`PARTS`."""
    return 2 if k >= TWO_PARTS_MIN_K else PARTS


def linear_fp32(x: Tensor, weight: Tensor, parts: int | None = None) -> Tensor:
    """``x.float() @ weight.float().T`` [..., N] for a ``weight`` held in bf16 or fp32 (see
    the module), an fp32 input split into ``parts`` bf16 parts (default :func:`parts_for`;
    ``benchmarks/fp32_projections.py`` measures each count)."""
    if weight.dtype != torch.bfloat16:
        return F.linear(x.float(), weight.float())
    lead, k = x.shape[:-1], x.shape[-1]
    parts = parts_for(k) if parts is None else parts
    flat = x.reshape(-1, k)
    n, rows = weight.shape[0], flat.shape[0]
    if flat.dtype == torch.bfloat16:
        return mm_fp32(flat, weight).view(*lead, n)
    if rows == 0:
        return flat.new_zeros(*lead, n, dtype=torch.float32)
    split = bf16_parts(flat, parts).view(parts * rows, k)
    return sum_parts(mm_fp32(split, weight).view(parts, rows, n)).view(*lead, n)
