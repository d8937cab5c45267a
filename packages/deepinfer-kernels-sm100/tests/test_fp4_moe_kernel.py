"""The FP4 grouped-expert kernels against a float64 recomputation of the routed SwiGLU experts,
through Triton's interpreter off the GPU.

The reference dequantises the packed weights to float64 with ``deepinfer.models.quant`` and
runs every (token, slot) pair's expert in float64. Bound per output element, to first order,
with u = 2**-24 (fp32 unit roundoff), for a token's pairs with router weight r:

* Weights and inputs: every dequantised weight (two significant bits times a power of two)
  and every input (bf16 or fp32, the kernel's compute dtype) is exact where the kernel uses it.
* Dots: a dot of n products, each exact (bf16) or rounded once (fp32), summed in fp32 with at
  most n - 1 additions, each off by at most u of the running sum, is within
  gamma(n) = (n + 1) u sum |a||w| of the exact value. On CUDA ``DOT_SLACK`` = 8 widens it
  for tensor cores, whose adders may truncate (2u) and align products to fewer bits.
  Gate and up: dg, du = gamma(d) sum_k |x_k||W_jk|.
* SwiGLU: clamps are 1-Lipschitz and |silu'| <= 1.1, so with u_c the clamped up value the
  activation moves by at most 1.1 dg (|u_c| + du) + |silu(g_c)| du; times r. Its fp32
  evaluation (sigmoid, three products) is allowed ``EPILOGUE_REL`` = 2**-18 relative (64 ulps)
  and an absolute 2**-100 for sigmoid's underflow at large negative gates.
* Hidden rounding: bf16 has 8 significant bits, so rounding h to bf16 costs 2**-8 |h|
  (fp32 runs keep h in fp32: u).
* Down: dy = sum_j |W2_ij| dh_j + gamma(I) sum_j |W2_ij| (|h_j| + dh_j).
* Combine: the k slot outputs are summed in fp32: k u sum_s |y_s| more. The output is fp32.
  Where the down kernel adds a token's pairs itself (``fp4_gluon_sum``), its k I products form
  one chain of fp32 sums: gamma(k I) in place of gamma(I) (``chain`` = k).

The bf16 bound is dominated by the hidden rounding (about 2**-8 sum_j |W2_ij||h_j|), the fp32
bound by the two dots. Each check also requires the bound to stay under ``BOUND_CAP`` of the
largest output (2**-6 bf16, 2**-9 fp32 off CUDA), far below what a wrong code, nibble order or
scale would move an output by, so a loose bound cannot pass unnoticed.

The worst-case fp32 bound (about 1e-3 of the largest output here) would still let a stray bf16
or TF32 rounding through (errors of 2**-12 and more). Rounding errors typically grow like
sqrt(n) u, not n u (Higham and Mary's probabilistic analysis), about 1e-6 here, so fp32 runs
must also stay under ``FP32_TYPICAL`` = 2**-16 of the largest output: a check of the compute
precision, not a bound.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from deepinfer.models.quant import dequant_fp4_e2m1
from deepinfer_kernels_sm100 import fp4_gluon, fp4_gluon_sum, fp4_moe, gluon_support

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
U32 = 2.0**-24
U_BF16 = 2.0**-8
SILU_LIP = 1.1  # max |silu'(x)| = 1.0998
EPILOGUE_REL = 2.0**-18
TINY = 2.0**-100
DOT_SLACK = 8.0 if DEVICE == "cuda" else 1.0
FP32_TYPICAL = 2.0**-16
#: largest bound / max |y| a case may have (module doc)
BOUND_CAP = {torch.bfloat16: 2.0**-6, torch.float32: 2.0**-9 * DOT_SLACK}
HIDDEN, INTER, EXPERTS, TOPK, LIMIT = 256, 128, 8, 2, 10.0

Weights = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def _gamma(n: int) -> float:
    return DOT_SLACK * (n + 1) * U32


def _experts(hidden: int, inter: int, experts: int, seed: int) -> Weights:
    """Random packed bytes (every code in both nibbles) with ue8m0 scales of 2**-6 .. 2**-4,
    eight times larger on the first four gate and up rows of each expert, so both clamps see
    values past the limit."""
    g = torch.Generator().manual_seed(seed)

    def part(rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
        packed = torch.randint(0, 256, (experts, rows, cols // 2), generator=g, dtype=torch.uint8)
        scale = torch.randint(121, 124, (experts, rows, cols // 32), generator=g)
        return packed, scale.to(torch.uint8)

    w13, w13_scale = part(2 * inter, hidden)
    w13_scale[:, :4] += 3
    w13_scale[:, inter : inter + 4] += 3
    w2, w2_scale = part(hidden, inter)
    return w13, w13_scale, w2, w2_scale


def _routing(n: int, k: int, experts: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp32 weights, int64 indices) [n, k]: expert 0 takes most tokens, the last none; from
    3 tokens on, token 1 goes to expert 2 in every slot and token n - 1 has a slot without
    an expert (-1, another expert-parallel rank's)."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, experts, generator=g)
    logits[:, 0] += 3
    logits[:, -1] -= 9
    indices = logits.argsort(-1, descending=True)[:, :k].contiguous()
    if n >= 3:
        indices[1] = 2
        indices[n - 1, 0] = -1
    return torch.rand(n, k, generator=g), indices


def _dequant(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    pairs = zip(packed, scale, strict=True)
    return torch.stack([dequant_fp4_e2m1(p, s, out_dtype=torch.float64) for p, s in pairs])


def _reference(  # noqa: PLR0917
    x: torch.Tensor,
    weights: torch.Tensor,
    indices: torch.Tensor,
    ws: Weights,
    limit: float,
    chain: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(float64 experts' weighted sum [N, d], the module doc's bound on the kernel's error;
    ``chain``: pairs whose down products are summed in one chain)."""
    w13, w2 = _dequant(ws[0], ws[1]), _dequant(ws[2], ws[3])
    inter, d = w2.shape[2], x.shape[1]
    h_round = U_BF16 if x.dtype == torch.bfloat16 else U32
    want = torch.zeros(x.shape[0], d, dtype=torch.float64, device=x.device)
    bound, magnitude = torch.zeros_like(want), torch.zeros_like(want)
    for e in range(w13.shape[0]):
        tok, slot = (indices == e).nonzero(as_tuple=True)
        xs, r = x[tok].double(), weights[tok, slot].double()[:, None]
        gate, up = (xs @ w13[e].T).chunk(2, dim=-1)
        dg, du = (_gamma(d) * (xs.abs() @ w13[e].abs().T)).chunk(2, dim=-1)
        if limit > 0:
            gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
        act = F.silu(gate)
        h = act * up * r
        dh = r * (SILU_LIP * dg * (up.abs() + du) + act.abs() * du)
        dh = dh + EPILOGUE_REL * (h.abs() + dh) + TINY
        dh = dh + h_round * (h.abs() + dh)
        y = h @ w2[e].T
        dy = dh @ w2[e].abs().T + _gamma(chain * inter) * ((h.abs() + dh) @ w2[e].abs().T)
        want.index_put_((tok,), y, accumulate=True)
        bound.index_put_((tok,), dy, accumulate=True)
        magnitude.index_put_((tok,), y.abs() + dy, accumulate=True)
    return want, bound + indices.shape[1] * U32 * magnitude


