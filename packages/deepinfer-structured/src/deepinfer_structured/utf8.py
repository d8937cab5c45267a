"""Only valid UTF-8 under a grammar.

A byte-level vocabulary holds tokens that are single bytes or partial characters. xgrammar's
character classes accept some byte sequences that are not UTF-8 (UTF-8-encoded surrogates such
as ``ED A0 80``, and overlong forms such as ``E0 80 80`` in pattern strings); the detokenizer
turns those into U+FFFD, so the text would no longer be the text the grammar checked (a
``maxLength`` or ``pattern`` can fail). :class:`Utf8Guard` tracks where the output stands in
the current character and allows only tokens whose bytes continue it validly (RFC 3629), and
the stop token only between characters.
"""

from __future__ import annotations

import json

import numpy as np
import torch
from tokenizers import Tokenizer
from torch import Tensor

from deepinfer_structured.bits import pack_bitmask

#: Decoder states: (continuation bytes still needed, lowest and highest allowed next byte).
_STATES: tuple[tuple[int, int, int], ...] = (
    (0, 0, 0),  # between characters
    (1, 0x80, 0xBF),
    (2, 0x80, 0xBF),
    (2, 0xA0, 0xBF),  # after E0: no overlong form
    (2, 0x80, 0x9F),  # after ED: no surrogate
    (3, 0x80, 0xBF),
    (3, 0x90, 0xBF),  # after F0: no overlong form
    (3, 0x80, 0x8F),  # after F4: nothing above U+10FFFF
)
_INDEX = {state: i for i, state in enumerate(_STATES)}
INVALID = -1


def _lead(byte: int) -> int:
    """The state after a first byte, or INVALID."""
    if byte < 0x80:
        return 0
    if 0xC2 <= byte <= 0xDF:
        return _INDEX[1, 0x80, 0xBF]
    if byte == 0xE0:
        return _INDEX[2, 0xA0, 0xBF]
    if byte == 0xED:
        return _INDEX[2, 0x80, 0x9F]
    if 0xE1 <= byte <= 0xEF:
        return _INDEX[2, 0x80, 0xBF]
    if byte == 0xF0:
        return _INDEX[3, 0x90, 0xBF]
    if 0xF1 <= byte <= 0xF3:
        return _INDEX[3, 0x80, 0xBF]
    if byte == 0xF4:
        return _INDEX[3, 0x80, 0x8F]
    return INVALID


def _step(state: int, byte: int) -> int:
    need, low, high = _STATES[state]
    if need == 0:
        return _lead(byte)
    if not low <= byte <= high:
        return INVALID
    return 0 if need == 1 else _INDEX[need - 1, 0x80, 0xBF]


def require_byte_level(tokenizer: Tokenizer) -> None:
    """Refuse a tokenizer whose tokens are not byte-level BPE pieces: every grammar backend
    here reads each token's bytes, and only DeepSeek's byte-level vocabulary has them."""
    decoder = (json.loads(tokenizer.to_str()).get("decoder") or {}).get("type")
    if decoder != "ByteLevel":
        raise NotImplementedError(
            f"structured outputs need a byte-level BPE tokenizer (DeepSeek's); this one "
            f"decodes with {decoder!r}"
        )


def token_bytes(tokenizer: Tokenizer, vocab_size: int) -> list[bytes | None]:
    """Each token's bytes (byte-level BPE: one character per byte); None for added tokens,
    which are markup rather than text."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    byte_of = {chr(b): b for b in printable}
    shifted = 0
    for byte in range(256):
        if byte not in printable:
            byte_of[chr(256 + shifted)] = byte
            shifted += 1
    added = set(tokenizer.get_added_tokens_decoder())
    table: list[bytes | None] = [None] * vocab_size
    for text, index in tokenizer.get_vocab(with_added_tokens=False).items():
        if index < vocab_size and index not in added and all(c in byte_of for c in text):
            table[index] = bytes(byte_of[c] for c in text)
    return table


class Utf8Guard:
    """Per-vocabulary tables: the state after each token from each state, and the masks."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, stop_token_ids: list[int]) -> None:
        table = token_bytes(tokenizer, vocab_size)
        rows = []
        for state in range(len(_STATES)):
            row = []
            for data in table:
                if data is None:  # markup and stop tokens: only between characters
                    row.append(0 if state == 0 else INVALID)
                    continue
                current = state
                for byte in data:
                    current = _step(current, byte)
                    if current == INVALID:
                        break
                row.append(current)
            rows.append(row)
        self.next = torch.tensor(rows, dtype=torch.int8)  # [states, vocab]
        for stop in stop_token_ids:
            if stop < vocab_size:
                self.next[1:, stop] = INVALID
        self.valid = self.next != INVALID  # [states, vocab] bool
        words = (vocab_size + 31) // 32
        self.packed = torch.stack([pack_bitmask(row, words) for row in self.valid])
        self._packed_np = self.packed.numpy()

    def advance(self, state: int, token_id: int) -> int:
        """The state after ``token_id`` (INVALID if it would break a character)."""
        return int(self.next[state, token_id])

    def mask(self, state: int) -> Tensor:
        return self.valid[state]

    def packed_mask(self, state: int) -> Tensor:
        return self.packed[state]

    def packed_words(self, state: int) -> np.ndarray:
        """:meth:`packed_mask` as a numpy array (for matchers that unpack with numpy)."""
        return self._packed_np[state]
