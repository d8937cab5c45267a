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
next to the shards (`checkpoint_config.quant_settings`); otherwise it is inferred from the weight
and scale shapes among the layouts the family is known to use (see `_KNOWN_FP8_BLOCKS`).

Before any tensor is read, every shard's header is checked against the file's size, so a
truncated, empty or foreign file fails at once with its name (`shard_check`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import json
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from deepinfer.models.checkpoint_config import (
    CONFIG_FILE,
    CheckpointLayout,
    quant_settings,
    read_config,
)
from deepinfer.models.dequantise import (
    SCALE_SUFFIX,
    WEIGHT_SUFFIX,
    dequantise_tensor,
    scale_name_of,
    weight_name_of,
)
from deepinfer.models.errors import CheckpointError
from deepinfer.models.quant import (
    decode_scale,
    is_ue8m0_dtype,
)
from deepinfer.models.shard_check import check_listed_shards, open_shard, read_shard_header

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
_TRIM_EVERY_BYTES = 64 << 20

_FP4_X2_DTYPE: torch.dtype | None = getattr(torch, "float4_e2m1fn_x2", None)
_PACKED_FP4_DTYPES = tuple(d for d in (torch.uint8, torch.int8, _FP4_X2_DTYPE) if d is not None)


# ----------------------------------------------------------------------------------------------
# Checkpoint layout


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
    if p.suffix == ".json":  # a single file was checked as its names were read
        check_listed_shards(root, names_by_shard)
    config = read_config(root) if (root / CONFIG_FILE).is_file() else None
    return CheckpointLayout(
        root=root,
        shards=sorted(names_by_shard),
        shard_of=shard_of,
        names_by_shard={k: sorted(v) for k, v in names_by_shard.items()},
        config=config,
    )


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
            scale = scale_name_of(name)
            home = layout.shard_of.get(scale)
            if home is not None and home != shard:
                wanted[home].append(scale)
    if not wanted:
        return {}
    found: dict[str, torch.Tensor] = {}
    for home, scales in wanted.items():
        with open_shard(layout.root / home) as handle:
            for scale in scales:  # resolve_layout has checked that the shard holds them
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
    #: FP8 weights to yield as stored, their scales as fp32 (``quantization="auto"``).
    keep_fp8: frozenset[str] = frozenset()
    #: Weights to yield as their stored bytes (packed FP4 experts, FP8 tables with a scale per
    #: 32 of a row), their ue8m0 scales as bytes too.
    keep_bytes: frozenset[str] = frozenset()

    def _scale_bytes(self, name: str) -> torch.Tensor:
        """The ue8m0 bytes of a weight's scale ``name``, never converted."""
        scale = self.handle.get_tensor(name)
        if not is_ue8m0_dtype(scale.dtype):
            raise CheckpointError(
                f"scale {name} in shard {self.shard} has dtype {scale.dtype}; the model keeps "
                "its weight as stored, with ue8m0 scales (uint8 or float8_e8m0fnu)"
            )
        return scale.view(torch.uint8).to(self.device, copy=True)

    def _scale(self, scale_name: str) -> torch.Tensor:
        if self.layout.shard_of[scale_name] == self.shard:
            return self.handle.get_tensor(scale_name)
        return self.foreign_scales.pop(scale_name)

    def read(self, name: str) -> torch.Tensor | None:
        """The tensor to yield for `name`, or None for a scale consumed with its weight."""
        all_names = self.layout.shard_of
        shard = self.shard
        if name.endswith(SCALE_SUFFIX) and weight_name_of(name) in all_names:
            if weight_name_of(name) in self.keep_fp8:  # ue8m0 powers of two are exact in fp32
                return decode_scale(self.handle.get_tensor(name)).to(self.device)
            if weight_name_of(name) in self.keep_bytes:
                return self._scale_bytes(name)
            return None  # consumed (and validated) together with its weight
        raw = self.handle.get_tensor(name)
        raw_storage = raw.untyped_storage().data_ptr()
        is_weight = name.endswith(WEIGHT_SUFFIX)
        scale_name = scale_name_of(name) if is_weight else None
        has_scale = scale_name is not None and scale_name in all_names

        if name.endswith(SCALE_SUFFIX) and is_ue8m0_dtype(raw.dtype):
            raise CheckpointError(
                f"scale {name} in shard {shard} (dtype {raw.dtype}) has no weight "
                f"{weight_name_of(name)} anywhere in the checkpoint"
            )
        if is_weight and _is_quantised(raw):
            if not has_scale:
                kind = "FP8" if raw.dtype == torch.float8_e4m3fn else "packed FP4"
                raise CheckpointError(
                    f"{kind} weight {name} in shard {shard} (dtype {raw.dtype}, shape "
                    f"{list(raw.shape)}) has no scale tensor {scale_name} in the checkpoint"
                )
            assert scale_name is not None
            if name in self.keep_fp8:
                if raw.dtype != torch.float8_e4m3fn:
                    raise CheckpointError(
                        f"weight {name} in shard {shard} has dtype {raw.dtype}; the model keeps "
                        "it as FP8 e4m3 (quantization='auto'), as config.json describes it"
                    )
                return raw.to(self.device, copy=True)
            if name in self.keep_bytes:
                return raw.view(torch.uint8).to(self.device, copy=True)
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
    path: str | Path | CheckpointLayout,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    *,
    progress: bool | None = None,
    block_size: tuple[int, int] | None = None,
    keep_fp8: frozenset[str] = frozenset(),
    keep_bytes: frozenset[str] = frozenset(),
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (raw checkpoint name, tensor) for every non-scale tensor, one shard at a time.

    Floats come out as `dtype` on `device`, quantised weights dequantised, integers as int64.
    Raw bytes are moved to `device` before dequantising so a GPU does the arithmetic.
    `path`: what `resolve_layout` accepts, or a layout it returned (so that a caller who has
    resolved it already does not read every shard header again).
    `progress`: tqdm bar over shards; None shows it only on a terminal. `block_size` overrides
    the FP8 block from config.json (tests and exotic checkpoints only). ``keep_fp8``: FP8
    weights to yield as stored (e4m3) rather than dequantised, each with its scale as fp32;
    ``keep_bytes``: weights to yield as their stored bytes, each with its ue8m0 scale bytes.
    Consumers should drop each tensor once they have copied it into place; the iterator itself
    keeps no reference to earlier tensors or shards.
    """
    from tqdm.auto import tqdm

    if not dtype.is_floating_point:
        raise CheckpointError(f"dtype must be a floating-point dtype, got {dtype}")
    layout = path if isinstance(path, CheckpointLayout) else resolve_layout(path)
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
                reader = _ShardReader(
                    layout,
                    shard,
                    handle,
                    foreign_scales,
                    dtype,
                    target,
                    block_size,
                    keep_fp8,
                    keep_bytes,
                )
                for name in layout.names_by_shard[shard]:
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
