"""Training data of the tiny model: plain Shakespeare windows and Shakespeare chats.

Plain windows teach the text itself. Chat examples teach the DeepSeek-V4.1 non-thinking chat
layout (``recipe.md`` §4), so a chat with the tiny model answers in kind::

    <｜begin▁of▁sentence｜><｜User｜>{a few lines}
    <｜Assistant｜></think>{the next lines}<｜end▁of▁sentence｜>

(one line in the data; broken here for width).

The control tokens are appended by id and each text span is encoded on its own, which is exactly
how ``deepseek_recipe`` encodes a rendered prompt (control spans -> ids, gaps -> plain BPE).
Everything is derived from the corpus and a seed, so the data is reproducible.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer
from torch import Tensor

from tiny.bpe import BOS, EOS
from tiny.corpus import Corpus

USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"
END_THINK = "</think>"


@dataclass
class TokenizedData:
    """Token streams (int64 tensors) and where samples may start."""

    train: Tensor  # the training plays, one stream
    train_line_starts: Tensor  # indices into ``train`` of tokens that begin a line
    chat: Tensor  # chat examples, concatenated (each starts with BOS)
    chat_starts: Tensor  # index of each example's BOS in ``chat``
    validation: Tensor  # BOS + the validation plays, so every character is predicted
    validation_chars: int  # characters of the validation text (the bpc denominator)
    sdist_sha256: str

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(self.__dict__, path)

    @classmethod
    def load(cls, path: Path) -> TokenizedData:
        return cls(**torch.load(path))


def chat_example(user: str, assistant: str, tok: Tokenizer) -> list[int]:
    """One finished non-thinking V4.1 exchange as token ids."""

    def special(text: str) -> int:
        tid = tok.token_to_id(text)
        if tid is None:
            raise ValueError(f"the tokenizer has no {text!r} token")
        return tid

    def plain(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False).ids

    return [
        special(BOS),
        special(USER),
        *plain(user),
        special(ASSISTANT),
        special(END_THINK),
        *plain(assistant),
        special(EOS),
    ]


def chat_pairs(text: str, n: int, seed: int) -> list[tuple[str, str]]:
    """``n`` (user, assistant) pairs: 1-4 consecutive lines, then the next 3-10 lines.

    Both sides start at a line that is not blank and neither ends with blank lines, so the
    assistant turn is the continuation a reader of the user's lines would write next.
    """
    lines = text.split("\n")
    rng = random.Random(seed)
    pairs: list[tuple[str, str]] = []
    while len(pairs) < n:
        start = rng.randrange(len(lines) - 20)
        if not lines[start].strip():
            continue
        k, m = rng.randint(1, 4), rng.randint(3, 10)
        user = "\n".join(lines[start : start + k]).strip()
        rest = lines[start + k :]
        while rest and not rest[0].strip():
            rest = rest[1:]
        assistant = "\n".join(rest[:m]).strip()
        if user and assistant:
            pairs.append((user, assistant))
    return pairs


def tokenize(corpus: Corpus, tok: Tokenizer, n_chat: int = 30000, seed: int = 0) -> TokenizedData:
    """Encode the corpus once (the slow part of data preparation)."""
    bos = tok.token_to_id(BOS)
    train_text = corpus.train_text
    enc = tok.encode(train_text, add_special_tokens=False)
    at_line_start = [start == 0 or train_text[start - 1] == "\n" for start, _ in enc.offsets]
    line_starts = torch.nonzero(torch.tensor(at_line_start)).flatten()
    examples = [chat_example(u, a, tok) for u, a in chat_pairs(train_text, n_chat, seed)]
    lengths = torch.tensor([len(e) for e in examples])
    chat_starts = torch.cumsum(lengths, 0) - lengths
    val_text = corpus.validation_text
    val_ids = [bos, *tok.encode(val_text, add_special_tokens=False).ids]
    return TokenizedData(
        train=torch.tensor(enc.ids, dtype=torch.long),
        train_line_starts=line_starts,
        chat=torch.tensor([t for e in examples for t in e], dtype=torch.long),
        chat_starts=chat_starts,
        validation=torch.tensor(val_ids, dtype=torch.long),
        validation_chars=len(val_text),
        sdist_sha256=corpus.sdist_sha256,
    )


@dataclass
class BatchSampler:
    """Seeded random windows of ``seq_len + 1`` tokens (inputs and shifted targets).

    A row is a chat window with probability ``chat_fraction``, else a plain window that starts
    at a line with a BOS in front (half of them, as a prompt the engine feeds would) or at a
    random token.
    """

    data: TokenizedData
    seq_len: int
    chat_fraction: float = 0.2
    seed: int = 0

    def __post_init__(self) -> None:
        self.gen = torch.Generator().manual_seed(self.seed)
        self.bos = int(self.data.chat[0])
        width = self.seq_len + 1
        starts = self.data.chat_starts
        self.chat_starts = starts[starts < self.data.chat.numel() - width]
        starts = self.data.train_line_starts
        self.line_starts = starts[starts < self.data.train.numel() - width]

    def _randint(self, high: int, n: int) -> Tensor:
        return torch.randint(0, high, (n,), generator=self.gen)

    def sample(self, batch: int) -> Tensor:
        width = self.seq_len + 1
        kind = torch.rand(batch, generator=self.gen)
        rows = []
        for r in range(batch):
            if kind[r] < self.chat_fraction:
                starts = self.chat_starts
                s = int(starts[self._randint(starts.numel(), 1)])
                rows.append(self.data.chat[s : s + width])
                continue
            train = self.data.train
            if kind[r] < self.chat_fraction + (1 - self.chat_fraction) / 2:
                starts = self.line_starts
                s = int(starts[self._randint(starts.numel(), 1)])
                bos = torch.tensor([self.bos])
                rows.append(torch.cat((bos, train[s : s + width - 1])))
            else:
                s = int(self._randint(train.numel() - width, 1))
                rows.append(train[s : s + width])
        return torch.stack(rows)


def validation_windows(data: TokenizedData, seq_len: int) -> Tensor:
    """The validation stream as [n, seq_len + 1] windows overlapping by one token.

    Window i predicts tokens ``i*seq_len + 1 .. (i+1)*seq_len``; the last window is padded
    with -100 targets (ignored). Together they predict every validation token exactly once.
    """
    ids = data.validation
    n = -(-(ids.numel() - 1) // seq_len)
    padded = torch.full((n * seq_len + 1,), -100, dtype=torch.long)
    padded[: ids.numel()] = ids
    idx = torch.arange(n)[:, None] * seq_len + torch.arange(seq_len + 1)[None, :]
    return padded[idx]


def spread_windows(ids: Sequence[int], n: int, length: int) -> list[list[int]]:
    """``n`` windows of ``length`` tokens spread evenly over ``ids`` (prompts from the
    held-out plays for the speculative-decoding tool and benchmark)."""
    step = (len(ids) - length) // n
    return [list(ids[i * step : i * step + length]) for i in range(n)]
