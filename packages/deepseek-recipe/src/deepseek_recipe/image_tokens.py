"""The V4.1 image token specification: how many inference tokens one image costs.

A V4.1 image is cut into 14-pixel ViT patches and merged 3x3, so the language
model sees one token per 42x42 pixel cell, plus one row-end token per row and
two frame tokens: ``rows * (cols + 1) + 2``.  Before that, the official resize
policy moves the image size into a fixed budget:

* an image smaller than 295 936 pixels (544 x 544) is scaled up to that area;
* both sides are rounded up to whole patches;
* an image whose token count exceeds 1024 is solved down to the largest grid
  whose aspect ratio matches, with 1-cell-wide grids for extreme shapes;
* the whole step repeats until the size stops changing (at most 10 rounds).

Every step here mirrors the official integer and IEEE-754 arithmetic (``u64``
wrapping, saturating float-to-integer casts, truncation), because a single
pixel of difference can move a grid boundary and change the token count that
`resolve_max_tokens` and KV-cache sizing depend on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from deepseek_recipe.errors import CalcResizeError

__all__ = [
    "V41_IMAGE_TOKEN_SPEC",
    "CalcResizeError",
    "ImageTokenSpec",
    "ResizeResult",
    "image_token_count",
]

_U64 = (1 << 64) - 1
_U64_MAX_AS_F64 = 1.8446744073709552e19
_MAX_ROUNDS = 10


def _f64_to_u64(value: float) -> int:
    """Rust's saturating `f64 as u64`: NaN and negatives become 0, overflow saturates."""
    if not value >= 0.0:
        return 0
    if value >= _U64_MAX_AS_F64:
        return _U64
    return int(value)


def _ceil_div(numerator: int, denominator: int) -> int:
    return -(-numerator // denominator)


def _rust_min(first: float, second: float) -> float:
    """Rust's `f64::min`: a NaN operand yields the other operand."""
    if math.isnan(first):
        return second
    if math.isnan(second):
        return first
    return first if first < second else second


@dataclass(frozen=True)
class ResizeResult:
    """One solved image size: the token grid, the pixel size and the token count."""

    n_llm_h: int
    n_llm_w: int
    best_height: int
    best_width: int
    token_count: int

    def __repr__(self) -> str:
        # Rust's derived `Debug`, which the official error message embeds.
        return (
            f"ResizeResult {{ n_llm_h: {self.n_llm_h}, n_llm_w: {self.n_llm_w}, "
            f"best_height: {self.best_height}, best_width: {self.best_width}, "
            f"token_count: {self.token_count} }}"
        )


@dataclass(frozen=True)
class ImageTokenSpec:
    """Patch geometry and size budget of an image encoder.

    The defaults are the V4.1 values; other values exist for tests of the solver
    and are not a supported configuration of the model.
    """

    patch_size: int = 14
    downsample: int = 3
    max_tokens: int = 1024
    min_pixels: int = 544 * 544

    @property
    def cell(self) -> int:
        """Pixels per token-grid cell along one side."""
        return self.patch_size * self.downsample

    def _grid(self, width: int, height: int) -> ResizeResult:
        patch = self.patch_size
        best_height = (_ceil_div(height, patch) * patch) & _U64
        best_width = (_ceil_div(width, patch) * patch) & _U64
        rows = _ceil_div(best_height // patch, self.downsample)
        cols = _ceil_div(best_width // patch, self.downsample)
        tokens = ((cols + 1) * rows + 2) & _U64
        return ResizeResult(rows, cols, best_height, best_width, tokens)

    def calc_resize_once(self, width: int, height: int) -> ResizeResult:
        """One round of the resize policy for an image of ``width`` x ``height`` pixels."""
        if self.patch_size <= 0 or self.downsample <= 0:
            raise ZeroDivisionError("attempt to divide by zero")
        area = (width * height) & _U64
        if area != 0 and area < self.min_pixels:
            scale = math.sqrt(float(self.min_pixels) / float(area))
            width = _f64_to_u64(float(width) * scale)
            height = _f64_to_u64(float(height) * scale)
        result = self._grid(width, height)
        if result.token_count <= self.max_tokens:
            return result

        # Over budget: solve rows * (cols + 1) = max_tokens - 2 for the image's
        # aspect ratio, then shrink to the largest whole-cell size inside it.
        cell = self.cell
        h_f, w_f = float(height), float(width)
        ratio = h_f / w_f if w_f != 0.0 else (math.inf if h_f > 0.0 else math.nan)
        cols_f = math.sqrt((float(self.max_tokens) + -2.0) / ratio + 0.25) + -0.5
        if cols_f < 1.0:
            # Too tall for even one column: a single column of the most rows.
            height = (((self.max_tokens - 2) & _U64) >> 1) * cell
            width = cell
        else:
            rows_f = ratio * cols_f
            if rows_f < 1.0:
                # Too wide for even one row: a single row of the most columns.
                if (self.max_tokens - 3) & _U64 <= 1:
                    raise RuntimeError("token budget must allow a two-column grid")
                height = cell
                width = ((self.max_tokens - 3) * cell) & _U64
            else:
                cols = _f64_to_u64(cols_f)
                rows = _f64_to_u64(rows_f)
                scale = _rust_min(
                    float((cols * cell) & _U64) / w_f, float((cell * rows) & _U64) / h_f
                )
                width = (_f64_to_u64(w_f * scale / float(self.patch_size)) * self.patch_size) & _U64
                height = (
                    _f64_to_u64(scale * h_f / float(self.patch_size)) * self.patch_size
                ) & _U64
        result = self._grid(width, height)
        if result.token_count > self.max_tokens:
            raise RuntimeError("token budget must be satisfied after one solve")
        return result

    def calc_resize(self, width: int, height: int) -> ResizeResult:
        """Repeat `calc_resize_once` on its own output until the size is stable.

        Raises `CalcResizeError` when ten rounds do not reach a fixed point.
        """
        result = self.calc_resize_once(width, height)
        for _ in range(_MAX_ROUNDS - 1):
            following = self.calc_resize_once(result.best_width, result.best_height)
            if following == result:
                return result
            result = following
        raise CalcResizeError(
            f"image resize did not converge after {_MAX_ROUNDS} iterations, last result: {result!r}"
        )


V41_IMAGE_TOKEN_SPEC = ImageTokenSpec()


def image_token_count(width: int, height: int) -> int:
    """Inference tokens of one V4.1 image of the given size (its placeholder included)."""
    return V41_IMAGE_TOKEN_SPEC.calc_resize(width, height).token_count
