"""Image sources attached to conversation messages.

`path` records where in the request the image came from (`.messages[1]`), so
errors raised while resolving images can point at the offending part.
"""

from __future__ import annotations

from typing import Literal

from deepseek_recipe._image_args import as_bytes, as_str
from deepseek_recipe.reprs import rust_str as _rust_str

ImageDetail = Literal["low", "high", "original", "auto"]
_DETAILS = ("low", "high", "original", "auto")


def check_detail(detail: object) -> ImageDetail:
    """Validate a detail level with the official error for an unknown one."""
    text = as_str(detail, "detail")
    if text not in _DETAILS:
        raise ValueError(
            f'invalid detail {_rust_str(text)}; expected "low", "high", "original", or "auto"'
        )
    return text  # type: ignore[return-value]


class ImageSource:
    """Base class of image sources; `path` is the request location used in error messages."""

    _kind: Literal["data_url", "url", "bytes"]

    def __init__(self, detail: ImageDetail = "high", path: str = "") -> None:
        self._detail: ImageDetail = check_detail(detail)
        self._path = as_str(path, "path")

    @property
    def kind(self) -> str:
        return self._kind

    @property
    def detail(self) -> ImageDetail:
        return self._detail

    @property
    def data_url(self) -> str | None:
        return None

    @property
    def url(self) -> str | None:
        return None

    @property
    def data(self) -> bytes | None:
        return None

    @property
    def path(self) -> str:
        return self._path

    def _tail(self) -> str:
        return f"detail={_rust_str(self._detail)}, path={_rust_str(self._path)}"


class DataUrlImageSource(ImageSource):
    """An image referenced by a `data:` URL."""

    _kind = "data_url"

    def __init__(self, data_url: str, detail: ImageDetail = "high", *, path: str = "") -> None:
        self._data_url = as_str(data_url, "data_url")
        super().__init__(detail, path)

    @property
    def data_url(self) -> str | None:
        return self._data_url

    def __repr__(self) -> str:
        return f"DataUrlImageSource({_rust_str(self._data_url)}, {self._tail()})"


class UrlImageSource(ImageSource):
    """An image referenced by an external URL."""

    _kind = "url"

    def __init__(self, url: str, detail: ImageDetail = "high", *, path: str = "") -> None:
        self._url = as_str(url, "url")
        super().__init__(detail, path)

    @property
    def url(self) -> str | None:
        return self._url

    def __repr__(self) -> str:
        return f"UrlImageSource({_rust_str(self._url)}, {self._tail()})"


class BytesImageSource(ImageSource):
    """An image supplied as encoded bytes."""

    _kind = "bytes"

    def __init__(self, data: bytes, detail: ImageDetail = "high", *, path: str = "") -> None:
        self._data = as_bytes(data, "data")
        super().__init__(detail, path)

    @property
    def data(self) -> bytes | None:
        return self._data

    def __repr__(self) -> str:
        return f"BytesImageSource(<{len(self._data)} bytes>, {self._tail()})"
