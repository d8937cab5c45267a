"""DeepInfer: an inference engine for DeepSeek-V4-family models."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from deepinfer.__about__ import __version__
from deepinfer.sampling_params import SamplingParams

if TYPE_CHECKING:
    from deepinfer.llm import LLM

__all__ = ["LLM", "SamplingParams", "__version__"]


def __getattr__(name: str) -> Any:
    # LLM pulls in the model and torch; keep `import deepinfer` (plugins, info) light.
    if name == "LLM":
        from deepinfer.llm import LLM

        return LLM
    raise AttributeError(f"module 'deepinfer' has no attribute {name!r}")
