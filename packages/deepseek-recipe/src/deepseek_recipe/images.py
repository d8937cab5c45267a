"""Preprocessed-image containers for the inference backend.

The V4.1 prompt holds one placeholder per image, but the model sees a grid of
image tokens whose size depends on the official resize policy.  That policy
(minimum/maximum image areas and its convergence search) has not been
reproduced exactly, so the token count raises instead of guessing: a wrong
count would silently corrupt `resolve_max_tokens` and KV-cache sizing.
"""

from __future__ import annotations

from collections.abc import Sequence

from deepseek_recipe.errors import CalcResizeError

__all__ = ["CalcResizeError", "ImageInfo", "MultiModalData"]


class ImageInfo:
    """Encoded image bytes plus the image size in pixels after preprocessing."""

    def __init__(self, data: bytes, width: int, height: int) -> None:
        self._data = bytes(data)
        self._width = int(width)
        self._height = int(height)

    @property
    def data(self) -> bytes:
        return self._data

    @property
    def width(self) -> int:
        return self._width

    @property
    def height(self) -> int:
        return self._height

    def __repr__(self) -> str:
        return f"ImageInfo(<{len(self._data)} bytes>, width={self._width}, height={self._height})"


class MultiModalData:
    """Images in the order their placeholders appear in a prompt."""

    def __init__(self, images: Sequence[ImageInfo] | None = None) -> None:
        self._images = list(images or [])

    @property
    def images(self) -> list[ImageInfo]:
        return list(self._images)

    def is_empty(self) -> bool:
        return not self._images

    def image_token_adjustment(self) -> int:
        """Inference tokens beyond one per placeholder (0 when there are no images)."""
        if not self._images:
            return 0
        raise NotImplementedError(
            "image_token_adjustment: the official V4.1 image resize policy is not reproduced by "
            "this package yet; compute image token counts with the official package"
        )
