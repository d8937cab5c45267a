"""An engine over the embedded tiny model for constrained-generation tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from deepinfer.assets import random_tiny_model, tiny_tokenizer
from deepinfer.engine.config import EngineConfig
from deepinfer.engine.engine import LLMEngine
from deepinfer.models.deepseek_v4 import DeepseekV4ForCausalLM


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny() -> DeepseekV4ForCausalLM:
    return random_tiny_model(torch.float32)


@pytest.fixture
def make_engine(tiny: DeepseekV4ForCausalLM):  # type: ignore[no-untyped-def]
    def make(**options: object) -> LLMEngine:
        return LLMEngine(tiny, tiny_tokenizer(), EngineConfig(**options))  # type: ignore[arg-type]

    return make
