"""A model that holds one expert-parallel rank's shard of every MoE layer's routed experts.

Under expert parallelism each rank holds attention, shared experts and every dense weight, and
``E / W`` routed experts per MoE layer (MTP layers included). A sharded model is planned on the
meta device, its expert stacks replaced by shard-sized ones (:func:`shard_routed_experts`) and
only then allocated (:func:`allocate`), so a rank never holds, even briefly, experts it does not
own; its checkpoint layout is restricted to its experts' tensors (:func:`shard_layout`), so it
never reads another rank's. The per-expert names stay the global ones the checkpoint uses.
"""

from __future__ import annotations

import dataclasses
import re

import torch
from torch import nn

from deepinfer.backends.base import Backend
from deepinfer.backends.torch_ref import TorchBackend
from deepinfer.config import ModelConfig
from deepinfer.models.causal_lm import DeepseekCausalLM
from deepinfer.models.checkpoint_config import CheckpointLayout
from deepinfer.models.layers.moe import MoE, RoutedExperts
from deepinfer.parallel import ExpertParallel, ExpertShard
from deepinfer.parallel.expert_parallel import joined_expert_parallel

#: ``...ffn.experts.{e}.`` of a routed expert's tensor (weights and their scales).
_ROUTED = re.compile(r"(?:^|\.)ffn\.experts\.(\d+)\.")


@torch.no_grad()
def shard_routed_experts(model: nn.Module, ep: ExpertParallel) -> None:
    """Make every MoE layer of ``model`` hold only ``ep``'s shard of its routed experts and
    exchange tokens in ``ep``'s group. Held values are kept (sliced), so a model already built
    with every expert can be sharded; on the meta device nothing is allocated. The stored
    format (float or FP4 stacks) is kept."""
    joined_expert_parallel()
    for module in model.modules():
        if not isinstance(module, MoE):
            continue
        module.expert_parallel = ep
        old = module.experts
        if old.w13.shape[0] != module.cfg.n_routed_experts or not ep.enabled:
            continue  # sharded already, or the world of one holds every expert
        module.experts = _shard_of(old, ep.shard(module.cfg.n_routed_experts))


def _shard_of(old: RoutedExperts, shard: ExpertShard) -> RoutedExperts:
    """``old``'s experts ``shard.first .. shard.stop`` in a stack of their own (same format,
    same device), planned on the meta device so nothing but the shard is ever allocated."""
    device = old.w13.device
    fp4 = old.w13_scale is not None and old.w2_scale is not None
    dtype = old.w13.dtype if old.w13.is_floating_point() else torch.float32
    hidden = old.w2.shape[1]
    with torch.device("meta"):
        new = RoutedExperts(shard.count, hidden, old.inter, dtype, first=shard.first)
    if fp4:
        assert old.w13_scale is not None
        new.hold_fp4(hidden // old.w13_scale.shape[-1])
    new = new.to_empty(device=device)
    if device.type != "meta":
        for name, tensor in new.named_parameters():
            tensor.copy_(getattr(old, name)[shard.first : shard.stop])
    return new


def shard_layout(layout: CheckpointLayout, shard: ExpertShard) -> CheckpointLayout:
    """``layout`` without the routed-expert tensors (and scales) of experts outside ``shard``;
    shards left with nothing to read are not opened at all. ``shard_of`` stays whole, so a
    weight still finds its scale wherever the index puts it."""

    def wanted(name: str) -> bool:
        found = _ROUTED.search(name)
        return found is None or shard.owns(int(found.group(1)))

    names = {s: [n for n in ns if wanted(n)] for s, ns in layout.names_by_shard.items()}
    names = {s: ns for s, ns in names.items() if ns}
    return dataclasses.replace(
        layout, shards=[s for s in layout.shards if s in names], names_by_shard=names
    )


def planned_model(
    cls: type[DeepseekCausalLM],
    cfg: ModelConfig,
    dtype: torch.dtype,
    device: torch.device,
    backend: Backend | None,
    *,
    ep: ExpertParallel | None,
) -> DeepseekCausalLM:
    """``cls`` on the meta device, with ``ep``'s expert shard where given; the op table is
    ``backend`` or the torch reference on ``device``, where :func:`allocate` puts it."""
    if backend is None:
        backend = TorchBackend(device)
    model = cls(cfg, dtype=dtype, device="meta", backend=backend)
    if ep is not None:
        shard_routed_experts(model, ep)
    return model


def allocate(model: DeepseekCausalLM, device: torch.device) -> None:
    """Give a planned model its memory on ``device`` (uninitialised: loading or drawing the
    weights comes next) and the constants derived at build time, lost on the meta device."""
    model.to_empty(device=device)
    for module in model.modules():
        rebuild = getattr(module, "rebuild_derived_buffers", None)
        if rebuild is not None:
            rebuild()
