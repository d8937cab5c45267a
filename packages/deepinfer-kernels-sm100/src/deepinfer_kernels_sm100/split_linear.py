"""fp32 projections on bf16 tensor cores, exactly.

The head, the router gate and the compressors' projections are computed in fp32 (model
reference §3: ``x.float() @ w.float().T``) from weights the checkpoint stores in bf16. Widened
to fp32 they are read at twice their bytes and multiplied on CUDA cores. Held in bf16 they give
the same fp32 result on tensor cores:

* a bf16 input (the router gate's and compressors' hidden states): every product of two bf16
  values is exact in fp32, and the GEMM accumulates in fp32, so the result is the fp32 product
  up to summation order;
* an fp32 input (the head's normed hidden state) is first split into three bf16 parts,
  ``x = hi + mid + lo`` to fp32's 24-bit significand (each part holds the next 8 bits of what
  the previous ones missed), stacked as three times the rows of one GEMM, so the weight is read
  once; the parts' products are then added smallest first.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor

#: bf16 parts an fp32 value is split into: 3 x 8 significand bits cover fp32's 24.
PARTS = 3


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


def linear_fp32(x: Tensor, weight: Tensor, parts: int = PARTS) -> Tensor:
    """``x.float() @ weight.float().T`` [..., N] for a ``weight`` held in bf16 or fp32 (see
    the module); ``parts`` below :data:`PARTS` trades the input's last bits for time
    (``benchmarks/fp32_projections.py`` measures both)."""
    if weight.dtype != torch.bfloat16:
        return F.linear(x.float(), weight.float())
    lead, k = x.shape[:-1], x.shape[-1]
    flat = x.reshape(-1, k)
    n, rows = weight.shape[0], flat.shape[0]
    if flat.dtype == torch.bfloat16:
        return mm_fp32(flat, weight).view(*lead, n)
    if rows == 0:
        return flat.new_zeros(*lead, n, dtype=torch.float32)
    split = bf16_parts(flat, parts).view(parts * rows, k)
    products = mm_fp32(split, weight).view(parts, rows, n)
    out = products[parts - 1]
    for i in range(parts - 2, -1, -1):  # smallest parts first
        out = out + products[i]
    return out.view(*lead, n)
