"""Strict name-for-name loading of checkpoint tensors into a model's parameters."""

from __future__ import annotations

from collections.abc import Iterable

from torch import Tensor

from deepinfer.models.errors import CheckpointError


def load_named(
    expected: dict[str, Tensor], tensors: Iterable[tuple[str, Tensor]], model: str
) -> None:
    """Copy (official name, tensor) pairs into ``expected``'s targets as they arrive (a streamed
    checkpoint never sits in memory twice); strict about names, shapes and float-ness. Raises
    :class:`CheckpointError` naming the tensor, what was expected, and ``model``."""
    seen: set[str] = set()
    for name, tensor in tensors:
        target = expected.get(name)
        if target is None:
            raise CheckpointError(
                f"unexpected tensor {name!r} {tuple(tensor.shape)} {tensor.dtype}: the model "
                f"({model}) has no such parameter"
            )
        if name in seen:
            raise CheckpointError(f"tensor {name!r} appears twice in the checkpoint")
        if tuple(tensor.shape) != tuple(target.shape):
            raise CheckpointError(
                f"tensor {name!r} has shape {tuple(tensor.shape)}, expected "
                f"{tuple(target.shape)} ({target.dtype})"
            )
        if tensor.is_floating_point() != target.is_floating_point():
            raise CheckpointError(
                f"tensor {name!r} has dtype {tensor.dtype}, expected {target.dtype} "
                f"{tuple(target.shape)}"
            )
        target.copy_(tensor)
        seen.add(name)
    missing = [n for n in expected if n not in seen]
    if missing:
        listed = ", ".join(
            f"{n} {tuple(expected[n].shape)} {expected[n].dtype}" for n in missing[:8]
        )
        more = f" and {len(missing) - 8} more" if len(missing) > 8 else ""
        raise CheckpointError(f"checkpoint is missing {len(missing)} tensors: {listed}{more}")
