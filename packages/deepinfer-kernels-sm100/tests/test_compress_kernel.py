"""The compressor's softmax-pooling kernel against the torch reference and float64."""

from __future__ import annotations

import pytest
import torch

from deepinfer.backends.torch_ref import TorchBackend
from deepinfer_kernels_sm100.compress import softmax_pool

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _pool64(
    kv: torch.Tensor,
    score: torch.Tensor,
    prev_kv: torch.Tensor | None,
    prev_score: torch.Tensor | None,
) -> torch.Tensor:
    """Overlapping pooling in float64, written out window by window."""
    b, n, r, width = kv.shape
    d = width // 2
    out = torch.empty(b, n, d, dtype=torch.float64)
    for i in range(n):
        if i > 0:
            first_kv, first_sc = kv[:, i - 1, :, :d], score[:, i - 1, :, :d]
        elif prev_kv is not None and prev_score is not None:
            first_kv, first_sc = prev_kv, prev_score
        else:
            first_kv, first_sc = torch.zeros(b, r, d), torch.full((b, r, d), float("-inf"))
        window_kv = torch.cat((first_kv, kv[:, i, :, d:]), dim=1).double()
        window_sc = torch.cat((first_sc, score[:, i, :, d:]), dim=1).double()
        out[:, i] = (window_sc.softmax(dim=1) * window_kv).sum(dim=1)
    return out


@pytest.mark.parametrize(
    "case",
    [
        (3, 1, 4, 40, True, True),  # a CSA decode step, carried first halves
        (2, 5, 4, 24, True, False),  # a CSA prefill chunk, the first window's predecessor absent
        (2, 3, 4, 24, True, True),
        (4, 1, 128, 72, False, False),  # an HCA decode step: one long window
        (1, 6, 16, 20, False, False),
    ],
    ids=["csa-decode", "csa-chunk-fresh", "csa-chunk", "hca-decode", "hca-chunk"],
)
def test_matches_reference(case: tuple[int, int, int, int, bool, bool]) -> None:
    b, n, r, d, overlap, prev = case  # rows, windows, ratio, entry width, overlap, carried halves
    g = torch.Generator().manual_seed(b * 1000 + n * 10 + r)
    width = 2 * d if overlap else d
    kv = torch.randn(b, n, r, width, generator=g)
    score = torch.randn(b, n, r, width, generator=g) * 3
    prev_kv = torch.randn(b, r, d, generator=g) if prev else None
    prev_score = torch.randn(b, r, d, generator=g) * 3 if prev else None
    if prev_score is not None:
        prev_score[0, :, :5] = float("-inf")  # a fresh state's carried halves weigh nothing
    dev = [None if t is None else t.to(DEVICE) for t in (kv, score, prev_kv, prev_score)]
    got = softmax_pool(*dev, overlap).cpu()
    want = TorchBackend("cpu").compress(kv, score, prev_kv, prev_score, overlap)
    assert got.shape == want.shape == (b, n, d) and got.dtype == torch.float32
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    if overlap:
        exact = _pool64(kv, score, prev_kv, prev_score)
    else:
        exact = (score.double().softmax(dim=2) * kv.double()).sum(dim=2)
    torch.testing.assert_close(got.double(), exact, atol=1e-6, rtol=1e-5)


def test_strided_windows() -> None:
    """Windows read through strides (a view of wider rows), as the reference reads them."""
    g = torch.Generator().manual_seed(7)
    rows_kv = torch.randn(2, 3, 4, 100, generator=g)
    rows_sc = torch.randn(2, 3, 4, 100, generator=g)
    kv, score = rows_kv[..., 10:58], rows_sc[..., 10:58]
    got = softmax_pool(kv.to(DEVICE), score.to(DEVICE), None, None, True).cpu()
    want = TorchBackend("cpu").compress(kv, score, None, None, True)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
