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


@pytest.mark.parametrize("part", [slice(0, 40), slice(40, 64)], ids=["first", "second"])
def test_rms_norm_of_row_slices(part: slice) -> None:
    """Rows that are a slice of wider ones (a fused projection's two outputs) are read in
    place, and normalise as the same values held alone do."""
    wide = _rand(3, 5, 64, seed=5) * 2
    w = _rand(part.stop - part.start, seed=6)
    got = elementwise.rms_norm(wide.to(DEVICE)[..., part], w.to(DEVICE), 1e-6).cpu()
    want = ref.rms_norm(wide[..., part].contiguous(), w, 1e-6)
    assert got.is_contiguous() and got.shape == want.shape
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)


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


def _hc_mix_float64(x: torch.Tensor, fn: torch.Tensor, eps: float) -> tuple[torch.Tensor, ...]:
    """(the mixer logits, ``scale * sum_k |x_k| |fn_jk|``, and the logits had fn been rounded
    to one bf16 part), in float64, of streams ``x`` [rows, n, d]."""
    flat = x.reshape(x.shape[0], -1).double()
    scale = torch.rsqrt(flat.square().mean(-1, keepdim=True) + eps)
    exact = (flat @ fn.double().T) * scale
    magnitude = (flat.abs() @ fn.double().abs().T) * scale
    one_part = (flat @ fn.to(torch.bfloat16).double().T) * scale
    return exact, magnitude, one_part


def _hc_mix_bound(k_dim: int, magnitude: torch.Tensor) -> torch.Tensor:
    """How far hc_mix's fp32 logits may be from the float64 ones (first order, u = 2**-24).

    The products x_k * fn_jk are exact (bf16 times a bf16 part of fn, or fp32 products in the
    IEEE dots), so only sums round. A program's accumulator takes its split's S columns as
    three part products each: at most 3S roundings, each at most 2u of the running sum (2u, not
    u, to cover tensor-core adders that truncate), and the finishing sum of the P splits' partials
    P more: (3S + P) * 2u * sum_k |x_k fn_jk| at most. The sum of squares (S + P roundings of
    non-negative terms) moves the scale by at most half its (S + P) * u relative error; the mean,
    the rsqrt (a few ulps on a GPU) and the last product add a few u more. With S and P at most
    K this is below (4S + 2P + 16) * 2u relative to the magnitude: for V4-Flash's K = 16384 in
    splits of 128, about 2**-13.4, where one bf16 part of fn errs by up to 2**-9 of it.
    """
    split = min(mhc.HC_MIX_SPLIT, k_dim)
    splits = -(-k_dim // mhc.HC_MIX_SPLIT)
    return (4 * split + 2 * splits + 16) * 2.0**-23 * magnitude


@pytest.mark.parametrize("rows", [1, 17, 64])
@pytest.mark.parametrize("d", [64, 300], ids=["two-splits", "ten-splits-partial"])
@pytest.mark.parametrize("signs", ["random", "one-signed"])
def test_hc_mix_bf16_streams_match_float64(rows: int, d: int, signs: str) -> None:
    """bf16 streams meet fn as bf16 parts on tensor cores: the logits must keep an fp32 dot's
    accuracy, within a bound that fn rounded to a single bf16 part would break."""
    hc = 4
    x = _rand(rows, hc, d, seed=30 + rows, dtype=torch.bfloat16) * 2
    fn = _rand((2 + hc) * hc, hc * d, seed=31) * 0.1
    if signs == "one-signed":
        # Positive streams and weights 1.5 * 2**-10 above a bf16 value: the weights' low bits
        # all push one way, so a dot of fn rounded to bf16 errs by about 2**-9.4 of the
        # magnitude, whereas random signs would let its errors cancel under the bound.
        x = x.abs()
        fn = fn.abs().to(torch.bfloat16).float() * (1 + 3 * 2.0**-11)
    got = mhc.hc_mix(x.to(DEVICE), fn.to(DEVICE), 1e-6).cpu()
    assert got.dtype == torch.float32 and got.shape == (rows, fn.shape[0])
    exact, magnitude, one_part = _hc_mix_float64(x, fn, 1e-6)
    bound = _hc_mix_bound(hc * d, magnitude)
    err = (got.double() - exact).abs()
    assert (err <= bound).all(), f"worst error {(err / magnitude).max():.3g} of the magnitude"
    if signs == "one-signed":  # the bound tells the parts from a single bf16 part
        assert ((one_part - exact).abs() > bound).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_hc_mix_row_does_not_depend_on_the_batch(dtype: torch.dtype) -> None:
    """A row's logits are the same bits alone, in a smaller batch and in a batch of 64 (the
    engine's outputs must not depend on what else is batched): the tiles and splits are fixed.

    Off the GPU the interpreter's dots are numpy's matmul, whose CPU kernels round a row
    differently by its place in a block of rows, so there each row keeps its place in its
    program's tile; on the GPU rows are also moved to other places."""
    hc, d = 4, 300
    x = _rand(64, hc, d, seed=32, dtype=dtype).to(DEVICE)
    fn = (_rand((2 + hc) * hc, hc * d, seed=33) * 0.1).to(DEVICE)
    batch = mhc.hc_mix(x, fn, 1e-6)
    assert torch.equal(mhc.hc_mix(x[:1], fn, 1e-6), batch[:1])
    assert torch.equal(mhc.hc_mix(x[:17], fn, 1e-6), batch[:17])
    if DEVICE == "cuda":
        for row in (17, 63):
            assert torch.equal(mhc.hc_mix(x[row : row + 1], fn, 1e-6)[0], batch[row]), row
        assert torch.equal(mhc.hc_mix(x[40:57], fn, 1e-6), batch[40:57])


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
