"""Repository-wide pytest setup.

Triton reads TRITON_INTERPRET when kernels are defined, so it must be set here, before any test
module imports a kernel. Hardware-marked tests are skipped, with the reason shown, where the
hardware is absent: they are reported as not run, never as passed.
"""

from __future__ import annotations

import importlib.util
import os

import pytest


def _has_cuda() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available()


def _has_npu() -> bool:
    if importlib.util.find_spec("torch_npu") is None:
        return False
    try:
        import torch
        import torch_npu  # noqa: F401
    except (ImportError, OSError, RuntimeError):
        return False
    return bool(torch.npu.is_available())  # type: ignore[attr-defined]


HAS_CUDA = _has_cuda()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    has_npu: bool | None = None
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(pytest.mark.skip(reason="needs an NVIDIA GPU; not run here"))
        if "npu" in item.keywords:
            if has_npu is None:
                has_npu = _has_npu()
            if not has_npu:
                item.add_marker(pytest.mark.skip(reason="needs an Ascend NPU with CANN; not run"))


def pytest_sessionstart(session: pytest.Session) -> None:
    """pytest-xdist workers share the machine's cores: each gets its share of torch's CPU
    threads (oversubscribed, torch's threads spin against each other's). A test that needs
    another count sets it (the deepinfer-core and -structured suites run each test on one)."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers and importlib.util.find_spec("torch") is not None:
        import torch

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(workers)))


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (``-n``), schedule by ``xdist_group``: a module whose tests share an
    expensive module fixture (the ahead-of-time compiles, the interpreted FP8/FP4 engine) marks
    itself with one group, so one worker builds that fixture instead of every worker that
    receives some of its tests. Tests without the mark are spread as ``--dist load`` does."""
    if getattr(config.option, "dist", "no") == "load":
        config.option.dist = "loadgroup"
