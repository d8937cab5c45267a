"""deepinfer_kernels_ascend."""

from __future__ import annotations

from deepinfer_kernels_ascend.__about__ import __version__

__all__ = ["__version__"]
