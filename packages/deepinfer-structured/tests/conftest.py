"""Engines for constrained-generation tests: the random-weight V4 stand-in (fast, any seed
gives varied tokens) and the trained tiny V4.1 model ``LLM("tiny")`` (real text, chat)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from deepinfer.assets import random_tiny_model, tiny_tokenizer
from deepinfer.engine.config import EngineConfig
from deepinfer.engine.engine import LLMEngine
from deepinfer.llm import LLM

sys.path.insert(0, str(Path(__file__).parent))  # schema_suite, shared with the benchmark
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


@pytest.fixture(scope="session")
def trained() -> LLM:
    """The trained tiny model; tests share it, so each must run its requests to the end."""
    return LLM("tiny", dtype="float32", enable_prefix_caching=False)
