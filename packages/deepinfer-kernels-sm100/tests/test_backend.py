from __future__ import annotations

import pytest
import torch

from deepinfer import plugins
from deepinfer.errors import BackendUnavailableError
from deepinfer_kernels_sm100.backend import Sm100Backend


def test_registered_under_backends() -> None:
    assert plugins.backends.load("sm100") is Sm100Backend


def test_availability_matches_the_machine() -> None:
    avail = Sm100Backend.availability()
    has_hopper = torch.cuda.is_available() and torch.cuda.get_device_capability(0) >= (9, 0)
    assert avail.ok == has_hopper
    if not avail.ok:
        assert avail.reason
        with pytest.raises(BackendUnavailableError, match="backend 'sm100' cannot run here"):
            Sm100Backend()


@pytest.mark.gpu
def test_runs_on_cuda() -> None:
    backend = Sm100Backend()
    assert backend.device.type == "cuda"
    with pytest.raises(BackendUnavailableError, match="runs on cuda"):
        Sm100Backend("cpu")
