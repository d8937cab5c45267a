"""A prompt as a sequence of pieces, each either plain text or one special token.

Rendering builds pieces instead of a string so that encoding never has to
re-scan text for token spellings: text a user typed can look exactly like a
control token and must still be encoded as ordinary text.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Piece:
    value: str
    is_special: bool


def text(value: str) -> Piece:
    return Piece(value, False)


def special(value: str) -> Piece:
    return Piece(value, True)


def assemble(pieces: Iterable[Piece]) -> tuple[str, list[tuple[int, int]], list[Piece]]:
    """Join pieces; return the prompt, code-point ranges of special pieces, and merged pieces."""
    parts: list[str] = []
    ranges: list[tuple[int, int]] = []
    merged: list[Piece] = []
    pos = 0
    for piece in pieces:
        if not piece.value:
            continue
        end = pos + len(piece.value)
        if piece.is_special:
            ranges.append((pos, end))
            merged.append(piece)
        elif merged and not merged[-1].is_special:
            merged[-1] = Piece(merged[-1].value + piece.value, False)
        else:
            merged.append(piece)
        parts.append(piece.value)
        pos = end
    return "".join(parts), ranges, merged
