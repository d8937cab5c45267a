"""The mHC exit kernels against float64 and the torch reference, through Triton's interpreter
off the GPU: the exit alone, and the exit that also makes the next mixer's split products,
which must be the very bits of the exit followed by the mixer's own kernel (the engine picks
between them by the row count, and a row's bits must not depend on its batch)."""

from __future__ import annotations

import pytest
import torch

from deepinfer.backends.torch_ref import TorchBackend
from deepinfer_kernels_sm100 import mhc, mhc_exit

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ref = TorchBackend("cpu")


def _inputs(rows: int, hc: int, d: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, ...]:
    """(y [rows, d], streams [rows, hc, d], post [rows, hc], comb [rows, hc, hc], fn)."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randn(rows, d, generator=g).to(dtype)
    x = torch.randn(rows, hc, d, generator=g).to(dtype)
    post = torch.randn(rows, hc, generator=g).sigmoid() * 2
    comb = torch.randn(rows, hc, hc, generator=g).softmax(-1)
    fn = torch.randn((2 + hc) * hc, hc * d, generator=g) * 0.1
    return y, x, post, comb, fn


def _exit_float64(y: torch.Tensor, x: torch.Tensor, post: torch.Tensor, comb: torch.Tensor):
    """The exit in float64 of its inputs rounded to the streams' dtype, as the reference
    rounds them."""
    dt = x.dtype
    p, c = post.to(dt).double(), comb.to(dt).double()
    return p[..., None] * y.double()[..., None, :] + c.transpose(-1, -2) @ x.double()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mhc_post(dtype: torch.dtype) -> None:
    y, x, post, comb, _ = _inputs(6, 4, 300, dtype, seed=9)  # two D blocks, the last partial
    got = mhc_exit.mhc_post(*(t.to(DEVICE) for t in (y, x, post, comb))).cpu()
    assert got.dtype == dtype and got.shape == x.shape
    # bf16: post, comb and the result each rounded once to the dtype, where the interpreter
    # truncates (an ulp, 2**-7 relative, each)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    exact = _exit_float64(y, x, post, comb)
    torch.testing.assert_close(got.double(), exact, atol=tol, rtol=tol)
    want = ref.mhc_post(y, x, post, comb)
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("hc", [4, 3], ids=["four-streams", "three-streams"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("rows", [1, 17])
def test_post_mix_is_the_exit_then_the_mixer(rows: int, dtype: torch.dtype, hc: int) -> None:
    """d = 256: two of the mixer's 128-column splits per stream. The new streams and every
    split's products and sums of squares are the bits of ``mhc_post`` then
    ``hc_mix_parts``; the mixer logits they finish to match float64 of those streams."""
    y, x, post, comb, fn = (t.to(DEVICE) for t in _inputs(rows, hc, 256, dtype, seed=rows + hc))
    out, parts = mhc_exit.mhc_post_mix(y, x, post, comb, fn)
    assert parts is not None
    want = mhc_exit.mhc_post(y, x, post, comb)
    assert torch.equal(out, want)
    flat, products, squares = mhc.hc_mix_parts(want, fn, 1e-6)
    assert torch.equal(parts[0], flat)
    assert torch.equal(parts[1], products) and torch.equal(parts[2], squares)
    streams = out.cpu().reshape(rows, -1).double()
    k_dim = streams.shape[1]
    scale = torch.rsqrt(parts[2].cpu().double().sum(0) / k_dim + 1e-6)
    logits = parts[1].cpu().double().sum(0) * scale[:, None]
    exact = (streams @ fn.cpu().double().T) * torch.rsqrt(
        streams.square().mean(-1, keepdim=True) + 1e-6
    )
    magnitude = (streams.abs() @ fn.cpu().double().abs().T) * scale[:, None]
    assert ((logits - exact).abs() <= 2.0**-16 * magnitude).all()


def test_post_mix_runs_the_exit_alone_where_it_does_not_apply(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A hidden size that is no multiple of the mixer's split, and more rows than the fused
    kernel takes: the exit's streams, and no products."""
    y, x, post, comb, fn = (t.to(DEVICE) for t in _inputs(3, 4, 200, torch.float32, seed=1))
    out, parts = mhc_exit.mhc_post_mix(y, x, post, comb, fn)
    assert parts is None and torch.equal(out, mhc_exit.mhc_post(y, x, post, comb))
    monkeypatch.setattr(mhc_exit, "POST_MIX_MAX_ROWS", 2)
    y, x, post, comb, fn = (t.to(DEVICE) for t in _inputs(3, 4, 128, torch.float32, seed=2))
    out, parts = mhc_exit.mhc_post_mix(y, x, post, comb, fn)
    assert parts is None and torch.equal(out, mhc_exit.mhc_post(y, x, post, comb))
