"""Preprocessed-image containers for the inference backend.

The V4.1 prompt holds one placeholder token per image, but the model consumes a
grid of image tokens whose size follows the official resize policy
(`deepseek_recipe.image_tokens`).  `MultiModalData.image_token_adjustment` is the
difference between the two, which the caller adds to the encoded prompt length
before `ConversationRequest.resolve_max_tokens` and KV-cache sizing.
"""

from __future__ import annotations

from collections.abc import Sequence

from deepseek_recipe._image_args import as_bytes, as_sequence, as_u32, expect_instance
from deepseek_recipe.errors import CalcResizeError
from deepseek_recipe.image_tokens import V41_IMAGE_TOKEN_SPEC

__all__ = ["CalcResizeError", "ImageInfo", "MultiModalData"]


class ImageInfo:
    """A preprocessed image: its encoded bytes and its size in pixels after preprocessing.

    Width and height are unsigned 32-bit values, as in the official type, so an
    out-of-range size fails when the object is built rather than when tokens are
    counted.
    """

    __slots__ = ("_data", "_height", "_width")

    def __init__(self, data: bytes, width: int, height: int) -> None:
        self._data = as_bytes(data, "data")
        self._width = as_u32(width, "width")
        self._height = as_u32(height, "height")

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

    __slots__ = ("_images",)

    def __init__(self, images: Sequence[ImageInfo] | None = None) -> None:
        items = [] if images is None else list(as_sequence(images, "images"))
        for item in items:
            expect_instance(item, ImageInfo, "images")
        # Copies, so later changes to the caller's objects cannot alter the counts.
        self._images = [ImageInfo(i.data, i.width, i.height) for i in items]

    @property
    def images(self) -> list[ImageInfo]:
        return [ImageInfo(i.data, i.width, i.height) for i in self._images]

    def is_empty(self) -> bool:
        return not self._images

    def image_token_adjustment(self) -> int:
        """Inference input tokens beyond one per placeholder (0 when there are no images).

        Each image counts its V4.1 image token count minus the one placeholder it
        already occupies in the prompt.  Raises `CalcResizeError` when fitting an
        image does not converge.
        """
        total = 0
        for image in self._images:
            total += V41_IMAGE_TOKEN_SPEC.calc_resize(image.width, image.height).token_count - 1
        return total
