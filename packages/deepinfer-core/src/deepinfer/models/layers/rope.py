"""Rotary tables for V4's two RoPE flavours.

Sliding-window-only layers use the base theta with no scaling. Compressed layers (and everything
derived from them: compressed entries, indexer queries and keys) use ``compress_rope_theta`` with
DeepSeek's YaRN frequency blend and no attention-scale factor. The YaRN blend is applied always,
as transformers does, because the released checkpoints were trained at the long context.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor


def base_inv_freq(rope_dim: int, theta: float) -> Tensor:
    return 1.0 / (theta ** (torch.arange(0, rope_dim, 2, dtype=torch.float32) / rope_dim))


def yarn_inv_freq(rope_dim: int, theta: float, scaling: dict[str, Any]) -> Tensor:
    """DeepSeek YaRN: interpolate low frequencies by ``factor``, keep high ones, ramp between."""
    factor = float(scaling["factor"])
    original = float(scaling["original_max_position_embeddings"])
    beta_fast = float(scaling.get("beta_fast") or 32)
    beta_slow = float(scaling.get("beta_slow") or 1)

    def correction_dim(rotations: float) -> float:
        return rope_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low = max(math.floor(correction_dim(beta_fast)), 0)
    high = min(math.ceil(correction_dim(beta_slow)), rope_dim - 1)
    if low == high:
        high += 0.001  # avoid a zero-width ramp
    ramp = ((torch.arange(rope_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1.0 - ramp  # 1 = keep the original (extrapolated) frequency
    freq = base_inv_freq(rope_dim, theta)
    return freq / factor * (1.0 - keep) + freq * keep


def is_yarn(scaling: dict[str, Any] | None) -> bool:
    return bool(scaling) and scaling.get("rope_type", scaling.get("type")) == "yarn"


@dataclass
class Rotary:
    """Inverse frequencies of one RoPE flavour; angles are computed per call in fp32."""

    inv_freq: Tensor
    #: Angles already computed, by the ``id`` of the positions tensor (kept, so the id stays
    #: its own); None: no memo (the model's own tables, see :meth:`per_call`).
    memo: dict[int, tuple[Tensor, Tensor, Tensor]] | None = field(
        default=None, repr=False, compare=False
    )

    @classmethod
    def build(
        cls, rope_dim: int, theta: float, scaling: dict[str, Any] | None, device: torch.device
    ) -> Rotary:
        if is_yarn(scaling):
            assert scaling is not None
            freq = yarn_inv_freq(rope_dim, theta, scaling)
        elif scaling and scaling.get("rope_type", scaling.get("type")) not in (None, "default"):
            kind = scaling.get("rope_type", scaling.get("type"))
            raise NotImplementedError(f"rope scaling type {kind!r} is not implemented (only yarn)")
        else:
            freq = base_inv_freq(rope_dim, theta)
        return cls(freq.to(device))

    def per_call(self) -> Rotary:
        """This flavour with a memo for one forward call, whose layers all rotate at the same
        ``positions``: their angles are computed once, not once per layer (four ops, or GPU
        kernels, each). The memo must not outlive the call: a CUDA graph captured after a
        warm-up run would otherwise read the warm-up's angles instead of recording their
        computation."""
        return Rotary(self.inv_freq, {})

    def cos_sin(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """cos/sin of shape [*positions.shape, rope_dim/2] for absolute ``positions``: [S] for
        a sequence chunk, [B, S] for a batch whose rows sit at different positions."""
        if self.memo is not None:
            hit = self.memo.get(id(positions))
            if hit is not None and hit[0] is positions:
                return hit[1], hit[2]
        inv_freq = self.inv_freq.to(positions.device)
        angles = positions.float()[..., None] * inv_freq
        cos, sin = angles.cos(), angles.sin()
        if self.memo is not None:
            self.memo[id(positions)] = (positions, cos, sin)
        return cos, sin


def per_call(tables: dict[str, Rotary]) -> dict[str, Rotary]:
    """A forward call's own copies of the model's RoPE flavours (see :meth:`Rotary.per_call`)."""
    return {kind: r.per_call() for kind, r in tables.items()}
