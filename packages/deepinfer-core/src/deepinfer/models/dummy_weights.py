"""Weights drawn from a seed instead of read from files (vLLM's ``load_format="dummy"``).

A full-size model can then be started, profiled and benchmarked from its config.json alone:
no checkpoint is read, and every tensor is filled in place on its device, so a model of
hundreds of gigabytes starts in the time its memory takes to write, with no host copy. The
values follow :func:`init_kind`'s scales (unit-variance activations through random
projections), which the embedded test models use too; they mean nothing beyond that.

Weights are drawn in the dtypes the model holds them in; FP8/FP4 parameters will be drawn in
their stored formats once the model keeps them (``quantization``).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Literal

import torch
from torch import Tensor

from deepinfer.backends.base import Backend
from deepinfer.config import ModelConfig
from deepinfer.models.causal_lm import DeepseekCausalLM
from deepinfer.models.checkpoint_config import read_config
from deepinfer.models.errors import CheckpointError

#: How a parameter is drawn: expert ids per token (hash routing's ``tid2eid``), ones (norm
#: weights), unit normal (the embedding), normal / sqrt(fan-in) in the model's dtype
#: (projections, as a checkpoint stores them), or small normal (sinks, position biases, mHC).
Kind = Literal["expert_ids", "ones", "embedding", "projection", "small"]

#: Standard deviation of the ``small`` kind.
SMALL_STD = 0.1


def init_kind(name: str, t: Tensor) -> Kind:
    """The kind of the parameter or buffer ``name`` (official checkpoint names)."""
    if not t.is_floating_point():
        return "expert_ids"
    leaf = name.rsplit(".", 1)[-1]
    if "norm" in name and leaf == "weight":
        return "ones"
    if name.endswith("embed.weight"):
        return "embedding"
    if t.dim() == 2 and leaf == "weight":
        return "projection"
    return "small"


@torch.no_grad()
def fill_dummy_weights(model: DeepseekCausalLM, seed: int = 0) -> None:
    """Fill every tensor of ``model`` in place on its device from one seeded generator."""
    device = model.device
    g = torch.Generator(device=device).manual_seed(seed)
    n_experts = model.cfg.n_routed_experts
    for name, t in model.state_dict(keep_vars=True).items():
        kind = init_kind(name, t)
        if kind == "expert_ids":  # distinct experts per token
            noise = torch.rand(t.shape[0], n_experts, generator=g, device=device)
            t.copy_(noise.argsort(dim=-1)[:, : t.shape[1]])
        elif kind == "ones":
            t.fill_(1.0)
        elif kind == "embedding":
            t.normal_(0.0, 1.0, generator=g)
        elif kind == "projection":
            t.normal_(0.0, 1.0 / math.sqrt(t.shape[1]), generator=g)
            if t.dtype != model.dtype:  # held wider than stored (router gate, compressors)
                t.copy_(t.to(model.dtype))
        else:
            t.normal_(0.0, SMALL_STD, generator=g)


def dummy_model(
    path: str | Path,
    dtype: torch.dtype,
    device: str | torch.device,
    backend: Backend | None = None,
    seed: int = 0,
) -> DeepseekCausalLM:
    """The model ``path/config.json`` describes (or the file itself), with dummy weights."""
    from deepinfer.models import model_class

    cfg = ModelConfig.from_dict(read_config(path))
    cls = model_class(cfg.model_type)
    device = torch.device(device)
    needed = weight_bytes(cls(cfg, dtype=dtype, device="meta"))
    free = free_bytes(device)
    if free is not None and needed > free:
        gib = 2**30
        raise CheckpointError(
            f"{path}: the weights need {needed / gib:.1f} GiB as {dtype} and {device} has "
            f"{free / gib:.1f} GiB free (`deepinfer info --model {path}` plans the GPUs a "
            "model needs)"
        )
    model = cls(cfg, dtype=dtype, device=device, backend=backend)
    fill_dummy_weights(model, seed)
    return model.eval()


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of every parameter and buffer (a meta-device model costs nothing to ask)."""
    return sum(t.numel() * t.element_size() for t in model.state_dict(keep_vars=True).values())


def free_bytes(device: torch.device) -> int | None:
    """Memory free on ``device`` now (None where it cannot be told)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type == "cpu" and hasattr(os, "sysconf"):
        try:
            return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError):
            return None
    return None
