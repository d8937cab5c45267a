"""deepinfer_kernels_sm100."""

from __future__ import annotations

from deepinfer_kernels_sm100.__about__ import __version__

__all__ = ["__version__"]
