"""Image sources attached to conversation messages.

`path` records where in the request the image came from (`.messages[1]`), so
errors raised while resolving images can point at the offending part.
"""

from __future__ import annotations

from typing import Literal

from deepseek_recipe.reprs import rust_str as _rust_str

ImageDetail = Literal["low", "high", "original", "auto"]


class ImageSource:
    """Base class of image sources; `path` is the request location used in error messages."""

    _kind: Literal["data_url", "url", "bytes"]

    def __init__(self, detail: ImageDetail = "high", path: str = "") -> None:
        if detail not in ("low", "high", "original", "auto"):
            raise ValueError(f"unknown image detail {detail!r}")
        self._detail: ImageDetail = detail
        self._path = path

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
        super().__init__(detail, path)
        self._data_url = data_url

    @property
    def data_url(self) -> str | None:
        return self._data_url

    def __repr__(self) -> str:
        return f"DataUrlImageSource(<{len(self._data_url)} characters>, {self._tail()})"


class UrlImageSource(ImageSource):
    """An image referenced by an external URL."""

    _kind = "url"

    def __init__(self, url: str, detail: ImageDetail = "high", *, path: str = "") -> None:
        super().__init__(detail, path)
        self._url = url

    @property
    def url(self) -> str | None:
        return self._url

    def __repr__(self) -> str:
        return f"UrlImageSource({_rust_str(self._url)}, {self._tail()})"


class BytesImageSource(ImageSource):
    """An image supplied as encoded bytes."""

    _kind = "bytes"

    def __init__(self, data: bytes, detail: ImageDetail = "high", *, path: str = "") -> None:
        super().__init__(detail, path)
        self._data = bytes(data)

    @property
    def data(self) -> bytes | None:
        return self._data

    def __repr__(self) -> str:
        return f"BytesImageSource(<{len(self._data)} bytes>, {self._tail()})"
