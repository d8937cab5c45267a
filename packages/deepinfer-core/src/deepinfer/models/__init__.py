"""DeepSeek-V4-family models and the entry point that loads one from a checkpoint directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from deepinfer.backends.base import Backend
from deepinfer.config import ModelConfig
from deepinfer.models.causal_lm import DeepseekCausalLM
from deepinfer.models.deepseek_v4 import DeepseekV4ForCausalLM
from deepinfer.models.deepseek_v41 import DeepseekV41ForCausalLM
from deepinfer.models.state import ModelState
from deepinfer.parallel import ExpertParallel

#: model_type in config.json -> model class (also registered under ``deepinfer.models``).
MODEL_CLASSES: dict[str, type[DeepseekCausalLM]] = {
    "deepseek_v4": DeepseekV4ForCausalLM,
    "deepseek_v41": DeepseekV41ForCausalLM,
}


def model_class(model_type: str) -> type[DeepseekCausalLM]:
    """The class for a config's ``model_type``: a ``deepinfer.models`` plugin first, then ours."""
    from deepinfer import plugins

    if model_type in plugins.models:
        return plugins.models.load(model_type)  # type: ignore[no-any-return]
    if model_type in MODEL_CLASSES:
        return MODEL_CLASSES[model_type]
    raise NotImplementedError(f"model_type {model_type!r} is not implemented")


def load_model(
    path: str | Path,
    dtype: torch.dtype = torch.bfloat16,
    device: str | torch.device = "cpu",
    backend: Backend | None = None,
    quantization: str | None = "auto",
    *,
    expert_parallel: ExpertParallel | None = None,
) -> DeepseekV4ForCausalLM:
    """Build the model described by ``path/config.json`` and fill it from the checkpoint.

    ``quantization="auto"``: what the checkpoint stores in a format the backend computes on
    (``native_formats``: FP8 projections, FP4 routed experts) stays in it
    (:mod:`deepinfer.models.stored_formats`); the rest, and everything with
    ``quantization=None``, is dequantised as follows.

    Weights are streamed shard by shard and dequantised (FP8 blocks, FP4 experts) in fp32, then
    rounded once into each parameter's dtype: ``dtype`` for projections and the embedding, fp32
    for norms, mHC, sinks, position biases, the router bias and the head. Reading in fp32 keeps
    the checkpoint's fp32 tensors exact; the fp32 copy lives for one tensor at a time.
    A checkpoint without MTP weights loads without MTP layers (see ``model_config``).

    ``expert_parallel``: hold and read only this rank's shard of the routed experts
    (:mod:`deepinfer.models.expert_shard`); the MoE layers then exchange tokens in its group.
    """
    from deepinfer.models.checkpoint_config import model_config
    from deepinfer.models.expert_shard import allocate, planned_model, shard_layout
    from deepinfer.models.loader import iter_checkpoint_tensors, resolve_layout

    layout = resolve_layout(path)  # every shard header read and checked, once
    cfg = model_config(layout)
    cls = model_class(cfg.model_type)
    if expert_parallel is None:
        model = cls(cfg, dtype=dtype, device=device, backend=backend)
        fp8, as_bytes = keep_stored_formats(model, layout.config or {}, quantization)
    else:
        device = torch.device(device)
        model = planned_model(cls, cfg, dtype, device, backend, ep=expert_parallel)
        fp8, as_bytes = keep_stored_formats(model, layout.config or {}, quantization)
        allocate(model, device)
        layout = shard_layout(layout, expert_parallel.shard(cfg.n_routed_experts))
    tensors = iter_checkpoint_tensors(
        layout, torch.float32, device, keep_fp8=fp8, keep_bytes=as_bytes
    )
    model.load_state(tensors)
    hold_computed_formats(model, quantization)
    weights_loaded(model)
    return model.eval()


def keep_stored_formats(
    model: DeepseekCausalLM, config: dict[str, Any], quantization: str | None
) -> tuple[frozenset[str], frozenset[str]]:
    """Under ``quantization="auto"``, make ``model`` hold the stored formats its backend
    computes on (see :func:`load_model`); the names of the FP8 projections it keeps (scales as
    fp32) and of the weights it keeps as stored bytes (FP4 experts, FP8 tables)."""
    from deepinfer.models.checkpoint_config import quant_settings
    from deepinfer.models.stored_formats import (
        QUANTIZATION_CHOICES,
        hold_fp4,
        hold_fp8,
        hold_fp8_tables,
    )

    if quantization not in QUANTIZATION_CHOICES:
        raise ValueError(f"quantization must be 'auto' or None, got {quantization!r}")
    native = model.ops.native_formats if quantization == "auto" else frozenset()
    quant = quant_settings(config)
    fp8, as_bytes = frozenset[str](), frozenset[str]()
    if "fp8" in native:
        fp8, as_bytes = hold_fp8(model, quant), hold_fp8_tables(model, quant)
    if "fp4_experts" in native:
        as_bytes |= hold_fp4(model, quant)
    return fp8, as_bytes


def hold_computed_formats(model: DeepseekCausalLM, quantization: str | None) -> None:
    """Once the weights are in, under ``quantization="auto"``: hold in bf16 the projections
    computed in fp32 whose values allow it, where the backend computes on those
    (``"bf16_projections"``: :func:`~deepinfer.models.stored_formats.hold_bf16_projections`).
    Unlike :func:`keep_stored_formats` this needs the values, so it runs after loading."""
    from deepinfer.models.stored_formats import hold_bf16_projections

    if quantization == "auto" and "bf16_projections" in model.ops.native_formats:
        hold_bf16_projections(model)


def weights_loaded(model: DeepseekCausalLM) -> None:
    """What needs the weights' values, once they are in (loaded or drawn): whether the FP4
    experts' scales allow the kernels' shorter decoding
    (:func:`~deepinfer.models.stored_formats.note_fp4_scale_range`), and, where the backend
    asks for it, projections of one input fused into one GEMM
    (:func:`~deepinfer.models.layers.fused.fuse_projections`)."""
    from deepinfer.models.layers.fused import fuse_projections
    from deepinfer.models.stored_formats import note_fp4_scale_range

    note_fp4_scale_range(model)
    if model.ops.fuse_projections:
        fuse_projections(model)


__all__ = [
    "MODEL_CLASSES",
    "DeepseekV4ForCausalLM",
    "DeepseekV41ForCausalLM",
    "ModelConfig",
    "ModelState",
    "load_model",
    "model_class",
]
