"""Image format detection and header sizes, without decoding pixels.

The official preprocessor decides the format from the bytes (never from a URL
or a declared media type), accepts only PNG, JPEG, GIF and WebP, and rejects an
image whose header declares a side above the limit before spending memory on
decoding it.  Detection follows the `infer` crate's magic numbers in its order,
including the non-image signatures it tests first, because those can claim a
buffer whose WebP signature (bytes 8-11) is otherwise valid.

Nothing here needs Pillow, so format and size checks work on any installation.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from typing import Literal

from deepseek_recipe._image_errors import ImageFailure

__all__ = [
    "SUPPORTED_MEDIA_TYPES",
    "MediaType",
    "gif_first_frame_complete",
    "header_size",
    "media_type_from_mime",
    "png_is_complete",
    "sniff",
]

MediaType = Literal["image/png", "image/jpeg", "image/gif", "image/webp"]

SUPPORTED_MEDIA_TYPES: tuple[MediaType, ...] = (
    "image/png",
    "image/jpeg",
    "image/gif",
    "image/webp",
)

# Declared media types the official request conversion accepts (case-insensitive).
_MIME_ALIASES: dict[str, MediaType] = {
    "image/png": "image/png",
    "image/jpeg": "image/jpeg",
    "image/jpg": "image/jpeg",
    "image/gif": "image/gif",
    "image/webp": "image/webp",
}


def media_type_from_mime(mime: str) -> MediaType | None:
    """Map a MIME essence (`type/subtype`) to a supported media type, or `None`."""
    return _MIME_ALIASES.get(mime.lower())


def _claimed_by_earlier_matcher(buf: bytes) -> bool:
    """Whether an application or book signature, tested before images, matches."""
    n = len(buf)
    head = buf[:4]
    if n >= 8 and buf[:8] == b"\x00asm\x01\x00\x00\x00":
        return True  # wasm
    if n > 52 and head == b"\x7fELF":
        return True  # elf
    if n > 1 and buf[:2] == b"MZ":
        return True  # exe / dll
    if n >= 4 and head == b"\xca\xfe\xba\xbe":
        return True  # java class / universal mach-o
    if n >= 2 and buf[:2] == b"BC":
        return True  # llvm bitcode
    if n >= 4 and (
        (head[1:] == b"\xfa\xed\xfe" and head[0] in (0xCF, 0xCE))
        or (head[:3] == b"\xfe\xed\xfa" and head[3] in (0xCF, 0xCE))
    ):
        return True  # mach-o
    if n > 36 and head == b"dex\n" and buf[36] == 0x70:
        return True  # dex
    if n > 100 and head == b"dey\n" and buf[40:44] == b"dex\n" and buf[76] == 0x70:
        return True  # dey
    if n > 2 and buf[:2] in (b"\x30\x82", b"\x4c\x01", b"\x64\x86", b"\x00\x02"):
        return True  # der certificate, coff i386 / x64 / ia64
    if n > 10 and buf[:11] == b"-----BEGIN ":
        return True  # pem
    if n > 57 and head == b"PK\x03\x04" and buf[30:58] == b"mimetypeapplication/epub+zip":
        return True  # epub
    return n > 67 and buf[60:68] == b"BOOKMOBI"  # mobi


def sniff(data: bytes) -> MediaType | None:
    """The supported media type the bytes' magic number names, or `None`."""
    if _claimed_by_earlier_matcher(data):
        return None
    n = len(data)
    if n > 2 and data[:3] == b"\xff\xd8\xff":
        return "image/jpeg"
    if n > 12 and data[:13] == b"\x00\x00\x00\x0cjP  \r\n\x87\n\x00":
        return None  # jpeg 2000
    if n > 3 and data[:4] == b"\x89PNG":
        return "image/png"
    if n > 2 and data[:3] == b"GIF":
        return "image/gif"
    if n > 11 and data[8:12] == b"WEBP":
        return "image/webp"
    return None


def _decode_error(detail: str) -> ImageFailure:
    return ImageFailure("Decode", detail)


def _png_chunks(data: bytes) -> Iterator[tuple[bytes, int, int, bool]]:
    """Walk the complete PNG chunks: (type, data offset, data length, CRC valid).

    The walk stops at the first chunk that is cut off.
    """
    pos = 8
    while pos + 12 <= len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        end = pos + 12 + length
        if end > len(data):
            return
        crc_ok = zlib.crc32(data[pos + 4 : end - 4]) == int.from_bytes(data[end - 4 : end], "big")
        yield data[pos + 4 : pos + 8], pos + 8, length, crc_ok
        pos = end


def _png_size(data: bytes) -> tuple[int, int]:
    # Like the `png` crate, read every chunk before the image data, CRCs included.
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise _decode_error("invalid PNG signature")
    size: tuple[int, int] | None = None
    pos = 8
    for kind, start, length, crc_ok in _png_chunks(data):
        if size is None:
            if kind != b"IHDR" or length != 13 or not crc_ok:
                raise _decode_error("PNG does not start with a valid IHDR chunk")
            width, height = struct.unpack(">II", data[start : start + 8])
            if width == 0 or height == 0 or width > 0x7FFFFFFF or height > 0x7FFFFFFF:
                raise _decode_error(f"invalid PNG dimensions {width}x{height}")
            size = (width, height)
        elif kind == b"IDAT":
            return size
        elif not crc_ok:
            raise _decode_error(f"CRC error in PNG chunk {kind!r}")
        pos = start + length + 4
    # The image data may start in a chunk that is itself cut off: its header is enough.
    if size is not None and data[pos + 4 : pos + 8] == b"IDAT":
        return size
    raise _decode_error("PNG ends before its image data")


