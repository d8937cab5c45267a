"""Streaming reader for DeepSeek-V4-family safetensors checkpoints.

`iter_checkpoint_tensors` yields (official raw name, tensor) one tensor at a time and opens one
shard at a time, so a 280 B-parameter checkpoint can be converted into the model's layout without
ever holding more than about one shard plus the tensor being yielded. Quantised weights are
dequantised on the fly and their `.scale` companions are consumed:

* `X.weight` stored as `float8_e4m3fn` needs `X.scale` (block FP8, §6.3);
* `X.weight` stored as uint8 / int8 / `float4_e2m1fn_x2` needs `X.scale` (packed FP4 experts);
* integer tensors (`tid2eid`, int32 or int64 in the wild) come out as int64;
* every other float tensor is cast to the requested dtype.

The FP8 block size comes from `quantization_config.weight_block_size` when a config.json sits
next to the shards; otherwise it is inferred from the weight and scale shapes among the layouts
the family is known to use (see `_KNOWN_FP8_BLOCKS`).

Before any tensor is read, every shard's header is checked against the file's size, so a
truncated, empty or foreign file fails at once with its name (`read_shard_header`).
`model_config` reconciles config.json's MTP layer count with the tensors actually present, so
checkpoints saved without MTP weights load as the main model alone.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import json
import logging
import struct
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from deepinfer.config import ModelConfig
from deepinfer.models.errors import CheckpointError, QuantFormatError
from deepinfer.models.quant import (
    dequant_fp4_e2m1,
    dequant_fp8_block,
    fp4_scale_shape,
    fp8_scale_shape,
    is_scale_dtype,
    is_ue8m0_dtype,
)

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
WEIGHT_SUFFIX = ".weight"
SCALE_SUFFIX = ".scale"
FP4_GROUP = 32
_TRIM_EVERY_BYTES = 64 << 20
MTP_PREFIX = "mtp."
#: The key under which config.json counts the MTP layers (V4: top level; V4.1: text_config).
MTP_KEY = "num_nextn_predict_layers"
#: safetensors' own cap on the JSON header; a larger length field means the file is not one.
_MAX_HEADER_BYTES = 100_000_000
_LFS_POINTER = b"version https://git-lfs"

logger = logging.getLogger(__name__)

# V4 dense FP8 uses 128 x 128, V4.1 uses 32 x 32; V4.1 Engram tables use one scale per 32 values
# of a row, i.e. a (1, 32) block. The (1, 32) Engram layout is inferred from the model reference
# (§5 item 9) and has not been checked against a real shard header.
_KNOWN_FP8_BLOCKS: tuple[tuple[int, int], ...] = ((128, 128), (32, 32), (1, 32))

_FP4_X2_DTYPE: torch.dtype | None = getattr(torch, "float4_e2m1fn_x2", None)
_PACKED_FP4_DTYPES = tuple(d for d in (torch.uint8, torch.int8, _FP4_X2_DTYPE) if d is not None)


# ----------------------------------------------------------------------------------------------
# Config


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


# ----------------------------------------------------------------------------------------------
# Shard headers


def read_shard_header(path: Path) -> list[str]:
    """The tensor names of one safetensors file, after checking that the file is complete.

    safetensors itself answers a truncated, empty or foreign file with a bare ``SafetensorError``
    ("header too small", "incomplete metadata") that names no file. Reading the header here costs
    one small read per shard and turns each failure into a CheckpointError naming the file and
    what is wrong with it, before any weight is read: a truncated last shard of a large
    checkpoint is reported at once, not after the shards before it have loaded.
    """
    raw = b""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            start = f.read(len(_LFS_POINTER))
            n = struct.unpack("<Q", start[:8])[0] if len(start) >= 8 else 0
            if len(start) >= 8 and n <= min(size - 8, _MAX_HEADER_BYTES):
                f.seek(8)
                raw = f.read(n)
    except FileNotFoundError as exc:
        raise CheckpointError(f"shard {path} does not exist") from exc
    except OSError as exc:
        raise CheckpointError(f"cannot read shard {path}: {exc}") from exc
    if size == 0:
        raise CheckpointError(f"{path} is empty (0 bytes), not a safetensors file")
    if start == _LFS_POINTER:
        raise CheckpointError(
            f"{path} is a Git LFS pointer ({size} bytes), not the weights: fetch them with "
            "`git lfs pull`"
        )
    if size < 8:
        raise CheckpointError(
            f"{path} is truncated: {size} bytes, shorter than a safetensors header length field"
        )
    if n > _MAX_HEADER_BYTES:
        raise CheckpointError(
            f"{path} is not a safetensors file: its first 8 bytes give a header of {n} bytes"
        )
    if n > size - 8:
        raise CheckpointError(
            f"{path} is truncated: {size} bytes, but its header alone needs {8 + n}"
        )
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path} is not a safetensors file: its header is not JSON") from exc
    if not isinstance(header, dict):
        raise CheckpointError(f"{path} is not a safetensors file: its header is not an object")
    names: list[str] = []
    data_end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if not (
            isinstance(offsets, list)
            and len(offsets) == 2
            and all(isinstance(o, int) and o >= 0 for o in offsets)
        ):
            raise CheckpointError(
                f"{path} is not a valid safetensors file: tensor {name!r} has no data_offsets"
            )
        names.append(name)
        data_end = max(data_end, offsets[1])
    expected = 8 + n + data_end
    if size < expected:
        raise CheckpointError(
            f"{path} is truncated: {size} bytes, but its header describes {expected} "
            f"({expected - size} bytes missing)"
        )
    if size > expected:
        raise CheckpointError(
            f"{path} is corrupted: {size} bytes, {size - expected} more than its header "
            f"describes ({expected})"
        )
    return names


@contextlib.contextmanager
def open_shard(path: Path) -> Iterator[Any]:
    """``safetensors.safe_open`` whose failures name the file (anything read_shard_header let
    through, such as an unknown dtype or overlapping tensors)."""
    from safetensors import SafetensorError, safe_open

    try:
        handle = safe_open(str(path), framework="pt", device="cpu")
    except (SafetensorError, OSError) as exc:
        raise CheckpointError(f"{path} is not a readable safetensors file: {exc}") from exc
    with handle:
        yield handle


# ----------------------------------------------------------------------------------------------
# Checkpoint layout


@dataclass
class CheckpointLayout:
    """Where each tensor lives: shard file name per tensor, in the order shards are read."""

    root: Path
    shards: list[str]
    shard_of: dict[str, str]
    names_by_shard: dict[str, list[str]] = field(default_factory=dict)
    config: dict[str, Any] | None = None


def resolve_layout(path: str | Path) -> CheckpointLayout:
    """Accept a checkpoint directory, its index json, or a single .safetensors file."""
    p = Path(path)
    if p.is_dir():
        root = p
        index = p / INDEX_FILE
        single = p / SINGLE_FILE
        if index.is_file():
            p = index
        elif single.is_file():
            p = single
        else:
            raise CheckpointError(f"{root} holds neither {INDEX_FILE} nor {SINGLE_FILE}")
    elif p.is_file():
        root = p.parent
    else:
        raise CheckpointError(f"checkpoint path {p} does not exist")

    if p.suffix == ".json":
        try:
            index_data = json.loads(p.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise CheckpointError(f"{p} is not valid JSON: {exc}") from exc
        weight_map = index_data.get("weight_map") if isinstance(index_data, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f"{p} has no `weight_map` object")
        shard_of = {str(k): str(v) for k, v in weight_map.items()}
    else:
        shard_of = dict.fromkeys(read_shard_header(p), p.name)

    names_by_shard: dict[str, list[str]] = defaultdict(list)
    for name, shard in shard_of.items():
        names_by_shard[shard].append(name)
    for shard in names_by_shard:
        if not (root / shard).is_file():
            raise CheckpointError(f"shard {shard} listed in the index is missing from {root}")
    if p.suffix == ".json":
        # Every listed shard is checked before any is read (a single file was just checked).
        for shard, names in names_by_shard.items():
            present = set(read_shard_header(root / shard))
            absent = [n for n in names if n not in present]
            if absent:
                raise CheckpointError(
                    f"index places {absent[0]} in shard {shard}, but that shard does not hold it"
                    + (f" ({len(absent) - 1} more such tensors)" if len(absent) > 1 else "")
                )
    config = read_config(root) if (root / CONFIG_FILE).is_file() else None
    return CheckpointLayout(
        root=root,
        shards=sorted(names_by_shard),
        shard_of=shard_of,
        names_by_shard={k: sorted(v) for k, v in names_by_shard.items()},
        config=config,
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


def model_config(path: str | Path) -> ModelConfig:
    """The ModelConfig of a checkpoint, with its MTP layer count checked against the tensors.

    Checkpoints re-saved by other tools (fine-tunes, conversions) often drop the MTP layers, and
    some configs omit ``num_nextn_predict_layers``. The main model does not need the MTP layers
    (they only draft tokens for speculative decoding), so rather than refusing such a checkpoint
    for its missing ``mtp.*`` tensors, this builds a model without them and says so once;
    ``model.cfg.num_nextn_predict_layers == 0`` then tells a speculator that MTP is unavailable.
    A config that omits the count gets the one the tensors show. A checkpoint that holds only
    some of an MTP layer's tensors is still rejected by the strict load, naming them.
    """
    raw = read_config(path)
    text = raw["text_config"] if isinstance(raw.get("text_config"), dict) else raw
    declared = text.get(MTP_KEY)
    found = mtp_depths(resolve_layout(path).shard_of)
    if declared is None:
        text[MTP_KEY] = found
        if found == 0:
            logger.info("%s: no MTP layers (config.json omits %s; no mtp.* tensors)", path, MTP_KEY)
    elif found == 0 and isinstance(declared, int) and not isinstance(declared, bool) and declared:
        text[MTP_KEY] = 0
        logger.warning(
            "%s: config.json declares %d MTP layer(s) but the checkpoint holds no mtp.* tensors; "
            "loading the main model only (MTP speculative decoding is unavailable)",
            path,
            declared,
        )
    return ModelConfig.from_dict(raw)


# ----------------------------------------------------------------------------------------------
# Dequantisation with context-rich errors


def _scale_name(weight_name: str) -> str:
    return weight_name[: -len(WEIGHT_SUFFIX)] + SCALE_SUFFIX


def _weight_name(scale_name: str) -> str:
    return scale_name[: -len(SCALE_SUFFIX)] + WEIGHT_SUFFIX


def _fp8_block_for(
    name: str,
    shard: str,
    weight_shape: tuple[int, int],
    scale_shape: tuple[int, ...],
    preferred: tuple[int, int] | None,
) -> tuple[int, int]:
    """Pick the block whose ceil-sized grid matches the stored scale, preferring the config's."""
    candidates = [preferred] if preferred else []
    candidates += [b for b in _KNOWN_FP8_BLOCKS if b not in candidates]
    for block in candidates:
        if fp8_scale_shape(weight_shape, block) == scale_shape:
            return block
    primary = candidates[0]
    raise CheckpointError(
        f"scale {_scale_name(name)} in shard {shard} has shape {list(scale_shape)}, but FP8 weight "
        f"{name} of shape {list(weight_shape)} with block {list(primary)} expects "
        f"{list(fp8_scale_shape(weight_shape, primary))}"
        + ("" if preferred else f" (also tried blocks {[list(b) for b in candidates[1:]]})")
    )


