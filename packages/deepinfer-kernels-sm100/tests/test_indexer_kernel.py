"""The fused lightning-indexer scores against the torch reference and a float64 recomputation."""

from __future__ import annotations

import pytest
import torch

from deepinfer.backends.torch_ref import TorchBackend
from deepinfer_kernels_sm100.indexer import indexer_scores

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize(
    "shape",
    [(2, 5, 4, 16, 37), (1, 33, 3, 24, 70), (3, 1, 16, 32, 200), (1, 4, 2, 8, 0)],
    ids=["chunk", "odd-sizes", "decode-rows", "no-entries"],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_reference_and_float64(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    b, s, h, c, t = shape  # batch, queries, heads, head dim, entries
    g = torch.Generator().manual_seed(s * 10 + t)
    q = torch.randn(b, s, h, c, generator=g).to(dtype)
    keys = torch.randn(b, t, c, generator=g).to(dtype)
    keys[:, ::5] = 0.0  # every head's dot is 0: the score must be an exact 0 (a top-k tie)
    weights = torch.randn(b, s, h, generator=g)
    got = indexer_scores(q.to(DEVICE), keys.to(DEVICE), weights.to(DEVICE)).cpu()
    assert got.dtype == torch.float32 and got.shape == (b, s, t)
    want = TorchBackend("cpu").indexer_scores(q, keys, weights)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-5)
    dots = torch.einsum("bshc,btc->bsht", q.double(), keys.double()).relu()
    exact = (dots * weights.double()[..., None]).sum(dim=2)
    torch.testing.assert_close(got.double(), exact, atol=1e-4, rtol=1e-5)
    assert torch.equal(got == 0, want == 0)
    assert bool((got[:, :, ::5] == 0).all())
