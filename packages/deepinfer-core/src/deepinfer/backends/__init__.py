"""Op backends: the torch reference (here) and hardware plugins found through entry points."""

from __future__ import annotations

from deepinfer.backends.base import Availability, Backend

__all__ = ["Availability", "Backend"]
