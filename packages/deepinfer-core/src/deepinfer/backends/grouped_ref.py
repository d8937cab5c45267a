"""The grouped linear (V4's grouped output projection ``wo_a``) written token-major.

``einsum("...gi,goi->...go")`` runs one batched GEMM over the groups and returns its [g, M, o]
result permuted to [M, g, o]: a strided view, so the ``flatten`` of (g, o) that feeds ``wo_b``
copies it (a kernel a layer, on every prefill chunk and every decode step of more than one
row). Here the batched GEMM writes each group's [M, o] block straight into its columns of a
token-major [M, g, o] result, so that flatten is a view.
"""

from __future__ import annotations

import torch
from torch import Tensor


def grouped_linear(x: Tensor, weight: Tensor) -> Tensor:
    """Group j of ``x`` [..., g, i] through rows j * o .. (j + 1) * o of ``weight`` [g * o, i]:
    [..., g, o], contiguous, in ``weight``'s dtype."""
    groups, width = x.shape[-2], x.shape[-1]
    w = weight.view(groups, -1, width)  # [g, o, i]
    x = x.to(weight.dtype)
    if torch.is_grad_enabled() and (x.requires_grad or w.requires_grad):
        return torch.einsum("...gi,goi->...go", x, w)  # an out= product takes no gradient
    rows = x.reshape(-1, groups, width)  # [M, g, i]
    out = torch.empty(rows.shape[0], groups, w.shape[1], dtype=w.dtype, device=w.device)
    torch.bmm(rows.transpose(0, 1), w.transpose(1, 2), out=out.transpose(0, 1))
    return out.view(*x.shape[:-1], w.shape[1])
