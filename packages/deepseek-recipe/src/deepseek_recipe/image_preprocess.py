"""Image preprocessing: the official `OpenCvImagePreprocessor` in pure Python.

Preprocessing turns uploaded image bytes into the picture the V4.1 vision
encoder reads: it checks the format and the declared size, decodes, optionally
shrinks a ``detail="low"`` image, solves the token budget
(`deepseek_recipe.image_tokens`), letterboxes the picture into the solved size
on mid-grey, and re-encodes it as WebP (quality 90).

The sizes, and so the token counts, are computed exactly as the official
package computes them, by `plan_image_size`, which needs nothing but the header
size.  Pixel work uses Pillow, an optional dependency (``deepseek-recipe[images]``)
imported only when an image is actually decoded; its resampling differs from
OpenCV's in the last bits of each pixel, which no count depends on.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from deepseek_recipe._image_args import as_bytes, as_str, as_u32, expect_instance
from deepseek_recipe._image_errors import ImageFailure
from deepseek_recipe.errors import CalcResizeError
from deepseek_recipe.image_formats import (
    MediaType,
    gif_first_frame_complete,
    header_size,
    png_is_complete,
    sniff,
)
from deepseek_recipe.image_tokens import V41_IMAGE_TOKEN_SPEC
from deepseek_recipe.images import ImageInfo
from deepseek_recipe.reprs import rust_str

if TYPE_CHECKING:
    from PIL.Image import Image as PilImage

__all__ = [
    "IMAGE_DETAILS",
    "ImageDetail",
    "OpenCvImagePreprocessor",
    "PreprocessOptions",
    "plan_image_size",
    "preprocess_image",
]

ImageDetail = Literal["low", "high", "original", "auto"]
IMAGE_DETAILS: tuple[ImageDetail, ...] = ("low", "high", "original", "auto")

# The largest side the WebP encoder accepts is 16383; solved sizes at or above
# 16384 are scaled so the long side is 16380 (a whole number of patches).
_WEBP_LIMIT = 16384
_WEBP_FIT = 16380
_WEBP_FIT_ATTEMPTS = 5
_LETTERBOX_GREY = (127, 127, 127)
_WEBP_QUALITY = 90

_I32_MIN = -(2**31)
_I32_MAX = 2**31 - 1


def _as_i32(value: int) -> int:
    """Reinterpret an unsigned 32-bit value as signed, as the official comparisons do."""
    value &= 0xFFFFFFFF
    return value - 2**32 if value > _I32_MAX else value


def _f64_to_i32(value: float) -> int:
    """Rust's saturating `f64 as i32`."""
    if math.isnan(value):
        return 0
    return int(max(float(_I32_MIN), min(float(_I32_MAX), value)))


def _round_half_away(value: float) -> float:
    """Rust's `f64::round`: halves round away from zero."""
    floor = math.floor(value)
    return floor + 1.0 if value - floor >= 0.5 else float(floor)


def _round_half_even(value: float) -> float:
    """Rust's `f64::round_ties_even`."""
    floor = math.floor(value)
    fraction = value - floor
    if fraction < 0.5:
        return float(floor)
    if fraction > 0.5:
        return floor + 1.0
    return float(floor) if floor % 2 == 0 else floor + 1.0