def _run(
    x: torch.Tensor,
    weights: torch.Tensor,
    indices: torch.Tensor,
    ws: Weights,
    limit: float,
    *,
    scales_fit: bool = False,
) -> torch.Tensor:
    """The kernel's result on the test device for CPU operands, back on the CPU."""
    w13, w13_scale, w2, w2_scale = (t.to(DEVICE) for t in ws)
    got = fp4_moe.moe_experts_fp4(
        x.to(DEVICE),
        weights.to(DEVICE),
        indices.to(DEVICE),
        w13_packed=w13,
        w13_scale=w13_scale,
        w2_packed=w2,
        w2_scale=w2_scale,
        swiglu_limit=limit,
        scales_fit=scales_fit,
    )
    return got.cpu()


def _check(
    got: torch.Tensor,
    want: torch.Tensor,
    bound: torch.Tensor,
    dtype: torch.dtype,
    *,
    cap: bool = True,
) -> None:
    """``got`` within ``bound`` of ``want``; with ``cap``, the bound itself under BOUND_CAP
    (shapes as wide as V4-Flash's sum thousands of terms of random sign, whose worst-case
    bound passes the cap: their checks against the Triton kernel stand in)."""
    assert got.dtype == torch.float32 and got.shape == want.shape
    err = (got.double() - want).abs()
    worst = int((err / bound).argmax())
    assert (err <= bound).all(), (
        f"error {err.flatten()[worst]:.3g} over the bound {bound.flatten()[worst]:.3g} at "
        f"{divmod(worst, want.shape[1])} (|y| {want.flatten()[worst].abs():.3g})"
    )
    loose = bound.max() > BOUND_CAP[dtype] * want.abs().max()
    assert not (cap and loose), "the bound is too loose to test"
    if dtype == torch.float32:
        assert err.max() <= FP32_TYPICAL * want.abs().max(), "not computed in fp32 throughout"


