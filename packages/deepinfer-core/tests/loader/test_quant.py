"""FP8 block / FP4 e2m1 dequantisation against independent float64 decoders (see conftest)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from deepinfer.models.errors import QuantFormatError
from deepinfer.models.quant import (
    E2M1_VALUES,
    decode_ue8m0,
    dequant_fp4_e2m1,
    dequant_fp8_block,
    quant_fp4_e2m1,
    quant_fp8_block,
    unpack_fp4_codes,
)

HAS_E8M0 = hasattr(torch, "float8_e8m0fnu")
HAS_FP4X2 = hasattr(torch, "float4_e2m1fn_x2")


def test_e4m3_definition_matches_torch(ref) -> None:
    """The test-side bit decoder agrees with torch.float8_e4m3fn on all 256 codes."""
    codes = torch.arange(256, dtype=torch.uint8)
    mine = ref.e4m3_to_f64(codes.numpy())
    torch_f64 = codes.view(torch.float8_e4m3fn).to(torch.float64).numpy()
    np.testing.assert_array_equal(mine, torch_f64)  # NaNs compare equal here
    assert np.nanmax(mine) == 448.0
    assert mine[1] == 2.0**-9  # smallest subnormal


def test_ue8m0_decode_all_bytes(ref) -> None:
    codes = torch.arange(256, dtype=torch.uint8)
    expected = ref.ue8m0_to_f64(codes.numpy())
    got = decode_ue8m0(codes, torch.float64).numpy()
    np.testing.assert_array_equal(got, expected)
    assert got[127] == 1.0 and got[0] == 2.0**-127 and np.isnan(got[255])
    if HAS_E8M0:
        as_e8m0 = codes.view(torch.float8_e8m0fnu)
        np.testing.assert_array_equal(decode_ue8m0(as_e8m0, torch.float64).numpy(), expected)
        # torch's own numeric conversion of e8m0 agrees wherever it is defined
        np.testing.assert_array_equal(as_e8m0[:255].to(torch.float64).numpy(), expected[:255])


def test_e2m1_table_matches_published(ref) -> None:
    np.testing.assert_array_equal(E2M1_VALUES.numpy(), ref.e2m1_table)
    assert np.signbit(E2M1_VALUES.numpy()[8])  # code 8 is -0


FP8_CASES = [
    ((256, 384), (128, 128)),
    ((300, 200), (128, 128)),  # partial last blocks in both dimensions
    ((1, 5), (128, 128)),
    ((96, 160), (32, 32)),  # V4.1
    ((70, 33), (32, 32)),
    ((8, 96), (1, 32)),  # per-row groups of 32 (Engram tables)
]


@pytest.mark.parametrize(("shape", "block"), FP8_CASES)
@pytest.mark.parametrize("scale_fmt", ["ue8m0", "fp32", "e8m0_dtype"])
def test_fp8_block_round_trip(ref, shape, block, scale_fmt: str) -> None:
    if scale_fmt == "e8m0_dtype" and not HAS_E8M0:
        pytest.skip("torch has no float8_e8m0fnu")
    gen = torch.Generator().manual_seed(hash((shape, block)) & 0xFFFF)
    w = torch.randn(shape, generator=gen, dtype=torch.float64) * 3
    # rows with very different magnitudes so blocks get different scales
    w *= torch.logspace(-6, 4, shape[0], base=2, dtype=torch.float64)[:, None]
    fmt = "fp32" if scale_fmt == "fp32" else "ue8m0"
    q, scale = quant_fp8_block(w, block, fmt, as_e8m0_dtype=scale_fmt == "e8m0_dtype")
    assert q.dtype == torch.float8_e4m3fn and q.shape == w.shape
    expected_scale_dtype = {
        "ue8m0": torch.uint8,
        "fp32": torch.float32,
        "e8m0_dtype": getattr(torch, "float8_e8m0fnu", None),
    }[scale_fmt]
    assert scale.dtype == expected_scale_dtype
    reference = ref.fp8_block(q, scale, block)

    got64 = dequant_fp8_block(q, scale, block, out_dtype=torch.float64).numpy()
    np.testing.assert_array_equal(got64, reference)
    got32 = dequant_fp8_block(q, scale, block).numpy().astype(np.float64)
    if fmt == "ue8m0":  # e4m3 x power of two is exact in fp32
        np.testing.assert_array_equal(got32, reference)
    else:  # one fp32 rounding of the product
        np.testing.assert_allclose(got32, reference, rtol=2.0**-24, atol=0)
    got_bf16 = dequant_fp8_block(q, scale, block, out_dtype=torch.bfloat16)
    assert got_bf16.dtype == torch.bfloat16
    np.testing.assert_allclose(got_bf16.to(torch.float64).numpy(), reference, rtol=2.0**-8)

    # The quantiser itself: e4m3 keeps 3 mantissa bits, so the error is at most half a step of
    # the value's binade (2**-4 relative) or half the subnormal step (2**-10 of the scale).
    s = ref.fp8_block(torch.ones(shape).to(torch.float8_e4m3fn), scale, block)
    bound = np.maximum(np.abs(w.numpy()) * 2.0**-4, s * 2.0**-10) * (1 + 1e-6)
    assert np.all(np.abs(reference - w.numpy()) <= bound)


def test_fp8_accepts_byte_view_and_large_chunked_weight(ref) -> None:
    """The row-chunked bf16 path (weights above the chunk size) equals the one-shot result."""
    w = torch.randn(4352, 1100)
    q, scale = quant_fp8_block(w, (128, 128))
    reference = ref.fp8_block(q, scale, (128, 128))
    got = dequant_fp8_block(q.view(torch.uint8), scale, out_dtype=torch.bfloat16)
    expected = torch.from_numpy(reference).to(torch.float32).to(torch.bfloat16)
    assert torch.equal(got, expected)


def test_fp8_scale_shape_mismatch() -> None:
    q, scale = quant_fp8_block(torch.randn(256, 256), (128, 128))
    with pytest.raises(QuantFormatError, match=r"expected \(2, 2\)"):
        dequant_fp8_block(q, scale[:, :1], (128, 128))


def _random_packed(rows: int, n: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    packed = torch.randint(0, 256, (rows, n), generator=gen, dtype=torch.int32).to(torch.uint8)
    packed[0, : min(n, 256)] = torch.arange(min(n, 256), dtype=torch.uint8)  # every byte value
    return packed


@pytest.mark.parametrize("packed_dtype", ["uint8", "int8", "fp4x2"])
@pytest.mark.parametrize("shape", [(4, 256), (33, 48), (2, 20)])  # (2, 20): ragged last group
def test_fp4_decoding_matches_table(ref, packed_dtype: str, shape: tuple[int, int]) -> None:
    if packed_dtype == "fp4x2" and not HAS_FP4X2:
        pytest.skip("torch has no float4_e2m1fn_x2")
    rows, n = shape
    packed = _random_packed(rows, n, seed=rows * n)
    gen = torch.Generator().manual_seed(7)
    scale = torch.randint(120, 135, (rows, -(-2 * n // 32)), generator=gen).to(torch.uint8)
    reference = ref.fp4(packed, scale)
    arg = {
        "uint8": packed,
        "int8": packed.view(torch.int8),
        "fp4x2": packed.view(getattr(torch, "float4_e2m1fn_x2", torch.uint8)),
    }[packed_dtype]
    got = dequant_fp4_e2m1(arg, scale, 32, out_dtype=torch.float64).numpy()
    np.testing.assert_array_equal(got, reference)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(reference))  # -0 stays -0
    got32 = dequant_fp4_e2m1(arg, scale).numpy().astype(np.float64)
    np.testing.assert_array_equal(got32, reference)


def test_fp4_low_nibble_first_by_hand() -> None:
    packed = torch.tensor([[0x71, 0xF8, 0x2A, 0x00] * 4], dtype=torch.uint8)  # 32 values
    assert unpack_fp4_codes(packed)[0, :6].tolist() == [1, 7, 8, 15, 10, 2]
    scale = torch.tensor([[128]], dtype=torch.uint8)  # x2
    got = dequant_fp4_e2m1(packed, scale).tolist()[0]
    assert got[:8] == [1.0, 12.0, -0.0, -12.0, -2.0, 2.0, 0.0, 0.0]


def test_fp4_quantiser_picks_nearest(ref) -> None:
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(16, 128, generator=gen, dtype=torch.float64)
    w[3] *= 1e-3
    w[5, :32] = 0.0
    packed, scale = quant_fp4_e2m1(w)
    assert packed.shape == (16, 64) and scale.shape == (16, 4) and scale.dtype == torch.uint8
    got = ref.fp4(packed, scale)
    s = ref.ue8m0_to_f64(ref.raw_bytes(scale))[:, np.arange(128) // 32]
    # every value is the nearest representable one for its group scale ...
    candidates = ref.e2m1_table[None, None, :] * s[:, :, None]
    best = np.min(np.abs(candidates - w.numpy()[:, :, None]), axis=-1)
    np.testing.assert_allclose(np.abs(got - w.numpy()), best, rtol=0, atol=1e-12)
    # ... and the group's largest magnitude fits without clipping
    amax = np.abs(w.numpy()).reshape(16, 4, 32).max(-1)
    assert np.all(amax <= 6 * s[:, ::32] * (1 + 1e-12))
    assert np.all(got[5, :32] == 0)


def test_fp4_scale_shape_mismatch() -> None:
    packed, scale = quant_fp4_e2m1(torch.randn(4, 64))
    with pytest.raises(QuantFormatError, match=r"expected \(4, 2\)"):
        dequant_fp4_e2m1(packed, scale[:, :1])
