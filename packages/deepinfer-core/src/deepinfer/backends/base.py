"""The Backend protocol: the op table the model and the sampler call.

A backend is a class registered under the ``deepinfer.backends`` entry-point group. Hardware
packages subclass :class:`deepinfer.backends.torch_ref.TorchBackend` and override only the ops they
accelerate, so every op always has the torch reference to fall back on and to be tested against.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from deepinfer.errors import BackendUnavailableError
from deepinfer.plugins import Availability

__all__ = ["Availability", "Backend"]


class Backend:
    """Base of every backend: availability check and the device it runs on.

    ``availability()`` is a classmethod so that discovery and ``deepinfer info`` can ask without
    building a backend (and without touching the device more than the check needs).
    """

    name: ClassVar[str] = "base"
    #: torch device types this backend runs on.
    device_types: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def availability(cls) -> Availability:
        raise NotImplementedError(f"{cls.__name__} must implement availability()")

    @classmethod
    def default_device(cls) -> torch.device:
        return torch.device(cls.device_types[0])

    def __init__(self, device: str | torch.device | None = None) -> None:
        avail = type(self).availability()
        if not avail.ok:
            raise BackendUnavailableError(f"backend '{self.name}' cannot run here: {avail.reason}")
        self.device = torch.device(device) if device is not None else type(self).default_device()
        if self.device.type not in self.device_types:
            raise BackendUnavailableError(
                f"backend '{self.name}' runs on {', '.join(self.device_types)}, "
                f"not on device '{self.device}'"
            )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(device={str(self.device)!r})"
