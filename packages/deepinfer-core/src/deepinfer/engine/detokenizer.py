"""Incremental detokenization and stop-string handling.

Decoding the whole output every step would be quadratic; instead each step decodes a short
window (vLLM's prefix/read offsets) and emits only the text that is complete, holding back a
trailing partial UTF-8 sequence until the next token finishes it.
"""

from __future__ import annotations

from tokenizers import Tokenizer

from deepinfer.engine.request import Request

_WINDOW = 6  # tokens of left context so merges across the boundary decode correctly


class Detokenizer:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def update(self, req: Request) -> str:
        """Append the newly complete text of ``req``'s output to ``req.text``; return it."""
        ids = req.output_token_ids
        skip = req.params.skip_special_tokens
        prefix = self.decode(ids[req.prefix_offset : req.read_offset], skip)
        full = self.decode(ids[req.prefix_offset :], skip)
        if full.endswith("\ufffd") or len(full) <= len(prefix):
            return ""  # an incomplete byte sequence (or nothing visible yet): wait
        new = full[len(prefix) :]
        req.text += new
        req.prefix_offset = max(req.prefix_offset, len(ids) - _WINDOW)
        req.read_offset = len(ids)
        return new


def find_stop(text: str, new_len: int, stops: list[str]) -> tuple[str, int] | None:
    """The first stop string that the last ``new_len`` characters completed, and its index."""
    best: tuple[str, int] | None = None
    for stop in stops:
        start = max(0, len(text) - new_len - len(stop) + 1)
        idx = text.find(stop, start)
        if idx != -1 and (best is None or idx < best[1]):
            best = (stop, idx)
    return best
