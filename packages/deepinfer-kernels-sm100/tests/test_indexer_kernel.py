"""The paged indexer-scores kernel against the reference and a float64 recomputation."""

from __future__ import annotations

import pytest
import torch

from deepinfer.backends.torch_ref import TorchBackend
from deepinfer.paging import PagedEntries
from deepinfer_kernels_sm100.backend import Sm100Backend
from deepinfer_kernels_sm100.indexer import paged_indexer_scores

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
    weights = torch.randn(b, s, heads, generator=g)
    counts = torch.randint(0, limit + 1, (b,), generator=g)
    counts[0] = limit
    keys = PagedEntries(pages.to(DEVICE), index.to(DEVICE), limit, counts.to(DEVICE))

    got = paged_indexer_scores(q.to(DEVICE), keys, weights.to(DEVICE)).cpu()
    assert got.shape == (b, s, limit) and got.dtype == torch.float32
    held = torch.arange(limit) < counts[:, None, None]  # [B, 1, T]
    assert (got[~held.expand_as(got)] == 0).all(), "entries past a row's count are not read"
    got = torch.where(held, got, 0.0)

    # the keys laid out by hand, row by row, block by block
    dense = torch.stack(
        [torch.cat([pages[p] for p in index[i].tolist()])[:limit] for i in range(b)]
    )
    want = torch.where(held, TorchBackend("cpu").indexer_scores(q, dense, weights), 0.0)
    dots = torch.einsum("bshc,btc->bsht", q.double(), dense.double()).relu()
    exact = torch.where(held, (dots * weights.double()[..., None]).sum(dim=2), 0.0)
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
