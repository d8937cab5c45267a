"""The paged indexer-scores kernel against the reference and a float64 recomputation."""

from __future__ import annotations

import pytest
import torch

from deepinfer.backends.torch_ref import TorchBackend
from deepinfer.paging import PagedEntries
from deepinfer_kernels_sm100.backend import Sm100Backend
from deepinfer_kernels_sm100.indexer import dense_indexer_scores, paged_indexer_scores

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize(
    "shape",
    [
        (3, 1, 8, 32, 32, 45),
        (2, 1, 20, 64, 24, 130),
        (2, 2, 64, 128, 128, 300),
        (2, 1, 4, 32, 32, 0),
    ],
    ids=["ratio4-few-heads", "ratio2-odd", "ratio1-two-queries", "no-entries"],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_reference_and_float64(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    b, s, heads, rows, dim, limit = shape  # rows: entries per page (128 / ratio)
    g = torch.Generator().manual_seed(heads * 1000 + limit)
    cols = max(1, -(-limit // rows))
    pages = torch.randn(b * cols + 3, rows, dim, generator=g).to(dtype)
    # each row's blocks in scattered, distinct pages (page 0 unused, as in the engine)
    index = (torch.randperm(b * cols + 2, generator=g)[: b * cols] + 1).view(b, cols)
    q = torch.randn(b, s, heads, dim, generator=g).to(dtype)
    weights = torch.randn(b, s, heads, generator=g).to(dtype)  # the projection's dtype
    scale = 0.3  # widened, then scaled, where the kernel reads them
    counts = torch.randint(0, limit + 1, (b,), generator=g)
    counts[0] = limit
    keys = PagedEntries(pages.to(DEVICE), index.to(DEVICE), limit, counts.to(DEVICE))

    got = paged_indexer_scores(q.to(DEVICE), keys, weights.to(DEVICE), scale).cpu()
    assert got.shape == (b, s, limit) and got.dtype == torch.float32
    held = torch.arange(limit) < counts[:, None, None]  # [B, 1, T]
    assert (got[~held.expand_as(got)] == 0).all(), "entries past a row's count are not read"
    got = torch.where(held, got, 0.0)

    # the keys laid out by hand, row by row, block by block
    dense = torch.stack(
        [torch.cat([pages[p] for p in index[i].tolist()])[:limit] for i in range(b)]
    )
    want = torch.where(held, TorchBackend("cpu").indexer_scores(q, dense, weights, scale), 0.0)
    dots = torch.einsum("bshc,btc->bsht", q.double(), dense.double()).relu()
    exact = torch.where(held, (dots * weights.double()[..., None] * scale).sum(dim=2), 0.0)
    tol = 1e-4 if dtype == torch.float32 else 1e-3
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)
    torch.testing.assert_close(got.double(), exact, atol=tol, rtol=tol)


def test_backend_takes_the_kernel_for_paged_keys_only() -> None:
    """Dense keys (a prefill chunk's) keep the reference; paged ones (decode rows) the kernel,
    whose top-k picks equal the reference's on the same keys."""
    if DEVICE == "cpu":
        ops = Sm100Backend.__new__(Sm100Backend)  # the op table, without the device check
        ops.device = torch.device("cpu")
    else:
        ops = Sm100Backend()
    g = torch.Generator().manual_seed(7)
    b, heads, rows, dim, limit, k = 4, 16, 32, 64, 200, 16
    cols = -(-limit // rows)
    pages = torch.randn(b * cols + 1, rows, dim, generator=g)
    index = torch.arange(1, b * cols + 1).view(b, cols)
    q = torch.randn(b, 1, heads, dim, generator=g)
    weights = torch.rand(b, 1, heads, generator=g)
    n_visible = torch.tensor([[3], [64], [150], [200]])
    # every row holds all 200 entries, but sees only its first n_visible
    paged = PagedEntries(pages.to(DEVICE), index.to(DEVICE), limit)
    got = ops.indexer_topk(q.to(DEVICE), paged, weights.to(DEVICE), n_visible.to(DEVICE), k).cpu()
    want = TorchBackend("cpu").indexer_topk(q, paged.dense().cpu(), weights, n_visible, k)
    assert torch.equal(got, want)
    assert (got[0, 0, 3:] == -1).all() and (got[0, 0, :3] >= 0).all()


def _float64_scores(q: torch.Tensor, keys: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    dots = torch.einsum("bshc,btc->bsht", q.double(), keys.double()).relu()
    return (dots * weights.double()[..., None]).sum(dim=2)


@pytest.mark.parametrize(
    "shape",
    [
        (1, 70, 8, 32, 45),
        (2, 130, 20, 64, 150),
        (1, 64, 64, 128, 64),
        (2, 3, 1, 16, 200),
        (1, 5, 4, 32, 0),
    ],
    ids=["odd-rows", "two-rows-odd-heads", "v4-heads", "one-head", "no-keys"],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("visible", [False, True], ids=["all", "causal"])
def test_dense_scores_match_reference_and_float64(
    shape: tuple[int, ...], dtype: torch.dtype, visible: bool
) -> None:
    """A prefill chunk's scores: every entry a query sees within rounding of float64 and of the
    reference; with visibility, an entry no query sees scores 0 or its score, never else."""
    b, s, heads, dim, limit = shape
    g = torch.Generator().manual_seed(b * 100 + s + heads)
    # the chunk's queries as a slice of a longer chunk's, as the backend's row blocks pass them
    q = torch.randn(b, s + 3, heads, dim, generator=g).to(dtype)[:, 2 : s + 2]
    keys = torch.randn(b, limit, dim, generator=g).to(dtype)
    weights = torch.randn(b, s, heads, generator=g).to(dtype)
    scale = 0.3
    n_visible = None
    if visible:  # ratio-4 entries of a chunk at a position offset per row
        offset = torch.tensor([0, 37])[:b, None]
        n_visible = ((torch.arange(s)[None] + offset + 1) // 4).clamp(max=limit)
    got = dense_indexer_scores(
        q.to(DEVICE),
        keys.to(DEVICE),
        weights.to(DEVICE),
        None if n_visible is None else n_visible.to(DEVICE),
        scale,
    ).cpu()
    assert got.shape == (b, s, limit) and got.dtype == torch.float32

    exact = _float64_scores(q, keys, weights) * scale
    want = TorchBackend("cpu").indexer_scores(q, keys, weights, scale)
    seen = torch.ones(b, s, limit, dtype=torch.bool)
    if n_visible is not None:
        seen = torch.arange(limit) < n_visible[..., None]
    tol = 1e-4 if dtype == torch.float32 else 1e-3
    torch.testing.assert_close(
        torch.where(seen, got, 0.0), torch.where(seen, want, 0.0), atol=tol, rtol=tol
    )
    torch.testing.assert_close(
        torch.where(seen, got.double(), 0.0), torch.where(seen, exact, 0.0), atol=tol, rtol=tol
    )
    unseen = got[~seen].double()
    close = (unseen - exact[~seen]).abs() <= tol * (1 + exact[~seen].abs())
    assert ((unseen == 0) | close).all(), "an unseen entry scores 0 or its score"


@pytest.mark.parametrize("per_row", [False, True], ids=["visible-per-query", "visible-per-row"])
def test_backend_dense_topk_matches_reference(
    per_row: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prefill chunk's picks through the kernel, in several blocks of queries (the score
    budget shrunk to force them), equal the reference's on the same keys."""
    from deepinfer_kernels_sm100 import indexer

    monkeypatch.setattr(indexer, "MAX_DENSE_SCORES", 2 * 150 * 24)
    if DEVICE == "cpu":
        ops = Sm100Backend.__new__(Sm100Backend)  # the op table, without the device check
        ops.device = torch.device("cpu")
    else:
        ops = Sm100Backend()
    g = torch.Generator().manual_seed(11)
    b, s, heads, dim, limit, k = 2, 100, 16, 64, 150, 16
    q = torch.randn(b, s, heads, dim, generator=g)
    keys = torch.randn(b, limit, dim, generator=g)
    weights = torch.rand(b, s, heads, generator=g)
    n_visible = (torch.arange(s) * 3 // 2).clamp(max=limit)  # [S]: the first rows see few
    if per_row:
        n_visible = torch.stack([n_visible, (n_visible + 20).clamp(max=limit)])
    got = ops.indexer_topk(
        q.to(DEVICE), keys.to(DEVICE), weights.to(DEVICE), n_visible.to(DEVICE), k
    ).cpu()
    want = TorchBackend("cpu").indexer_topk(q, keys, weights, n_visible, k)
    assert torch.equal(got, want)
    assert (got[0, 0] == -1).all() and (got[0, -1] >= 0).all()
