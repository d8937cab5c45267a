"""Shared fixtures: the real V4 tokenizer, loaded once for the whole test run."""

from __future__ import annotations

import pytest

from deepseek_recipe import Tokenizer


@pytest.fixture(scope="session")
def v4_tokenizer() -> Tokenizer:
    return Tokenizer.default_v4()