def _ceil_to_patch(value: int) -> int:
    patch = V41_IMAGE_TOKEN_SPEC.patch_size
    return -(-value // patch) * patch


class PreprocessOptions:
    """Options of one preprocessing operation.

    `max_dimension_px` rejects a larger image outright; `low_detail_max_dimension_px`
    shrinks the long side of a ``"low"`` detail image before the token budget is
    solved.  ``"high"``, ``"original"`` and ``"auto"`` are preprocessed alike.
    """

    __slots__ = ("_detail", "_low_detail_max_dimension_px", "_max_dimension_px")

    def __init__(
        self, detail: ImageDetail, max_dimension_px: int, low_detail_max_dimension_px: int
    ) -> None:
        text = as_str(detail, "detail")
        if text not in IMAGE_DETAILS:
            raise ValueError(
                f'invalid detail {rust_str(text)}; expected "low", "high", "original", or "auto"'
            )
        self._detail: ImageDetail = text  # type: ignore[assignment]
        self._max_dimension_px = as_u32(max_dimension_px, "max_dimension_px")
        self._low_detail_max_dimension_px = as_u32(
            low_detail_max_dimension_px, "low_detail_max_dimension_px"
        )

    @property
    def detail(self) -> ImageDetail:
        return self._detail

    @property
    def max_dimension_px(self) -> int:
        return self._max_dimension_px

    @property
    def low_detail_max_dimension_px(self) -> int:
        return self._low_detail_max_dimension_px

    def __repr__(self) -> str:
        return (
            f"PreprocessOptions(detail={rust_str(self._detail)}, "
            f"max_dimension_px={self._max_dimension_px}, "
            f"low_detail_max_dimension_px={self._low_detail_max_dimension_px})"
        )


@dataclass(frozen=True)
class ImagePlan:
    """The sizes one image goes through: decoded, after the low-detail limit, and final."""

    decoded: tuple[int, int]
    limited: tuple[int, int]
    target: tuple[int, int]
    token_count: int


def _check_header(width: int, height: int, options: PreprocessOptions) -> None:
    limit = options.max_dimension_px
    if width > limit or height > limit:
        raise ImageFailure(
            "ImageDimensionsTooLarge", f"Image dimensions ({width}, {height}) are too large"
        )


def _limit_low_detail(width: int, height: int, options: PreprocessOptions) -> tuple[int, int]:
    if options.detail != "low":
        return width, height
    long_side = max(width, height)
    limit = options.low_detail_max_dimension_px
    if long_side <= _as_i32(limit):
        return width, height
    if _as_i32(limit) < 0:
        # Read as a signed 32-bit value the limit is negative, so the official
        # code "shrinks" to about 2^31 pixels per side, which OpenCV cannot allocate.
        raise ImageFailure("Resize", f"cannot resize an image to a side of {limit} pixels")
    ratio = float(limit) / float(long_side)
    new_width = max(1, _f64_to_i32(_round_half_away(float(width) * ratio)))
    new_height = max(1, _f64_to_i32(_round_half_away(float(height) * ratio)))
    return new_width, new_height


def _solve_target(width: int, height: int) -> tuple[int, int, int]:
    try:
        result = V41_IMAGE_TOKEN_SPEC.calc_resize(width, height)
        for _ in range(_WEBP_FIT_ATTEMPTS):
            best_width, best_height = result.best_width, result.best_height
            if max(best_width, best_height) < _WEBP_LIMIT:
                break
            short_side = min(best_width, best_height)
            long_side = max(best_width, best_height)
            scaled = _round_half_away(float(short_side) * float(_WEBP_FIT) / float(long_side))
            short_fit = _ceil_to_patch(max(1, int(scaled)))
            if best_width < best_height:
                best_width, best_height = short_fit, _WEBP_FIT
            else:
                best_width, best_height = _WEBP_FIT, short_fit
            result = V41_IMAGE_TOKEN_SPEC.calc_resize(best_width, best_height)
    except CalcResizeError as exc:
        raise ImageFailure("TokenBudget", str(exc)) from exc
    best_width, best_height = result.best_width, result.best_height
    if max(best_width, best_height) >= _WEBP_LIMIT:
        raise ImageFailure(
            "Resize",
            f"no V4.1 target size within {_WEBP_LIMIT - 1} pixels for an image of "
            f"{width}x{height} pixels",
        )
    if _as_i32(best_width) <= 0 or _as_i32(best_height) <= 0:
        raise ImageFailure("Resize", f"invalid target size: {best_width}x{best_height}")
    return best_width, best_height, result.token_count


def _plan(width: int, height: int, options: PreprocessOptions) -> ImagePlan:
    limited = _limit_low_detail(width, height, options)
    limit = _as_i32(options.max_dimension_px)
    if not (limited[0] <= limit and limited[1] <= limit):
        raise ImageFailure(
            "ImageDimensionsTooLarge",
            f"Image dimensions ({limited[0]}, {limited[1]}) are too large",
        )
    target_width, target_height, tokens = _solve_target(*limited)
    return ImagePlan((width, height), limited, (target_width, target_height), tokens)


def plan_image_size(width: int, height: int, options: PreprocessOptions) -> tuple[int, int]:
    """The ``(width, height)`` preprocessing gives an image of the given decoded size.

    This is the size of the `ImageInfo` that `OpenCvImagePreprocessor.preprocess`
    returns, so its image token count can be known without decoding any pixels.
    Raises `ImageError` (location ``image[0]``) where preprocessing would.
    """
    width = as_u32(width, "width")
    height = as_u32(height, "height")
    expect_instance(options, PreprocessOptions, "options")
    try:
        _check_header(width, height, options)
        return _plan(width, height, options).target
    except ImageFailure as failure:
        raise failure.located() from None


# --- pixels ---------------------------------------------------------------------------------


def _pillow() -> Any:
    try:
        from PIL import Image
    except ImportError as exc:  # pragma: no cover - exercised only without Pillow
        raise ImportError(
            "decoding and re-encoding images needs Pillow; install deepseek-recipe[images] "
            "(image sizes and token counts work without it: see plan_image_size)"
        ) from exc
    return Image


def _decode(data: bytes, media_type: MediaType) -> PilImage:
    """Decode the first frame to 8-bit RGB, compositing any transparency over white."""
    image_module = _pillow()
    # The official code decodes GIF with the Rust image crate, whose failures are
    # decode errors, and everything else with OpenCV, which reports an empty image.
    failure_kind = "Decode" if media_type == "image/gif" else "EmptyImage"
    if media_type == "image/gif":
        gif_first_frame_complete(data)
    elif media_type == "image/png" and not png_is_complete(data):
        raise ImageFailure("EmptyImage", "the PNG is cut off or corrupt")
    try:
        image = image_module.open(io.BytesIO(data))
        image.load()
    except Exception as exc:
        raise ImageFailure(failure_kind, f"cannot decode the image: {exc}") from exc
    try:
        mode = image.mode
        if mode.startswith("I;16") or mode == "I":
            image = image.point(lambda value: value * (1 / 256)).convert("L")
        elif mode == "F":
            image = image.convert("L")
        has_alpha = mode in ("RGBA", "LA", "PA", "La", "RGBa") or "transparency" in image.info
        if has_alpha:
            rgba = image.convert("RGBA")
            white = image_module.new("RGBA", rgba.size, (255, 255, 255, 255))
            return image_module.alpha_composite(white, rgba).convert("RGB")
        return image.convert("RGB")
    except Exception as exc:
        raise ImageFailure(failure_kind, f"cannot convert the image: {exc}") from exc


def _letterbox(image: PilImage, width: int, height: int) -> PilImage:
    """Fit the image into ``width`` x ``height`` keeping its aspect ratio, padding with grey."""
    image_module = _pillow()
    src_width, src_height = image.size
    src_aspect = src_width / src_height
    dst_aspect = width / height
    fit_width, fit_height = width, height
    if src_aspect > dst_aspect:
        fit_height = max(1, _f64_to_i32(_round_half_even(src_height / src_width * width)))
    elif dst_aspect > src_aspect:
        fit_width = max(1, _f64_to_i32(_round_half_even(src_width / src_height * height)))
    resized = image.resize((fit_width, fit_height), image_module.Resampling.BICUBIC)
    if (fit_width, fit_height) == (width, height):
        return resized
    left = _f64_to_i32(_round_half_even((width - fit_width) * 0.5))
    top = _f64_to_i32(_round_half_even((height - fit_height) * 0.5))
    canvas = image_module.new("RGB", (width, height), _LETTERBOX_GREY)
    canvas.paste(resized, (left, top))
    return canvas


def preprocess_image(data: bytes, options: PreprocessOptions) -> ImageInfo:
    """Preprocess one image; raises `ImageFailure` without a location."""
    if not data:
        raise ImageFailure("EmptyImage", "the image is empty")
    media_type = sniff(data)
    if media_type is None:
        raise ImageFailure("UnsupportedMediaType", "unknown media type")
    _check_header(*header_size(data, media_type), options)
    image = _decode(data, media_type)
    width, height = image.size
    limited = _limit_low_detail(width, height, options)
    if limited != (width, height):
        image = image.resize(limited, _pillow().Resampling.BOX)
    plan = _plan(width, height, options)
    target_width, target_height = plan.target
    if (target_width, target_height) != image.size:
        try:
            image = _letterbox(image, target_width, target_height)
        except Exception as exc:
            raise ImageFailure("Resize", f"cannot resize the image: {exc}") from exc
    buffer = io.BytesIO()
    try:
        image.save(buffer, "WEBP", quality=_WEBP_QUALITY)
    except Exception as exc:
        raise ImageFailure("Encode", f"cannot encode the image as WebP: {exc}") from exc
    return ImageInfo(buffer.getvalue(), target_width, target_height)


class OpenCvImagePreprocessor:
    """Decodes, resizes and re-encodes images as the official OpenCV preprocessor does.

    Output sizes (and so token counts) match the official package exactly; the
    WebP bytes come from Pillow and differ from OpenCV's output pixel by pixel.
    """

    def preprocess(self, data: bytes, options: PreprocessOptions) -> ImageInfo:
        """Preprocess one encoded image; raises `ImageError` (location ``image[0]``)."""
        payload = as_bytes(data, "data")
        expect_instance(options, PreprocessOptions, "options")
        try:
            return preprocess_image(payload, options)
        except ImageFailure as failure:
            raise failure.located() from failure.__cause__

    def __repr__(self) -> str:
        return "OpenCvImagePreprocessor()"
