"""The FP8 block-scaled linear kernels against float64 recomputations, through Triton's
interpreter off the GPU.

Error bounds, per output element y = sum_k a_k w_k of K terms, where a and w are the
dequantised e4m3 activations and weights (exact in float64: 4 significant bits times an fp32
scale):

* Kernel arithmetic. Each e4m3 product is exact in fp32. A K step sums its products in fp32
  (at most BLOCK_K - 1 roundings), its partial sum is multiplied by the product of two scales
  (2 roundings) and added to the accumulator (one rounding per step), so with unit roundoff
  u = 2**-24 the fp32 value is within (BLOCK_K + K / BLOCK_K + 2) u sum_k |a_k||w_k| of y, to
  first order; K eps_fp32 = 2 K u covers it for every K >= 128 used here. On a CUDA device the
  fp8 tensor cores may sum each step with fewer bits than fp32 (Hopper's keep about 14, per
  DeepSeek-V3's report), adding up to 2**-11 sum_k |a_k||w_k| (``TENSOR_CORE_REL``: truncating
  to 14 significant bits loses less than 2**-13 of the sum, in each of up to 4 accumulations of
  a 128-wide step).
* Output rounding: bf16 has 8 significant bits, so rounding the fp32 value v costs at most
  2**-8 |v| <= 2**-8 (|y| + the arithmetic bound).
* FP8 quantisation (end-to-end against the unquantised bf16 linear): a value v quantised with
  scale s is within half an e4m3 step of v, 2**-4 |v| for normal e4m3 values (3 mantissa bits)
  and 2**-10 s below 2**-6 s (subnormal spacing 2**-9), plus 2**-22 |v| for v / s being rounded
  to fp32 first. With da, dw those per-element bounds, |sum a w - sum x W| <=
  sum (da |W| + |x| dw + da dw).
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch

from deepinfer.models.quant import decode_scale, dequant_fp8_block, quant_fp8_block
from deepinfer_kernels_sm100 import fp8_gluon, fp8_linear, fp8_split, fp8_wgmma
from deepinfer_kernels_sm100.fp8_linear import (
    fp8_block_grouped_linear,
    fp8_block_linear,
    quantize_act_fp8,
)
from deepinfer_kernels_sm100.gluon_support import on_hopper

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
EPS_FP32 = 2.0**-23
U_BF16 = 2.0**-8
TENSOR_CORE_REL = 2.0**-11 if DEVICE == "cuda" else 0.0
N, K = 256, 512


def _activations(m: int, k: int, seed: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Rows whose groups of 128 span five decades of magnitude (so scales differ per group and
    small values land on e4m3 subnormals), with one all-zero group."""
    g = torch.Generator().manual_seed(seed)
    magnitude = 10.0 ** torch.empty(m, k // 128, 1).uniform_(-3, 2, generator=g)
    x = torch.randn(m, k // 128, 128, generator=g) * magnitude
    x[0, -1] = 0.0
    return x.reshape(m, k).to(dtype)


def _weight(
    n: int, k: int, fmt: str, seed: int, *, block: tuple[int, int] = (128, 128), e8m0: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(bf16 weight, its e4m3 values, its block scales)."""
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=g) / k**0.5).bfloat16()
    wq, ws = quant_fp8_block(w, block, fmt, as_e8m0_dtype=e8m0)  # type: ignore[arg-type]
    return w, wq, ws


def _dequant_act(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return q.double() * s.double().repeat_interleave(q.shape[-1] // s.shape[-1], dim=-1)


def _kernel_bound(
    abs_sum: torch.Tensor, y: torch.Tensor, out_dtype: torch.dtype, k: int = K
) -> torch.Tensor:
    """The arithmetic bound (module doc) for ``k`` terms plus the output rounding."""
    arith = (k * EPS_FP32 + TENSOR_CORE_REL) * abs_sum
    if out_dtype == torch.bfloat16:
        return arith + U_BF16 * (y.abs() + arith)
    return arith + 2.0**-24 * (y.abs() + arith)


def _run(
    x: torch.Tensor,
    wq: torch.Tensor,
    ws: torch.Tensor,
    *,
    block: tuple[int, int] = (128, 128),
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """The kernel's result on the test device for CPU operands, back on the CPU."""
    dev = (t.to(DEVICE) for t in (x, wq, ws))
    return fp8_block_linear(*dev, block=block, out_dtype=out_dtype).cpu()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("m", [1, 3, 64, 300])
def test_quantizer_matches_float64(m: int, dtype: torch.dtype) -> None:
    x = _activations(m, K, seed=m, dtype=dtype)
    q, s = (t.cpu() for t in quantize_act_fp8(x.to(DEVICE)))
    assert q.dtype == torch.float8_e4m3fn and q.shape == (m, K)
    assert s.dtype == torch.float32 and s.shape == (m, K // 128)
    groups = x.double().view(m, -1, 128)
    amax = groups.abs().amax(-1)
    # amax / 448 in float64, rounded to fp32: the correctly rounded fp32 quotient (a quotient
    # by 7 * 2**6 repeats with period 3 bits, so it never lies within 2**-53 of an fp32 tie).
    want_scale = torch.where(amax > 0, amax / 448, 1.0).float()
    assert torch.equal(s, want_scale)
    # rounding, independently: torch's own e4m3 cast of x / scale
    want_q = (x.float().view(m, -1, 128) / s[..., None]).to(torch.float8_e4m3fn).view(m, K)
    assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))
    # and in float64: within half an e4m3 step of x, in range, zero groups stay zero
    err = (_dequant_act(q, s).view(m, -1, 128) - groups).abs()
    half_step = torch.maximum(2.0**-4 * groups.abs(), 2.0**-10 * s.double()[..., None])
    assert (err <= half_step + 2.0**-22 * groups.abs()).all()
    assert q.float().abs().max() <= 448
    assert torch.equal(q[0, -128:].float(), torch.zeros(128))


def test_quantizer_keeps_leading_dims() -> None:
    x = _activations(6, 256, seed=9).view(2, 3, 256)
    q, s = quantize_act_fp8(x.to(DEVICE))
    assert q.shape == (2, 3, 256) and s.shape == (2, 3, 2)


def _check_against_float64(
    x: torch.Tensor,
    wq: torch.Tensor,
    ws: torch.Tensor,
    block: tuple[int, int],
    out_dtype: torch.dtype,
    *,
    got: torch.Tensor | None = None,
) -> None:
    """The kernel (or its result ``got``) against float64 sums of the dequantised quantised
    operands."""
    if got is None:
        got = _run(x, wq, ws, block=block, out_dtype=out_dtype)
    assert got.dtype == out_dtype and got.shape == (*x.shape[:-1], wq.shape[0])
    q, s = quantize_act_fp8(x.to(DEVICE))  # float64 sums on the test device
    a = _dequant_act(q, s).reshape(-1, x.shape[-1])
    w = dequant_fp8_block(wq.to(DEVICE), ws.to(DEVICE), block, out_dtype=torch.float64)
    want = a @ w.T
    bound = _kernel_bound(a.abs() @ w.abs().T, want, out_dtype, x.shape[-1])
    err = (got.to(DEVICE).double().reshape(want.shape) - want).abs()
    assert (err <= bound).all(), f"max error {err.max():.3g}, max excess {(err - bound).max():.3g}"


@pytest.mark.parametrize("fmt", ["fp32", "ue8m0"])
@pytest.mark.parametrize("m", [1, 3, 64, 300])
def test_linear_matches_float64(m: int, fmt: str) -> None:
    """m <= 64 takes decode tiles (K split across programs), 300 prefill tiles."""
    x = _activations(m, K, seed=10 + m)
    _, wq, ws = _weight(N, K, fmt, seed=m)
    _check_against_float64(x, wq, ws, (128, 128), torch.bfloat16)


@pytest.mark.parametrize("m", [3, 300])
def test_fp32_output_is_within_the_arithmetic_bound(m: int) -> None:
    """Without bf16's rounding on top, the fp32 accumulation bound itself is what is checked."""
    x = _activations(m, K, seed=20 + m)
    _, wq, ws = _weight(N, K, "fp32", seed=20 + m)
    _check_against_float64(x, wq, ws, (128, 128), torch.float32)


@pytest.mark.parametrize("m", [3, 300])
def test_e8m0_dtype_scales_and_32_blocks(m: int) -> None:
    """float8_e8m0fnu scales are bit-decoded like uint8 ones; V4.1's 32 x 32 blocks give a
    weight scale per 32 columns within each activation group (and the unfused path)."""
    x = _activations(m, K, seed=30 + m).view(1, m, K)
    _, wq, ws = _weight(N, K, "ue8m0", seed=30 + m, block=(32, 32), e8m0=True)
    assert ws.dtype == torch.float8_e8m0fnu
    _check_against_float64(x, wq, ws, (32, 32), torch.bfloat16)
    as_bytes = _run(x, wq, ws.view(torch.uint8), block=(32, 32))
    assert torch.equal(as_bytes, _run(x, wq, ws, block=(32, 32)))


@pytest.mark.parametrize("fmt", ["fp32", "ue8m0"])
@pytest.mark.parametrize("m", [1, 64, 300])
def test_close_to_the_unquantised_linear(m: int, fmt: str) -> None:
    x = _activations(m, K, seed=40 + m)
    w, wq, ws = _weight(N, K, fmt, seed=40 + m)
    got = _run(x, wq, ws).double()
    xd, wd = x.double(), w.double()
    want = xd @ wd.T
    amax = xd.view(m, -1, 128).abs().amax(-1)
    s_x = (amax / 448).repeat_interleave(128, dim=-1)  # a zero group quantises exactly
    s_w = decode_scale(ws, torch.float64).repeat_interleave(128, 0).repeat_interleave(128, 1)
    dx = torch.maximum(2.0**-4 * xd.abs(), 2.0**-10 * s_x) + 2.0**-22 * xd.abs()
    dw = torch.maximum(2.0**-4 * wd.abs(), 2.0**-10 * s_w) + 2.0**-22 * wd.abs()
    quant = dx @ wd.abs().T + xd.abs() @ dw.T + dx @ dw.T
    abs_sum = (xd.abs() + dx) @ (wd.abs() + dw).T  # bounds sum |a||w| of the quantised values
    bound = quant + _kernel_bound(abs_sum, want.abs() + quant, torch.bfloat16)
    err = (got - want).abs()
    assert (err <= bound).all(), f"max error {err.max():.3g}, max excess {(err - bound).max():.3g}"
    # the bound is not vacuous: quantisation costs a few per cent of sum |x||W| at most
    assert (quant <= 0.15 * (xd.abs() @ wd.abs().T)).all()


def test_empty_batch() -> None:
    _, wq, ws = _weight(128, 128, "fp32", seed=0)
    got = _run(torch.empty(0, 128, dtype=torch.bfloat16), wq, ws)
    assert got.shape == (0, 128)


@pytest.mark.parametrize(
    ("n", "k", "scale_shape", "x_k", "block"),
    [
        (200, 256, (2, 2), 256, (128, 128)),  # N not a multiple of 128
        (256, 300, (2, 3), 300, (128, 128)),  # K not a multiple of 128
        (256, 256, (2, 3), 256, (128, 128)),  # scale grid does not match
        (256, 256, (2, 2), 384, (128, 128)),  # x's features differ from K
        (256, 256, (16, 16), 256, (16, 16)),  # K blocks narrower than one fp8 dot step
        (256, 256, (2, 2), 256, (128, 96)),  # K blocks neither divide nor span 128
    ],
    ids=["n", "k", "scale-shape", "x-features", "block-16", "block-96"],
)
def test_bad_shapes_raise_value_error(
    n: int, k: int, scale_shape: tuple[int, int], x_k: int, block: tuple[int, int]
) -> None:
    wq = torch.zeros(n, k).to(torch.float8_e4m3fn)
    ws = torch.ones(scale_shape)
    with pytest.raises(ValueError):
        _run(torch.zeros(2, x_k, dtype=torch.bfloat16), wq, ws, block=block)


def test_quantizer_rejects_ragged_groups() -> None:
    with pytest.raises(ValueError, match="multiple of the group"):
        quantize_act_fp8(torch.zeros(2, 200, dtype=torch.bfloat16, device=DEVICE))


@pytest.mark.parametrize("m", [3, 300])
def test_bf16_output_is_the_fp32_result_rounded_to_nearest(m: int) -> None:
    x = _activations(m, K, seed=50 + m)
    _, wq, ws = _weight(N, K, "ue8m0", seed=50 + m)
    wide = _run(x, wq, ws, out_dtype=torch.float32)
    assert torch.equal(_run(x, wq, ws), wide.bfloat16())
    assert torch.equal(_run(x, wq, ws, out_dtype=torch.float16), wide.half())


@pytest.mark.parametrize("fused", [False, True], ids=["quantised-ahead", "quantised-in-gemm"])
@pytest.mark.parametrize("programs", [1, 4096])
@pytest.mark.parametrize("m", [1, 64])
def test_split_and_whole_k_are_within_the_bound(
    m: int, programs: int, fused: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decode batches split K across programs when the output has few column tiles; summed
    in order by each tile's last program, the result keeps the whole-K bound (more programs:
    the most splits). Decode activations are quantised ahead of the GEMM or, fused, inside
    it."""
    monkeypatch.setattr(fp8_linear, "_programs", lambda device: programs)
    monkeypatch.setattr(fp8_linear, "FUSE_DECODE_QUANT", fused)
    monkeypatch.setattr(fp8_linear, "DECODE_KERNEL", "triton")  # not the Hopper Gluon kernel
    tiles = fp8_linear._tiles(m, N, K, 128, programs, fused=fused)
    assert tiles.fused == fused
    assert tiles.splits == (1 if programs == 1 else K // 128 // fp8_linear.MIN_SPLIT_STEPS)
    x = _activations(m, K, seed=60 + m)
    _, wq, ws = _weight(N, K, "ue8m0", seed=60 + m)
    for out_dtype in (torch.bfloat16, torch.float32):
        _check_against_float64(x, wq, ws, (128, 128), out_dtype)


def test_split_launches_repeat_bit_for_bit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whichever split program finishes last, it adds the partial sums in split order: many
    launches give the same bits, and each leaves the tile counters at zero for the next."""
    monkeypatch.setattr(fp8_linear, "_programs", lambda device: 4096)
    monkeypatch.setattr(fp8_linear, "DECODE_KERNEL", "triton")  # not the Hopper Gluon kernel
    x = _activations(3, K, seed=80)
    _, wq, ws = _weight(N, K, "ue8m0", seed=80)
    x, wq, ws = (t.to(DEVICE) for t in (x, wq, ws))
    first = fp8_block_linear(x, wq, ws, out_dtype=torch.float32)
    for _ in range(20):
        assert torch.equal(fp8_block_linear(x, wq, ws, out_dtype=torch.float32), first)
    assert not fp8_split.split_counters(first.device).any()


@pytest.mark.skipif(
    not fp8_wgmma.usable(torch.device(DEVICE), (128, 128), 128), reason="a Hopper GPU's kernel"
)
@pytest.mark.parametrize(("fmt", "out_dtype"), [("ue8m0", torch.bfloat16), ("fp32", torch.float32)])
@pytest.mark.parametrize("k", [384, 512])
@pytest.mark.parametrize(("m", "n"), [(65, N), (300, N), (1000, 2048), (1100, N)])
def test_hopper_wgmma_kernel_gives_the_triton_kernels_bits(  # noqa: PLR0917
    m: int, n: int, k: int, fmt: str, out_dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Gluon kernel (async wgmma, each step's promotion overlapped with the next step)
    sums the Triton kernel's products in its order: the same bits, within the float64 bound;
    64 x 64, 64 x 128 and 128 x 128 tiles (:func:`.fp8_wgmma.tile`), odd and even step
    counts, a grouped launch."""
    x = _activations(m, k, seed=90 + m)
    _, wq, ws = _weight(n, k, fmt, seed=90 + k)
    dev = [t.to(DEVICE) for t in (x, wq, ws)]
    grouped = dev[0][: m // 2 * 2].view(m // 2, 2, k)
    got = fp8_block_linear(*dev, out_dtype=out_dtype)
    got_grouped = fp8_block_grouped_linear(grouped, dev[1], dev[2], out_dtype=out_dtype)
    monkeypatch.setattr(fp8_wgmma, "usable", lambda *args: False)
    assert torch.equal(got, fp8_block_linear(*dev, out_dtype=out_dtype))
    want = fp8_block_grouped_linear(grouped, dev[1], dev[2], out_dtype=out_dtype)
    assert torch.equal(got_grouped, want)
    _check_against_float64(x, wq, ws, (128, 128), out_dtype, got=got.cpu())


@pytest.mark.parametrize("m", [2, 300])
def test_grouped_linear_is_each_group_against_float64(m: int) -> None:
    """fp8_block_grouped_linear: group j of x against rows j * O .. (j + 1) * O, one launch."""
    groups, rows = 3, 128
    x = _activations(m * groups, K, seed=70 + m).view(m, groups, K)
    _, wq, ws = _weight(groups * rows, K, "ue8m0", seed=70 + m)
    dev = (t.to(DEVICE) for t in (x, wq, ws))
    got = fp8_block_grouped_linear(*dev).cpu()
    assert got.shape == (m, groups, rows)
    for j in range(groups):
        part = slice(j * rows, (j + 1) * rows)
        _check_against_float64(
            x[:, j], wq[part], ws[j : j + 1], (128, 128), torch.bfloat16, got=got[:, j]
        )


@pytest.mark.parametrize(
    ("x_shape", "n"), [((2, 3, 256), 256), ((2, 2, 128), 256), ((256,), 256)],
    ids=["rows-not-split-evenly", "features", "no-group-dim"],
)  # fmt: skip
def test_grouped_linear_rejects_bad_shapes(x_shape: tuple[int, ...], n: int) -> None:
    _, wq, ws = _weight(n, 256, "ue8m0", seed=0)
    with pytest.raises(ValueError):
        fp8_block_grouped_linear(torch.zeros(x_shape, dtype=torch.bfloat16), wq, ws)


# -- the Gluon decode kernel (Hopper) ------------------------------------------------------------

#: V4-Flash's FP8 projections (N, K): wq_a, wkv, wq_b, wo_b, shared_w2
FLASH_SHAPES = [(1024, 4096), (512, 4096), (32768, 1024), (4096, 8192), (4096, 2048)]
_gluon_only = pytest.mark.skipif(
    not on_hopper(torch.device(DEVICE)), reason="the Gluon decode kernel runs on Hopper GPUs"
)


@functools.cache
def _device_weight(
    n: int, k: int, fmt: str, block: tuple[int, int] = (128, 128)
) -> tuple[torch.Tensor, torch.Tensor]:
    """A random e4m3 weight and its scales on the test device (built once per shape)."""
    _, wq, ws = _weight(n, k, fmt, seed=n + k, block=block)
    return wq.to(DEVICE), ws.to(DEVICE)


def _gluon(
    x: torch.Tensor, wq: torch.Tensor, ws: torch.Tensor, linear: Any = fp8_block_linear, **kw: Any
) -> torch.Tensor:
    """``linear`` (fp8_block_linear or the grouped one) on the Gluon decode kernel
    (ValueError should it not take the call)."""
    old, fp8_linear.DECODE_KERNEL = fp8_linear.DECODE_KERNEL, "gluon"
    try:
        return linear(x, wq, ws, **kw)
    finally:
        fp8_linear.DECODE_KERNEL = old


@_gluon_only
@pytest.mark.parametrize("m", [1, 13, 64])
@pytest.mark.parametrize(("n", "k"), FLASH_SHAPES, ids=["wq_a", "wkv", "wq_b", "wo_b", "w2"])
def test_gluon_decode_matches_float64(n: int, k: int, m: int) -> None:
    """The Gluon kernel at V4-Flash's shapes, one, two and four token tiles a pass (13 rows:
    a ragged last tile), within the float64 bound; fp32 out for the bound without bf16."""
    wq, ws = _device_weight(n, k, "ue8m0")
    x = _activations(m, k, seed=100 + m).to(DEVICE)
    for out_dtype in (torch.bfloat16, torch.float32):
        got = _gluon(x, wq, ws, out_dtype=out_dtype)
        _check_against_float64(x, wq, ws, (128, 128), out_dtype, got=got)


@_gluon_only
@pytest.mark.parametrize("m", [1, 8, 30])
@pytest.mark.parametrize(("n", "k"), [(512, 4096), (32768, 1024)], ids=["wkv", "wq_b"])
def test_gluon_decode_fp32_scales(n: int, k: int, m: int) -> None:
    wq, ws = _device_weight(n, k, "fp32")
    x = _activations(m, k, seed=110 + m).to(DEVICE)
    _check_against_float64(x, wq, ws, (128, 128), torch.bfloat16, got=_gluon(x, wq, ws))


@_gluon_only
@pytest.mark.parametrize("block", [(32, 32), (64, 64), (128, 256)], ids=str)
@pytest.mark.parametrize("m", [3, 17])
def test_gluon_decode_other_blocks(block: tuple[int, int], m: int) -> None:
    """V4.1's 32 x 32 blocks (8-byte loads, a scale per MMA), 64-wide ones (a scale per two
    MMAs) and blocks two steps wide, with ue8m0 scales."""
    wq, ws = _device_weight(1024, 2048, "ue8m0", block)
    x = _activations(m, 2048, seed=120 + m).to(DEVICE)
    _check_against_float64(x, wq, ws, block, torch.bfloat16, got=_gluon(x, wq, ws, block=block))


@_gluon_only
@pytest.mark.parametrize("m", [1, 9])
def test_gluon_grouped_decode_is_each_group_against_float64(m: int) -> None:
    """V4-Flash's grouped wo_a (8 groups of 1024 rows over 4096 columns) on the Gluon kernel."""
    groups, rows, k = 8, 1024, 4096
    wq, ws = _device_weight(groups * rows, k, "ue8m0")
    x = _activations(m * groups, k, seed=130 + m).view(m, groups, k).to(DEVICE)
    got = _gluon(x, wq, ws, fp8_block_grouped_linear)
    for j in range(groups):
        part = slice(j * rows, (j + 1) * rows)
        _check_against_float64(
            x[:, j], wq[part], ws[j * 8 : (j + 1) * 8], (128, 128), torch.bfloat16, got=got[:, j]
        )


@_gluon_only
@pytest.mark.parametrize(("n", "k"), FLASH_SHAPES, ids=["wq_a", "wkv", "wq_b", "wo_b", "w2"])
def test_gluon_decode_is_batch_invariant(n: int, k: int) -> None:
    """A row's output bits do not depend on M or on the other rows: each row of a 64-row call
    equals the same row within shorter batches (ragged ones too) and computed alone."""
    wq, ws = _device_weight(n, k, "ue8m0")
    x = _activations(64, k, seed=140).to(DEVICE)
    full = _gluon(x, wq, ws, out_dtype=torch.float32)
    for m in (1, 2, 7, 8, 9, 16, 33, 63):
        assert torch.equal(_gluon(x[:m], wq, ws, out_dtype=torch.float32), full[:m]), m
    for r in (0, 5, 17, 63):
        assert torch.equal(_gluon(x[r : r + 1], wq, ws, out_dtype=torch.float32), full[r : r + 1])
    other = _activations(64, k, seed=141).to(DEVICE)
    other[11] = x[11]
    assert torch.equal(_gluon(other, wq, ws, out_dtype=torch.float32)[11], full[11])


@_gluon_only
@pytest.mark.parametrize("splits", [1, 2, 4], ids=lambda s: f"programs{s}")
@pytest.mark.parametrize(("n", "k"), [(512, 4096), (4096, 2048)], ids=["wkv", "w2"])
def test_gluon_decode_repeats_bit_for_bit(
    n: int, k: int, splits: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every launch gives the same bits, K split across ``splits`` programs too (the last of a
    tile's programs adds the partial sums in split order), within the float64 bound, and
    leaves the split counters at zero."""
    monkeypatch.setitem(fp8_gluon.OVERRIDE, (n, k), fp8_gluon.Tiles(1, 4, splits, 1))
    wq, ws = _device_weight(n, k, "ue8m0")
    x = _activations(5, k, seed=150).to(DEVICE)
    first = _gluon(x, wq, ws, out_dtype=torch.float32)
    _check_against_float64(x, wq, ws, (128, 128), torch.float32, got=first)
    for _ in range(20):
        assert torch.equal(_gluon(x, wq, ws, out_dtype=torch.float32), first)
    assert not fp8_split.split_counters(first.device).any()


def test_gluon_launch_shape_depends_on_n_and_k_alone() -> None:
    """Batch invariance needs the K split fixed by the weight: every V4-Flash shape's launch
    shape divides its rows and K steps, whatever the batch."""
    for n, k in [*FLASH_SHAPES, (8192, 4096), (5120, 5120)]:
        tiles = fp8_gluon.pick_tiles(n, k, 132)
        assert fp8_gluon._checked(tiles, n, k, n) == tiles
        assert tiles.warps_n * tiles.split_k <= 16
