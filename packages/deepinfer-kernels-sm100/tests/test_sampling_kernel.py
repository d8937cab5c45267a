"""The fused counter-RNG kernel against the reference's tensor-op hashes, bit for bit."""

from __future__ import annotations

import pytest
import torch

from deepinfer.sampling import rng
from deepinfer_kernels_sm100.sampling import sampling_uniform

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("stream", [rng.STREAM_SAMPLE, rng.STREAM_ACCEPT])
@pytest.mark.parametrize("width", [1, 1000, 4099])
def test_uniforms_equal_the_reference_bits(stream: int, width: int) -> None:
    g = torch.Generator().manual_seed(width)
    # Seeds over the whole 63-bit range and positions past 2**32 (both are folded to 32 bits).
    seeds = torch.cat([torch.randint(0, 2**62, (6,), generator=g), torch.tensor([0, 2**63 - 1])])
    positions = torch.cat(
        [torch.randint(0, 10**9, (6,), generator=g), torch.tensor([0, 2**40 + 7])]
    )
    want = rng.sampling_uniform(seeds, positions, width, stream)
    got = sampling_uniform(seeds.to(DEVICE), positions.to(DEVICE), width, stream).cpu()
    assert got.dtype == torch.float32 and got.shape == (8, width)
    assert torch.equal(got, want)
    assert bool(((got > 0) & (got < 1)).all())


def test_no_rows() -> None:
    empty = torch.empty(0, dtype=torch.int64, device=DEVICE)
    assert sampling_uniform(empty, empty, 16).shape == (0, 16)
