"""Resolving a prompt's image sources into preprocessed images: `ImageResolver` and friends.

The resolver applies the official per-request limits (600 images, 32 MiB per
image, 64 MiB in total, URLs of at most 8192 bytes), obtains each source's
bytes (inline bytes, a ``data:`` URL, or a download), and preprocesses them with
the official options: ``detail`` from the source, images larger than 8192
pixels per side rejected, low-detail images limited to 512 pixels.  Limits and
error kinds, messages and their order follow the official package, because a
server returns them to clients.

This package never opens a network connection on its own.  `ReqwestImageFetcher`
keeps the official name and builder API, but downloads only through a
``transport`` the caller supplies (a function from URL to bytes); without one,
resolving a URL source raises `ImageError` of kind ``"Unsupported"``.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

from deepseek_recipe._image_args import (
    as_bytes,
    as_sequence,
    as_str,
    as_u64,
    expect_instance,
)
from deepseek_recipe._image_errors import ImageFailure
from deepseek_recipe.data_urls import InvalidDataUrl, parse_data_url
from deepseek_recipe.errors import ImageError
from deepseek_recipe.image_formats import media_type_from_mime
from deepseek_recipe.image_preprocess import (
    OpenCvImagePreprocessor,
    PreprocessOptions,
    preprocess_image,
)
from deepseek_recipe.image_sources import ImageSource
from deepseek_recipe.images import ImageInfo, MultiModalData
from deepseek_recipe.reprs import rust_str

__all__ = [
    "LOW_DETAIL_MAX_DIMENSION_PX",
    "MAX_DIMENSION_PX",
    "MAX_IMAGES_PER_REQUEST",
    "MAX_IMAGE_BYTES",
    "MAX_TOTAL_IMAGE_BYTES",
    "MAX_URL_BYTES",
    "ImageQuota",
    "ImageResolver",
    "ImageTransport",
    "ReqwestImageFetcher",
]

MAX_IMAGES_PER_REQUEST = 600
MAX_IMAGE_BYTES = 32 * 1024 * 1024
MAX_TOTAL_IMAGE_BYTES = 64 * 1024 * 1024
MAX_URL_BYTES = 8192
MAX_DIMENSION_PX = 8192
LOW_DETAIL_MAX_DIMENSION_PX = 512

ImageTransport = Callable[[str], bytes]
DestinationFilter = Callable[[str, str], bool]

_NO_TRANSPORT = (
    "unsupported operation: this deepseek-recipe never downloads image URLs by itself; "
    "build the fetcher with ReqwestImageFetcher(transport=...) or .with_transport(...), "
    "where the transport takes the URL and returns the image bytes"
)


def _download_failed(url: str) -> str:
    return f"Failed to download image from {url}"


def _too_large(limit: int) -> str:
    return f"image file size exceeds limit {limit >> 20} MB"


class ImageQuota:
    """Images and encoded bytes recorded by the completed resolve calls of one request.

    Pass the same quota to every resolve call of a request so that the image
    count and total size limits apply to the request as a whole.  A call records
    its sources only after all of them are preprocessed, so a failed call adds
    nothing.
    """

    __slots__ = ("_byte_size", "_image_count")

    def __init__(self) -> None:
        self._image_count = 0
        self._byte_size = 0

    def image_count(self) -> int:
        return self._image_count

    def byte_size(self) -> int:
        return self._byte_size

    def __repr__(self) -> str:
        return f"ImageQuota(image_count={self._image_count}, byte_size={self._byte_size})"


def _url_host(url: str) -> tuple[str, str] | None:
    """The URL's scheme and host, or `None` when it has no host."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError:
        return None
    if not host:
        return None
    return parts.scheme.lower(), host


def _address_of(host: str) -> str:
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host


