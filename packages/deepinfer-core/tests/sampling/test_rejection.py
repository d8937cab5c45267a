"""Speculative verification emits tokens distributed as the target's own draws.

Many independent rounds run as rows of one batch: each draws drafts from a proposal q that
differs from the target p, verifies them and samples the token after the kept ones. The
frequencies of the first emitted token must match p_1, and those of the second (in rounds that
kept the first draft) p_2, within five standard errors per token: the statistical check of the
lossless claim, independent of how the code computes it. Greedy rows (one-hot distributions)
keep exactly the drafts that equal the argmax.
"""

from __future__ import annotations

import torch
from torch import Tensor

from deepinfer.sampling.rejection import accept, next_distribution

ROUNDS = 400_000
V, K = 6, 3


def _emitted(p: Tensor, q: Tensor | None, drafts: Tensor, num: Tensor, g: torch.Generator):
    """(kept drafts [R], the tokens emitted this round [R, K + 1], -1 past them)."""
    u = torch.rand(drafts.shape, generator=g)
    kept = accept(p, q, drafts, num, u)
    dist = next_distribution(p, q, drafts, num, kept)
    after = torch.multinomial(dist, 1, generator=g)[:, 0]
    tokens = torch.full((p.shape[0], K + 1), -1, dtype=torch.long)
    cols = torch.arange(K + 1)
    tokens = torch.where(cols < kept[:, None], torch.cat((drafts, drafts[:, :1]), 1), tokens)
    tokens[torch.arange(p.shape[0]), kept] = after
    return kept, tokens


def _assert_distributed_as(samples: Tensor, want: Tensor) -> None:
    n = samples.numel()
    freq = torch.bincount(samples, minlength=V).double() / n
    err = (want.double() * (1 - want.double()) / n).sqrt()
    assert ((freq - want.double()).abs() <= 5 * err + 1e-12).all(), (freq, want)


def _distributions(g: torch.Generator, rows: int) -> Tensor:
    """[K + 1, V] fixed random distributions with a zero entry (never sampled)."""
    logits = torch.randn(rows, V, generator=g) * 1.5
    logits[:, -1] = float("-inf")
    return torch.softmax(logits, dim=-1)


def test_sampled_drafts_keep_the_target_distribution() -> None:
    g = torch.Generator().manual_seed(0)
    p_one = _distributions(g, K + 1)
    q_one = _distributions(g, K).roll(1, dims=-1)  # another proposal, mass where p has none
    p = p_one.expand(ROUNDS, -1, -1)
    q = q_one.expand(ROUNDS, -1, -1)
    drafts = torch.stack(
        [torch.multinomial(q_one[i], ROUNDS, replacement=True, generator=g) for i in range(K)], 1
    )
    num = torch.full((ROUNDS,), K)
    kept, tokens = _emitted(p, q, drafts, num, g)
    _assert_distributed_as(tokens[:, 0], p_one[0])
    second = tokens[kept >= 1, 1]
    assert second.numel() > ROUNDS // 10
    _assert_distributed_as(second, p_one[1])
    assert 0 < float(kept.float().mean()) < K  # some kept, some rejected


def test_deterministic_drafts_and_shorter_verification_keep_it_too() -> None:
    """A drafter that proposes fixed tokens (q one-hot, passed as None), and rows that verify
    fewer drafts than they have (the scheduler's choice): still the target's distribution."""
    g = torch.Generator().manual_seed(1)
    p_one = _distributions(g, K + 1)
    p = p_one.expand(ROUNDS, -1, -1)
    drafts = torch.randint(0, V, (ROUNDS, K), generator=g)
    num = torch.randint(0, K + 1, (ROUNDS,), generator=g)
    kept, tokens = _emitted(p, None, drafts, num, g)
    assert (kept <= num).all()
    _assert_distributed_as(tokens[:, 0], p_one[0])
    _assert_distributed_as(tokens[kept >= 1, 1], p_one[1])


def test_greedy_rows_keep_the_drafts_equal_to_the_argmax() -> None:
    g = torch.Generator().manual_seed(2)
    rows = 64
    best = torch.randint(0, V, (rows, K + 1), generator=g)
    p = torch.nn.functional.one_hot(best, V).float()
    drafts = torch.where(torch.rand(rows, K, generator=g) < 0.7, best[:, :K], (best[:, :K] + 1) % V)
    kept = accept(p, None, drafts, torch.full((rows,), K), torch.rand(rows, K, generator=g))
    want = (drafts == best[:, :K]).long().cumprod(dim=1).sum(dim=1)
    assert torch.equal(kept, want)
    after = next_distribution(p, None, drafts, torch.full((rows,), K), kept).argmax(dim=-1)
    assert torch.equal(after, best[torch.arange(rows), kept])


def test_a_row_without_drafts_draws_from_the_target() -> None:
    """Zero drafts (a round the drafter thought not worth verifying): nothing kept, and the
    next token's distribution is the target's own at the anchor."""
    g = torch.Generator().manual_seed(3)
    p = _distributions(g, 1)[None]
    drafts = torch.zeros(1, 0, dtype=torch.long)
    num = torch.zeros(1, dtype=torch.long)
    kept = accept(p, None, drafts, num, torch.rand(1, 0, generator=g))
    assert kept.tolist() == [0]
    assert torch.equal(next_distribution(p, None, drafts, num, kept), p[:, 0])
