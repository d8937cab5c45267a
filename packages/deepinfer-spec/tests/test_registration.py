from __future__ import annotations

import pytest

from deepinfer import plugins
from deepinfer_spec.speculators import DSparkSpeculator, MTPSpeculator


def test_both_are_registered() -> None:
    assert plugins.speculators.load("dspark") is DSparkSpeculator
    assert plugins.speculators.load("mtp") is MTPSpeculator


def test_dspark_refuses_to_pretend() -> None:
    assert not DSparkSpeculator.availability().ok
    with pytest.raises(NotImplementedError, match="not implemented in deepinfer-spec"):
        DSparkSpeculator()


def test_mtp_is_available() -> None:
    assert MTPSpeculator.availability().ok
