"""The reference maths of FP4 e2m1 routed experts: decode the stored bytes, then the float op.

Two e2m1 codes per byte, the low nibble the even element; one ue8m0 byte b, 2**(b - 127), per
:data:`FP4_GROUP` elements along the input dim. Every decoded value is exact in bf16 and fp32
(two significant bits times a power of two), so the reference decodes to the activations'
dtype and runs the float experts (:meth:`~deepinfer.backends.base.Backend.moe_experts`).
"""

from __future__ import annotations

import torch
from torch import Tensor

#: Elements per ue8m0 scale along the input dim.
FP4_GROUP = 32
#: The 16 e2m1 values in code order.
_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_VALUES = _MAGNITUDES + tuple(-v for v in _MAGNITUDES)


def dequant_fp4(packed: Tensor, scale: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """``packed`` [..., K / 2] codes and ``scale`` [..., K / 32] ue8m0 bytes -> [..., K]."""
    codes = packed.view(torch.uint8)
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=packed.device)
    values = torch.stack((table[(codes & 0xF).long()], table[(codes >> 4).long()]), dim=-1)
    values = values.flatten(-2)  # [..., K]: even elements from the low nibbles
    exponents = scale.view(torch.uint8).float() - 127.0
    factor = torch.exp2(exponents).repeat_interleave(FP4_GROUP, dim=-1)
    return (values * factor).to(dtype)
