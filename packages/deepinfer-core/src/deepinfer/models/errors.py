"""Errors raised while reading and dequantising checkpoints.

Kept apart from `deepinfer.errors` so the checkpoint reader can grow its own error vocabulary
without touching the package-wide module; every class still derives from DeepInferError, so the
engine and the CLI report them as user-facing problems rather than bugs.
"""

from __future__ import annotations

from deepinfer.errors import DeepInferError


class CheckpointError(DeepInferError):
    """A checkpoint is missing, malformed, or inconsistent with the format it claims to be.

    Messages name the tensor, the shard and the expected versus found shape or dtype, because a
    real checkpoint holds tens of thousands of tensors spread over dozens of shards.
    """


class QuantFormatError(DeepInferError, ValueError):
    """Arguments to a (de)quantisation routine do not describe a valid quantised layout."""
