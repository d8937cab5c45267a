"""Pure-Python DeepSeek-V4/V4.1 chat encoding and output parsing."""

from __future__ import annotations

from deepseek_recipe.__about__ import __version__

__all__ = ["__version__"]
