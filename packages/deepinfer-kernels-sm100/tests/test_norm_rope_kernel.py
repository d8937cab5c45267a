"""The fused RMSNorm + RoPE kernel against float64 and the torch reference's two separate ops
(Triton's interpreter off the GPU)."""

from __future__ import annotations

import pytest
import torch

from deepinfer.backends.torch_ref import TorchBackend
from deepinfer_kernels_sm100.norm_rope import rms_norm_rope

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
EPS = 1e-6


def _norm_rope64(x: torch.Tensor, w: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor):
    """Each head normed, weighted and its trailing 2 * half channels rotated as interleaved
    pairs, in float64."""
    y = x.double()
    y = y * torch.rsqrt(y.square().mean(-1, keepdim=True) + EPS)
    if w is not None:
        y = y * w.double()
    rot = y.shape[-1] - 2 * cos.shape[-1]
    c, s = cos.double().unsqueeze(-2), sin.double().unsqueeze(-2)  # over the heads
    even, odd = y[..., rot::2].clone(), y[..., rot + 1 :: 2].clone()
    y[..., rot::2] = even * c - odd * s
    y[..., rot + 1 :: 2] = even * s + odd * c
    return y


CASES = [
    ((2, 5, 3, 40), (5, 4), False),  # query heads of a chunk, unweighted; 40: not a power of 2
    ((6, 1, 17, 24), (6, 1, 4), False),  # a decode batch's query heads at their positions
    ((4, 1, 1, 24), (4, 1, 4), True),  # kv rows, weighted
    ((3, 7, 1, 32), (7, 8), True),  # compressed entries of a chunk: the whole head rotated
]


@pytest.mark.parametrize(("x_shape", "cos_shape", "weighted"), CASES)
def test_matches_float64(x_shape: tuple[int, ...], cos_shape: tuple[int, ...], weighted: bool):
    g = torch.Generator().manual_seed(sum(x_shape))
    x = torch.randn(*x_shape, generator=g) * 3
    w = torch.randn(x_shape[-1], generator=g) if weighted else None
    angle = torch.randn(*cos_shape, generator=g) * 3
    cos, sin = angle.cos(), angle.sin()
    args = (None if w is None else w.to(DEVICE), EPS, cos.to(DEVICE), sin.to(DEVICE))
    got = rms_norm_rope(x.to(DEVICE), *args).cpu()
    assert got.shape == x.shape and got.dtype == x.dtype
    want = TorchBackend("cpu").rms_norm_rope(x, w, EPS, cos, sin)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.double(), _norm_rope64(x, w, cos, sin), atol=1e-5, rtol=1e-5)
    rot = x_shape[-1] - 2 * cos_shape[-1]
    plain = TorchBackend("cpu").rms_norm(x, w, EPS)[..., :rot]
    torch.testing.assert_close(got[..., :rot], plain, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("weighted", [False, True])
def test_bf16_rounds_the_norm_before_rotating(weighted: bool) -> None:
    """bf16 heads: the normed values are rounded to bf16 before the rotation, as the two
    separate ops do: each output is within one bf16 rounding of the reference's (the head's
    sum of squares may round differently) and within two of float64."""
    g = torch.Generator().manual_seed(11)
    x = (torch.randn(3, 2, 8, 64, generator=g) * 4).bfloat16()
    w = torch.randn(64, generator=g) if weighted else None
    angle = torch.randn(2, 16, generator=g) * 3
    cos, sin = angle.cos(), angle.sin()
    args = (None if w is None else w.to(DEVICE), EPS, cos.to(DEVICE), sin.to(DEVICE))
    got = rms_norm_rope(x.to(DEVICE), *args).cpu().double()
    want = TorchBackend("cpu").rms_norm_rope(x, w, EPS, cos, sin).double()
    exact = _norm_rope64(x, w, cos, sin)
    ulp = 2.0 ** (torch.floor(torch.log2(exact.abs().clamp_min(1e-30))) - 7)
    scale = exact.abs().amax(-1, keepdim=True)  # a rotation mixes a pair's magnitudes
    assert ((got - want).abs() <= 2 * ulp + scale * 2**-8).all()
    assert ((got - exact).abs() <= 2 * ulp + scale * 2**-7).all()


def test_row_slices_read_in_place() -> None:
    """kv rows as a column slice of a fused projection's output (rows 1536 apart in V4-Flash)
    give the bits of the same rows held alone."""
    g = torch.Generator().manual_seed(3)
    wide = torch.randn(4, 1, 56, generator=g).to(DEVICE)
    w = torch.randn(24, generator=g).to(DEVICE)
    angle = torch.randn(4, 1, 4, generator=g).to(DEVICE)
    kv = wide[..., 32:][:, :, None]
    got = rms_norm_rope(kv, w, EPS, angle.cos(), angle.sin())
    alone = rms_norm_rope(kv.contiguous(), w, EPS, angle.cos(), angle.sin())
    assert got.is_contiguous() and torch.equal(got, alone)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_stored_into_a_pool(dtype: torch.dtype) -> None:
    """A decode step's new entries normed, rotated and stored at their pages' rows: each
    listed pool row gets the float64 result (within the dtype's rounding) and exactly what the
    kernel returns when it is asked for the rows instead; no other row of the pool changes."""
    from deepinfer_kernels_sm100.norm_rope import rms_norm_rope_into

    g = torch.Generator().manual_seed(3)
    b, dim, half = 5, 48, 8
    x = (torch.randn(b, 1, 1, dim, generator=g) * 3).to(dtype)
    w = torch.randn(dim, generator=g)
    angle = torch.randn(b, 1, half, generator=g) * 3
    cos, sin = angle.cos(), angle.sin()
    pool = torch.randn(40, dim, generator=g).to(dtype)
    rows = torch.randperm(40, generator=g)[:b]
    on = [t.to(DEVICE) for t in (x, w, cos, sin)]
    got = pool.to(DEVICE)
    rms_norm_rope_into(on[0], on[1], EPS, on[2], on[3], got, rows.to(DEVICE))
    got = got.cpu()
    untouched = torch.ones(40, dtype=torch.bool)
    untouched[rows] = False
    assert torch.equal(got[untouched], pool[untouched])
    returned = rms_norm_rope(*on[:2], EPS, *on[2:]).cpu()
    assert torch.equal(got[rows], returned.view(b, dim))
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    exact = _norm_rope64(x.float(), w, cos, sin).view(b, dim)
    torch.testing.assert_close(got[rows].double(), exact, atol=tol, rtol=tol)
    ref = pool.clone()
    TorchBackend("cpu").rms_norm_rope_into(x, w, EPS, cos, sin, ref, rows)
    torch.testing.assert_close(got.float(), ref.float(), atol=tol, rtol=tol)