def _case(
    n: int, dtype: torch.dtype, seed: int, shape: tuple[int, int, int, int] | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Weights]:
    hidden, inter, experts, k = shape or (HIDDEN, INTER, EXPERTS, TOPK)
    ws = _experts(hidden, inter, experts, seed)
    weights, indices = _routing(n, k, experts, seed + 1)
    x = torch.randn(n, hidden, generator=torch.Generator().manual_seed(seed + 2)).to(dtype)
    return x, weights, indices, ws


@pytest.mark.parametrize(
    ("dtype", "scales_fit"),
    [(torch.float32, False), (torch.bfloat16, False), (torch.bfloat16, True)],
    ids=["fp32", "bf16", "bf16-scales-fit"],
)
@pytest.mark.parametrize("n", [1, 5, 70])
def test_matches_float64_recomputation(n: int, dtype: torch.dtype, scales_fit: bool) -> None:
    """``scales_fit`` (every scale byte here is at most 126) folds 2**126 into the scales on
    a GPU's bf16 path; the result must not change."""
    x, weights, indices, ws = _case(n, dtype, seed=n)
    want, bound = _reference(x, weights, indices, ws, LIMIT)
    _check(_run(x, weights, indices, ws, LIMIT, scales_fit=scales_fit), want, bound, dtype)
    if n == 70:  # the case exercises both clamps and an expert without tokens
        gate_up = x.double() @ _dequant(ws[0], ws[1])[0].T
        assert (gate_up[:, :INTER] > LIMIT).any() and (gate_up[:, INTER:].abs() > LIMIT).any()
        assert not (indices == EXPERTS - 1).any()


def test_residual_joins_the_slot_sum_as_torch_adds_it() -> None:
    """The shared expert's output handed to the FP4 experts' last kernel: the bits of the
    fp32 sum then ``torch.add(sum, residual, out=bf16)`` (the reference's ``add_residual``)."""
    x, weights, indices, ws = _case(5, torch.bfloat16, seed=7)
    residual = torch.randn(5, HIDDEN, generator=torch.Generator().manual_seed(8)).bfloat16()
    w13, w13_scale, w2, w2_scale = (t.to(DEVICE) for t in ws)
    got = fp4_moe.moe_experts_fp4(
        x.to(DEVICE), weights.to(DEVICE), indices.to(DEVICE), w13_packed=w13,
        w13_scale=w13_scale, w2_packed=w2, w2_scale=w2_scale, swiglu_limit=LIMIT,
        residual=residual.to(DEVICE), out_dtype=torch.bfloat16,
    ).cpu()  # fmt: skip
    routed = _run(x, weights, indices, ws, LIMIT)
    want = torch.add(routed, residual, out=torch.empty(5, HIDDEN, dtype=torch.bfloat16))
    assert got.dtype == torch.bfloat16 and torch.equal(got, want)


