from __future__ import annotations

import pytest
import torch

from deepinfer import plugins
from deepinfer.assets import random_tiny_model
from deepinfer_spec.speculators import DSparkSpeculator, MTPSpeculator


def test_both_are_registered() -> None:
    assert plugins.speculators.load("dspark") is DSparkSpeculator
    assert plugins.speculators.load("mtp") is MTPSpeculator


def test_both_are_available() -> None:
    assert DSparkSpeculator.availability().ok and MTPSpeculator.availability().ok


def test_dspark_refuses_a_model_without_a_drafter() -> None:
    """The shipped drafter is the tiny model's: another model needs its own directory."""
    model = random_tiny_model(torch.float32, seed=5)
    with pytest.raises(ValueError, match="DSpark drafter was built for"):
        DSparkSpeculator(model, 3)
