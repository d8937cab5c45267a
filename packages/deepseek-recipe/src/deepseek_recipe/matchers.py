"""Incremental matchers used by the output parser.

Each matcher consumes one symbol (a byte, or a whole control token) at a time
and reports how many trailing symbols could still be the start of its pattern;
the parser holds exactly those symbols back, which is what makes markers split
across chunks (even one byte per chunk) parse the same as unsplit ones.
"""

from __future__ import annotations

from collections.abc import Sequence


def _failure_table(pattern: Sequence[int]) -> list[int]:
    table = [0] * len(pattern)
    k = 0
    for i in range(1, len(pattern)):
        while k and pattern[i] != pattern[k]:
            k = table[k - 1]
        if pattern[i] == pattern[k]:
            k += 1
        table[i] = k
    return table


class Matcher:
    """Interface: `feed(symbol) -> matched`, `held` = symbols that may belong to a match.

    `starters` are the symbols that can move an idle matcher; any other symbol leaves
    it idle, which lets the parser skip plain text in bulk.
    """

    held: int = 0
    starters: frozenset[int] = frozenset()

    @property
    def idle(self) -> bool:
        return self.held == 0

    def feed(self, byte: int) -> bool:
        raise NotImplementedError


class LiteralMatcher(Matcher):
    """Matches one fixed byte string (KMP, so overlapping prefixes are not lost)."""

    def __init__(self, pattern: Sequence[int]) -> None:
        self.pattern = tuple(pattern)
        self.table = _failure_table(pattern)
        self.held = 0
        self.starters = frozenset(self.pattern[:1])

    def _advance(self, k: int, byte: int) -> int:
        pattern = self.pattern
        while k and (k >= len(pattern) or pattern[k] != byte):
            k = self.table[k - 1]
        if k < len(pattern) and pattern[k] == byte:
            k += 1
        return k

    def feed(self, byte: int) -> bool:
        self.held = self._advance(self.held, byte)
        return self.held == len(self.pattern)


class NewlinesThenMatcher(LiteralMatcher):
    """Matches a run of newlines followed by a fixed string; the newlines go with the match."""

    def __init__(self, pattern: Sequence[int]) -> None:
        super().__init__(pattern)
        self.matched = 0
        self.newlines = 0
        self.starters = self.starters | {0x0A}

    def feed(self, byte: int) -> bool:
        if self.matched == 0 and byte == 0x0A:
            self.newlines += 1
        else:
            nxt = self._advance(self.matched, byte)
            if nxt <= self.matched:
                self.newlines = 0
            self.matched = nxt
        self.held = self.matched + self.newlines
        return self.matched == len(self.pattern)


class LeadingNewlineMatcher(Matcher):
    """Matches a newline only as the very first byte it sees."""

    def __init__(self) -> None:
        self.first = True
        self.hit = False
        self.held = 0

    @property
    def idle(self) -> bool:
        return not self.first and not self.hit

    def feed(self, byte: int) -> bool:
        if self.first:
            self.hit = byte == 0x0A
        self.first = False
        self.held = 1 if self.hit else 0
        return self.hit
