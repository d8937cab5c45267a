"""A checkpoint's config.json as the loader reads it, and the ModelConfig it describes.

`read_config` returns the dict as published (V4 flat, V4.1 nested); `quant_settings` picks out
the quantisation facts the tensor reader needs wherever the variant put them. `model_config`
reconciles config.json's MTP layer count with the tensors actually present, so checkpoints saved
without MTP weights load as the main model alone.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deepinfer.config import ModelConfig
from deepinfer.models.errors import CheckpointError

CONFIG_FILE = "config.json"
MTP_PREFIX = "mtp."
#: The key under which config.json counts the MTP layers (V4: top level; V4.1: text_config).
MTP_KEY = "num_nextn_predict_layers"

logger = logging.getLogger(__name__)


def read_config(path: str | Path) -> dict[str, Any]:
    """Load config.json (from a checkpoint directory or the file itself) as published.

    The dict is returned unflattened: V4.1 keeps its nested `text_config` / `vision_config` and
    the top-level `quantization_config`; V4 keeps its top-level `expert_dtype`. Interpreting those
    fields is the model config's job; `quant_settings` covers what the loader itself needs.
    """
    p = Path(path)
    file = p / CONFIG_FILE if p.is_dir() else p
    if not file.is_file():
        raise CheckpointError(f"no {CONFIG_FILE} at {file}")
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{file} is not valid JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise CheckpointError(f"{file} must hold a JSON object, found {type(config).__name__}")
    for key in ("text_config", "vision_config", "quantization_config"):
        if key in config and not isinstance(config[key], dict):
            raise CheckpointError(
                f"{file}: `{key}` must be an object, found {type(config[key]).__name__}"
            )
    return config


@dataclass(frozen=True)
class QuantSettings:
    """The quantisation facts the loader needs, wherever the config variant put them."""

    weight_block_size: tuple[int, int] | None = None
    scale_fmt: str | None = None
    expert_dtype: str | None = None
    quant_method: str | None = None


def quant_settings(config: Mapping[str, Any]) -> QuantSettings:
    """Read quantisation fields from V4 (top level + `expert_dtype`) or V4.1 (nested) configs."""
    text = config.get("text_config") or {}
    qc = config.get("quantization_config") or text.get("quantization_config") or {}
    block = qc.get("weight_block_size")
    if block is not None:
        if not (isinstance(block, list | tuple) and len(block) == 2):
            raise CheckpointError(
                f"quantization_config.weight_block_size must be [n, k], got {block}"
            )
        block = (int(block[0]), int(block[1]))
    expert_dtype = qc.get("expert_dtype", config.get("expert_dtype", text.get("expert_dtype")))
    return QuantSettings(
        weight_block_size=block,
        scale_fmt=qc.get("scale_fmt"),
        expert_dtype=expert_dtype,
        quant_method=qc.get("quant_method"),
    )


def mtp_depths(names: Iterable[str]) -> int:
    """How many MTP layers a checkpoint's tensor names hold: one past the highest ``mtp.{i}.``.

    V4.1 keeps DSpark head tensors under ``mtp.<word>.``; they are not MTP layers.
    """
    depth = 0
    for name in names:
        if name.startswith(MTP_PREFIX):
            index = name[len(MTP_PREFIX) :].split(".", 1)[0]
            if index.isdigit():
                depth = max(depth, int(index) + 1)
    return depth


@dataclass
class CheckpointLayout:
    """Where each tensor lives: shard file name per tensor, in the order shards are read."""

    root: Path
    shards: list[str]
    shard_of: dict[str, str]
    names_by_shard: dict[str, list[str]] = field(default_factory=dict)
    config: dict[str, Any] | None = None


def model_config(layout: CheckpointLayout) -> ModelConfig:
    """The ModelConfig of a checkpoint, with its MTP layer count checked against the tensors.

    Checkpoints re-saved by other tools (fine-tunes, conversions) often drop the MTP layers, and
    some configs omit ``num_nextn_predict_layers``. The main model does not need the MTP layers
    (they only draft tokens for speculative decoding), so rather than refusing such a checkpoint
    for its missing ``mtp.*`` tensors, this builds a model without them and says so once;
    ``model.cfg.num_nextn_predict_layers == 0`` then tells a speculator that MTP is unavailable.
    A config that omits the count gets the one the tensors show. A checkpoint that holds only
    some of an MTP layer's tensors is still rejected by the strict load, naming them, and a
    count that is not a positive integer is left for ModelConfig to reject.
    Takes the resolved layout, whose tensor names come from the shard headers already read.
    """
    if layout.config is None:
        raise CheckpointError(f"no {CONFIG_FILE} at {layout.root / CONFIG_FILE}")
    raw = copy.deepcopy(layout.config)  # the layout's copy stays as published
    text = raw.get("text_config", raw)  # read_config has checked that it is an object
    declared = text.get(MTP_KEY)
    found = mtp_depths(layout.shard_of)
    if declared is None:
        text[MTP_KEY] = found
        if found == 0:
            logger.info(
                "%s: no MTP layers (config.json omits %s; no mtp.* tensors)", layout.root, MTP_KEY
            )
    elif found == 0 and type(declared) is int and declared > 0:
        text[MTP_KEY] = 0
        logger.warning(
            "%s: config.json declares %d MTP layer(s) but the checkpoint holds no mtp.* tensors; "
            "loading the main model only (MTP speculative decoding is unavailable)",
            layout.root,
            declared,
        )
    return ModelConfig.from_dict(raw)