def test_unclamped_with_large_row_tiles(monkeypatch: pytest.MonkeyPatch) -> None:
    """No clamp (limit 0), and the prefill's row tiles (bf16: 128 rows on 8 warps) over the
    same pairs."""
    monkeypatch.setattr(fp4_moe, "SMALL_PAIRS_PER_EXPERT", 0)
    x, weights, indices, ws = _case(70, torch.bfloat16, seed=11)
    want, bound = _reference(x, weights, indices, ws, 0.0)
    _check(_run(x, weights, indices, ws, 0.0), want, bound, torch.bfloat16)


def test_scales_past_two_keep_the_exact_decoding() -> None:
    """Scale bytes of 131 .. 136 (2**4 .. 2**9): past what ``scales_fit`` may promise, so the
    decoding applies 2**126 and the scale as two products; the values stay exact."""
    x, weights, indices, ws = _case(5, torch.bfloat16, seed=61)
    w13, w13_scale, w2, w2_scale = ws
    ws = (w13, w13_scale + 10, w2, w2_scale + 10)
    want, bound = _reference(x, weights, indices, ws, 0.0)
    _check(_run(x, weights, indices, ws, 0.0), want, bound, torch.bfloat16)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_ragged_dims_are_masked(dtype: torch.dtype) -> None:
    """d = 96 and I = 160: neither a multiple of the K tile (128) nor of the column tile (64)."""
    x, weights, indices, ws = _case(5, dtype, seed=21, shape=(96, 160, 3, 3))
    want, bound = _reference(x, weights, indices, ws, LIMIT)
    _check(_run(x, weights, indices, ws, LIMIT), want, bound, dtype)


def test_stored_dtypes_are_bit_viewed() -> None:
    """int8 packed bytes and int8 / float8_e8m0fnu scales read as the same bytes as uint8."""
    x, weights, indices, ws = _case(5, torch.bfloat16, seed=31)
    base = _run(x, weights, indices, ws, LIMIT)
    w13, w13_scale, w2, w2_scale = (t.view(torch.int8) for t in ws)
    assert torch.equal(_run(x, weights, indices, (w13, w13_scale, w2, w2_scale), LIMIT), base)
    e8m0 = getattr(torch, "float8_e8m0fnu", None)
    if e8m0 is not None:
        scales = (ws[0], ws[1].view(e8m0), ws[2], ws[3].view(e8m0))
        assert torch.equal(_run(x, weights, indices, scales, LIMIT), base)


def test_tokens_without_any_expert_get_zero() -> None:
    x, weights, indices, ws = _case(5, torch.float32, seed=41)
    indices[2] = -1
    got = _run(x, weights, indices, ws, LIMIT)
    assert torch.equal(got[2], torch.zeros(HIDDEN)) and got.isfinite().all()
    empty = _run(x[:0], weights[:0], indices[:0], ws, LIMIT)
    assert empty.shape == (0, HIDDEN) and empty.dtype == torch.float32


#: (argument position in x, weights, indices, w13, w13_scale, w2, w2_scale; its bad value)
_BAD: dict[str, tuple[int, Callable[[torch.Tensor], torch.Tensor]]] = {
    "x-fp16": (0, lambda t: t.half()),
    "x-1d": (0, lambda t: t[0]),
    "x-width": (0, lambda t: t[:, :128]),
    "weights-shape": (1, lambda t: t[:, :1]),
    "indices-float": (2, lambda t: t.float()),
    "w13-float": (3, lambda t: t.float()),
    "w13-odd-rows": (3, lambda t: t[:, :-1]),
    "inter-48": (3, lambda t: t[:, :96]),
    "w13-scale-cols": (4, lambda t: t[..., :-1]),
    "w13-scale-fp32": (4, lambda t: t.float()),
    "w2-rows": (5, lambda t: t[:, :-1]),
    "w2-2d": (5, lambda t: t[0]),
    "w2-scale-cols": (6, lambda t: t[..., :1]),
}