class ReqwestImageFetcher:
    """Fetches image URLs through a caller-supplied transport, never by itself.

    The official class downloads with the Rust ``reqwest`` client.  Here a
    ``transport`` callable does the download: it takes the URL and returns the
    body as bytes.  Without one, `fetch` raises `ImageError` of kind
    ``"Unsupported"``.  The size limit (32 MiB unless set by `with_max_bytes`)
    applies to what the transport returns.

    A transport error becomes a retryable ``"Fetch"`` error; one with an integer
    ``status`` (or ``code``) attribute in 100-599, like `urllib.error.HTTPError`,
    becomes ``"FetchStatus"``, retryable for 5xx, as in the official package.
    An `ImageError` raised by the transport passes through unchanged.

    The destination filter is called before the transport, with the URL's host
    and, for an IP-literal host, its address.  This package resolves no names,
    so for a host name the filter receives the name as the address; a filter
    that parses addresses then rejects it, which fails closed.  Redirects and
    name resolution are the transport's responsibility.
    """

    DEFAULT_MAX_BYTES = MAX_IMAGE_BYTES

    __slots__ = ("_destination_filter", "_max_bytes", "_transport")

    def __init__(self, *, transport: ImageTransport | None = None) -> None:
        if transport is not None and not callable(transport):
            raise TypeError("transport must be callable")
        self._transport = transport
        self._max_bytes = self.DEFAULT_MAX_BYTES
        self._destination_filter: DestinationFilter | None = None

    def _copy(self) -> ReqwestImageFetcher:
        other = ReqwestImageFetcher(transport=self._transport)
        other._max_bytes = self._max_bytes
        other._destination_filter = self._destination_filter
        return other

    @staticmethod
    def with_max_bytes(max_bytes: int) -> ReqwestImageFetcher:
        """A fetcher (without transport or filter) that refuses bodies over ``max_bytes``."""
        fetcher = ReqwestImageFetcher()
        fetcher._max_bytes = as_u64(max_bytes, "max_bytes")
        return fetcher

    def with_destination_filter(self, destination_filter: DestinationFilter) -> ReqwestImageFetcher:
        """A fetcher with this size limit and transport that fetches only allowed hosts.

        ``destination_filter(host, address)`` returns whether the host may be
        fetched; a callable that raises or returns a non-boolean rejects it.
        """
        if not callable(destination_filter):
            raise TypeError("destination_filter must be callable")
        fetcher = self._copy()
        fetcher._destination_filter = destination_filter
        return fetcher

    def with_transport(self, transport: ImageTransport) -> ReqwestImageFetcher:
        """A fetcher with this size limit and filter that downloads through ``transport``."""
        if not callable(transport):
            raise TypeError("transport must be callable")
        fetcher = self._copy()
        fetcher._transport = transport
        return fetcher

    @property
    def max_bytes(self) -> int:
        return self._max_bytes

    def _allowed(self, host: str) -> bool:
        check = self._destination_filter
        if check is None:
            return True
        try:
            verdict = check(host, _address_of(host))
        except Exception:
            return False
        return verdict is True

    def _fetch(self, url: str) -> bytes:
        """Download one URL; raises `ImageFailure` without a location."""
        if self._transport is None:
            raise ImageFailure("Unsupported", text=_NO_TRANSPORT, scope="none")
        target = _url_host(url)
        if target is not None and not self._allowed(target[1]):
            raise ImageFailure("DestinationRejected", text=_download_failed(url))
        if target is None or target[0] not in ("http", "https"):
            raise ImageFailure("Fetch", text=_download_failed(url), retryable=True)
        try:
            body = self._transport(url)
        except ImageError:
            raise
        except Exception as exc:
            status = getattr(exc, "status", None)
            if not isinstance(status, int) or isinstance(status, bool):
                status = getattr(exc, "code", None)
            if isinstance(status, int) and not isinstance(status, bool) and 100 <= status < 600:
                raise ImageFailure(
                    "FetchStatus",
                    f"HTTP status {status}",
                    text=_download_failed(url),
                    retryable=500 <= status < 600,
                ) from exc
            raise ImageFailure(
                "Fetch", str(exc), text=_download_failed(url), retryable=True
            ) from exc
        data = as_bytes(body, "transport result")
        if len(data) > self._max_bytes:
            raise ImageFailure("ImageTooLarge", text=_too_large(self._max_bytes))
        return data

    def fetch(self, url: str) -> bytes:
        """Download ``url`` through the transport; raises `ImageError` (location ``image[0]``)."""
        text = as_str(url, "url")
        try:
            return self._fetch(text)
        except ImageFailure as failure:
            raise failure.located() from failure.__cause__

    def __repr__(self) -> str:
        return (
            f"ReqwestImageFetcher(max_bytes={self._max_bytes}, "
            f"transport={'set' if self._transport else 'none'}, "
            f"destination_filter={'set' if self._destination_filter else 'none'})"
        )


def _is_http_url(url: str) -> bool:
    """The official test: the first four bytes spell ``http`` in any case."""
    return url[:4].lower() == "http" and len(url.encode("utf-8")) >= 4


