"""deepinfer_spec."""

from __future__ import annotations

from deepinfer_spec.__about__ import __version__

__all__ = ["__version__"]
