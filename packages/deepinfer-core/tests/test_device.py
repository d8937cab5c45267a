from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from deepinfer import plugins
from deepinfer.device import DeviceInfo, probe_device, select_backend
from deepinfer.errors import DeepInferError, PluginNotFoundError
from deepinfer.plugins import Registry

FakeDist = Callable[..., Path]


@pytest.fixture
def registry_with(fake_dist: FakeDist) -> Callable[..., Registry]:
    """A backends registry holding exactly the given names, from fake installed distributions."""

    def make(*names: str) -> Registry:
        group = f"deepinfer.backends_{uuid.uuid4().hex[:8]}"
        for name in names:
            fake_dist(f"fake-{name}", {group: {name: f"fake_{name}:Backend"}})
        return Registry(group, "backend", plugins.backends.hints)

    return make


GPU = DeviceInfo("cuda", "NVIDIA H200", (9, 0))
NPU = DeviceInfo("npu", "Ascend950")
CPU = DeviceInfo("cpu")


@pytest.mark.parametrize(
    ("probe", "installed", "backend", "device"),
    [
        (GPU, ("torch", "sm100"), "sm100", "cuda:0"),
        (GPU, ("torch", "sm100", "ascend"), "sm100", "cuda:0"),
        (GPU, ("torch",), "torch", "cuda:0"),
        (NPU, ("torch", "ascend"), "ascend", "npu:0"),
        (NPU, ("torch", "sm100", "ascend"), "ascend", "npu:0"),
        (CPU, ("torch", "sm100", "ascend"), "torch", "cpu"),
        (CPU, ("torch",), "torch", "cpu"),
    ],
)
def test_auto_selection(
    registry_with: Callable[..., Registry],
    probe: DeviceInfo,
    installed: tuple[str, ...],
    backend: str,
    device: str,
) -> None:
    choice = select_backend("auto", probe=lambda: probe, registry=registry_with(*installed))
    assert (choice.backend, choice.device) == (backend, device)


def test_auto_on_npu_without_plugin_names_the_extra(registry_with: Callable[..., Registry]) -> None:
    with pytest.raises(PluginNotFoundError, match=r"pip install 'deepinfer\[ascend\]'"):
        select_backend("auto", probe=lambda: NPU, registry=registry_with("torch", "sm100"))


def test_gpu_without_plugin_explains_the_fallback(registry_with: Callable[..., Registry]) -> None:
    choice = select_backend("auto", probe=lambda: GPU, registry=registry_with("torch"))
    assert "deepinfer[sm100] is not installed" in choice.reason


def test_pre_hopper_gpu_keeps_the_torch_reference(registry_with: Callable[..., Registry]) -> None:
    ampere = DeviceInfo("cuda", "NVIDIA A100", (8, 0))
    choice = select_backend("auto", probe=lambda: ampere, registry=registry_with("torch", "sm100"))
    assert (choice.backend, choice.device) == ("torch", "cuda:0")
    assert "older than Hopper" in choice.reason


def _no_probe() -> DeviceInfo:
    raise AssertionError("an explicit device must not probe the hardware")


@pytest.mark.parametrize(
    ("device", "installed", "backend", "torch_device"),
    [
        ("cpu", ("torch", "sm100"), "torch", "cpu"),
        ("cuda", ("torch", "sm100"), "sm100", "cuda:0"),
        ("cuda:1", ("torch", "sm100"), "sm100", "cuda:1"),
        ("cuda", ("torch",), "torch", "cuda:0"),
        ("npu:3", ("torch", "ascend"), "ascend", "npu:3"),
    ],
)
def test_explicit_device(
    registry_with: Callable[..., Registry],
    device: str,
    installed: tuple[str, ...],
    backend: str,
    torch_device: str,
) -> None:
    choice = select_backend(device, probe=_no_probe, registry=registry_with(*installed))
    assert (choice.backend, choice.device) == (backend, torch_device)


def test_explicit_errors(registry_with: Callable[..., Registry]) -> None:
    reg = registry_with("torch")
    with pytest.raises(PluginNotFoundError, match=r"deepinfer\[ascend\]"):
        select_backend("npu", probe=_no_probe, registry=reg)
    with pytest.raises(DeepInferError, match="unknown device 'tpu'"):
        select_backend("tpu", probe=_no_probe, registry=reg)


def test_real_probe_agrees_with_torch() -> None:
    import torch

    info = probe_device()
    assert (info.kind == "cuda") == torch.cuda.is_available()