@pytest.mark.parametrize(("position", "bad"), list(_BAD.values()), ids=list(_BAD))
def test_bad_shapes_raise_value_error(
    position: int, bad: Callable[[torch.Tensor], torch.Tensor]
) -> None:
    x, weights, indices, ws = _case(3, torch.bfloat16, seed=51)
    args = [x, weights, indices, *ws]
    args[position] = bad(args[position])
    with pytest.raises(ValueError):
        _run(args[0], args[1], args[2], (args[3], args[4], args[5], args[6]), LIMIT)


@pytest.mark.gpu
@pytest.mark.parametrize("scales_fit", [False, True])
def test_bf16_tensor_core_path_matches_float64(scales_fit: bool) -> None:
    """bf16 activations on the GPU: the decoded tiles go to the tensor cores."""
    x, weights, indices, ws = _case(70, torch.bfloat16, seed=71)
    want, bound = _reference(x, weights, indices, ws, LIMIT)
    got = _run(x, weights, indices, ws, LIMIT, scales_fit=scales_fit)
    _check(got, want, bound, torch.bfloat16)


# -- Hopper's Gluon kernels (fp4_gluon): bf16 activations, decode batches, scales that fit ------

#: (tokens, (hidden, inter, experts, top-k), swiglu limit): V4-Flash's widths (hidden 4096,
#: experts of 2048) on 32 experts at the pair counts of batches 1 .. 200 (6 .. 1200 pairs: a
#: slot per pair for one and two tokens, whose down kernel adds a token's pairs (two tokens
#: share expert 0), the slot list below 32 pairs, a slot per expert from 48;
#: expert 0 takes most tokens, so its pairs loop over many token tiles; at 24 tokens, one tile
#: a pass, slots of 9 to 16 pairs take one pass of two), and the module's small shape.
GLUON_CASES = {
    "flash-b1": (1, (4096, 2048, 32, 6), LIMIT),
    "flash-b2": (2, (4096, 2048, 32, 6), LIMIT),
    "flash-b3": (3, (4096, 2048, 32, 6), LIMIT),
    "flash-b8-unclamped": (8, (4096, 2048, 32, 6), 0.0),
    "flash-b24": (24, (4096, 2048, 32, 6), LIMIT),
    "flash-b64": (64, (4096, 2048, 32, 6), LIMIT),
    "flash-b200": (200, (4096, 2048, 32, 6), LIMIT),
    "small-b5": (5, (HIDDEN, INTER, EXPERTS, TOPK), LIMIT),
    "small-b70-unclamped": (70, (HIDDEN, INTER, EXPERTS, TOPK), 0.0),
}
#: launch shapes forced on both kernels (d = 1024, I = 512: 8 and 4 K steps)
GLUON_TILES = {
    "one-warp-one-stage": fp4_gluon.Tiles(1, 1, 1, 1),
    "split-k2-tiles2": fp4_gluon.Tiles(2, 2, 2, 2, 168),
    "split-k4-tiles4": fp4_gluon.Tiles(4, 4, 4, 1),
    "eight-warps-stages4": fp4_gluon.Tiles(8, 1, 1, 4),
}


def _hopper_gluon() -> None:
    if not gluon_support.on_hopper(torch.device(DEVICE)):
        pytest.skip("the Gluon kernels run on Hopper with Gluon of gluon_support.GLUON_RELEASES")


