"""A small random-weight V4 model shared by the engine tests, and the reference decoder."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from deepinfer.assets import random_tiny_model, tiny_tokenizer
from deepinfer.models.deepseek_v4 import DeepseekV4ForCausalLM


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def model() -> DeepseekV4ForCausalLM:
    return random_tiny_model(torch.float32)


@pytest.fixture(scope="session")
def tokenizer():  # type: ignore[no-untyped-def]
    return tiny_tokenizer()
