from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from deepinfer.sampling import rng


def _mul32_reference(x: int, c: int) -> int:
    return (x * c) & 0xFFFFFFFF


def test_mul32_is_exact_unsigned_32bit_multiplication() -> None:
    g = np.random.default_rng(0)
    xs = g.integers(0, 2**32, size=2000, dtype=np.uint64)
    for c in (0xED5AD4BB, 0xAC4C1B51, 0x31848BAB, 1, 0xFFFFFFFF):
        got = rng._mul32_(torch.tensor(xs.astype(np.int64)), c).numpy()
        want = [_mul32_reference(int(x), c) for x in xs]
        assert got.tolist() == want


def _triple32_reference(x: int) -> int:
    m = 0xFFFFFFFF
    x ^= x >> 17
    x = (x * 0xED5AD4BB) & m
    x ^= x >> 11
    x = (x * 0xAC4C1B51) & m
    x ^= x >> 15
    x = (x * 0x31848BAB) & m
    return x ^ (x >> 14)


def test_hash_matches_python_integers_and_leaves_its_input_alone() -> None:
    xs = torch.tensor(np.random.default_rng(1).integers(0, 2**32, size=3000, dtype=np.int64))
    before = xs.clone()
    got = rng.hash32(xs)
    assert got.tolist() == [_triple32_reference(int(x)) for x in before]
    assert torch.equal(xs, before)


def test_hash_is_a_bijection_on_a_slice() -> None:
    x = torch.arange(1 << 16, dtype=torch.int64) * 65537
    assert torch.unique(rng.hash32(x)).numel() == x.numel()


def test_uniforms_are_uniform_and_open() -> None:
    keys = rng.position_keys(torch.tensor([7, 8, 9]), torch.tensor([0, 1, 2]))
    u = rng.uniform(keys, 50_000).flatten().numpy()
    assert u.min() > 0.0 and u.max() < 1.0
    assert stats.kstest(u, "uniform").pvalue > 1e-3


def test_extreme_hash_values_stay_inside_the_open_interval(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The largest and smallest 32-bit hashes must still give finite Gumbel noise."""
    rng._column_keys.cache_clear()  # computed under the patched hash below: not kept after
    monkeypatch.setattr(rng, "hash32", lambda x: torch.full_like(x, 0xFFFFFFFF))
    assert torch.isfinite(rng.gumbel(rng.uniform(torch.tensor([1]), 4))).all()
    monkeypatch.setattr(rng, "hash32", torch.zeros_like)
    assert torch.isfinite(rng.gumbel(rng.uniform(torch.tensor([1]), 4))).all()
    rng._column_keys.cache_clear()


def test_streams_and_keys_are_distinct() -> None:
    seeds = torch.tensor([1, 1, 2, 1 + 2**32])
    pos = torch.tensor([5, 6, 5, 5])
    keys = rng.position_keys(seeds, pos)
    assert torch.unique(keys).numel() == 4
    accept = rng.position_keys(seeds, pos, stream=rng.STREAM_ACCEPT)
    assert not torch.equal(keys, accept)


def test_draw_depends_only_on_its_key() -> None:
    """The same (seed, position) row gives the same noise alone or among other rows."""
    alone = rng.gumbel(rng.uniform(rng.position_keys(torch.tensor([42]), torch.tensor([17])), 1000))
    seeds = torch.tensor([3, 42, 99])
    batch = rng.gumbel(rng.uniform(rng.position_keys(seeds, torch.tensor([0, 17, 5])), 1000))
    assert torch.equal(alone[0], batch[1])


@pytest.mark.parametrize("cols", [1, 129_280])
def test_gumbel_moments(cols: int) -> None:
    rows = max(1, 200_000 // cols)
    keys = rng.position_keys(torch.arange(rows), torch.zeros(rows, dtype=torch.int64))
    g = rng.gumbel(rng.uniform(keys, cols)).double()
    assert abs(g.mean().item() - np.euler_gamma) < 0.02
    assert abs(g.var().item() - np.pi**2 / 6) < 0.05
