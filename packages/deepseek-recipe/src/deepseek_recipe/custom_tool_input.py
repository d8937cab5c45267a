"""Streams the raw `input` text of a custom tool call out of its JSON arguments.

The model calls `apply_patch` like a function, so its output arrives as JSON
arguments (`{"input": "*** Begin Patch\\n..."}`), but a Responses custom tool
call carries the bare input text.  This decoder unwraps the string while it
streams.  Until the text is known to start with `{"input": "` it is held back;
if it turns out to be anything else (another parameter, a non-string value, no
parameters) the JSON text is passed through unchanged, so nothing is lost.
Once the string closes, the rest of the arguments is ignored.
"""

from __future__ import annotations

PREFIX = '{"input": "'
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


class CustomInputDecoder:
    """Feed argument fragments with `feed`; each call returns the input text to emit."""

    def __init__(self) -> None:
        self._state = "prefix"
        self._buffer = ""
        self._pending = ""
        self._high_surrogate: int | None = None
        self.value = ""

    def feed(self, text: str) -> str:
        if self._state == "raw":
            self.value += text
            return text
        if self._state == "prefix":
            self._buffer += text
            if self._buffer.startswith(PREFIX):
                rest = self._buffer[len(PREFIX) :]
                self._buffer = ""
                self._state = "string"
                return self._decode(rest)
            if PREFIX.startswith(self._buffer):
                return ""
            self._state = "raw"
            out, self._buffer = self._buffer, ""
            self.value += out
            return out
        if self._state == "string":
            return self._decode(text)
        return ""

    def finish(self) -> str:
        """Release text still held back when the arguments end early."""
        if self._state == "prefix" and self._buffer:
            self._state = "raw"
            out, self._buffer = self._buffer, ""
            self.value += out
            return out
        return ""

    def _decode(self, text: str) -> str:
        """Decode JSON string content up to the closing quote; hold back a split escape."""
        data = self._pending + text
        self._pending = ""
        out: list[str] = []
        i = 0
        while i < len(data):
            ch = data[i]
            if ch == '"':
                self._state = "done"
                break
            if ch != "\\":
                out.append(ch)
                i += 1
                continue
            if i + 1 >= len(data):
                self._pending = data[i:]
                break
            esc = data[i + 1]
            if esc == "u":
                if i + 6 > len(data):
                    self._pending = data[i:]
                    break
                out.append(self._unicode(data[i + 2 : i + 6]))
                i += 6
                continue
            out.append(_ESCAPES.get(esc, esc))
            i += 2
        decoded = "".join(out)
        self.value += decoded
        return decoded

    def _unicode(self, digits: str) -> str:
        try:
            code = int(digits, 16)
        except ValueError:
            return ""
        if 0xD800 <= code < 0xDC00:
            self._high_surrogate = code
            return ""
        if 0xDC00 <= code < 0xE000 and self._high_surrogate is not None:
            high, self._high_surrogate = self._high_surrogate, None
            return chr(0x10000 + ((high - 0xD800) << 10) + (code - 0xDC00))
        return chr(code)