def dequantise_tensor(
    name: str,
    shard: str,
    weight: torch.Tensor,
    scale: torch.Tensor,
    *,
    dtype: torch.dtype,
    block: tuple[int, int] | None,
) -> torch.Tensor:
    """Dequantise one FP8 or packed-FP4 weight, raising CheckpointError with full context."""
    if not is_scale_dtype(scale.dtype):
        raise CheckpointError(
            f"scale {_scale_name(name)} in shard {shard} has dtype {scale.dtype}; expected ue8m0 "
            "(uint8 or float8_e8m0fnu) or a floating-point dtype"
        )
    if weight.dim() != 2 or scale.dim() != 2:
        raise CheckpointError(
            f"quantised weight {name} in shard {shard} and its scale must be 2-D, found weight "
            f"{list(weight.shape)} and scale {list(scale.shape)}"
        )
    try:
        if weight.dtype == torch.float8_e4m3fn:
            chosen = _fp8_block_for(name, shard, tuple(weight.shape), tuple(scale.shape), block)
            return dequant_fp8_block(weight, scale, chosen, out_dtype=dtype)
        expected = fp4_scale_shape(tuple(weight.shape), FP4_GROUP)
        if tuple(scale.shape) != expected:
            raise CheckpointError(
                f"scale {_scale_name(name)} in shard {shard} has shape {list(scale.shape)}, but "
                f"packed FP4 weight {name} of shape {list(weight.shape)} (dtype {weight.dtype}, "
                f"{2 * weight.shape[1]} values per row) expects {list(expected)}"
            )
        return dequant_fp4_e2m1(weight, scale, FP4_GROUP, out_dtype=dtype)
    except QuantFormatError as exc:
        raise CheckpointError(f"cannot dequantise {name} in shard {shard}: {exc}") from exc


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def _return_freed_memory() -> None:
    """Ask glibc to hand freed heap pages back to the OS (after each shard and every 64 MiB).

    glibc raises its mmap threshold after the first large free and then keeps multi-megabyte
    freed blocks on its heap, so resident memory creeps up although the loader holds no
    references. Best effort: a no-op off glibc; about a millisecond per call.
    """
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def _shares_memory(tensor: torch.Tensor, storage_ptr: int) -> bool:
    return tensor.device.type == "cpu" and tensor.untyped_storage().data_ptr() == storage_ptr


