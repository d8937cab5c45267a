"""Weights drawn from a seed instead of read from files (vLLM's ``load_format="dummy"``).

A full-size model can then be started, profiled and benchmarked from its config.json alone:
no checkpoint is read, and every tensor is filled in place on its device, so a model of
hundreds of gigabytes starts in the time its memory takes to write, with no host copy. The
values follow :func:`init_kind`'s scales (unit-variance activations through random
projections), which the embedded test models use too; they mean nothing beyond that.

Weights are drawn in the formats the model holds them in (``quantization``): FP8 projections as
e4m3 with block scales, FP4 routed experts as packed e2m1 codes with ue8m0 scales, the rest in
their float dtypes.
"""

from __future__ import annotations

import math
import os
import zlib
from pathlib import Path
from typing import Literal

import torch
from torch import Tensor

from deepinfer.backends.base import Backend
from deepinfer.backends.fp4_ref import E2M1_VALUES
from deepinfer.backends.fp8_ref import E4M3_MAX
from deepinfer.config import ModelConfig
from deepinfer.models.causal_lm import DeepseekCausalLM
from deepinfer.models.checkpoint_config import read_config
from deepinfer.models.errors import CheckpointError
from deepinfer.models.layers.moe import RoutedExperts
from deepinfer.models.layers.norm import Embedding, Linear
from deepinfer.parallel import ExpertParallel

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
    filled: set[str] = set()  # names of tensors filled apart (stored formats, experts)
    for prefix, module in model.named_modules():
        if isinstance(module, Linear) and module.scale is not None:
            _fill_fp8(module, g)
            filled |= {f"{prefix}.weight", f"{prefix}.scale"}
        elif isinstance(module, Embedding) and module.scale is not None:
            _fill_fp8_rows(module, g)
            filled |= {f"{prefix}.weight", f"{prefix}.scale"}
        elif isinstance(module, RoutedExperts):
            _fill_experts(module, prefix, seed)
            filled |= {f"{prefix}.{name}" for name, _ in module.named_views()}
    for name, t in model.state_dict(keep_vars=True).items():
        if name in filled:
            continue
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


def _fill_fp8(linear: Linear, g: torch.Generator) -> None:
    """A projection's values drawn as for any other, stored as FP8 e4m3 with one fp32 scale
    per block, amax / 448 (the checkpoints' recipe)."""
    assert linear.scale is not None
    n, k = linear.weight.shape
    bn, bk = linear.block
    values = torch.empty(n, k, device=linear.weight.device).normal_(0, k**-0.5, generator=g)
    blocks = values.view(n // bn, bn, k // bk, bk)
    amax = blocks.abs().amax(dim=(1, 3))
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    linear.scale.copy_(scale)
    linear.weight.copy_((blocks / scale[:, None, :, None]).view(n, k).to(torch.float8_e4m3fn))


def _fill_fp8_rows(table: Embedding, g: torch.Generator) -> None:
    """Unit-normal rows stored as e4m3 with one power-of-two scale per group of a row, the
    smallest that keeps the group's largest value finite (the checkpoints' ue8m0 recipe)."""
    assert table.scale is not None
    rows, dim = table.weight.shape
    groups = table.scale.shape[1]
    values = torch.zeros(rows, groups * table.group, device=table.weight.device)
    values[:, :dim].normal_(0.0, 1.0, generator=g)  # a short last group: zeros beyond the row
    blocks = values.view(rows, groups, table.group)
    amax = blocks.abs().amax(dim=-1).clamp(min=2**-100)
    exponent = torch.ceil(torch.log2(amax / E4M3_MAX))
    table.scale.copy_(exponent + 127)
    codes = (blocks / torch.exp2(exponent)[..., None]).to(torch.float8_e4m3fn)
    table.weight.copy_(codes.view(torch.uint8).view(rows, -1)[:, :dim])


def _fill_experts(experts: RoutedExperts, prefix: str, seed: int) -> None:
    """Each routed expert drawn from a generator of its own, seeded by ``seed`` and its global
    name, so an expert-parallel rank holding a shard draws exactly the whole model's values
    for it. Float stacks: normal / sqrt(fan-in), as any projection; FP4 stacks: packed e2m1
    codes drawn uniformly, with one power-of-two scale per stack, the one that brings the
    values' spread nearest 1 / sqrt(fan-in)."""
    device = experts.w13.device
    rms = math.sqrt(sum(v * v for v in E2M1_VALUES) / len(E2M1_VALUES))  # of a uniform code
    stacks = ((experts.w13, experts.w13_scale), (experts.w2, experts.w2_scale))
    for e in range(experts.w13.shape[0]):
        name = f"{prefix}.{experts.first + e}".encode()
        g = torch.Generator(device=device).manual_seed((seed << 32) ^ zlib.crc32(name))
        for stack, scale in stacks:
            if scale is None:
                stack[e].normal_(0.0, 1.0 / math.sqrt(stack.shape[-1]), generator=g)
            else:
                stack[e].random_(0, 256, generator=g)
                exponent = round(math.log2(1 / (math.sqrt(2 * stack.shape[-1]) * rms)))
                scale[e].fill_(127 + exponent)


def dummy_model(
    path: str | Path,
    dtype: torch.dtype,
    device: str | torch.device,
    backend: Backend | None = None,
    *,
    seed: int = 0,
    quantization: str | None = "auto",
    expert_parallel: ExpertParallel | None = None,
) -> DeepseekCausalLM:
    """The model ``path/config.json`` describes (or the file itself), with dummy weights,
    FP8 where a checkpoint stores them so and ``quantization`` keeps them
    (:func:`~deepinfer.models.keep_stored_formats`).

    The model is planned on the meta device, given its stored formats there and only then
    allocated on ``device``: built there directly it would first hold every weight in
    ``dtype``, about four times the bytes of FP4 experts, so a model that fits as stored
    could not be built. ``expert_parallel``: hold and draw only this rank's routed experts,
    with the values the whole model draws for them.
    """
    from deepinfer.models import (
        hold_computed_formats,
        keep_stored_formats,
        model_class,
        weights_loaded,
    )
    from deepinfer.models.expert_shard import allocate, planned_model

    raw = read_config(path)
    cfg = ModelConfig.from_dict(raw)
    device = torch.device(device)
    cls = model_class(cfg.model_type)
    model = planned_model(cls, cfg, dtype, device, backend, ep=expert_parallel)
    keep_stored_formats(model, raw, quantization)
    hold_computed_formats(model, quantization)  # on meta: drawn in bf16, as stored
    needed = weight_bytes(model)
    free = free_bytes(device)
    if free is not None and needed > free:
        gib = 2**30
        raise CheckpointError(
            f"{path}: the weights need {needed / gib:.1f} GiB as held ({dtype} where not "
            f"stored FP8/FP4) and {device} has {free / gib:.1f} GiB free (`deepinfer info "
            f"--model {path}` plans the GPUs a model needs)"
        )
    allocate(model, device)
    fill_dummy_weights(model, seed)
    weights_loaded(model)
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
