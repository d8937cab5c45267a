"""Layer outputs captured as a forward runs: what a drafter reading the target's intermediate
layers (DSpark) takes as its context.

A V4 layer returns its residual streams [..., hc, d] (a V4.1 layer also the previous
sublayer's pre-mix state, ignored here). Forward hooks record them, so the model runs its own
code unchanged. A pass that calls a layer several times (spans run one after another) records
each call; :func:`features_of` puts their rows in call order, which is the order of the
batch's tokens in every pass.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn


@contextmanager
def captured_layers(
    model: nn.Module, layer_ids: Sequence[int]
) -> Iterator[dict[int, list[Tensor]]]:
    """Within the block, each call of ``model.layers[i]`` appends its output under i."""
    out: dict[int, list[Tensor]] = {i: [] for i in layer_ids}

    def keep(i: int) -> Any:
        def hook(_module: nn.Module, _args: Any, result: Any) -> None:
            out[i].append(result[0] if isinstance(result, tuple) else result)

        return hook

    layers = model.layers  # type: ignore[attr-defined]
    handles = [layers[i].register_forward_hook(keep(i)) for i in layer_ids]
    try:
        yield out
    finally:
        for handle in handles:
            handle.remove()


def features_of(captured: dict[int, list[Tensor]], layer_ids: Sequence[int]) -> Tensor:
    """[tokens, layers * hc * d]: each token's captured streams, the layers concatenated."""
    parts = []
    for i in layer_ids:
        if not captured.get(i):
            raise RuntimeError(f"target layer {i} did not run while capturing")
        parts.append(torch.cat([t.reshape(-1, t.shape[-2] * t.shape[-1]) for t in captured[i]]))
    return torch.cat(parts, dim=-1)
