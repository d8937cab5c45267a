"""The reference maths of FP8 block-scaled projections (DeepGEMM's scheme), in plain torch.

Weights are e4m3 with one fp32 scale per block; activations are quantised on the fly per token
and per :data:`FP8_ACT_GROUP` columns to e4m3 with an fp32 scale amax / 448 (1 for an all-zero
group), values rounded to nearest even by torch's own cast. The product of the quantised values
is exact in fp32 up to the summation, which a kernel may order differently.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from deepinfer.backends.base import Fp8Activation

#: ``Backend.fp8_linear``'s signature: (x, weight, scale, block) -> y.
Fp8Linear = Callable[[Tensor, Tensor, Tensor, tuple[int, int]], Tensor]

#: Activation quantisation group along K (DeepGEMM's and the V4 checkpoints' recipe).
FP8_ACT_GROUP = 128
#: Largest finite e4m3 value.
E4M3_MAX = 448.0


def quantize_act_fp8(x: Tensor, group: int = FP8_ACT_GROUP) -> tuple[Tensor, Tensor]:
    """``x`` [..., K] -> (e4m3 values [..., K], fp32 scales [..., K / group])."""
    *lead, k = x.shape
    if k % group:
        raise ValueError(f"the last dim ({k}) is not a multiple of the group ({group})")
    g = x.float().reshape(*lead, k // group, group)
    amax = g.abs().amax(dim=-1)
    # divided by a tensor (filled on the device: no host copy, so capturable): CUDA divides
    # by a Python scalar through its reciprocal, which can miss the IEEE quotient (the
    # kernels' scale) by an ulp and so move a code across a rounding tie
    scale = torch.where(amax > 0, amax / torch.full_like(amax, E4M3_MAX), torch.ones_like(amax))
    q = (g / scale[..., None]).to(torch.float8_e4m3fn)
    return q.reshape(*lead, k), scale


def dequant_weight_fp8(weight: Tensor, scale: Tensor, block: tuple[int, int]) -> Tensor:
    """fp32 values of an e4m3 ``weight`` [N, K] with one ``scale`` per ``block``."""
    n, k = weight.shape
    per_row = scale.float().repeat_interleave(block[0], dim=0)[:n]
    return weight.float() * per_row.repeat_interleave(block[1], dim=1)[:, :k]


def fp8_linear_ref(
    x: Tensor,
    weight: Tensor,
    scale: Tensor,
    block: tuple[int, int],
    x_fp8: Fp8Activation | None = None,
) -> Tensor:
    """``Backend.fp8_linear`` in fp32: the quantised activations (``x_fp8``, or ``x``
    quantised here) times the weight's values."""
    q, q_scale = (x_fp8.q, x_fp8.scale) if x_fp8 is not None else quantize_act_fp8(x)
    a = q.float() * q_scale.repeat_interleave(FP8_ACT_GROUP, dim=-1)
    return torch.nn.functional.linear(a, dequant_weight_fp8(weight, scale, block)).to(x.dtype)


def fp8_grouped(
    linear: Fp8Linear, x: Tensor, weight: Tensor, scale: Tensor, block: tuple[int, int]
) -> Tensor:
    """``Backend.fp8_grouped_linear`` through ``linear`` (a backend's ``fp8_linear``), one call
    per group: ``x`` [..., g, i], ``weight`` [g*o, i] whose groups start on block rows."""
    groups = x.shape[-2]
    rows = weight.shape[0] // groups
    if rows % block[0]:
        raise ValueError(f"group rows ({rows}) are not a multiple of the block rows ({block[0]})")
    per = rows // block[0]
    outs = [
        linear(
            x[..., j, :], weight[j * rows : (j + 1) * rows], scale[j * per : (j + 1) * per], block
        )
        for j in range(groups)
    ]
    return torch.stack(outs, dim=-2)
