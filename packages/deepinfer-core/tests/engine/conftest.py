"""A small random-weight V4 model shared by the engine tests, and the reference decoder."""

from __future__ import annotations

import pytest
import torch

from deepinfer.assets import random_tiny_model, tiny_tokenizer
from deepinfer.models.deepseek_v4 import DeepseekV4ForCausalLM


@pytest.fixture(scope="session")
def model() -> DeepseekV4ForCausalLM:
    return random_tiny_model(torch.float32)


@pytest.fixture(scope="session")
def tokenizer():  # type: ignore[no-untyped-def]
    return tiny_tokenizer()