def _is_quantised(tensor: torch.Tensor) -> bool:
    return tensor.dtype == torch.float8_e4m3fn or tensor.dtype in _PACKED_FP4_DTYPES


# ----------------------------------------------------------------------------------------------
# Streaming iterator


def _prefetch_foreign_scales(layout: CheckpointLayout, shard: str) -> dict[str, torch.Tensor]:
    """Read the scales of this shard's weights that the index places in other shards.

    Scales are tiny, so opening each foreign shard briefly keeps the one-shard memory bound. They
    are cloned because safetensors returns views of its mmap, which would keep the foreign shard
    mapped.
    """
    wanted: dict[str, list[str]] = defaultdict(list)
    for name in layout.names_by_shard[shard]:
        if name.endswith(WEIGHT_SUFFIX):
            scale = _scale_name(name)
            home = layout.shard_of.get(scale)
            if home is not None and home != shard:
                wanted[home].append(scale)
    if not wanted:
        return {}
    found: dict[str, torch.Tensor] = {}
    for home, scales in wanted.items():
        with open_shard(layout.root / home) as handle:
            present = set(handle.keys())
            for scale in scales:
                if scale not in present:
                    raise CheckpointError(
                        f"index places {scale} in shard {home}, but that shard does not hold it"
                    )
                found[scale] = handle.get_tensor(scale).clone()
    return found