def _source_bytes(source: ImageSource, fetcher: ReqwestImageFetcher) -> bytes:
    kind = source.kind
    if kind == "url":
        url = source.url or ""
        if not _is_http_url(url):
            raise ImageFailure("InvalidUrl", text=f"invalid url: {rust_str(url)}", scope="path")
        length = len(url.encode("utf-8"))
        if length > MAX_URL_BYTES:
            raise ImageFailure(
                "UrlTooLong",
                text=f"external link length {length} too long, max link length {MAX_URL_BYTES}",
                scope="path",
            )
        return fetcher._fetch(url)
    if kind == "data_url":
        try:
            data_url = parse_data_url(source.data_url or "")
        except InvalidDataUrl as exc:
            raise ImageFailure("InvalidDataUrl", str(exc)) from exc
        if media_type_from_mime(data_url.mime_essence) is None:
            raise ImageFailure(
                "UnsupportedMediaType", f"unsupported media type {data_url.mime_essence}"
            )
        try:
            return data_url.decode()
        except InvalidDataUrl as exc:
            raise ImageFailure("InvalidDataUrl", str(exc)) from exc
    return bytes(source.data or b"")


class ImageResolver:
    """Resolves image sources with a fetcher and a preprocessor, under per-request limits."""

    __slots__ = ("_fetcher", "_preprocessor")

    def __init__(self, fetcher: ReqwestImageFetcher, preprocessor: OpenCvImagePreprocessor) -> None:
        expect_instance(fetcher, ReqwestImageFetcher, "fetcher")
        expect_instance(preprocessor, OpenCvImagePreprocessor, "preprocessor")
        self._fetcher = fetcher
        self._preprocessor = preprocessor

    def _preprocess(self, data: bytes, options: PreprocessOptions) -> ImageInfo:
        if type(self._preprocessor).preprocess is OpenCvImagePreprocessor.preprocess:
            return preprocess_image(data, options)
        return self._preprocessor.preprocess(data, options)

    def resolve(self, sources: Sequence[ImageSource], quota: ImageQuota) -> MultiModalData:
        """Fetch and preprocess ``sources`` in order, recording them in ``quota`` on success.

        Raises `ImageError` for the first failing source; a failed call leaves the
        quota unchanged.
        """
        items: list[Any] = list(as_sequence(sources, "sources"))
        for item in items:
            expect_instance(item, ImageSource, "sources")
        expect_instance(quota, ImageQuota, "quota")
        count = quota.image_count() + len(items)
        if count > MAX_IMAGES_PER_REQUEST:
            raise ImageError(
                f"Too many images: max {MAX_IMAGES_PER_REQUEST} images per request, got {count}",
                "TooManyImages",
                False,
            )

        # The image index in messages counts sources with the same request path.
        seen: dict[str, int] = {}
        indices: list[int] = []
        for source in items:
            indices.append(seen.get(source.path, 0))
            seen[source.path] = indices[-1] + 1

        payloads: list[bytes] = []
        total = quota.byte_size()
        for source, index in zip(items, indices, strict=True):
            try:
                data = _source_bytes(source, self._fetcher)
                if not data:
                    raise ImageFailure("EmptyImage", "the image is empty")
                if len(data) > MAX_IMAGE_BYTES:
                    raise ImageFailure("ImageTooLarge", text=_too_large(MAX_IMAGE_BYTES))
                total += len(data)
                if total > MAX_TOTAL_IMAGE_BYTES:
                    raise ImageFailure(
                        "TotalSizeTooLarge",
                        text=(
                            "Total image size exceeds the limit: max "
                            f"{MAX_TOTAL_IMAGE_BYTES >> 20} MB per request, got {total >> 20} MB"
                        ),
                        scope="path",
                    )
            except ImageFailure as failure:
                raise failure.located(source.path, index) from failure.__cause__
            payloads.append(data)

        images: list[ImageInfo] = []
        for source, index, data in zip(items, indices, payloads, strict=True):
            options = PreprocessOptions(
                source.detail, MAX_DIMENSION_PX, LOW_DETAIL_MAX_DIMENSION_PX
            )
            try:
                images.append(self._preprocess(data, options))
            except ImageFailure as failure:
                raise failure.located(source.path, index) from failure.__cause__

        quota._image_count = count
        quota._byte_size = total
        return MultiModalData(images)

    def __repr__(self) -> str:
        return f"ImageResolver({self._fetcher!r}, {self._preprocessor!r})"
