"""Pairs of projections that read the same input, run as one (vLLM's merged column linear).

Attention's ``wq_a`` and ``wkv`` both project the normed layer input, the shared expert's
``w1`` and ``w3`` (gate and up) its input, and each compressor's ``wkv`` and ``wgate`` the
layer input (a module lists such pairs in ``FUSED_PAIRS``). Run apart, a pair costs two GEMM
launches; at decode sizes those fixed costs, not the bytes, set their time. The two results
are column slices of one tensor; a consumer that needs them contiguous copies them.

Once the weights are in, :func:`fuse_projections` gives each pair one weight, its rows the
first projection's over the second's, and points the two projections' weights at row slices
of it (no byte is held twice, the official names still load and report), so :func:`pair`
runs one launch and splits the result along its last dim.

Only where the backend asks for it (``Backend.fuse_projections``): a fused GEMM sums each
output in an order of its own choosing (its tiles depend on the width), so its results may
differ from the two separate ones in the last bits, which the torch reference must not.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from deepinfer.backends.base import Backend, Fp8Activation
from deepinfer.models.layers.norm import Linear

#: attribute of a fused pair on its module, outside the module's registered children (its
#: weight is already counted, as the two projections' slices)
_FUSED = "_fused_{}_{}"


def fusable(first: Linear, second: Linear) -> bool:
    """Whether the two projections can share one weight: same input width, held alike (dtype,
    FP8 block with the first's rows whole blocks, fp32 computation), not grouped."""
    if first.weight.shape[1] != second.weight.shape[1] or first.weight.is_meta:
        return False
    if first.weight.dtype != second.weight.dtype or first.groups != 1 or second.groups != 1:
        return False
    if first.computes_fp32 != second.computes_fp32 or first.block != second.block:
        return False
    if (first.scale is None) != (second.scale is None):
        return False
    return first.scale is None or first.weight.shape[0] % first.block[0] == 0


def fuse(first: Linear, second: Linear) -> Linear:
    """One projection whose rows are ``first``'s over ``second``'s; the two keep row slices of
    its weight (and block scales), so they compute as before and hold no bytes of their own."""
    rows = first.weight.shape[0]
    weight = torch.cat([first.weight.data, second.weight.data])
    with torch.device("meta"):  # its parameters are set below: allocate nothing here
        fused = Linear(
            weight.shape[1],
            weight.shape[0],
            weight.dtype,
            fp8_capable=first.fp8_capable,
            computes_fp32=first.computes_fp32,
        )
    fused.weight = nn.Parameter(weight, requires_grad=False)
    first.weight = nn.Parameter(weight[:rows], requires_grad=False)
    second.weight = nn.Parameter(weight[rows:], requires_grad=False)
    if first.scale is not None and second.scale is not None:
        scale = torch.cat([first.scale.data, second.scale.data])
        block_rows = rows // first.block[0]
        fused.scale = nn.Parameter(scale, requires_grad=False)
        first.scale = nn.Parameter(scale[:block_rows], requires_grad=False)
        second.scale = nn.Parameter(scale[block_rows:], requires_grad=False)
        fused.block = first.block
    return fused


def fuse_projections(model: nn.Module) -> int:
    """Fuse every pair a module lists in its ``FUSED_PAIRS`` ((first name, second name), ...)
    where :func:`fusable`; returns how many pairs were fused."""
    count = 0
    for module in model.modules():
        for first_name, second_name in getattr(module, "FUSED_PAIRS", ()):
            first, second = getattr(module, first_name), getattr(module, second_name)
            if isinstance(first, Linear) and isinstance(second, Linear) and fusable(first, second):
                # a plain attribute, not a registered child: its bytes are the pair's
                object.__setattr__(
                    module, _FUSED.format(first_name, second_name), fuse(first, second)
                )
                count += 1
    return count


def fused_pair(module: nn.Module, first: str, second: str) -> Linear | None:
    """The one projection standing for ``module.first`` and ``module.second``, if they are
    fused (and still are: ``.to()`` makes new tensors of the module's registered parameters,
    not of the fused weight, so the two no longer slice it)."""
    fused: Linear | None = module.__dict__.get(_FUSED.format(first, second))
    if fused is None or getattr(module, first).weight.data_ptr() != fused.weight.data_ptr():
        return None
    return fused


def pair(
    module: nn.Module,
    first: str,
    second: str,
    ops: Backend,
    x: Tensor,
    *,
    x_fp8: Fp8Activation | None = None,
) -> tuple[Tensor, Tensor]:
    """``module.first(x)`` and ``module.second(x)``: one launch where the pair is fused, else
    two (``x_fp8``, ``x`` quantised already, serves both)."""
    fused = fused_pair(module, first, second)
    one = getattr(module, first)
    if fused is None:
        return one(ops, x, x_fp8), getattr(module, second)(ops, x, x_fp8)
    rows = one.weight.shape[0]
    both = fused(ops, x, x_fp8)
    return both[..., :rows], both[..., rows:]
