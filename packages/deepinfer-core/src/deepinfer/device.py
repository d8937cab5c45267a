"""Device probing and backend selection.

The probe is a plain function returning a :class:`DeviceInfo` so that tests (and users with unusual
machines) can inject their own; selection itself never touches hardware.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from deepinfer import plugins
from deepinfer.errors import DeepInferError

DeviceKind = Literal["cuda", "npu", "cpu"]


@dataclass(frozen=True)
class DeviceInfo:
    """The accelerator this process would use."""

    kind: DeviceKind
    name: str = "cpu"
    capability: tuple[int, int] | None = None
    note: str = ""


@dataclass(frozen=True)
class BackendChoice:
    """A backend name, the torch device string it runs on, and why it was chosen."""

    backend: str
    device: str
    reason: str


def probe_device() -> DeviceInfo:
    """Look for an NVIDIA GPU, then an Ascend NPU; fall back to the CPU.

    torch_npu is imported only when it is installed, inside a guard: without CANN its import fails
    (missing libhccl.so etc.), which means "no NPU here", not a crash.
    """
    import torch

    if torch.cuda.is_available() and torch.version.cuda is not None:
        cap = torch.cuda.get_device_capability(0)
        return DeviceInfo("cuda", torch.cuda.get_device_name(0), (cap[0], cap[1]))
    if importlib.util.find_spec("torch_npu") is not None:
        try:
            import torch_npu  # noqa: F401

            if torch.npu.is_available():  # type: ignore[attr-defined]
                return DeviceInfo("npu", torch.npu.get_device_name(0))  # type: ignore[attr-defined]
            note = "torch_npu is installed but reports no NPU"
        except (ImportError, OSError, RuntimeError) as exc:
            note = f"torch_npu is installed but failed to import: {exc}"
        return DeviceInfo("cpu", "cpu", note=note)
    return DeviceInfo("cpu", "cpu")


#: The oldest NVIDIA architecture the sm100 package's kernels are built for (Hopper).
SM100_MIN_CAPABILITY: tuple[int, int] = (9, 0)

_DEVICE_BACKENDS: dict[str, tuple[str, ...]] = {
    # preferred first; the torch reference also runs on CUDA when no kernel package is installed
    "cuda": ("sm100", "torch"),
    "npu": ("ascend",),
    "cpu": ("torch",),
}


def select_backend(
    device: str = "auto",
    *,
    probe: Callable[[], DeviceInfo] = probe_device,
    registry: plugins.Registry = plugins.backends,
) -> BackendChoice:
    """Pick the backend for ``device`` ("auto", "cpu", "cuda[:i]", "npu[:i]")."""
    if device == "auto":
        info = probe()
        pre_hopper = info.capability is not None and info.capability < SM100_MIN_CAPABILITY
        if info.kind == "cuda" and "sm100" in registry and not pre_hopper:
            return BackendChoice("sm100", "cuda:0", f"NVIDIA GPU {info.name}; sm100 installed")
        if info.kind == "npu" and "ascend" in registry:
            return BackendChoice("ascend", "npu:0", f"Ascend NPU {info.name}; ascend installed")
        cuda_why = (
            f"NVIDIA GPU {info.name} is older than Hopper (sm_90), which the sm100 kernels need"
            if pre_hopper
            else f"NVIDIA GPU {info.name} but deepinfer[sm100] is not installed"
        )
        why = {
            "cuda": f"{cuda_why}; using torch",
            "npu": f"Ascend NPU {info.name} but deepinfer[ascend] is not installed",
            "cpu": "no NVIDIA GPU or Ascend NPU found" + (f" ({info.note})" if info.note else ""),
        }[info.kind]
        if info.kind == "npu":
            raise registry.missing_error("ascend")
        dev = "cuda:0" if info.kind == "cuda" else "cpu"
        return BackendChoice("torch", dev, why)

    kind = device.split(":", 1)[0]
    if kind not in _DEVICE_BACKENDS:
        raise DeepInferError(
            f"unknown device '{device}': expected 'auto', 'cpu', 'cuda[:index]' or 'npu[:index]'"
        )
    dev = device if ":" in device or kind == "cpu" else f"{kind}:0"
    candidates = _DEVICE_BACKENDS[kind]
    for name in candidates:
        if name in registry:
            return BackendChoice(name, dev, f"device '{device}' requested")
    raise registry.missing_error(candidates[0])
