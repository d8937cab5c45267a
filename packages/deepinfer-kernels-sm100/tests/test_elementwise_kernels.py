"""RMSNorm, RoPE, the mHC mixer and the mHC exit kernels against the torch reference (and
float64 where the reference itself rounds), through Triton's interpreter off the GPU."""

from __future__ import annotations

import pytest
import torch

from deepinfer.backends.torch_ref import TorchBackend
from deepinfer_kernels_sm100 import elementwise, mhc

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ref = TorchBackend("cpu")


def _rand(*shape: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("weighted", [True, False])
def test_rms_norm(dtype: torch.dtype, weighted: bool) -> None:
    x = _rand(3, 5, 40, seed=1, dtype=dtype) * 3  # 40: not a power of two
    w = _rand(40, seed=2) if weighted else None
    got = elementwise.rms_norm(x.to(DEVICE), None if w is None else w.to(DEVICE), 1e-6).cpu()
    want = ref.rms_norm(x, w, 1e-6)
    assert got.dtype == dtype and got.shape == x.shape
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("inverse", [False, True])
@pytest.mark.parametrize(
    ("x_shape", "cos_shape"),
    [((2, 5, 3, 24), (5, 4)), ((4, 1, 1, 24), (4, 1, 4)), ((6, 1, 17, 24), (6, 1, 4))],
    ids=["chunk", "kv-rows", "decode-heads"],
)
def test_rope(x_shape: tuple[int, ...], cos_shape: tuple[int, ...], inverse: bool) -> None:
    x = _rand(*x_shape, seed=3)
    angle = _rand(*cos_shape, seed=4)
    cos, sin = angle.cos(), angle.sin()
    got = elementwise.rope(x.to(DEVICE), cos.to(DEVICE), sin.to(DEVICE), inverse).cpu()
    want = ref.rope(x, cos, sin, inverse)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    assert torch.equal(got[..., :16], x[..., :16])  # the channels before the rotated tail


def test_rope_then_inverse_is_identity_in_bf16_range() -> None:
    x = _rand(2, 3, 4, 32, seed=5, dtype=torch.bfloat16)
    angle = _rand(3, 8, seed=6)
    c, s = angle.cos().to(DEVICE), angle.sin().to(DEVICE)
    back = elementwise.rope(elementwise.rope(x.to(DEVICE), c, s), c, s, inverse=True).cpu()
    torch.testing.assert_close(back.float(), x.float(), atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize(
    ("rows", "d"),
    [(1, 24), (19, 72), (3, 300)],
    ids=["one-row-one-split", "odd-rows-split-k", "split-k"],
)
def test_hc_mix_matches_float64(rows: int, d: int) -> None:
    # n*d = 96: one program along K, two K blocks, the last partial;
    # 288 and 1200: several programs along K, the last one partial
    hc = 4
    x = _rand(rows, hc, d, seed=7) * 2
    fn = _rand((2 + hc) * hc, hc * d, seed=8) * 0.1
    got = mhc.hc_mix(x.to(DEVICE), fn.to(DEVICE), 1e-6).cpu()
    flat = x.reshape(rows, -1).double()
    want = (flat * torch.rsqrt(flat.square().mean(-1, keepdim=True) + 1e-6)) @ fn.double().T
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got, ref.hc_mix(x, fn, 1e-6), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mhc_post(dtype: torch.dtype) -> None:
    hc, d = 4, 300  # two D blocks, the last partial
    x = _rand(2, 3, hc, d, seed=9, dtype=dtype)
    y = _rand(2, 3, d, seed=10, dtype=dtype)
    post = _rand(2, 3, hc, seed=11).sigmoid() * 2
    comb = _rand(2, 3, hc, hc, seed=12).softmax(-1)
    got = mhc.mhc_post(*(t.to(DEVICE) for t in (y, x, post, comb))).cpu()
    want = ref.mhc_post(y, x, post, comb)
    assert got.dtype == dtype and got.shape == x.shape
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("hc", [4, 3], ids=["four-streams", "three-streams"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mhc_collapse_matches_float64(hc: int, dtype: torch.dtype) -> None:
    d = 600  # two D blocks, the last partial
    x = _rand(2, 3, hc, d, seed=13, dtype=dtype)
    pre = _rand(2, 3, hc, seed=14).sigmoid()
    got = mhc.mhc_collapse(x.to(DEVICE), pre.to(DEVICE)).cpu()
    assert got.dtype == dtype and got.shape == (2, 3, d)
    exact = (pre.double()[..., None] * x.double()).sum(dim=-2)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got.double(), exact, atol=tol, rtol=tol)
    torch.testing.assert_close(got, ref.mhc_collapse(x, pre), atol=tol, rtol=tol)


@pytest.mark.parametrize("limit", [10.0, 0.0], ids=["clamped", "unclamped"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_swiglu_matches_float64(limit: float, dtype: torch.dtype) -> None:
    # 2500 entries: three programs, the last partial; values out to +-24 reach both clamps
    gate = (_rand(5, 500, seed=20) * 8).to(dtype)
    up = (_rand(5, 500, seed=21) * 8).to(dtype)
    got = elementwise.swiglu(gate.to(DEVICE), up.to(DEVICE), limit, dtype).cpu()
    g, u = gate.double(), up.double()
    if limit > 0:
        g, u = g.clamp(max=limit), u.clamp(-limit, limit)
    exact = g * torch.sigmoid(g) * u
    assert got.dtype == dtype and got.shape == gate.shape
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got.double(), exact, atol=tol, rtol=tol)
    if limit > 0:  # the clamp is live: an unclamped product would miss by far more
        assert (gate.float() > limit).any() and (up.float().abs() > limit).any()


def test_shared_expert_matches_the_reference() -> None:
    """The backend's dense SwiGLU MLP (the shared expert) through the kernel equals the
    reference's, bf16 weights with fp32 inputs as the MoE layer calls it."""
    from deepinfer_kernels_sm100.backend import Sm100Backend

    if DEVICE == "cpu":
        ops = Sm100Backend.__new__(Sm100Backend)  # the op table, without the device check
        ops.device = torch.device("cpu")
    else:
        ops = Sm100Backend()
    x = _rand(6, 64, seed=22)
    w1, w3 = ((_rand(96, 64, seed=s) * 0.2).to(torch.bfloat16) for s in (23, 24))
    w2 = (_rand(64, 96, seed=25) * 0.1).to(torch.bfloat16)
    args = (w1.to(DEVICE), w2.to(DEVICE), w3.to(DEVICE), 1.0)  # limit 1: both clamps live
    got = ops.swiglu_mlp(x.to(DEVICE), *args).cpu()
    want = ref.swiglu_mlp(x, w1, w2, w3, 1.0)
    assert got.dtype == torch.float32 and got.shape == want.shape
    # the hidden activations round to bf16 on both sides; an ulp there moves the output a little
    torch.testing.assert_close(got, want, atol=1e-2, rtol=1e-2)
