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

A group may name more than two projections, and projections of submodules by dotted path: a
CSA layer's two compressors (the attention's and its indexer's) project the same layer input,
four fp32 projections in all, which the layer runs as one GEMM (:func:`fused_outputs`) and hands
to the compressors. A projection belongs to one fused group at most: the first listed, in the
modules' order (a parent's before its children's).

Only where the backend asks for it (``Backend.fuse_projections``): a fused GEMM sums each
output in an order of its own choosing (its tiles depend on the width), so its results may
differ from the separate ones in the last bits, which the torch reference must not.
"""

from __future__ import annotations

import itertools

import torch
from torch import Tensor, nn

from deepinfer.backends.base import Backend, Fp8Activation
from deepinfer.models.layers.norm import Linear


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


def fuse(*members: Linear) -> Linear:
    """One projection whose rows are the ``members``' in order; they keep row slices of its
    weight (and block scales), so they compute as before and hold no bytes of their own."""
    first = members[0]
    weight = torch.cat([m.weight.data for m in members])
    with torch.device("meta"):  # its parameters are set below: allocate nothing here
        fused = Linear(
            weight.shape[1],
            weight.shape[0],
            weight.dtype,
            fp8_capable=first.fp8_capable,
            computes_fp32=first.computes_fp32,
        )
    fused.weight = nn.Parameter(weight, requires_grad=False)
    scale = None
    if first.scale is not None:
        scale = torch.cat([m.scale.data for m in members if m.scale is not None])
        fused.scale = nn.Parameter(scale, requires_grad=False)
        fused.block = first.block
    row = 0
    for m in members:
        rows = m.weight.shape[0]
        m.weight = nn.Parameter(weight[row : row + rows], requires_grad=False)
        if scale is not None:
            at, n = row // first.block[0], -(-rows // first.block[0])
            m.scale = nn.Parameter(scale[at : at + n], requires_grad=False)
        row += rows
    return fused


def _members(module: nn.Module, names: tuple[str, ...]) -> list[Linear] | None:
    """The projections ``names`` (dotted paths under ``module``), or None if one is missing."""
    found = []
    for name in names:
        try:
            member = module.get_submodule(name)
        except AttributeError:
            return None
        if not isinstance(member, Linear):
            return None
        found.append(member)
    return found


def _key(names: tuple[str, ...]) -> str:
    return "_fused_" + "_".join(n.replace(".", "__") for n in names)


def fuse_projections(model: nn.Module) -> int:
    """Fuse every group a module lists in its ``FUSED_PAIRS`` ((name, name, ...), ...) where
    its members are all there, :func:`fusable` and in no fused group yet; returns how many
    groups were fused."""
    count = 0
    taken: set[int] = set()
    for module in model.modules():
        for names in getattr(module, "FUSED_PAIRS", ()):
            members = _members(module, names)
            if members is None or any(id(m) in taken for m in members):
                continue
            if all(fusable(a, b) for a, b in itertools.pairwise(members)):
                # a plain attribute, not a registered child: its bytes are the members'
                object.__setattr__(module, _key(names), fuse(*members))
                taken.update(id(m) for m in members)
                count += 1
    return count


def fused_group(module: nn.Module, *names: str) -> Linear | None:
    """The one projection standing for ``names`` under ``module``, if they are fused (and still
    are: ``.to()`` makes new tensors of the module's registered parameters, not of the fused
    weight, so they no longer slice it)."""
    fused: Linear | None = module.__dict__.get(_key(names))
    if fused is None or module.get_submodule(names[0]).weight.data_ptr() != fused.weight.data_ptr():
        return None
    return fused


def fused_outputs(
    module: nn.Module,
    names: tuple[str, ...],
    ops: Backend,
    x: Tensor,
    x_fp8: Fp8Activation | None = None,
) -> tuple[Tensor, ...] | None:
    """Each of the projections ``names`` of ``x``, as column slices of their fused GEMM's
    output, or None where they are not fused (their owners then project ``x`` themselves)."""
    fused = fused_group(module, *names)
    if fused is None:
        return None
    out = fused(ops, x, x_fp8)
    widths = [module.get_submodule(n).weight.shape[0] for n in names]
    return tuple(out.split(widths, dim=-1))


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
    both = fused_outputs(module, (first, second), ops, x, x_fp8)
    if both is not None:
        return both[0], both[1]
    return getattr(module, first)(ops, x, x_fp8), getattr(module, second)(ops, x, x_fp8)
