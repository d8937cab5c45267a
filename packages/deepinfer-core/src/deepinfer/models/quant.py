"""FP8 block and FP4 (e2m1) dequantisation for DeepSeek-V4-family checkpoints, and test quantisers.

Formats (model reference §6.3):

* FP8 e4m3 weights with one scale per block of `block = (rows, cols)` elements: 128 x 128 for V4,
  32 x 32 for V4.1. Partial last blocks are allowed; the scale grid is ceil-sized.
* Scales are either floating point (fp32 in V4-Flash-Base) or ue8m0: a bare biased exponent byte
  b meaning 2**(b - 127), b = 255 being NaN. A ue8m0 scale may arrive as uint8 bytes (older torch,
  or a checkpoint that stores U8) or as `torch.float8_e8m0fnu` (newer torch only); both are
  bit-viewed, never converted numerically, since `.to(torch.uint8)` would turn 2**-3 into 0.
* FP4 e2m1 experts: two 4-bit codes per byte, the low nibble holding the even (first) element,
  with one ue8m0 scale per 32 consecutive elements of a row.

The quantisers exist so tests can write small quantised checkpoints; they are not meant to
reproduce DeepSeek's own conversion bit-for-bit (the rounding of FP4 ties is our choice, see
`quant_fp4_e2m1`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import torch

from deepinfer.models.errors import QuantFormatError

FP8_E4M3_MAX = 448.0
FP4_E2M1_MAX = 6.0
UE8M0_BIAS = 127

ScaleFormat = Literal["ue8m0", "fp32"]

_E8M0_DTYPE: torch.dtype | None = getattr(torch, "float8_e8m0fnu", None)
_FP4_X2_DTYPE: torch.dtype | None = getattr(torch, "float4_e2m1fn_x2", None)
# fp32 elements per dequantisation chunk when the output is narrower than fp32 (16 MiB).
_CHUNK_ELEMENTS = 1 << 22
_FLOAT_SCALE_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def _e2m1_table() -> torch.Tensor:
    """Values of the 16 e2m1 codes, derived from the bit layout rather than typed in.

    Layout: sign bit 3, two exponent bits (bias 1), one mantissa bit; exponent 0 is subnormal
    (0.m * 2**0). Deriving it keeps the test-side literal table an independent check.
    """
    values = []
    for code in range(16):
        sign = -1.0 if code & 0b1000 else 1.0
        exponent = (code >> 1) & 0b11
        mantissa = code & 0b1
        if exponent == 0:
            magnitude = mantissa * 0.5
        else:
            magnitude = (1.0 + mantissa * 0.5) * 2.0 ** (exponent - 1)
        values.append(sign * magnitude)
    return torch.tensor(values, dtype=torch.float64)


E2M1_VALUES = _e2m1_table()
_E4M3_VALUES = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn)
_E4M3_VALUES = _E4M3_VALUES.to(torch.float64)
_ALL_BYTES = torch.arange(256)
_E2M1_PAIRS = torch.stack((E2M1_VALUES[_ALL_BYTES & 0x0F], E2M1_VALUES[_ALL_BYTES >> 4]), dim=-1)
# Midpoints between consecutive non-negative e2m1 magnitudes, used for nearest rounding.
_E2M1_MAGNITUDES = E2M1_VALUES[:8]
_E2M1_MIDPOINTS = (_E2M1_MAGNITUDES[1:] + _E2M1_MAGNITUDES[:-1]) / 2


def _compute_dtype(out_dtype: torch.dtype) -> torch.dtype:
    """fp32 is exact for fp8 x power-of-two; fp64 only when the caller asks for fp64 output."""
    return torch.float64 if out_dtype == torch.float64 else torch.float32


def is_ue8m0_dtype(dtype: torch.dtype) -> bool:
    """True for the dtypes that carry ue8m0 exponent bytes (uint8, int8 bit pattern, e8m0fnu)."""
    return dtype in (torch.uint8, torch.int8) or (_E8M0_DTYPE is not None and dtype == _E8M0_DTYPE)


def is_scale_dtype(dtype: torch.dtype) -> bool:
    return is_ue8m0_dtype(dtype) or dtype in _FLOAT_SCALE_DTYPES


def _ue8m0_table() -> torch.Tensor:
    """2**(b - 127) for every byte b, built from fp32 bit patterns.

    Bit construction avoids relying on `exp2` being exact in vectorised math libraries. b = 0 is
    the fp32 subnormal 2**-127, b = 255 is NaN as in the OCP MX specification.
    """
    b = torch.arange(256, dtype=torch.int32)
    bits = torch.where(b == 0, torch.full_like(b, 0x00400000), b << 23)
    bits = torch.where(b == 255, torch.full_like(b, 0x7FC00000), bits)
    return bits.view(torch.float32).to(torch.float64)


_UE8M0_VALUES = _ue8m0_table()


def decode_ue8m0(scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Exact 2**(b - 127) from exponent bytes, by table lookup (bit-viewed, never cast)."""
    if not is_ue8m0_dtype(scale.dtype):
        raise QuantFormatError(
            f"ue8m0 scale must be uint8, int8 or float8_e8m0fnu, got {scale.dtype}"
        )
    raw = scale.contiguous().view(torch.uint8)
    table = _UE8M0_VALUES.to(device=raw.device, dtype=dtype)
    return torch.index_select(table, 0, raw.reshape(-1).to(torch.int32)).view(raw.shape)