@dataclass
class _ShardReader:
    """Per-shard state for turning raw stored tensors into what the model consumes."""

    layout: CheckpointLayout
    shard: str
    handle: Any
    foreign_scales: dict[str, torch.Tensor]
    dtype: torch.dtype
    device: torch.device
    block: tuple[int, int] | None

    def _scale(self, scale_name: str) -> torch.Tensor:
        if self.layout.shard_of[scale_name] == self.shard:
            return self.handle.get_tensor(scale_name)
        return self.foreign_scales.pop(scale_name)

    def read(self, name: str) -> torch.Tensor | None:
        """The tensor to yield for `name`, or None for a scale consumed with its weight."""
        all_names = self.layout.shard_of
        shard = self.shard
        if name.endswith(SCALE_SUFFIX) and _weight_name(name) in all_names:
            return None  # consumed (and validated) together with its weight
        raw = self.handle.get_tensor(name)
        raw_storage = raw.untyped_storage().data_ptr()
        is_weight = name.endswith(WEIGHT_SUFFIX)
        scale_name = _scale_name(name) if is_weight else None
        has_scale = scale_name is not None and scale_name in all_names

        if name.endswith(SCALE_SUFFIX) and is_ue8m0_dtype(raw.dtype):
            raise CheckpointError(
                f"scale {name} in shard {shard} (dtype {raw.dtype}) has no weight "
                f"{_weight_name(name)} anywhere in the checkpoint"
            )
        if is_weight and _is_quantised(raw):
            if not has_scale:
                kind = "FP8" if raw.dtype == torch.float8_e4m3fn else "packed FP4"
                raise CheckpointError(
                    f"{kind} weight {name} in shard {shard} (dtype {raw.dtype}, shape "
                    f"{list(raw.shape)}) has no scale tensor {scale_name} in the checkpoint"
                )
            assert scale_name is not None
            scale = self._scale(scale_name)
            return dequantise_tensor(
                name,
                shard,
                raw.to(self.device),
                scale.to(self.device),
                dtype=self.dtype,
                block=self.block,
            )
        if raw.dtype == torch.float8_e4m3fn:
            raise CheckpointError(
                f"FP8 tensor {name} in shard {shard} is not a `.weight`, so no scale can be "
                "paired with it"
            )
        if has_scale:
            raise CheckpointError(
                f"weight {name} in shard {shard} has dtype {raw.dtype}, expected float8_e4m3fn "
                f"or packed FP4 (uint8/int8) because scale {scale_name} exists"
            )
        if raw.dtype == torch.bool:
            out = raw.to(self.device)
        elif raw.dtype.is_floating_point or raw.dtype.is_complex:
            # A float `.scale` without a weight is an ordinary parameter, not a quantisation
            # scale, and passes through here like any other float.
            out = raw.to(device=self.device, dtype=self.dtype)
        else:
            out = raw.to(device=self.device, dtype=torch.int64)
        if _shares_memory(out, raw_storage):
            # safetensors hands out views of its mmap; a yielded view would keep the whole
            # shard mapped for as long as the consumer holds the tensor.
            out = out.clone()
        return out


