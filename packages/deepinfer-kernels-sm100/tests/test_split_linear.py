"""fp32 projections from bf16 weights (:mod:`deepinfer_kernels_sm100.split_linear`) against a
float64 recomputation: within the dot-product bound of the parts taken (three: the fp32 product
up to summation order; two, for wide inputs: that bound plus the bits they drop), and visibly
better than rounding the input to bf16 once."""

from __future__ import annotations

import pytest
import torch

from deepinfer_kernels_sm100.split_linear import (
    PARTS,
    bf16_parts,
    linear_fp32,
    parts_for,
    sum_parts,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _bound(x: torch.Tensor, w: torch.Tensor, parts: int = PARTS) -> torch.Tensor:
    """What fp32 arithmetic may miss on ``x @ w.T`` with the input in ``parts`` bf16 parts:
    each of the K products' accumulation and the parts' additions is within 2**-24 relative of
    the running sum, and the bits the parts drop are within 2**(-8 parts) of the input, so the
    error is at most about ``(K + parts + 1 + 2**(24 - 8 parts)) 2**-24 sum_k |x_k| |w_k|``
    (the standard dot-product bound plus the dropped bits)."""
    k = x.shape[-1]
    slack = k + parts + 1 + 2.0 ** (24 - 8 * parts)
    return slack * 2.0**-24 * (x.double().abs() @ w.double().abs().T)


def test_parts_sum_back_to_the_input() -> None:
    """Three bf16 parts carry all 24 significand bits of an fp32: their sum is the input
    exactly (the split ``hc_mix`` makes of its fp32 weights in registers too)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 96, generator=g) * torch.logspace(-30, 30, 96)
    parts = bf16_parts(x)
    assert parts.shape == (PARTS, 64, 96) and parts.dtype == torch.bfloat16
    assert torch.equal(parts.double().sum(0), x.double())
    two = (parts[:2].double().sum(0) - x.double()).abs()
    assert bool((two > 0).any())  # two parts are not enough


@pytest.mark.parametrize("rows", [0, 1, 7, 64])
@pytest.mark.parametrize("k", [128, 1024, 4096])
def test_fp32_input_against_float64(rows: int, k: int) -> None:
    g = torch.Generator().manual_seed(rows * 31 + k)
    n = 96
    x = torch.randn(rows, k, generator=g)
    w = (torch.randn(n, k, generator=g) / k**0.5).to(torch.bfloat16)
    got = linear_fp32(x.to(DEVICE), w.to(DEVICE)).cpu()
    assert got.dtype == torch.float32 and got.shape == (rows, n)
    want = x.double() @ w.double().T
    parts = parts_for(k)
    bound = _bound(x, w.float(), parts)
    assert bool(((got.double() - want).abs() <= bound).all())
    if rows and k <= 1024:  # the bound is tight enough to catch an input rounded to bf16 once
        # (at 4096 random rounding errors, a random walk, stay under the worst-case bound)
        coarse = x.to(torch.bfloat16).double() @ w.double().T
        assert bool(((coarse - want).abs() > bound).any())


def test_bf16_input_and_leading_dims() -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 5, 256, generator=g).to(torch.bfloat16)
    w = (torch.randn(40, 256, generator=g) / 16).to(torch.bfloat16)
    got = linear_fp32(x.to(DEVICE), w.to(DEVICE)).cpu()
    assert got.shape == (2, 5, 40) and got.dtype == torch.float32
    want = x.double() @ w.double().T
    assert bool(((got.double() - want).abs() <= _bound(x.float(), w.float())).all())


def test_fp32_weight_is_the_plain_fp32_product() -> None:
    g = torch.Generator().manual_seed(2)
    x = torch.randn(9, 64, generator=g).to(torch.bfloat16)
    w = torch.randn(32, 64, generator=g)
    got = linear_fp32(x.to(DEVICE), w.to(DEVICE)).cpu()
    torch.testing.assert_close(got, x.float() @ w.T, atol=1e-5, rtol=1e-5)


def test_parts_products_summed_smallest_first() -> None:
    """The products' sum (one kernel) is the fp32 sum taken smallest part first, each addition
    rounded once: the same bits as adding them in that order in float64 then rounding to fp32
    after each step, and within one fp32 rounding of the terms' magnitude per addition of the
    exact float64 total."""
    g = torch.Generator().manual_seed(2)
    scales = torch.tensor([1.0, 2.0**-8, 2.0**-16]).view(PARTS, 1, 1)
    products = (torch.randn(PARTS, 5, 3001, generator=g) * scales).float()
    got = sum_parts(products.to(DEVICE)).cpu()
    want = products[PARTS - 1].double()
    for i in range(PARTS - 2, -1, -1):
        want = (want + products[i].double()).float().double()  # one rounding per addition
    assert got.shape == (5, 3001) and torch.equal(got.double(), want)
    exact, magnitude = products.double().sum(0), products.double().abs().sum(0)
    assert bool(((got.double() - exact).abs() <= 2 * 2.0**-24 * magnitude).all())


@pytest.mark.parametrize("rows", [1, 6, 7, 12, 16, 17])
def test_fp32_weights_at_few_rows(rows: int) -> None:
    """The backend's ``linear`` on fp32 weights, whose products of a few rows it pads: every
    row within the fp32 dot-product bound of a float64 recomputation, leading dimensions and
    an input of another dtype kept."""
    from deepinfer_kernels_sm100.backend import Sm100Backend, pads_fp32_rows

    ops = object.__new__(Sm100Backend)  # skip the availability check: no GPU in CI
    ops.device = torch.device(DEVICE)
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(1, rows, 128, generator=g).to(torch.bfloat16)
    w = torch.randn(160, 128, generator=g) / 11
    assert pads_fp32_rows(rows, w) == (7 <= rows <= 16)
    got = ops.linear(x.to(DEVICE), w.to(DEVICE)).cpu()
    assert got.shape == (1, rows, 160) and got.dtype == torch.float32 and got.is_contiguous()
    want = x.double() @ w.double().T
    assert bool(((got.double() - want).abs() <= _bound(x.float(), w, parts=3)).all())
