"""Mixture-of-experts maths of the torch reference: group routed pairs, run experts, sum slots.

A routing gives each token ``k`` (expert, weight) slots. The reference sorts those (token, slot)
pairs by expert, runs each expert's SwiGLU MLP over its contiguous group (one grouped matmul
where torch has one for the device and dtype, else one matmul per expert) and sums each token's
slots back in a fixed order.

It is a module of its own, apart from :class:`~deepinfer.backends.torch_ref.TorchBackend`,
because kernel packages reuse the grouping without the rest of the backend (the sm100 MoE kernel
orders its pairs with :func:`group_by_expert` so that its sums match the reference's), and
because probing torch's grouped matmul, and giving it up when it fails, is a concern of its own.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

GroupedMM = Callable[..., Tensor]
#: SwiGLU on (gate, up) with a clamp ``limit`` (0: none); the backend passes its own method so
#: that subclasses overriding it (tests that watch the clamp) see every expert's call.
Activation = Callable[[Tensor, Tensor, float], Tensor]

#: Per (device type, dtype): torch's grouped matmul where it runs there, else None. Decided by
#: one probe per pair, and set to None for good when a real call fails.
GROUPED_MM: dict[tuple[str, torch.dtype], GroupedMM | None] = {}


def grouped_mm_for(device: torch.device, dtype: torch.dtype) -> GroupedMM | None:
    """torch's grouped matmul if it runs for this device and dtype here, else None.

    It is new (public as ``F.grouped_mm`` from torch 2.10) and its kernels cover only some
    device/dtype pairs (CUDA wants bf16 on Hopper), so one tiny call decides, once per pair;
    without it the experts run one matmul each.
    """
    key = (device.type, dtype)
    if key not in GROUPED_MM:
        fn = getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)
        if fn is not None:
            try:
                a = torch.ones(4, 16, dtype=dtype, device=device)
                b = torch.ones(2, 16, 16, dtype=dtype, device=device)
                ends = torch.tensor([1, 4], dtype=torch.int32, device=device)
                got = fn(a, b.transpose(1, 2), offs=ends)
                fn = fn if bool((got.float() == 16).all()) else None
            except (RuntimeError, NotImplementedError, TypeError):
                fn = None
        GROUPED_MM[key] = fn
    return GROUPED_MM[key]


def group_by_expert(
    weights: Tensor, indices: Tensor, num_experts: int
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Group the (token, slot) pairs of a routing by expert, without a host sync.

    Returns (token row of each sorted pair [P], the sort order [P], each expert's end offset
    in the sorted pairs [E] int32, the router weights [P, 1] fp32, which sorted pairs have an
    expert [P]). The sort is stable: within an expert, pairs keep their (token, slot) order.
    "No expert" (-1) pairs sort after every expert's group, outside every offset, so grouped
    matmuls skip them.
    """
    k = indices.shape[-1]
    flat = indices.reshape(-1)
    key = torch.where(flat >= 0, flat, num_experts)
    order = key.argsort(stable=True)
    ordered = key[order]
    # Group ends by binary search in the sorted keys: unlike bincount, no host sync.
    experts = torch.arange(num_experts, device=indices.device, dtype=ordered.dtype)
    ends = torch.searchsorted(ordered, experts, right=True).to(torch.int32)
    scale = weights.reshape(-1)[order, None].float()
    return order // k, order, ends, scale, ordered < num_experts


def sort_by_expert(
    x: Tensor, weights: Tensor, indices: Tensor, w13: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """:func:`group_by_expert` and the inputs of the sorted pairs [P, d] in the weights' dtype:
    (rows, order, ends, inputs, router weights, live)."""
    rows, order, ends, scale, live = group_by_expert(weights, indices, w13.shape[0])
    return rows, order, ends, x[rows].to(w13.dtype), scale, live


def combine_slots(y: Tensor, order: Tensor, live: Tensor, k: int) -> Tensor:
    """Sum the expert outputs of each token [P, d] (sorted pairs) -> [N, d], in slot order.

    Pairs without an expert contribute zero (their rows were never computed). The sum runs
    over each token's k slots in a fixed order, so it is deterministic on any device.
    """
    y = torch.where(live[:, None], y, 0.0)
    per_slot = torch.empty_like(y).index_copy_(0, order, y)
    return per_slot.view(-1, k, y.shape[-1]).sum(dim=1)


def add_residual(routed: Tensor, residual: Tensor | None, out_dtype: torch.dtype) -> Tensor:
    """``routed`` (fp32) plus ``residual`` widened, rounded once to ``out_dtype``: one kernel,
    the add in fp32 and the rounding on store (``Backend.moe_experts``' ``residual``)."""
    if residual is None:
        return routed.to(out_dtype)
    return torch.add(routed, residual, out=torch.empty_like(routed, dtype=out_dtype))


def expert_outputs(
    xs: Tensor,
    ends: Tensor,
    scale: Tensor,
    *,
    w13: Tensor,
    w2: Tensor,
    swiglu_limit: float,
    activation: Activation,
) -> Tensor:
    """Each sorted pair's expert MLP output [P, d] fp32, already scaled by its router weight.

    ``xs`` [P, d] are the pairs' inputs grouped by expert (:func:`sort_by_expert`) and ``ends``
    the groups' end offsets; pairs past the last offset (no expert) are left unspecified.
    """
    y = _grouped_outputs(xs, ends, scale, w13=w13, w2=w2, limit=swiglu_limit, act=activation)
    if y is not None:
        return y
    y = torch.zeros(xs.shape[0], xs.shape[-1], dtype=torch.float32, device=xs.device)
    start = 0
    for e, stop in enumerate(ends.tolist()):
        if stop > start:
            part = slice(start, stop)
            gate, up = F.linear(xs[part], w13[e]).chunk(2, dim=-1)
            h = activation(gate, up, swiglu_limit) * scale[part]
            y[part] = F.linear(h.to(w2.dtype), w2[e]).float()
        start = stop
    return y


def _grouped_outputs(
    xs: Tensor,
    ends: Tensor,
    scale: Tensor,
    *,
    w13: Tensor,
    w2: Tensor,
    limit: float,
    act: Activation,
) -> Tensor | None:
    """:func:`expert_outputs` as two grouped matmuls, or None where torch has none that runs.

    A failing call (e.g. a CUDA kernel's alignment rule on these dims) turns the grouped matmul
    off for this device and dtype, with one warning, instead of failing the forward pass.
    """
    grouped = grouped_mm_for(xs.device, w13.dtype)
    if grouped is None:
        return None
    try:
        gate, up = grouped(xs, w13.transpose(1, 2), offs=ends).chunk(2, dim=-1)
        h = act(gate, up, limit) * scale  # scaled before w2
        return grouped(h.to(w2.dtype), w2.transpose(1, 2), offs=ends).float()
    except RuntimeError as exc:
        GROUPED_MM[(xs.device.type, w13.dtype)] = None
        warnings.warn(
            f"grouped matmul failed for experts {tuple(w13.shape)} on {xs.device} "
            f"({exc}); running one matmul per expert from now on",
            RuntimeWarning,
            # Blame the caller of ``Backend.moe_experts``, as before this code moved here.
            stacklevel=4,
        )
        return None
