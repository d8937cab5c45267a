"""Counter-based random numbers keyed by (seed, position, token).

A draw depends only on its key, never on how many draws came before, so a seeded request samples
the same tokens whatever else shares its batch, however its prompt was chunked, and after a
preemption. The hash is exact 32-bit integer arithmetic done in int64 tensors (every product stays
below 2**63), so CPU and GPU produce identical bits.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

_M32 = 0xFFFFFFFF
_M16 = 0xFFFF
_GOLDEN = 0x9E3779B97F4A7C15


def sample_seed(seed: int, index: int) -> int:
    """Seed of sample ``index`` of a group seeded with ``seed`` (sample 0 keeps it), so the
    ``n`` samples of a request draw independent streams that no batch changes."""
    return seed if index == 0 else (seed * _GOLDEN + index * 0xBF58476D1CE4E5B9) % (1 << 63)


def _mul32_(x: Tensor, c: int) -> Tensor:
    """``x = x * c mod 2**32`` in place, for x in [0, 2**32), without int64 overflow (16-bit
    halves of c)."""
    hi = torch.mul(x, c >> 16).bitwise_and_(_M16).bitwise_left_shift_(16)
    return x.mul_(c & _M16).add_(hi).bitwise_and_(_M32)


def hash32(x: Tensor) -> Tensor:
    """A bijective avalanche mix of 32-bit values (``triple32`` by C. Wellons).

    It runs on [rows, vocab] blocks every sampling step, so after the first (copying) mask every
    step works in place: a third faster than fresh tensors per op, same bits.
    """
    x = x & _M32
    x.bitwise_xor_(x >> 17)
    _mul32_(x, 0xED5AD4BB)
    x.bitwise_xor_(x >> 11)
    _mul32_(x, 0xAC4C1B51)
    x.bitwise_xor_(x >> 15)
    _mul32_(x, 0x31848BAB)
    return x.bitwise_xor_(x >> 14)


#: Salt that separates independent streams drawn at the same position (sampling, acceptance of
#: speculative drafts, and the drafts' own draws).
STREAM_SAMPLE = 0
STREAM_ACCEPT = 0x5BD1E995
STREAM_DRAFT = 0x27D4EB2F


def position_keys(seeds: Tensor, positions: Tensor, stream: int = STREAM_SAMPLE) -> Tensor:
    """One 32-bit key per row from a 63-bit seed and an absolute token position."""
    seeds = seeds.to(torch.int64)
    k = hash32(seeds & _M32) ^ hash32((seeds >> 32) ^ 0x9E3779B9)
    k = hash32(k ^ (positions.to(torch.int64) & _M32))
    return hash32(k ^ stream)


def uniform(keys: Tensor, width: int) -> Tensor:
    """``[rows, width]`` float32 uniforms in the open interval (0, 1), 23 bits each.

    23 bits, not 24: ``2**24 - 0.5`` is not a float32 and would round the top value to exactly
    1.0, whose Gumbel noise is +inf.
    """
    bits = hash32(keys[:, None] ^ _column_keys(width, keys.device)[None, :])
    return ((bits >> 9).to(torch.float32) + 0.5) * (1.0 / (1 << 23))


@functools.lru_cache(maxsize=16)
def _column_keys(width: int, device: torch.device) -> Tensor:
    """Each column's (token's) hashed key: the same every step, so computed once per vocab."""
    cols = torch.arange(width, device=device, dtype=torch.int64)
    return hash32(cols * 0x9E3779B1 & _M32)


def sampling_uniform(
    seeds: Tensor, positions: Tensor, width: int, stream: int = STREAM_SAMPLE
) -> Tensor:
    """``[rows, width]`` uniforms for each row's (seed, position) key: the draws of one step.

    Five hashes of plain tensor ops, about 140 launches on a GPU; kernel backends fuse them
    (``Backend.sampling_uniform``) with the same bits.
    """
    return uniform(position_keys(seeds, positions, stream), width)


def gumbel(u: Tensor) -> Tensor:
    """Standard Gumbel noise from uniforms in (0, 1): ``-log(-log(u))``."""
    return -torch.log(-torch.log(u))
