"""DeepInfer: an inference engine for DeepSeek-V4-family models."""

from __future__ import annotations

from deepinfer.__about__ import __version__

__all__ = ["__version__"]
