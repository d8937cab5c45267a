"""The block-of-queries sparse attention: its key unions against Python sets, its outputs
against a float64 recomputation and the per-query kernel."""

from __future__ import annotations

import pytest
import torch

from deepinfer_kernels_sm100.attention import sparse_mqa_sink_attention
from deepinfer_kernels_sm100.attention_blocks import (
    MIN_QUERIES,
    block_keys,
    block_sparse_attention,
    fits,
    queries_per_block,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def chunk_index(b: int, s: int, rows: int, k: int, g: torch.Generator) -> torch.Tensor:
    """[b, s, k] key rows as a prefill chunk lists them: a window of the 8 rows before each
    query (-1 before the first), then picks of the other rows in random order, some -1."""
    t = torch.arange(s)
    window = t[:, None] - 7 + torch.arange(8)
    window = torch.where(window >= 0, window, -1).expand(b, s, 8)
    picks = torch.rand(b, s, rows - s, generator=g).argsort(-1)[..., : k - 8] + s
    picks = picks.masked_fill(torch.rand(b, s, k - 8, generator=g) > 0.8, -1)
    return torch.cat((window, picks), dim=-1)


@pytest.mark.parametrize("queries", [1, 2, 4])
def test_unions_list_every_row_once_with_its_queries(queries: int) -> None:
    b, s, rows, k = 2, 11, 40, 16
    g = torch.Generator().manual_seed(queries)
    index = chunk_index(b, s, rows, k, g)
    index[1, 3] = -1  # a query that lists nothing
    got_rows, got_bits, count = (t.cpu() for t in block_keys(index.to(DEVICE), queries))
    blocks = -(-s // queries)
    assert got_rows.shape == (b * blocks, queries * k)
    for i in range(b):
        for blk in range(blocks):
            lists: dict[int, int] = {}
            for j in range(queries):
                q = blk * queries + j
                for row in index[i, q].tolist() if q < s else []:
                    if row >= 0:
                        lists[row] = lists.get(row, 0) | 1 << j
            n = int(count[i * blocks + blk])
            assert n == len(lists)
            assert got_rows[i * blocks + blk, :n].tolist() == sorted(lists)
            assert got_bits[i * blocks + blk, :n].tolist() == [lists[r] for r in sorted(lists)]


def exact_attention(
    q: torch.Tensor, kv: torch.Tensor, index: torch.Tensor, sinks: torch.Tensor, scale: float
) -> torch.Tensor:
    """float64 sparse attention with sinks: each query over the rows it lists."""
    b, s, h, _ = q.shape
    rows = index.clamp(min=0)
    keys = torch.stack([kv[i].double()[rows[i]] for i in range(b)])  # [b, s, k, d]
    logits = torch.einsum("bshd,bskd->bshk", q.double(), keys) * scale
    logits = logits.masked_fill((index < 0)[:, :, None, :], float("-inf"))
    sink = sinks.double().view(1, 1, h, 1).expand(b, s, h, 1)
    probs = torch.cat((logits, sink), -1).softmax(-1)[..., :-1]
    return torch.einsum("bshk,bskd->bshd", probs, keys)


@pytest.mark.parametrize(
    "shape",
    [(2, 70, 16, 90, 64, 24), (1, 67, 20, 80, 48, 20), (1, 64, 8, 70, 512, 12)],
    ids=["16-heads", "odd-heads-two-queries", "wide-head"],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_float64_and_the_per_query_kernel(
    shape: tuple[int, ...], dtype: torch.dtype
) -> None:
    b, s, h, rows, dim, k = shape  # batch, queries, heads, kv rows, head dim, keys per query
    g = torch.Generator().manual_seed(s + h)
    q = (torch.randn(b, s, h, dim, generator=g) * 2).to(dtype)
    kv = torch.randn(b, rows, dim, generator=g).to(dtype)
    index = chunk_index(b, s, rows, k, g)
    index[0, 5] = -1  # sees nothing: only the sink, so the output is zero
    sinks = torch.randn(h, generator=g)
    scale = dim**-0.5
    dev = [t.to(DEVICE) for t in (q, kv, index, sinks)]
    assert fits(dev[0], dev[2])
    got = block_sparse_attention(*dev, scale).cpu()
    assert got.dtype == dtype and got.shape == q.shape
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(
        got.double(), exact_attention(q, kv, index, sinks, scale), atol=tol, rtol=tol
    )
    per_query = sparse_mqa_sink_attention(*dev, scale).cpu()
    torch.testing.assert_close(got.float(), per_query.float(), atol=tol, rtol=tol)
    assert torch.equal(got[0, 5], torch.zeros_like(got[0, 5]))


def test_a_query_depends_only_on_its_block() -> None:
    """A query's output is the same whatever the queries of other blocks list."""
    b, s, h, rows, dim, k = 1, 72, 16, 100, 32, 20
    g = torch.Generator().manual_seed(7)
    q = torch.randn(b, s, h, dim, generator=g)
    kv = torch.randn(b, rows, dim, generator=g)
    index = chunk_index(b, s, rows, k, g)
    sinks = torch.randn(h, generator=g)
    other = index.clone()
    other[:, 4:] = chunk_index(b, s, rows, k, g)[:, 4:]  # blocks 1.. list other rows
    one, two = (
        block_sparse_attention(*(t.to(DEVICE) for t in (q, kv, i, sinks)), dim**-0.5).cpu()
        for i in (index, other)
    )
    assert torch.equal(one[:, :4], two[:, :4])


def test_takes_chunks_of_few_heads_only() -> None:
    index = torch.zeros(1, MIN_QUERIES, 640, dtype=torch.int64)
    assert queries_per_block(16) == 4 and queries_per_block(20) == 2
    assert fits(torch.empty(1, MIN_QUERIES, 16, 8), index)
    assert not fits(torch.empty(1, MIN_QUERIES, 64, 8), index)  # one query fills a block
    assert not fits(torch.empty(1, MIN_QUERIES - 1, 16, 8), index[:, :-1])  # few queries
    wide = torch.zeros(1, MIN_QUERIES, 4096, dtype=torch.int64)  # 4 x 4096 codes to sort
    assert not fits(torch.empty(1, MIN_QUERIES, 16, 8), wide)
