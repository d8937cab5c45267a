"""The torch reference backend: every op in plain torch.

It is the CPU default and the numeric reference that every accelerated kernel is tested against.
It also runs on a CUDA device (plain torch ops), which is how kernel packages inherit the ops they
do not accelerate.
"""

from __future__ import annotations

from typing import ClassVar

from deepinfer.backends.base import Availability, Backend


class TorchBackend(Backend):
    """Plain-torch ops on any device torch itself supports."""

    name: ClassVar[str] = "torch"
    device_types: ClassVar[tuple[str, ...]] = ("cpu", "cuda")

    @classmethod
    def availability(cls) -> Availability:
        return Availability(True)
