"""Engram n-gram hashing: token map, per-layer multipliers, prime table sizes, row ids.

This follows DeepSeek's published Engram recipe (the demo's ``CompressedTokenizer`` and
``NgramHashMapping``, which SGLang's V4.1 ``layers/engram.py`` implements):

* raw token ids map to "compressed" ids that merge tokens whose decoded text normalises alike
  (NFKC, NFD, strip accents, lower-case, collapse whitespace); the map needs the tokenizer;
* each Engram layer draws one odd int64 multiplier per look-back from
  ``numpy.random.default_rng(seed + 10007 * layer_id)``, bounded so no product overflows;
* the n-gram of size n (the token and its n-1 predecessors, pad before the sequence start) is
  mixed by XOR of ``id * multiplier`` and reduced modulo ``n_heads`` distinct primes per size;
  primes are searched upwards from ``engram_vocab_size`` and never reused, across sizes and
  layers (in layer order), which reproduces the published ``engram_num_embeddings`` exactly;
* each (size, head) table is a slice of one stacked table; its row offset is the sum of the
  primes before it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

#: Per-layer seed stride of the multiplier generator.
LAYER_SEED_STRIDE = 10007
_MR_BASES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37)  # deterministic below 3.3e24


def is_prime(n: int) -> bool:
    """Deterministic Miller-Rabin for every n below 3.3e24 (far beyond any table size)."""
    if n < 2:
        return False
    for p in _MR_BASES:
        if n % p == 0:
            return n == p
    d, r = n - 1, 0
    while d % 2 == 0:
        d, r = d // 2, r + 1
    for a in _MR_BASES:
        y = pow(a, d, n)
        if y in (1, n - 1):
            continue
        for _ in range(r - 1):
            y = y * y % n
            if y == n - 1:
                break
        else:
            return False
    return True


def table_primes(
    layer_ids: Sequence[int], vocab_sizes: Sequence[int], n_heads: int
) -> dict[int, list[list[int]]]:
    """layer -> [n-gram size 2.. -> [one prime per head]], primes never reused."""
    seen: set[int] = set()
    out: dict[int, list[list[int]]] = {}
    for layer in layer_ids:
        per_size: list[list[int]] = []
        for vocab in vocab_sizes:
            heads: list[int] = []
            candidate = vocab - 1
            for _ in range(n_heads):
                candidate += 1
                while candidate in seen or not is_prime(candidate):
                    candidate += 1
                seen.add(candidate)
                heads.append(candidate)
            per_size.append(heads)
        out[layer] = per_size
    return out


def hash_multipliers(layer_id: int, max_ngram: int, compressed_vocab: int, seed: int) -> Tensor:
    """The layer's odd multipliers [max_ngram] int64 (numpy's PCG64 stream, as published)."""
    max_long = np.iinfo(np.int64).max
    half_bound = max(1, int(max_long // compressed_vocab) // 2)
    rng = np.random.default_rng(int(seed + LAYER_SEED_STRIDE * layer_id))
    r = rng.integers(low=0, high=half_bound, size=(max_ngram,), dtype=np.int64)
    return torch.from_numpy(r * 2 + 1)


def hash_rows(
    ids: Tensor, history: int, multipliers: Tensor, primes: Tensor, offsets: Tensor
) -> Tensor:
    """Stacked-table row ids [B, S, n_tables] of compressed ``ids`` [B, history + S], whose
    first ``history`` columns are the look-back of the first new token, or of look-back
    windows [B, S, history + 1] (each token's, oldest first, the token last). ``primes`` and
    ``offsets`` are [n_sizes, n_heads] int64 (n-gram size 2 first).
    """
    if ids.dim() == 3:  # shifted[k]: each token's id k positions back
        shifted = [ids[..., history - k] for k in range(multipliers.shape[0])]
    else:
        s = ids.shape[1] - history
        shifted = [ids[:, history - k : history - k + s] for k in range(multipliers.shape[0])]
    rows = []
    mix = shifted[0] * multipliers[0]
    for size_index in range(primes.shape[0]):
        k = size_index + 1  # an n-gram of size k + 1 adds the token k positions back
        mix = torch.bitwise_xor(mix, shifted[k] * multipliers[k])
        rows.append(torch.remainder(mix[..., None], primes[size_index]) + offsets[size_index])
    return torch.cat(rows, dim=-1)


def _normalizer() -> Any:
    """The published normaliser sequence, built with the ``tokenizers`` library."""
    from tokenizers import Regex, normalizers

    sentinel = "\ue000"
    return normalizers.Sequence(
        [
            normalizers.NFKC(),
            normalizers.NFD(),
            normalizers.StripAccents(),
            normalizers.Lowercase(),
            normalizers.Replace(Regex(r"[ \t\r\n]+"), " "),
            normalizers.Replace(Regex(r"^ $"), sentinel),  # a lone space survives the strip
            normalizers.Strip(),
            normalizers.Replace(sentinel, " "),
        ]
    )


def build_compressed_token_map(tokenizer: Any, vocab_size: int | None = None) -> Tensor:
    """Raw id -> compressed id [vocab] int64, new ids numbered in order of first appearance.

    ``tokenizer`` is a transformers tokenizer (``decode`` + ``convert_ids_to_tokens``) or a
    ``tokenizers.Tokenizer`` (``decode`` + ``id_to_token``). Tokens whose decoded text contains
    U+FFFD (partial UTF-8) are keyed by their raw token string instead, so they stay distinct.
    """
    norm = _normalizer()
    raw_token = getattr(tokenizer, "convert_ids_to_tokens", None) or tokenizer.id_to_token
    if vocab_size is None:
        vocab_size = len(tokenizer) if hasattr(tokenizer, "__len__") else tokenizer.get_vocab_size()
    key_to_new: dict[str, int] = {}
    table = torch.empty(vocab_size, dtype=torch.long)
    for tid in range(vocab_size):
        text = tokenizer.decode([tid], skip_special_tokens=False)
        partial = "\ufffd" in text  # a partial UTF-8 piece: keep it distinct by its raw token
        key = str(raw_token(tid)) if partial else norm.normalize_str(text) or text
        table[tid] = key_to_new.setdefault(key, len(key_to_new))
    return table
