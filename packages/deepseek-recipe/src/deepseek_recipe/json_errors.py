"""serde_json-style syntax error messages for request bodies given as text.

Python's `json` module rejects the same documents but words and places the
error differently; clients that match on the official message need serde's
wording ("EOF while parsing an object at line 1 column 6").  This validator is
only run after `json.loads` has failed, so it favours clarity over speed.
"""

from __future__ import annotations

_WS = " \t\n\r"
_ESCAPES = set('"\\/bfnrtu')
_HEX = set("0123456789abcdefABCDEF")


class _SyntaxError(Exception):
    def __init__(self, message: str, index: int, at_eof: bool) -> None:
        super().__init__(message)
        self.index = index
        self.at_eof = at_eof


class _Reader:
    def __init__(self, text: str) -> None:
        self.s = text
        self.i = 0

    def fail(self, message: str, index: int | None = None) -> _SyntaxError:
        return _SyntaxError(message, self.i if index is None else index, False)

    def eof(self, what: str) -> _SyntaxError:
        return _SyntaxError(f"EOF while parsing {what}", len(self.s), True)

    def skip_ws(self) -> None:
        while self.i < len(self.s) and self.s[self.i] in _WS:
            self.i += 1

    def peek(self) -> str | None:
        return self.s[self.i] if self.i < len(self.s) else None

    def value(self, depth: int = 0) -> None:
        self.skip_ws()
        ch = self.peek()
        if ch is None:
            raise self.eof("a value")
        if depth > 127:
            raise self.fail("recursion limit exceeded")
        if ch == '"':
            self.string()
        elif ch == "{":
            self.obj(depth)
        elif ch == "[":
            self.array(depth)
        elif ch in "tfn":
            self.ident({"t": "true", "f": "false", "n": "null"}[ch])
        elif ch == "-" or ch.isdigit():
            self.number()
        else:
            raise self.fail("expected value")

    def ident(self, word: str) -> None:
        for expected in word:
            ch = self.peek()
            if ch is None:
                raise self.eof("a value")
            if ch != expected:
                raise self.fail("expected ident")
            self.i += 1

    def digits(self) -> int:
        start = self.i
        while self.peek() is not None and self.s[self.i].isdigit():
            self.i += 1
        return self.i - start

    def number(self) -> None:
        if self.peek() == "-":
            self.i += 1
        ch = self.peek()
        if ch is None:
            raise self.eof("a value")
        if ch == "0":
            self.i += 1
            if self.peek() is not None and self.s[self.i].isdigit():
                raise self.fail("invalid number")
        elif ch.isdigit():
            self.digits()
        else:
            raise self.fail("invalid number")
        if self.peek() == ".":
            self.i += 1
            if self.peek() is None:
                raise self.eof("a value")
            if not self.digits():
                raise self.fail("invalid number")
        if self.peek() in ("e", "E"):
            self.i += 1
            if self.peek() in ("+", "-"):
                self.i += 1
            if self.peek() is None:
                raise self.eof("a value")
            if not self.digits():
                raise self.fail("invalid number")

    def string(self) -> None:
        self.i += 1
        while True:
            ch = self.peek()
            if ch is None:
                raise self.eof("a string")
            if ch == '"':
                self.i += 1
                return
            if ord(ch) < 0x20:
                raise self.fail("control character (\\u0000-\\u001F) found while parsing a string")
            self.i += 1
            if ch == "\\":
                esc = self.peek()
                if esc is None:
                    raise self.eof("a string")
                if esc not in _ESCAPES:
                    raise self.fail("invalid escape")
                self.i += 1
                if esc == "u":
                    # serde reads all four digits before judging them.
                    if self.i + 4 > len(self.s):
                        raise self.eof("a string")
                    digits = self.s[self.i : self.i + 4]
                    self.i += 4
                    if not set(digits) <= _HEX:
                        raise self.fail("invalid escape", self.i - 1)

    def obj(self, depth: int) -> None:
        self.i += 1
        self.skip_ws()
        if self.peek() == "}":
            self.i += 1
            return
        while True:
            self.skip_ws()
            ch = self.peek()
            if ch is None:
                raise self.eof("an object")
            if ch != '"':
                raise self.fail("key must be a string")
            self.string()
            self.skip_ws()
            ch = self.peek()
            if ch is None:
                raise self.eof("an object")
            if ch != ":":
                raise self.fail("expected `:`")
            self.i += 1
            self.value(depth + 1)
            self.skip_ws()
            ch = self.peek()
            if ch is None:
                raise self.eof("an object")
            if ch == "}":
                self.i += 1
                return
            if ch != ",":
                raise self.fail("expected `,` or `}`")
            self.i += 1
            self.skip_ws()
            if self.peek() == "}":
                raise self.fail("trailing comma")

    def array(self, depth: int) -> None:
        self.i += 1
        self.skip_ws()
        if self.peek() == "]":
            self.i += 1
            return
        while True:
            self.value(depth + 1)
            self.skip_ws()
            ch = self.peek()
            if ch is None:
                raise self.eof("a list")
            if ch == "]":
                self.i += 1
                return
            if ch != ",":
                raise self.fail("expected `,` or `]`")
            self.i += 1
            self.skip_ws()
            if self.peek() == "]":
                raise self.fail("trailing comma")


def serde_syntax_error(text: str) -> str | None:
    """The serde_json message for the first syntax error in `text`, or None if it parses."""
    reader = _Reader(text)
    try:
        reader.value()
        reader.skip_ws()
        if reader.peek() is not None:
            raise reader.fail("trailing characters")
    except _SyntaxError as exc:
        index = exc.index
        line = text.count("\n", 0, index) + 1
        line_start = text.rfind("\n", 0, index) + 1
        column = index - line_start + (0 if exc.at_eof else 1)
        return f"{exc} at line {line} column {column}"
    return None
