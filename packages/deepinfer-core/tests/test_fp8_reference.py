"""The reference's activation quantiser (``backends.fp8_ref``) against float64 on every device
it runs on: the scales are the correctly rounded fp32 quotients amax / 448 (on a GPU too, where
dividing by a Python scalar would go through its reciprocal), so the kernels' IEEE scales and
the reference's agree bit for bit and a test that checks one against the other is exact."""

from __future__ import annotations

import pytest
import torch

from deepinfer.backends.fp8_ref import E4M3_MAX, quantize_act_fp8

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
def test_scales_are_the_correctly_rounded_quotient(device: str) -> None:
    g = torch.Generator().manual_seed(0)
    # many magnitudes, so some quotients lie near an fp32 rounding boundary
    x = torch.randn(512, 1024, generator=g) * torch.logspace(-8, 8, 1024)
    x[0, :128] = 0.0
    q, s = quantize_act_fp8(x.to(device))
    amax = x.double().view(512, 8, 128).abs().amax(-1)
    # float64 quotient rounded once to fp32: correctly rounded (53 >= 2 * 24 + 2 bits)
    want = torch.where(amax > 0, amax / E4M3_MAX, 1.0).float()
    assert torch.equal(s.cpu(), want)
    codes = (x.view(512, 8, 128) / want[..., None]).to(torch.float8_e4m3fn).view(512, 1024)
    assert torch.equal(q.cpu().view(torch.uint8), codes.view(torch.uint8))