def iter_checkpoint_tensors(
    path: str | Path,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    *,
    progress: bool | None = None,
    block_size: tuple[int, int] | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (raw checkpoint name, tensor) for every non-scale tensor, one shard at a time.

    Floats come out as `dtype` on `device`, quantised weights dequantised, integers as int64.
    Raw bytes are moved to `device` before dequantising so a GPU does the arithmetic.
    `progress`: tqdm bar over shards; None shows it only on a terminal. `block_size` overrides
    the FP8 block from config.json (tests and exotic checkpoints only).
    Consumers should drop each tensor once they have copied it into place; the iterator itself
    keeps no reference to earlier tensors or shards.
    """
    from tqdm.auto import tqdm

    if not dtype.is_floating_point:
        raise CheckpointError(f"dtype must be a floating-point dtype, got {dtype}")
    layout = resolve_layout(path)
    if block_size is None and layout.config is not None:
        block_size = quant_settings(layout.config).weight_block_size
    target = torch.device(device)

    bar = tqdm(
        layout.shards,
        desc="loading shards",
        unit="shard",
        disable=(None if progress is None else not progress),
    )
    since_trim = 0
    try:
        for shard in bar:
            foreign_scales = _prefetch_foreign_scales(layout, shard)
            with open_shard(layout.root / shard) as handle:
                present = set(handle.keys())
                reader = _ShardReader(
                    layout, shard, handle, foreign_scales, dtype, target, block_size
                )
                for name in layout.names_by_shard[shard]:
                    if name not in present:
                        raise CheckpointError(
                            f"index places {name} in shard {shard}, but that shard does not hold it"
                        )
                    if since_trim >= _TRIM_EVERY_BYTES:
                        # The consumer has normally dropped what it was given by now; hand those
                        # pages back before allocating more (amortised: one call per 64 MiB).
                        _return_freed_memory()
                        since_trim = 0
                    out = reader.read(name)
                    if out is not None:
                        since_trim += out.numel() * out.element_size()
                        yield name, out
                    del out
            del handle, reader, foreign_scales
            _return_freed_memory()
            since_trim = 0
    finally:
        bar.close()