def _gluon_against_references(
    n: int,
    shape: tuple[int, int, int, int],
    limit: float,
    seed: int,
    indices: torch.Tensor | None = None,
) -> None:
    """The Gluon kernels within the float64 bound (computed on the GPU), and within 2**-10 of
    the largest output of the Triton kernels on the same operands (only the order of the K
    products and, rarely, a hidden value's bf16 rounding differ); ``indices`` replace the
    case's routing."""
    x, weights, routed, ws = _case(n, torch.bfloat16, seed, shape)
    indices = routed if indices is None else indices
    x, weights, indices = x.to(DEVICE), weights.to(DEVICE), indices.to(DEVICE)
    ws = tuple(t.to(DEVICE) for t in ws)
    w = dict(zip(("w13_packed", "w13_scale", "w2_packed", "w2_scale"), ws, strict=True))
    run = {
        k: fp4_moe.moe_experts_fp4(
            x, weights, indices, swiglu_limit=limit, scales_fit=True, kernel=k, **w
        )
        for k in ("gluon", "triton")
    }
    chain = indices.shape[1] if fp4_gluon.sums_pairs(x) else 1
    want, bound = _reference(x, weights, indices, ws, limit, chain)
    _check(run["gluon"], want, bound, torch.bfloat16, cap=shape[1] <= INTER)
    gap = (run["gluon"] - run["triton"]).abs().max()
    assert gap <= 2**-10 * run["triton"].abs().max(), f"Gluon and Triton differ by {gap:.3g}"


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(GLUON_CASES.values()), ids=list(GLUON_CASES))
def test_gluon_kernels_match_float64_and_triton(case: tuple) -> None:
    _hopper_gluon()
    n, shape, limit = case
    _gluon_against_references(n, shape, limit, seed=81 + n)


