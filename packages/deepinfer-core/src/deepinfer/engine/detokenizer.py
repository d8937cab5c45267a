"""Incremental detokenization and stop-string handling.

Decoding the whole output every step would be quadratic. Each request keeps a
``tokenizers`` ``DecodeStream``, which extends the text by each new token: it decodes a short
window of the latest tokens (vLLM's prefix/read offsets, in Rust) and emits only the text that
is complete, holding back a trailing partial UTF-8 sequence until the next token finishes it.
"""

from __future__ import annotations

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

from deepinfer.engine.request import Request


class Detokenizer:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def update(self, req: Request) -> str:
        """Append the text that ``req``'s newest output token completes to ``req.text``;
        return it (empty while a character is still incomplete)."""
        stream = req.decode_stream
        if stream is None:
            skip = req.params.skip_special_tokens
            stream = req.decode_stream = DecodeStream(skip_special_tokens=skip)
        new = stream.step(self.tokenizer, req.output_token_ids[-1]) or ""
        req.text += new
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
