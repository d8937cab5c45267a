"""Fixtures for the V4.1 tests: a tiny config with every V4.1 feature on, and random weights."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """Tiny ops are dominated by thread hand-off on a shared CPU; one thread is much faster."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
