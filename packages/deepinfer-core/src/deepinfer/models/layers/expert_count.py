"""One MoE layer's per-expert counter (see :mod:`deepinfer.models.expert_load`, which attaches
them); apart from the layer so the layer needs nothing of the tracker."""

from __future__ import annotations

import torch
from torch import Tensor


class ExpertLoad:
    """One MoE layer's counts: pairs routed to each of its ``num_experts`` global experts."""

    def __init__(self, num_experts: int) -> None:
        self.num_experts = num_experts
        self.counts: Tensor | None = None
        self.enabled = True

    def add(self, indices: Tensor) -> None:
        """Count the router's global expert ids ``indices`` [N, k]; ids < 0 ("no expert")
        add nothing."""
        if not self.enabled:
            return
        flat = indices.reshape(-1)
        if self.counts is None or self.counts.device != flat.device:
            self.counts = torch.zeros(self.num_experts, dtype=torch.long, device=flat.device)
        self.counts.scatter_add_(0, flat.clamp(min=0).long(), (flat >= 0).long())

    def read(self) -> list[int]:
        return [0] * self.num_experts if self.counts is None else self.counts.tolist()
