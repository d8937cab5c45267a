"""Per-expert load: how many (token, slot) pairs each MoE layer routes to each global expert.

Expert parallelism is only as fast as its busiest rank, so the data-parallel front end reports
which experts (and so which ranks) the traffic lands on. Counting is a ``scatter_add_`` of the
router's indices into a per-layer vector on the model's device: no host sync and no shape that
depends on the data, so it costs one small kernel per layer and could sit inside a captured
graph. The vectors are read (one sync) only when the counts are asked for.

Counting is off unless a :class:`ExpertLoadTracker` is attached: a padded graph batch or a
dummy forward would count rows that are no request's tokens.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn

from deepinfer.models.layers.expert_count import ExpertLoad
from deepinfer.models.layers.moe import MoE


class ExpertLoadTracker:
    """Counters attached to every MoE layer of ``model``, keyed by the layer's module name."""

    def __init__(self, model: nn.Module) -> None:
        self.loads: dict[str, ExpertLoad] = {}
        for name, module in model.named_modules():
            if isinstance(module, MoE):
                load = ExpertLoad(module.cfg.n_routed_experts)
                module.expert_load = load
                self.loads[name] = load

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Count nothing inside (a dummy forward's token is no request's)."""
        for load in self.loads.values():
            load.enabled = False
        try:
            yield
        finally:
            for load in self.loads.values():
                load.enabled = True

    def read(self) -> dict[str, list[int]]:
        """Every layer's counts since the tracker was attached (a host sync)."""
        return {name: load.read() for name, load in self.loads.items()}
