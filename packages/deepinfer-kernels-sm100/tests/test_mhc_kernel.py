"""A sublayer's mHC entry kernels against the torch reference and float64 (Triton's interpreter
off the GPU)."""

from __future__ import annotations

import pytest
import torch

from deepinfer.backends.torch_ref import TorchBackend
from deepinfer_kernels_sm100 import elementwise, mhc_fused
from deepinfer_kernels_sm100.mhc_fused import Normed, mhc_entry

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_matches_float64_on_peaked_logits() -> None:
    """Gates and a 20-iteration Sinkhorn mix from peaked logits (a slow-converging softmax),
    recomputed in float64 from the streams. The float64 mixer output is the kernel's input
    but for the fp32 rounding of sums of 128 products: its error is about 1e-6 relative, which
    the sigmoid (slope <= 1/4) and the Sinkhorn steps (each divides by a sum near 1) carry to
    the bounds below."""
    g = torch.Generator().manual_seed(5)
    hc, d, iters, eps = 4, 32, 20, 1e-6
    x = torch.randn(9, hc, d, generator=g)
    fn = torch.randn((2 + hc) * hc, hc * d, generator=g) * (3 / (hc * d) ** 0.5)  # mix ~ N(0, 9)
    base = torch.randn((2 + hc) * hc, generator=g)
    scale = torch.rand(3, generator=g) + 0.5
    args = [t.to(DEVICE) for t in (x, fn, base, scale)]
    pre, post, comb, *_ = mhc_entry(*args, eps, eps, iters, False)
    flat = x.flatten(-2).double()
    m = flat * torch.rsqrt(flat.square().mean(-1, keepdim=True) + eps) @ fn.double().T
    assert m.abs().max() > 6  # peaked: some softmax rows near one-hot
    b, s = base.double(), scale.double()
    want_pre = torch.sigmoid(m[:, :hc] * s[0] + b[:hc]) + eps
    want_post = 2 * torch.sigmoid(m[:, hc : 2 * hc] * s[1] + b[hc : 2 * hc])
    c = (m[:, 2 * hc :] * s[2] + b[2 * hc :]).view(-1, hc, hc).softmax(-1) + eps
    c = c / (c.sum(-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        c = c / (c.sum(-1, keepdim=True) + eps)
        c = c / (c.sum(-2, keepdim=True) + eps)
    torch.testing.assert_close(pre.cpu().double(), want_pre, atol=2e-6, rtol=2e-6)
    torch.testing.assert_close(post.cpu().double(), want_post, atol=4e-6, rtol=2e-6)
    torch.testing.assert_close(comb.cpu().double(), c, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("iters", [1, 20])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("lead", [(1,), (2, 3), (33,)], ids=["one", "batch-seq", "odd-rows"])
def test_entry_in_two_kernels_matches_the_reference(
    lead: tuple[int, ...], dtype: torch.dtype, iters: int
) -> None:
    """The mixer, gates, Sinkhorn mix (one iteration or twenty) and collapse of
    :mod:`~deepinfer_kernels_sm100.mhc_fused` (n * d = 800 columns: seven splits, not a power
    of two) against the torch reference's ``mhc_weights`` and ``mhc_pre``."""
    g = torch.Generator().manual_seed(sum(lead) + iters)
    hc, d = 4, 200
    x = torch.randn(*lead, hc, d, generator=g).to(dtype)
    fn = torch.randn((2 + hc) * hc, hc * d, generator=g) * 0.05
    base = torch.randn((2 + hc) * hc, generator=g)
    scale = torch.rand(3, generator=g) + 0.5
    ref = TorchBackend("cpu")
    kw = {"norm_eps": 1e-6, "hc_eps": 1e-6, "sinkhorn_iters": iters}
    want = ref.mhc_weights(x, fn, base, scale, **kw)
    u_want, _, _ = ref.mhc_pre(x, fn, base, scale, **kw)
    args = [t.to(DEVICE) for t in (x, fn, base, scale)]
    *got, u, _ = mhc_entry(*args, 1e-6, 1e-6, iters, True)
    *weights_only, none, _ = mhc_entry(*args, 1e-6, 1e-6, iters, False)
    assert none is None and u is not None
    for name, a, b, c in zip(("pre", "post", "comb"), got, weights_only, want, strict=True):
        assert torch.equal(a, b), name
        torch.testing.assert_close(a.cpu(), c, atol=2e-5, rtol=2e-5, msg=name)
    assert u.dtype == dtype
    torch.testing.assert_close(u.cpu().float(), u_want.float(), atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("d", [640, 512], ids=["d640", "d512"])
@pytest.mark.parametrize("whole", [True, False], ids=["whole-row", "column-blocks"])
@pytest.mark.parametrize("quant", [False, True], ids=["normed", "normed-fp8"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("lead", [(1,), (2, 3)], ids=["one", "batch-seq"])
def test_entry_with_the_sublayer_norm(  # noqa: PLR0917 (pytest passes them by name)
    lead: tuple[int, ...], dtype: torch.dtype, quant: bool, whole: bool, d: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """The collapsed row RMSNormed in the entry's kernel (d = 640: loaded whole in a masked
    1024-wide tile, or in two 512-wide passes, the second part-masked; d = 512: a whole row
    of exactly the tile's width, unmasked, or one pass) against the reference's ``mhc_pre`` then
    ``rms_norm``, against float64 from the reference's ``pre`` weights, and against the
    unfused kernels; its weights equal the entry's without the norm; with ``quant`` its codes
    are its own output quantised, as ``rms_norm_fp8`` quantises."""
    if not whole:
        monkeypatch.setattr(mhc_fused, "FINISH_ROW_CELLS", 0)
    g = torch.Generator().manual_seed(sum(lead) + quant + d)
    hc, eps = 4, 1e-6
    x = (torch.randn(*lead, hc, d, generator=g) * 2).to(dtype)
    fn = torch.randn((2 + hc) * hc, hc * d, generator=g) * 0.05
    base = torch.randn((2 + hc) * hc, generator=g)
    scale = torch.rand(3, generator=g) + 0.5
    weight = torch.rand(d, generator=g) + 0.5
    args = [t.to(DEVICE) for t in (x, fn, base, scale)]
    norm = Normed(weight.to(DEVICE), 1e-5, quant)
    pre, post, comb, xn, codes = mhc_entry(*args, eps, eps, 20, True, norm)
    pre_u, post_u, comb_u, u, _ = mhc_entry(*args, eps, eps, 20, True)
    assert torch.equal(pre, pre_u) and torch.equal(post, post_u) and torch.equal(comb, comb_u)
    assert xn is not None and xn.dtype == dtype and xn.shape == (*lead, d)

    ref = TorchBackend("cpu")
    kw = {"norm_eps": eps, "hc_eps": eps, "sinkhorn_iters": 20}
    want, act, _, _ = ref.mhc_pre_normed(x, fn, base, scale, weight, eps=1e-5, fp8=quant, **kw)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(xn.cpu().float(), want.float(), atol=tol, rtol=tol)
    ref_pre, _, _ = ref.mhc_weights(x, fn, base, scale, **kw)
    collapsed = (ref_pre.double()[..., None] * x.double()).sum(-2)
    exact = collapsed * torch.rsqrt(collapsed.square().mean(-1, keepdim=True) + 1e-5) * weight
    torch.testing.assert_close(xn.cpu().double(), exact, atol=tol, rtol=tol)
    assert u is not None
    unfused = elementwise.rms_norm(u, weight.to(DEVICE), 1e-5)
    torch.testing.assert_close(xn, unfused, atol=tol, rtol=tol)
    assert (codes is not None) == quant and (act is not None) == quant
    if codes is not None:
        q, s = (t.cpu() for t in codes)
        groups = xn.cpu().double().reshape(-1, d // 128, 128)
        amax = groups.abs().amax(-1)
        want_s = torch.where(amax > 0, amax / 448, 1.0).float()
        assert torch.equal(s.reshape(want_s.shape), want_s)
        want_q = (xn.cpu().float().reshape(-1, d // 128, 128) / want_s[..., None]).to(
            torch.float8_e4m3fn
        )
        assert torch.equal(q.reshape(want_q.shape).float(), want_q.float())
