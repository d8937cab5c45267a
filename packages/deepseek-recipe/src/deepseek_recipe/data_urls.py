"""`data:` URL decoding as the Fetch Standard defines it (and the `data-url` crate implements).

Image parts of a request often carry the picture inline as a data URL.  The
official resolver decodes them with the WHATWG algorithm, which is more
forgiving than a plain split on ``,``: the scheme is case-insensitive, tabs and
newlines anywhere are ignored, whitespace may surround ``;base64``, base64 may
omit padding and contain spaces, and a ``#fragment`` ends the body.  A request
that the official package accepts must not be rejected here, and vice versa, so
the algorithm is reproduced step by step.
"""

from __future__ import annotations

import binascii
import re
from dataclasses import dataclass

__all__ = ["DataUrl", "InvalidDataUrl", "parse_data_url"]

_TAB_OR_NEWLINE = frozenset(b"\t\n\r")
_B64_WHITESPACE_BYTES = b" \t\n\r\x0c"
_B64_SHAPE = re.compile(rb"([A-Za-z0-9+/]*)(=*)")
# (symbols mod 4, padding symbols) pairs the decoder accepts at the end.
_B64_VALID_ENDINGS = frozenset({(0, 0), (2, 0), (2, 2), (3, 0), (3, 1)})
_ESCAPE_OR_BREAK = re.compile(rb"%[0-9A-Fa-f]{2}|[\t\n\r]")
_MIME_WHITESPACE = " \t\n\r\x0c"
# HTTP token code points (RFC 7230 tchar), as the mimesniff parser tests them.
_TOKEN = frozenset(b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")


class InvalidDataUrl(ValueError):
    """The string is not a data URL, has no body separator, or its base64 is invalid."""


@dataclass(frozen=True)
class DataUrl:
    """A processed data URL: its MIME essence (``type/subtype``, lower-case) and body."""

    mime_essence: str
    base64: bool
    encoded_body: str

    def decode(self) -> bytes:
        """Decode the body; raises `InvalidDataUrl` for invalid base64."""
        raw = _percent_decode(self.encoded_body)
        return _forgiving_base64(raw) if self.base64 else raw


def _after_scheme(url: str) -> str:
    text = url.lstrip("".join(chr(c) for c in range(0x21)))
    data = text.encode("utf-8")
    expected = iter(b"data:")
    consumed = 0
    matched = 0
    for byte in data:
        consumed += 1
        if byte in _TAB_OR_NEWLINE:
            continue
        want = next(expected)
        got = byte if want == ord(":") else (byte | 0x20 if 0x41 <= byte <= 0x5A else byte)
        if got != want:
            raise InvalidDataUrl("not a valid data url")
        matched += 1
        if matched == 5:
            break
    if matched < 5:
        raise InvalidDataUrl("not a valid data url")
    rest = data[consumed:].decode("utf-8")
    return rest.rstrip("".join(chr(c) for c in range(0x21)))


def _split_comma(after_colon: str) -> tuple[str, str]:
    comma = after_colon.find(",")
    hash_mark = after_colon.find("#")
    if comma < 0 or 0 <= hash_mark < comma:
        raise InvalidDataUrl("data url is missing comma delimiting attributes and body")
    return after_colon[:comma], after_colon[comma + 1 :]


def _remove_base64_suffix(header: str) -> str | None:
    data = header.encode("utf-8")
    position = len(data)

    def previous() -> int | None:
        nonlocal position
        while position > 0:
            position -= 1
            byte = data[position]
            if byte not in _TAB_OR_NEWLINE:
                return byte
        return None

    for want, fold in ((ord("4"), False), (ord("6"), False), (ord("e"), True), (ord("s"), True)):
        byte = previous()
        if byte is None or (byte | 0x20 if fold and 0x41 <= byte <= 0x5A else byte) != want:
            return None
    for want in (ord("a"), ord("b")):
        byte = previous()
        if byte is None or (byte | 0x20 if 0x41 <= byte <= 0x5A else byte) != want:
            return None
    byte = previous()
    while byte == ord(" "):
        byte = previous()
    if byte != ord(";"):
        return None
    return data[:position].decode("utf-8", errors="surrogateescape")


def _mime_essence(mime: str) -> str:
    """The URL-serialised header parsed as a MIME type; text/plain when it is not one."""
    serialised: list[str] = []
    if mime.startswith(";"):
        serialised.append("text/plain")
    in_query = False
    for byte in mime.encode("utf-8", errors="surrogateescape"):
        if byte in _TAB_OR_NEWLINE:
            continue
        if byte <= 0x1F or byte >= 0x7F or (in_query and byte in b' "<>'):
            serialised.append(f"%{byte:02X}")
        elif byte == ord("?"):
            in_query = True
            serialised.append("?")
        else:
            serialised.append(chr(byte))
    text = "".join(serialised).strip(_MIME_WHITESPACE)
    kind, slash, rest = text.partition("/")
    subtype = rest.partition(";")[0].rstrip(_MIME_WHITESPACE)
    if (
        not slash
        or not kind
        or not subtype
        or not all(ord(c) < 128 and ord(c) in _TOKEN for c in kind)
        or not all(ord(c) < 128 and ord(c) in _TOKEN for c in subtype)
    ):
        return "text/plain"
    return f"{kind.lower()}/{subtype.lower()}"


def _percent_decode(body: str) -> bytes:
    """Percent-decode up to the fragment, dropping tabs and newlines of the URL text.

    Scanning is left to right and decoded bytes are never rescanned, so a ``%``
    not followed by two hex digits stays literal and an encoded ``%09`` stays a tab.
    """
    data = body.encode("utf-8")
    cut = data.find(b"#")
    if cut >= 0:
        data = data[:cut]
    if b"%" not in data and b"\t" not in data and b"\n" not in data and b"\r" not in data:
        return data
    return _ESCAPE_OR_BREAK.sub(_unescape, data)


def _unescape(match: re.Match[bytes]) -> bytes:
    text = match.group()
    return b"" if len(text) == 1 else bytes((int(text[1:], 16),))


def _forgiving_base64(data: bytes) -> bytes:
    """WHATWG forgiving-base64 decode: whitespace ignored, padding optional but exact."""
    stripped = data.translate(None, _B64_WHITESPACE_BYTES)
    match = _B64_SHAPE.fullmatch(stripped)
    if match is None:
        raise InvalidDataUrl("invalid base64 symbol or symbol after padding")
    symbols, padding = match.group(1), len(match.group(2))
    remainder = len(symbols) % 4
    if (remainder, padding) not in _B64_VALID_ENDINGS:
        raise InvalidDataUrl("invalid base64 length or padding")
    if remainder:
        symbols += b"=" * (4 - remainder)
    return binascii.a2b_base64(symbols)


def parse_data_url(url: str) -> DataUrl:
    """Process a data URL; raises `InvalidDataUrl` when it is not one or has no comma."""
    header, body = _split_comma(_after_scheme(url))
    trimmed = header.strip(" \t\n\r")
    without_suffix = _remove_base64_suffix(trimmed)
    mime = trimmed if without_suffix is None else without_suffix
    return DataUrl(_mime_essence(mime), without_suffix is not None, body)