def decode_scale(scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Scale tensor of either format as floats: ue8m0 is bit-decoded, floats are cast."""
    if is_ue8m0_dtype(scale.dtype):
        return decode_ue8m0(scale, dtype)
    if scale.dtype in _FLOAT_SCALE_DTYPES:
        return scale.to(dtype)
    raise QuantFormatError(
        f"scale dtype {scale.dtype} is neither ue8m0 (uint8/float8_e8m0fnu) nor floating point"
    )


def fp8_scale_shape(weight_shape: tuple[int, ...], block: tuple[int, int]) -> tuple[int, int]:
    """Ceil-sized scale grid: a dimension not a multiple of the block gets a partial block."""
    rows, cols = weight_shape
    return (math.ceil(rows / block[0]), math.ceil(cols / block[1]))


def fp4_scale_shape(packed_shape: tuple[int, ...], group: int = 32) -> tuple[int, int]:
    rows, packed_cols = packed_shape
    return (rows, math.ceil(2 * packed_cols / group))


def _blockwise_mul(
    values: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]
) -> torch.Tensor:
    """values[r, c] *= scale[r // bn, c // bk] without materialising a full-size scale matrix.

    Full blocks go through a 4-D view and an in-place broadcast multiply; only when a dimension
    is ragged is the tensor zero-padded to whole blocks and the result copied back out.
    """
    rows, cols = values.shape
    bn, bk = block
    sr, sc = scale.shape
    if rows == sr * bn and cols == sc * bk:
        values.view(sr, bn, sc, bk).mul_(scale[:, None, :, None])
        return values
    padded = values.new_zeros(sr * bn, sc * bk)
    padded[:rows, :cols] = values
    padded.view(sr, bn, sc, bk).mul_(scale[:, None, :, None])
    return padded[:rows, :cols].contiguous()


def _by_row_chunks(
    fill: Callable[[int, int, torch.Tensor], torch.Tensor],
    shape: tuple[int, int],
    row_unit: int,
    *,
    compute: torch.dtype,
    out_dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    """Dequantise row ranges through one reused compute-dtype buffer into the output.

    `fill(r0, r1, buf)` writes rows r0:r1 into `buf` and returns the finished rows. When the
    output is narrower than the compute dtype (bf16 from fp32), the fp32 intermediate is bounded
    by `_CHUNK_ELEMENTS` instead of being one fp32 copy of the whole weight; reusing a single
    buffer also keeps the allocator from accumulating one freed temporary per chunk. Chunks are
    whole multiples of the scale block's rows so each piece sees complete blocks.
    """
    rows, cols = shape
    if out_dtype == compute or rows * cols <= _CHUNK_ELEMENTS:
        result = fill(0, rows, torch.empty(rows, cols, dtype=compute, device=device))
        return result if result.dtype == out_dtype else result.to(out_dtype)
    step = max(row_unit, (_CHUNK_ELEMENTS // max(cols, 1)) // row_unit * row_unit)
    out = torch.empty(rows, cols, dtype=out_dtype, device=device)
    buf = torch.empty(min(step, rows), cols, dtype=compute, device=device)
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        out[r0:r1] = fill(r0, r1, buf[: r1 - r0])
    return out


def dequant_fp8_block(
    weight_fp8: torch.Tensor,
    scale: torch.Tensor,
    block: tuple[int, int] = (128, 128),
    *,
    out_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """W[r, c] = e4m3(Wq[r, c]) * S[r // bn, c // bk] for a 2-D block-quantised weight.

    `weight_fp8` may be `torch.float8_e4m3fn` or its uint8/int8 bit pattern. The product is formed
    in fp32 (fp64 when `out_dtype` is fp64) and cast once at the end, so with ue8m0 scales the
    result is exact in any dtype wide enough to hold it.
    """
    if weight_fp8.dim() != 2:
        raise QuantFormatError(f"FP8 block weight must be 2-D, got shape {tuple(weight_fp8.shape)}")
    if weight_fp8.dtype in (torch.uint8, torch.int8):
        weight_fp8 = weight_fp8.view(torch.float8_e4m3fn)
    if weight_fp8.dtype != torch.float8_e4m3fn:
        raise QuantFormatError(f"FP8 block weight must be float8_e4m3fn, got {weight_fp8.dtype}")
    expected = fp8_scale_shape(tuple(weight_fp8.shape), block)
    if tuple(scale.shape) != expected:
        raise QuantFormatError(
            f"scale shape {tuple(scale.shape)} does not match weight {tuple(weight_fp8.shape)} "
            f"with block {block}: expected {expected}"
        )
    compute = _compute_dtype(out_dtype)
    scale_f = decode_scale(scale, compute).to(weight_fp8.device)

    on_cpu = weight_fp8.device.type == "cpu"
    if on_cpu:
        # torch's elementwise e4m3 -> fp32 cast runs at well under 100 M values/s on CPU; a
        # 256-entry table built from that same cast gives identical values several times faster.
        fp8_table = _E4M3_VALUES.to(compute)
        raw_bytes = weight_fp8.view(torch.uint8)
        index_buf: list[torch.Tensor] = []

    def fill(r0: int, r1: int, buf: torch.Tensor) -> torch.Tensor:
        if on_cpu:
            part = raw_bytes[r0:r1].reshape(-1)
            if not index_buf:
                index_buf.append(torch.empty(part.numel(), dtype=torch.int32))
            index = index_buf[0][: part.numel()]
            index.copy_(part)
            torch.index_select(fp8_table, 0, index, out=buf.view(-1))
        else:
            buf.copy_(weight_fp8[r0:r1])
        return _blockwise_mul(buf, scale_f[r0 // block[0] : -(-r1 // block[0])], block)

    return _by_row_chunks(
        fill,
        tuple(weight_fp8.shape),
        block[0],
        compute=compute,
        out_dtype=out_dtype,
        device=weight_fp8.device,
    )


def _packed_bytes(packed: torch.Tensor) -> torch.Tensor:
    if packed.dtype in (torch.uint8, torch.int8):
        return packed.view(torch.uint8)
    if _FP4_X2_DTYPE is not None and packed.dtype == _FP4_X2_DTYPE:
        return packed.view(torch.uint8)
    raise QuantFormatError(
        f"packed FP4 weight must be uint8, int8 or float4_e2m1fn_x2, got {packed.dtype}"
    )


def unpack_fp4_codes(packed: torch.Tensor) -> torch.Tensor:
    """[rows, n] bytes -> [rows, 2n] codes 0..15, low nibble first (element 2j is byte j & 0xF)."""
    raw = _packed_bytes(packed)
    low = raw & 0x0F
    high = raw >> 4
    return torch.stack((low, high), dim=-1).reshape(*raw.shape[:-1], raw.shape[-1] * 2)


def dequant_fp4_e2m1(
    packed_uint8_or_int8: torch.Tensor,
    scale_ue8m0: torch.Tensor,
    group: int = 32,
    *,
    out_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """W[r, c] = e2m1(code[r, c]) * S[r, c // group] for a packed [rows, cols / 2] expert weight.

    The scale is normally ue8m0 but a floating-point scale is accepted too. A ragged last group
    (cols not a multiple of `group`) is handled, though real checkpoints never have one.
    """
    if packed_uint8_or_int8.dim() != 2:
        raise QuantFormatError(
            f"packed FP4 weight must be 2-D, got shape {tuple(packed_uint8_or_int8.shape)}"
        )
    expected = fp4_scale_shape(tuple(packed_uint8_or_int8.shape), group)
    if tuple(scale_ue8m0.shape) != expected:
        raise QuantFormatError(
            f"scale shape {tuple(scale_ue8m0.shape)} does not match packed FP4 weight "
            f"{tuple(packed_uint8_or_int8.shape)} with group {group}: expected {expected}"
        )
    compute = _compute_dtype(out_dtype)
    scale_f = decode_scale(scale_ue8m0, compute).to(packed_uint8_or_int8.device)
    # Decode whole bytes through a 256 x 2 table (low nibble first): one int32 gather per byte
    # keeps the transient index at 2 bytes per value instead of 8 for a per-nibble int64 lookup.
    pair_table = _E2M1_PAIRS.to(device=packed_uint8_or_int8.device, dtype=compute)
    packed_bytes = _packed_bytes(packed_uint8_or_int8)

    index_buf: list[torch.Tensor] = []  # int32 gather index, reused across chunks

    def fill(r0: int, r1: int, buf: torch.Tensor) -> torch.Tensor:
        part = packed_bytes[r0:r1].reshape(-1)
        if not index_buf:
            index_buf.append(torch.empty(part.numel(), dtype=torch.int32, device=part.device))
        index = index_buf[0][: part.numel()]
        index.copy_(part)
        torch.index_select(pair_table, 0, index, out=buf.view(-1, 2))
        return _blockwise_mul(buf, scale_f[r0:r1], (1, group))

    rows, packed_cols = packed_uint8_or_int8.shape
    return _by_row_chunks(
        fill,
        (rows, 2 * packed_cols),
        1,
        compute=compute,
        out_dtype=out_dtype,
        device=packed_uint8_or_int8.device,
    )


# ----------------------------------------------------------------------------------------------
# Quantisers (test checkpoints only)


def _ue8m0_exponent(amax: torch.Tensor, qmax: float) -> torch.Tensor:
    """Smallest power-of-two exponent e with amax / 2**e <= qmax; all-zero blocks get e = 0."""
    ratio = (amax.to(torch.float64) / qmax).clamp_min(2.0**-127)
    exponent = torch.ceil(torch.log2(ratio))
    exponent = torch.where(amax > 0, exponent, torch.zeros_like(exponent))
    return exponent.clamp(-UE8M0_BIAS, UE8M0_BIAS).to(torch.int32)


def _encode_ue8m0(exponent: torch.Tensor, as_e8m0_dtype: bool) -> torch.Tensor:
    raw = (exponent + UE8M0_BIAS).to(torch.uint8)
    if as_e8m0_dtype:
        if _E8M0_DTYPE is None:
            raise QuantFormatError("this torch build has no float8_e8m0fnu dtype")
        return raw.view(_E8M0_DTYPE)
    return raw


def _pad_to_blocks(weight: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    rows, cols = weight.shape
    sr, sc = fp8_scale_shape((rows, cols), block)
    if (sr * block[0], sc * block[1]) == (rows, cols):
        return weight
    padded = weight.new_zeros(sr * block[0], sc * block[1])
    padded[:rows, :cols] = weight
    return padded


def quant_fp8_block(
    weight: torch.Tensor,
    block: tuple[int, int] = (128, 128),
    scale_fmt: ScaleFormat = "ue8m0",
    *,
    as_e8m0_dtype: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (float8_e4m3fn weight, scale) with one scale per block.

    ue8m0 scales are returned as uint8 exponent bytes, or as `float8_e8m0fnu` when
    `as_e8m0_dtype` is set (and torch has it); fp32 scales are amax / 448 per block.
    """
    if weight.dim() != 2:
        raise QuantFormatError(f"weight must be 2-D, got shape {tuple(weight.shape)}")
    rows, cols = weight.shape
    w = _pad_to_blocks(weight.to(torch.float32), block)
    sr, sc = fp8_scale_shape((rows, cols), block)
    blocks = w.view(sr, block[0], sc, block[1])
    amax = blocks.abs().amax(dim=(1, 3))
    if scale_fmt == "ue8m0":
        exponent = _ue8m0_exponent(amax, FP8_E4M3_MAX)
        scale_f = torch.pow(2.0, exponent.to(torch.float64)).to(torch.float32)
        scale_out = _encode_ue8m0(exponent, as_e8m0_dtype)
    elif scale_fmt == "fp32":
        scale_f = torch.where(amax > 0, amax / FP8_E4M3_MAX, torch.ones_like(amax))
        scale_out = scale_f.clone()
    else:
        raise QuantFormatError(f"unknown scale format {scale_fmt!r}")
    q = (blocks / scale_f[:, None, :, None]).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX)
    q = q.reshape(w.shape)[:rows, :cols].contiguous().to(torch.float8_e4m3fn)
    return q, scale_out


def quant_fp4_e2m1(
    weight: torch.Tensor, group: int = 32, *, as_e8m0_dtype: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (packed uint8 [rows, cols / 2], ue8m0 scale [rows, ceil(cols / group)]).

    Rounds to the nearest e2m1 value; exact ties go to the smaller magnitude (not round-to-even),
    which is fine for test checkpoints because the dequantiser only ever sees the stored codes.
    """
    if weight.dim() != 2:
        raise QuantFormatError(f"weight must be 2-D, got shape {tuple(weight.shape)}")
    rows, cols = weight.shape
    if cols % 2:
        raise QuantFormatError(f"FP4 packing needs an even number of columns, got {cols}")
    w = _pad_to_blocks(weight.to(torch.float32), (1, group))
    groups = w.view(rows, -1, group)
    exponent = _ue8m0_exponent(groups.abs().amax(dim=-1), FP4_E2M1_MAX)
    scale_f = torch.pow(2.0, exponent.to(torch.float64)).to(torch.float32)
    scaled = (groups / scale_f[:, :, None]).reshape(rows, -1)[:, :cols]
    magnitude_code = torch.bucketize(scaled.abs(), _E2M1_MIDPOINTS.to(torch.float32))
    codes = (magnitude_code | torch.where(scaled < 0, 8, 0)).to(torch.uint8)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return packed.contiguous(), _encode_ue8m0(exponent, as_e8m0_dtype)
