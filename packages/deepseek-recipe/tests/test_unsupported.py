"""What this package deliberately does not do must fail loudly, never pretend to work."""

from __future__ import annotations

import pytest

import deepseek_recipe as dr


def test_no_hub_download() -> None:
    with pytest.raises(NotImplementedError):
        dr.Tokenizer.from_pretrained("deepseek-ai/DeepSeek-V4-Pro")
