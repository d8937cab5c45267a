"""Decode-size bf16 linears (:mod:`deepinfer_kernels_sm100.skinny_linear`) against a float64
recomputation: the fp32 product up to summation order (the dot-product bound), rounded once to
the output's dtype; K split across programs or not, tensor-core or CUDA-core bodies, grouped
projections, and the backend ops that route decode batches there."""

from __future__ import annotations

import pytest
import torch

from deepinfer_kernels_sm100 import skinny_linear as skinny
from deepinfer_kernels_sm100.fp8_split import split_counters

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _reference(x: torch.Tensor, w: torch.Tensor, groups: int) -> torch.Tensor:
    """float64 x @ w.T, group j of x [M, groups * K] against rows j * N / groups of w."""
    m, (n, k) = x.shape[0], w.shape
    xs = x.double().view(m, groups, k)
    ws = w.double().view(groups, n // groups, k)
    return torch.einsum("mgk,gok->mgo", xs, ws).reshape(m, n)


def _bound(x: torch.Tensor, w: torch.Tensor, groups: int, out_dtype: torch.dtype) -> torch.Tensor:
    """fp32 sums of K exact products (each addition within 2**-24 of the running sum), then one
    rounding to ``out_dtype`` (half an ulp: 2**-8 relative for bf16)."""
    k = w.shape[1]
    sums = (k + 2) * 2.0**-24 * _reference(x.abs(), w.abs(), groups)
    rounding = 2.0**-8 if out_dtype == torch.bfloat16 else 2.0**-24
    return sums * (1 + rounding) + rounding * _reference(x, w, groups).abs()


@pytest.fixture(params=[True, False], ids=["dot", "fma"])
def tiles(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> skinny.Tiles:
    shape = skinny.Tiles(dot=request.param, block_n=64, block_k=64 if request.param else 32)
    monkeypatch.setattr(skinny, "TILES", shape)
    return shape


@pytest.mark.parametrize("rows", [1, 3, 8])
@pytest.mark.parametrize(
    "shape",
    [(64, 128, 1), (16, 1024, 1), (192, 512, 1), (128, 256, 2)],
    ids=["one-step", "router-like", "split", "grouped"],
)
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_against_float64(
    tiles: skinny.Tiles, rows: int, shape: tuple[int, int, int], out_dtype: torch.dtype
) -> None:
    """``shape``: (N, K, groups)."""
    n, k, groups = shape
    g = torch.Generator().manual_seed(rows * 1000 + n + k)
    x = torch.randn(rows, groups * k, generator=g).to(torch.bfloat16)
    w = (torch.randn(n, k, generator=g) / k**0.5).to(torch.bfloat16)
    xd, wd = x.to(DEVICE), w.to(DEVICE)
    assert skinny.fits(xd, wd, groups)
    got = skinny.skinny_linear(xd, wd, out_dtype=out_dtype, groups=groups)
    assert got.dtype == out_dtype and got.shape == (rows, n)
    err = (got.cpu().double() - _reference(x, w, groups)).abs()
    assert bool((err <= _bound(x, w, groups, out_dtype)).all()), float(err.max())
    assert not bool(split_counters(xd.device).any())  # every split launch left them at zero


def test_what_fits() -> None:
    """Decode batches of bf16 operands whose shapes take the tiles; everything else goes to
    the library GEMM."""
    w = torch.zeros(64, 256, dtype=torch.bfloat16, device=DEVICE)
    x = torch.zeros(8, 256, dtype=torch.bfloat16, device=DEVICE)
    assert skinny.fits(x, w)
    assert not skinny.fits(torch.zeros(9, 256, dtype=torch.bfloat16, device=DEVICE), w)
    assert not skinny.fits(x.float(), w)
    assert not skinny.fits(x, w.float())
    assert not skinny.fits(x[:, :200], w[:, :200])  # K not a multiple of the K step
    assert not skinny.fits(x, w[:40])  # no power of two from 16 divides N
    assert skinny.fits(x.view(8, 1, 256), w)  # leading dims are rows


def test_backend_routes_decode_batches() -> None:
    """The backend's ``linear``, ``grouped_linear`` and ``linear_fp32`` (bf16 input) of a
    decode batch give the float64 product within the bound, in the reference's dtypes and
    shapes."""
    from deepinfer_kernels_sm100.backend import Sm100Backend

    ops = object.__new__(Sm100Backend)
    g = torch.Generator().manual_seed(7)
    w = (torch.randn(128, 256, generator=g) / 16).to(torch.bfloat16)
    x = torch.randn(2, 1, 256, generator=g).to(torch.bfloat16)
    flat = x.view(2, 256)
    out = ops.linear(x.to(DEVICE), w.to(DEVICE))
    assert out.shape == (2, 1, 128) and out.dtype == torch.bfloat16
    err = (out.cpu().view(2, 128).double() - _reference(flat, w, 1)).abs()
    assert bool((err <= _bound(flat, w, 1, torch.bfloat16)).all())
    out = ops.linear_fp32(x.to(DEVICE), w.to(DEVICE))
    assert out.shape == (2, 1, 128) and out.dtype == torch.float32
    err = (out.cpu().view(2, 128).double() - _reference(flat, w, 1)).abs()
    assert bool((err <= _bound(flat, w, 1, torch.float32)).all())
    xg = torch.randn(2, 2, 128, generator=g).to(torch.bfloat16)  # two groups of 128 columns
    wg = (torch.randn(128, 128, generator=g) / 12).to(torch.bfloat16)
    out = ops.grouped_linear(xg.to(DEVICE), wg.to(DEVICE))
    assert out.shape == (2, 2, 64) and out.dtype == torch.bfloat16
    want = _reference(xg.view(2, 256), wg, 2)
    err = (out.cpu().view(2, 128).double() - want).abs()
    assert bool((err <= _bound(xg.view(2, 256), wg, 2, torch.bfloat16)).all())
