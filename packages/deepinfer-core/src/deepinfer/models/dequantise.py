"""Dequantising one stored FP8 or packed-FP4 weight, with errors that name it and its shard."""

from __future__ import annotations

import torch

from deepinfer.backends.fp4_ref import FP4_GROUP
from deepinfer.models.errors import CheckpointError, QuantFormatError
from deepinfer.models.quant import (
    dequant_fp4_e2m1,
    dequant_fp8_block,
    fp4_scale_shape,
    fp8_scale_shape,
    is_scale_dtype,
)

WEIGHT_SUFFIX = ".weight"
SCALE_SUFFIX = ".scale"

# V4 dense FP8 uses 128 x 128, V4.1 uses 32 x 32; V4.1 Engram tables use one scale per 32 values
# of a row, i.e. a (1, 32) block. The (1, 32) Engram layout is inferred from the model reference
# (§5 item 9) and has not been checked against a real shard header.
_KNOWN_FP8_BLOCKS: tuple[tuple[int, int], ...] = ((128, 128), (32, 32), (1, 32))


def scale_name_of(weight_name: str) -> str:
    return weight_name[: -len(WEIGHT_SUFFIX)] + SCALE_SUFFIX


def weight_name_of(scale_name: str) -> str:
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
        f"scale {scale_name_of(name)} in shard {shard} has shape {list(scale_shape)}, but FP8 "
        f"weight {name} of shape {list(weight_shape)} with block {list(primary)} expects "
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
            f"scale {scale_name_of(name)} in shard {shard} has dtype {scale.dtype}; expected ue8m0 "
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
                f"scale {scale_name_of(name)} in shard {shard} has shape {list(scale.shape)}, but "
                f"packed FP4 weight {name} of shape {list(weight.shape)} (dtype {weight.dtype}, "
                f"{2 * weight.shape[1]} values per row) expects {list(expected)}"
            )
        return dequant_fp4_e2m1(weight, scale, FP4_GROUP, out_dtype=dtype)
    except QuantFormatError as exc:
        raise CheckpointError(f"cannot dequantise {name} in shard {shard}: {exc}") from exc
