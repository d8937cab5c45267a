"""Values every layer of one pass computes alike, computed once per pass."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, TypeVar

_T = TypeVar("_T")


class StepMemo:
    """Values every layer of one pass computes alike from the pass's positions and rows: the
    window mask, the ring's read and write rows, a compression ratio's window phase and entry
    angles, the entries' page locations. A real model has dozens of layers; each would
    otherwise launch the same ~10 small integer kernels. One memo per pass (a decode step, a
    ragged step, a span's call), shared by its layers' rows; it must not outlive the pass (a
    CUDA graph captured after a warm-up run would read the warm-up's values)."""

    def __init__(self) -> None:
        self._values: dict[Hashable, Any] = {}

    def get(self, key: Hashable, make: Callable[[], _T]) -> _T:
        """The value stored under ``key``, made by ``make()`` the first time it is asked for."""
        if key not in self._values:
            self._values[key] = make()
        return self._values[key]