@pytest.mark.gpu
@pytest.mark.parametrize("paired", [True, False], ids=["paired-hidden", "natural-hidden"])
@pytest.mark.parametrize("tiles", list(GLUON_TILES.values()), ids=list(GLUON_TILES))
def test_gluon_launch_shapes(
    tiles: fp4_gluon.Tiles, paired: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each knob of the launch shape (warps, K split, token tiles, stages, register cap) and
    the hidden activation's two orders give the same result, within the same bounds; 48
    tokens on 16 experts, most on expert 0, loop over token tiles."""
    _hopper_gluon()
    monkeypatch.setattr(fp4_gluon, "OVERRIDE", {"gate_up": tiles, "down": tiles})
    monkeypatch.setattr(fp4_gluon, "PAIRED_HIDDEN", paired)
    _gluon_against_references(48, (1024, 512, 16, 4), LIMIT, seed=91)


@pytest.mark.gpu
@pytest.mark.parametrize("summed", [True, False], ids=["sum-in-down", "slot-sum"])
def test_gluon_one_token_takes_a_slot_per_pair(
    summed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One token runs a slot per (token, expert) pair, ungrouped: right with an expert routed
    twice and a slot without an expert (another rank's), and the grouping never launched;
    the pairs added by the down kernel or by a launch of their own."""
    _hopper_gluon()
    monkeypatch.setattr(fp4_gluon, "SUM_IN_DOWN", summed)
    shape = (4096, 2048, 32, 6)
    indices = torch.tensor([[5, 0, 5, -1, 31, 7]])
    grouped = []
    group = fp4_moe.group_pairs
    monkeypatch.setattr(fp4_moe, "group_pairs", lambda *a: grouped.append(1) or group(*a))
    _gluon_against_references(1, shape, LIMIT, seed=111, indices=indices)
    assert len(grouped) == 1, "the Triton kernels group the pairs; the Gluon ones must not"


def test_gluon_kernels_are_asked_for_only_where_they_apply() -> None:
    """fp32 activations (and, off Hopper, any) cannot take the Gluon kernels: asking raises."""
    x, weights, indices, ws = _case(3, torch.float32, seed=101)
    w13, w13_scale, w2, w2_scale = ws
    with pytest.raises(ValueError, match="kernel"):
        fp4_moe.moe_experts_fp4(
            x, weights, indices, w13_packed=w13, w13_scale=w13_scale, w2_packed=w2,
            w2_scale=w2_scale, swiglu_limit=LIMIT, scales_fit=True, kernel="gluon",
        )  # fmt: skip


@pytest.mark.parametrize("batch", [1, 3, 8, 64, 256, 1024])
def test_gluon_tiles_divide_v4_flash(batch: int) -> None:
    """The launch shapes picked at V4-Flash's sizes divide its rows and K steps."""
    pairs = 6 * batch
    slots = min(256, pairs)
    up = fp4_gluon.pick_tiles(4096, 2048, pairs, slots, 2, 132)
    down = fp4_gluon.pick_tiles(2048, 4096, pairs, slots, 1, 132)
    assert fp4_gluon._checked(up, 4096, 2048) == up
    assert fp4_gluon._checked(down, 2048, 4096) == down


#: the summing down kernel's launch shapes forced (I = 2048: 16 K steps a pair, 6 pairs)
GLUON_SUM_TILES = {
    "one-warp-whole-k": fp4_gluon_sum.SumTiles(1, 1, 4),
    "split-k2-stages2": fp4_gluon_sum.SumTiles(1, 2, 2),
    "split-k8-stages4": fp4_gluon_sum.SumTiles(1, 8, 4),
    "two-warps-split-k4-one-stage": fp4_gluon_sum.SumTiles(2, 4, 1),
}


@pytest.mark.gpu
@pytest.mark.parametrize("paired", [True, False], ids=["paired-hidden", "natural-hidden"])
@pytest.mark.parametrize("tiles", list(GLUON_SUM_TILES.values()), ids=list(GLUON_SUM_TILES))
def test_gluon_down_adds_the_pairs_in_any_launch_shape(
    tiles: fp4_gluon_sum.SumTiles, paired: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The down kernel that adds a token's pairs, in each launch shape and hidden order: within
    the float64 bound and near the Triton kernels, an expert routed twice and one slot empty."""
    _hopper_gluon()
    monkeypatch.setattr(fp4_gluon_sum, "OVERRIDE", tiles)
    monkeypatch.setattr(fp4_gluon, "PAIRED_HIDDEN", paired)
    indices = torch.tensor([[9, 0, 9, -1, 31, 7]])
    _gluon_against_references(1, (4096, 2048, 32, 6), LIMIT, seed=121, indices=indices)


@pytest.mark.gpu
def test_gluon_down_adds_the_residual_of_each_token(monkeypatch: pytest.MonkeyPatch) -> None:
    """Three tokens a slot per pair (BY_PAIR_TOKENS raised), a residual added in the kernel:
    each row within the float64 bound of the experts' sum plus the residual, rounded once to
    fp32; a token with no expert at all gets its residual exactly."""
    _hopper_gluon()
    monkeypatch.setattr(fp4_gluon, "BY_PAIR_TOKENS", 3)
    x, weights, indices, ws = _case(3, torch.bfloat16, seed=131, shape=(4096, 2048, 32, 6))
    indices[1] = -1
    residual = torch.randn(3, 4096, generator=torch.Generator().manual_seed(132)).bfloat16()
    w = dict(zip(("w13_packed", "w13_scale", "w2_packed", "w2_scale"), ws, strict=True))
    got = fp4_moe.moe_experts_fp4(
        x.to(DEVICE), weights.to(DEVICE), indices.to(DEVICE), swiglu_limit=LIMIT,
        scales_fit=True, kernel="gluon", residual=residual.to(DEVICE),
        **{k: t.to(DEVICE) for k, t in w.items()},
    ).cpu()  # fmt: skip
    routed, bound = _reference(x, weights, indices, ws, LIMIT, chain=6)
    want = routed + residual.double()
    _check(got, want, bound + U32 * (want.abs() + bound), torch.bfloat16, cap=False)
    assert torch.equal(got[1], residual[1].float())