def png_is_complete(data: bytes) -> bool:
    """Whether every chunk through IEND is present, critical chunks with valid CRCs.

    OpenCV's decoder (libpng) fails on a PNG cut anywhere before its end, even
    where a more lenient decoder would still produce the picture.
    """
    for kind, _start, _length, crc_ok in _png_chunks(data):
        if not crc_ok and kind[:1].isupper():
            return False
        if kind == b"IEND":
            return True
    return False


def _gif_size(data: bytes) -> tuple[int, int]:
    if len(data) < 13 or data[:6] not in (b"GIF87a", b"GIF89a"):
        raise _decode_error("GIF header is missing or invalid")
    width, height = struct.unpack("<HH", data[6:10])
    return width, height


def _skip_sub_blocks(data: bytes, pos: int) -> int:
    while True:
        if pos >= len(data):
            raise _decode_error("GIF ends inside a data block")
        size = data[pos]
        pos += 1
        if size == 0:
            return pos
        pos += size


def gif_first_frame_complete(data: bytes) -> None:
    """Check the GIF through its first frame's image data, as the `gif` crate reads it.

    Raises `ImageFailure` of kind ``Decode`` for a GIF without a complete first frame.
    """
    _gif_size(data)
    pos = 13
    if data[10] & 0x80:
        pos += 3 * (2 ** ((data[10] & 0x07) + 1))
    while True:
        if pos >= len(data):
            raise _decode_error("GIF ends before its first frame")
        block = data[pos]
        if block == 0x21:
            pos = _skip_sub_blocks(data, pos + 2)
        elif block == 0x2C:
            if pos + 10 > len(data):
                raise _decode_error("GIF ends inside an image descriptor")
            flags = data[pos + 9]
            pos += 10
            if flags & 0x80:
                pos += 3 * (2 ** ((flags & 0x07) + 1))
            _skip_sub_blocks(data, pos + 1)
            return
        else:
            raise _decode_error("file does not contain any image data")


_JPEG_SOF_SUPPORTED = frozenset({0xC0, 0xC1, 0xC2})
_JPEG_SOF_OTHER = frozenset({0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})


def _jpeg_size(data: bytes) -> tuple[int, int]:
    # Like `zune-jpeg`, read the headers through the first scan header.
    pos = 2
    n = len(data)
    size: tuple[int, int] | None = None
    while pos < n:
        if data[pos] != 0xFF:
            pos += 1
            continue
        while pos < n and data[pos] == 0xFF:
            pos += 1
        if pos >= n:
            break
        marker = data[pos]
        pos += 1
        if marker in (0x00, 0x01, 0xD8) or 0xD0 <= marker <= 0xD7:
            continue
        if marker == 0xD9 or pos + 2 > n:
            break
        (length,) = struct.unpack(">H", data[pos : pos + 2])
        if length < 2 or pos + length > n:
            break
        if marker in _JPEG_SOF_SUPPORTED:
            if length < 7:
                raise _decode_error("invalid JPEG frame header")
            height, width = struct.unpack(">HH", data[pos + 3 : pos + 7])
            if width == 0 or height == 0:
                raise _decode_error(f"invalid JPEG dimensions {width}x{height}")
            size = (width, height)
        elif marker in _JPEG_SOF_OTHER:
            raise _decode_error(f"unsupported JPEG frame type 0x{marker:02X}")
        elif marker == 0xDA:
            if size is None:
                raise _decode_error("JPEG scan before its frame header")
            return size
        pos += length
    raise _decode_error("JPEG ends before its first scan")


def _webp_size(data: bytes) -> tuple[int, int]:
    if len(data) < 20 or data[:4] != b"RIFF" or data[8:12] != b"WEBP":
        raise _decode_error("WebP header is missing or invalid")
    chunk = data[12:16]
    body = data[20:]
    if chunk == b"VP8 ":
        if len(body) < 10 or body[3:6] != b"\x9d\x01\x2a":
            raise _decode_error("invalid VP8 frame header")
        width, height = struct.unpack("<HH", body[6:10])
        return width & 0x3FFF, height & 0x3FFF
    if chunk == b"VP8L":
        if len(body) < 5 or body[0] != 0x2F:
            raise _decode_error("invalid VP8L header")
        (bits,) = struct.unpack("<I", body[1:5])
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X":
        if len(body) < 10:
            raise _decode_error("invalid VP8X header")
        width = int.from_bytes(body[4:7], "little") + 1
        height = int.from_bytes(body[7:10], "little") + 1
        return width, height
    raise _decode_error("unknown WebP chunk")


def header_size(data: bytes, media_type: MediaType) -> tuple[int, int]:
    """The ``(width, height)`` a supported image's header declares.

    Raises `ImageFailure` of kind ``Decode`` when the header cannot be read.
    """
    if media_type == "image/png":
        return _png_size(data)
    if media_type == "image/jpeg":
        return _jpeg_size(data)
    if media_type == "image/gif":
        return _gif_size(data)
    return _webp_size(data)
