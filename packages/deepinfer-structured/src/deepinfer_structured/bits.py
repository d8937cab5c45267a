"""Packed token bitmasks: xgrammar's int32 words (bit ``t % 32`` of word ``t // 32``).

The engine's sampler takes bool masks, so :func:`unpack_bitmask` unpacks the words with
numpy's ``unpackbits`` (a few microseconds for 8k tokens, against ~30 for torch shifts or
gathers); :func:`pack_bitmask` is the inverse.
"""

from __future__ import annotations

import sys

import numpy as np
import torch
from torch import Tensor

if sys.byteorder != "little":  # the byte views of the int32 words below assume it
    raise ImportError("deepinfer-structured needs a little-endian machine")


def unpack_words(words: np.ndarray, vocab_size: int) -> Tensor:
    """Bool mask [vocab_size] of an int32 bitmask row given as a numpy array."""
    bits = np.unpackbits(words.view(np.uint8), count=vocab_size, bitorder="little")
    return torch.from_numpy(bits).view(torch.bool)


def unpack_bitmask(words: Tensor, vocab_size: int) -> Tensor:
    """Bool mask [vocab_size] of an int32 bitmask row (bit ``t % 32`` of word ``t // 32``)."""
    return unpack_words(words.contiguous().numpy(), vocab_size)


def pack_bitmask(mask: Tensor, num_words: int) -> Tensor:
    """The int32 bitmask row [num_words] of a bool mask (the inverse of unpack_bitmask)."""
    padded = torch.zeros(num_words * 32, dtype=torch.bool)
    padded[: mask.numel()] = mask
    weights = 1 << torch.arange(8, dtype=torch.int32)
    packed = (padded.view(-1, 8).to(torch.int32) * weights).sum(dim=1).to(torch.uint8)
    return packed.view(torch.int32)
