"""RMSNorm and SwiGLU that also quantise their output for the FP8 projection reading it.

Each kernel's output is checked against the torch reference, and its e4m3 codes and scales
against an independent quantisation of that same output (scales amax / 448 computed in float64,
codes by torch's own e4m3 cast): the fused kernels must hand the projection exactly what a
separate quantisation pass would, and the projection fed them must give what it gives when it
quantises its input itself.
Runs through Triton's interpreter off the GPU.
"""

from __future__ import annotations

import pytest
import torch

from deepinfer.backends.torch_ref import TorchBackend
from deepinfer_kernels_sm100 import elementwise
from deepinfer_kernels_sm100.fp8_linear import fp8_block_linear

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ref = TorchBackend("cpu")


def _rand(*shape: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _check_codes(values: torch.Tensor, q: torch.Tensor, s: torch.Tensor) -> None:
    """``q``/``s`` are ``values`` [..., K] quantised per 128 columns: scale the group's amax
    / 448 rounded to fp32 (1 for a zero group), codes ``values / scale`` cast by torch."""
    k = values.shape[-1]
    groups = values.double().reshape(-1, k // 128, 128)
    amax = groups.abs().amax(-1)
    want_s = torch.where(amax > 0, amax / 448, 1.0).float()
    assert s.dtype == torch.float32 and torch.equal(s.reshape(want_s.shape), want_s)
    want_q = (values.float().reshape(-1, k // 128, 128) / want_s[..., None]).to(torch.float8_e4m3fn)
    assert q.dtype == torch.float8_e4m3fn and q.shape == values.shape
    # values, not bytes: a zero's sign (a negative norm weight times 0) may differ
    assert torch.equal(q.reshape(want_q.shape).float(), want_q.float())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(("rows", "dim"), [(1, 256), (5, 384), (70, 128)])
def test_rms_norm_fp8(rows: int, dim: int, dtype: torch.dtype) -> None:
    """384: not a power of two (the row's block has masked groups past it)."""
    x = _rand(rows, dim, seed=rows + dim, dtype=dtype) * 3
    x[0, :128] = 0  # a zero group (scale 1)
    w = _rand(dim, seed=dim)
    y, q, s = (t.cpu() for t in elementwise.rms_norm_fp8(x.to(DEVICE), w.to(DEVICE), 1e-6))
    assert y.dtype == dtype and y.shape == x.shape and s.shape == (rows, dim // 128)
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(y.float(), ref.rms_norm(x, w, 1e-6).float(), atol=tol, rtol=tol)
    _check_codes(y, q, s)
    plain = elementwise.rms_norm(x.to(DEVICE), w.to(DEVICE), 1e-6).cpu()
    assert torch.equal(plain, y)  # the same values whether or not it quantises


def test_rms_norm_fp8_of_row_slices_keeps_leading_dims() -> None:
    wide = _rand(2, 3, 384, seed=3, dtype=torch.bfloat16)
    w = _rand(256, seed=4)
    y, q, s = elementwise.rms_norm_fp8(wide.to(DEVICE)[..., :256], w.to(DEVICE), 1e-6)
    assert y.shape == q.shape == (2, 3, 256) and s.shape == (2, 3, 2)
    want = ref.rms_norm(wide[..., :256].contiguous(), w, 1e-6)
    torch.testing.assert_close(y.cpu().float(), want.float(), atol=1e-2, rtol=1e-2)
    _check_codes(y.cpu(), q.cpu(), s.cpu())


@pytest.mark.parametrize("limit", [0.0, 1.5])
@pytest.mark.parametrize(("rows", "width"), [(1, 256), (4, 1152)])
def test_swiglu_fp8_of_a_fused_projections_halves(rows: int, width: int, limit: float) -> None:
    """Gate and up as the two halves of one [rows, 2 * width] output, read in place; 1152:
    two column programs, the second with groups past the width."""
    both = _rand(rows, 2 * width, seed=width, dtype=torch.bfloat16) * 2
    gate, up = both[:, :width], both[:, width:]
    h, q, s = (t.cpu() for t in elementwise.swiglu_fp8(*(t.to(DEVICE) for t in (gate, up)),
                                                       limit, torch.bfloat16))  # fmt: skip
    want = ref.swiglu(gate.contiguous(), up.contiguous(), limit)
    assert h.dtype == torch.bfloat16 and h.shape == (rows, width)
    torch.testing.assert_close(h.float(), want.float(), atol=1e-2, rtol=1e-2)
    _check_codes(h, q, s)
    plain = elementwise.swiglu(gate.to(DEVICE), up.to(DEVICE), limit, torch.bfloat16).cpu()
    assert torch.equal(plain, h)


@pytest.mark.parametrize("m", [3, 300])
def test_projection_fed_the_norms_codes_equals_quantising_itself(m: int) -> None:
    """m = 3 takes decode tiles, 300 prefill tiles. The codes are checked independently above;
    fed them, the projection gives the bits it gives quantising its input itself (which its own
    tests check against float64)."""
    x = _rand(m, 256, seed=m, dtype=torch.bfloat16).to(DEVICE)
    w = _rand(256, seed=7).to(DEVICE)
    weight = (_rand(256, 256, seed=8) * 0.5).to(torch.float8_e4m3fn).to(DEVICE)
    scale = (_rand(2, 2, seed=9).abs() + 0.5).to(DEVICE)
    y, q, s = elementwise.rms_norm_fp8(x, w, 1e-6)
    _check_codes(y.cpu(), q.cpu(), s.cpu())
    fed = fp8_block_linear(y, weight, scale, out_dtype=torch.float32, quantized=(q, s))
    assert torch.equal(fed, fp8_block_linear(y, weight, scale, out_dtype=torch.float32))


def test_widths_off_the_group_raise() -> None:
    x = torch.zeros(2, 200, dtype=torch.bfloat16, device=DEVICE)
    with pytest.raises(ValueError, match="multiple of 128"):
        elementwise.rms_norm_fp8(x, torch.ones(200, device=DEVICE), 1e-6)
    with pytest.raises(ValueError, match="multiple of 128"):
        elementwise.swiglu_fp8(x, x, 0.0, torch.bfloat16)
    with pytest.raises(ValueError, match="e4m3 codes"):
        q = torch.zeros(3, 256, dtype=torch.float8_e4m3fn, device=DEVICE)  # 3 rows, x has 2
        fp8_block_linear(
            torch.zeros(2, 256, device=DEVICE),
            torch.zeros(128, 256, dtype=torch.float8_e4m3fn, device=DEVICE),
            torch.ones(1, 2, device=DEVICE),
            quantized=(q, torch.ones(3, 2, device=DEVICE)),
        )
