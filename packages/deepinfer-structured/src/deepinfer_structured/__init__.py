"""deepinfer_structured."""

from __future__ import annotations

from deepinfer_structured.__about__ import __version__

__all__ = ["__version__"]
