"""The grouped-expert kernels against the torch reference's ``moe_experts`` (itself checked
against a float64 per-token recomputation), through Triton's interpreter off the GPU."""

from __future__ import annotations

import pytest
import torch

from deepinfer.backends.moe_ref import group_by_expert
from deepinfer.backends.torch_ref import TorchBackend
from deepinfer_kernels_sm100 import moe, moe_group

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ref = TorchBackend("cpu")


def _case(
    shape: tuple[int, int, int, int, int], seed: int, dtype: torch.dtype
) -> tuple[torch.Tensor, ...]:
    n, d, inter, experts, k = shape
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g).to(dtype)
    w13 = (torch.randn(experts, 2 * inter, d, generator=g) / d**0.5).to(dtype)
    w2 = (torch.randn(experts, d, inter, generator=g) / inter**0.5).to(dtype)
    # Skewed routing: expert 0 takes most tokens (several row tiles), some experts none.
    logits = torch.randn(n, experts, generator=g)
    logits[:, 0] += 3
    logits[:, -1] -= 9
    indices = logits.argsort(-1, descending=True)[:, :k].contiguous()
    indices[min(1, n - 1), -1] = -1  # slots another expert-parallel rank owns
    indices[n - 1, 0] = -1
    weights = torch.rand(n, k, generator=g)
    return x, weights, indices, w13, w2


def _on_device(case: tuple[torch.Tensor, ...], limit: float) -> torch.Tensor:
    """The kernel's result on the test device for a CPU case (x, weights, indices, w13, w2)."""
    x, weights, indices, w13, w2 = (t.to(DEVICE) for t in case)
    return moe.moe_experts(x, weights, indices, w13=w13, w2=w2, swiglu_limit=limit).cpu()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("limit", [0.0, 1.5])
@pytest.mark.parametrize(
    "shape",
    [(40, 32, 24, 6, 2), (7, 48, 80, 4, 3), (1, 32, 16, 8, 2), (100, 32, 24, 4, 2)],
    ids=str,
)
def test_moe_experts_kernel_matches_reference(
    shape: tuple[int, int, int, int, int], limit: float, dtype: torch.dtype
) -> None:
    n, d = shape[:2]
    x, weights, indices, w13, w2 = _case(shape, seed=n + d, dtype=dtype)
    want = ref.moe_experts(x, weights, indices, w13=w13, w2=w2, swiglu_limit=limit)
    got = _on_device((x, weights, indices, w13, w2), limit)
    assert got.dtype == torch.float32 and got.shape == (n, d)
    # bf16: the reference rounds the gate/up projections to bf16, the kernel keeps them fp32.
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_residual_joins_the_slot_sum_as_torch_adds_it(out_dtype: torch.dtype) -> None:
    """The shared expert's output handed to the experts' last kernel: the same bits as the
    fp32 sum then ``torch.add(sum, residual, out=...)`` in ``out_dtype`` (the reference's
    ``add_residual``), here and in the reference backend; the sum alone is unchanged."""
    case = _case((40, 32, 24, 6, 2), seed=3, dtype=torch.bfloat16)
    x, weights, indices, w13, w2 = (t.to(DEVICE) for t in case)
    residual = (torch.randn(40, 32, generator=torch.Generator().manual_seed(4)) * 3).bfloat16()
    routed = moe.moe_experts(x, weights, indices, w13=w13, w2=w2, swiglu_limit=1.5)
    got = moe.moe_experts(
        x, weights, indices, w13=w13, w2=w2, swiglu_limit=1.5,
        residual=residual.to(DEVICE), out_dtype=out_dtype,
    ).cpu()  # fmt: skip
    want = torch.add(routed.cpu(), residual, out=torch.empty(40, 32, dtype=out_dtype))
    assert got.dtype == out_dtype and torch.equal(got, want)
    ref_routed = ref.moe_experts(*case[:3], w13=case[3], w2=case[4], swiglu_limit=1.5)
    ref_got = ref.moe_experts(
        *case[:3], w13=case[3], w2=case[4], swiglu_limit=1.5, residual=residual,
        out_dtype=out_dtype,
    )  # fmt: skip
    assert torch.equal(ref_got, ref_routed.to(torch.float32).add(residual).to(out_dtype))


def test_tokens_without_any_expert_get_zero() -> None:
    x, weights, indices, w13, w2 = _case((5, 32, 16, 4, 2), seed=0, dtype=torch.float32)
    indices[2] = -1
    got = _on_device((x, weights, indices, w13, w2), 0.0)
    assert torch.equal(got[2], torch.zeros(32))
    assert got.isfinite().all()


@pytest.mark.parametrize(
    "path", ["a-program-an-expert", "one-program-sorts", "chunks-of-64", "chunks-of-16"]
)
@pytest.mark.parametrize(
    ("n", "experts", "k"), [(40, 6, 2), (300, 16, 6), (1, 8, 2), (5, 3, 3), (700, 13, 3)]
)
def test_grouping_equals_the_reference_sort(
    n: int, experts: int, k: int, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every grouping gives the reference's stable order exactly: token rows, pair order,
    weights and expert ends (the chunked sort over several chunks, one a partial chunk)."""
    if path.startswith("chunks"):
        monkeypatch.setattr(moe_group, "GROUP_MAX_PAIRS", 0)
        monkeypatch.setattr(moe_group, "CHUNK_PAIRS", int(path.rsplit("-", 1)[1]))
    monkeypatch.setattr(moe_group, "EXPERTS_PER_PAIR", 0 if path == "one-program-sorts" else 64)
    g = torch.Generator().manual_seed(n * experts + k)
    indices = torch.randint(0, experts, (n, k), generator=g)
    indices[0, -1] = -1
    indices[n // 2, 0] = -1
    weights = torch.rand(n, k, generator=g).bfloat16()
    rows, order, scale, ends, busy = moe_group.group_pairs(
        weights.to(DEVICE), indices.to(DEVICE), experts
    )
    want_rows, want_order, want_ends, want_scale, live = group_by_expert(weights, indices, experts)
    live_pairs = int(live.sum())
    assert torch.equal(ends.cpu(), want_ends) and int(ends[-1]) == live_pairs
    assert torch.equal(rows.cpu().long(), want_rows)
    assert torch.equal(order.cpu().long(), want_order)
    assert torch.equal(scale.cpu(), want_scale.reshape(-1))
    # independent of the reference: each expert's pairs in (token, slot) order, and the
    # experts that have any in order, padded with -1 to min(E, pairs) kernel slots
    flat = indices.flatten()
    want_busy = sorted({int(e) for e in flat if e >= 0})
    slots = min(experts, n * k)
    assert busy.cpu().tolist() == want_busy + [-1] * (slots - len(want_busy))
    for e in range(experts):
        start = int(want_ends[e - 1]) if e else 0
        mine = order.cpu().long()[start : int(want_ends[e])]
        assert mine.tolist() == torch.nonzero(flat == e).flatten().tolist()


def test_inputs_rounded_to_the_weights_dtype() -> None:
    """fp32 tokens through bf16 experts: read in place and rounded as the reference's gather."""
    x, weights, indices, w13, w2 = _case((9, 32, 16, 4, 2), seed=3, dtype=torch.bfloat16)
    x = torch.randn(x.shape, generator=torch.Generator().manual_seed(4))
    want = ref.moe_experts(x, weights, indices, w13=w13, w2=w2, swiglu_limit=0.0)
    got = _on_device((x, weights, indices, w13, w2), 0.0)
    torch.testing.assert_close(got, want, atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_long_chunks_split_each_experts_rows_without_changing_bits(
    dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chunk with more pairs an expert than the last tier takes the large launch shape and
    splits each expert's row tiles among programs: it matches the reference, and its bits are
    those of one program walking every tile (each row is computed once, in the same order)."""
    case = _case((300, 32, 24, 4, 2), seed=11, dtype=dtype)
    x, weights, indices, w13, w2 = case
    ieee = dtype == torch.float32
    shape, splits = moe.launch_for(indices.numel(), 4, ieee)
    assert shape == (moe.FP32_LARGE if ieee else moe.LARGE) and splits > 1
    want = ref.moe_experts(x, weights, indices, w13=w13, w2=w2, swiglu_limit=1.5)
    got = _on_device(case, 1.5)
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)
    monkeypatch.setattr(moe, "LARGE", moe.LARGE._replace(tiles=1000))
    monkeypatch.setattr(moe, "FP32_LARGE", moe.FP32_LARGE._replace(tiles=1000))
    assert moe.launch_for(indices.numel(), 4, ieee)[1] == 1
    assert torch.equal(_on_device(case, 1.5), got)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("limit", [0.0, 1.5])
@pytest.mark.parametrize(
    "shape",
    [(40, 32, 24, 6, 2), (1, 32, 16, 8, 2), (300, 32, 24, 4, 2)],
    ids=["decode-batch", "one-token-listed-slots", "long-chunk-splits"],
)
def test_shared_expert_as_the_grids_last_slot(
    shape: tuple[int, int, int, int, int], limit: float, dtype: torch.dtype
) -> None:
    """``shared``: the reference's experts with the shared expert appended to the stacks as
    expert E, which every token takes in one more slot at weight 1, summed after its routed
    slots; rounded once to ``out_dtype``."""
    n, d, inter, experts, _ = shape
    x, weights, indices, w13, w2 = _case(shape, seed=n + d + 1, dtype=dtype)
    g = torch.Generator().manual_seed(n)
    s13 = (torch.randn(2 * inter, d, generator=g) / d**0.5).to(dtype)
    s2 = (torch.randn(d, inter, generator=g) / inter**0.5).to(dtype)
    stacks = {"w13": torch.cat([w13, s13[None]]), "w2": torch.cat([w2, s2[None]])}
    every = torch.full((n, 1), experts, dtype=indices.dtype)
    want = ref.moe_experts(
        x, torch.cat([weights, torch.ones(n, 1)], 1), torch.cat([indices, every], 1),
        swiglu_limit=limit, **stacks,
    )  # fmt: skip
    dev = [t.to(DEVICE) for t in (x, weights, indices, w13, w2, s13, s2)]
    for out_dtype in (torch.float32, torch.bfloat16):
        got = moe.moe_experts(
            *dev[:3], w13=dev[3], w2=dev[4], swiglu_limit=limit, out_dtype=out_dtype,
            shared=(dev[5], dev[6]),
        ).cpu()  # fmt: skip
        assert got.dtype == out_dtype and got.shape == (n, d)
        tol = 1e-5 if dtype == torch.float32 and out_dtype == torch.float32 else 3e-2
        torch.testing.assert_close(got.float(), want, atol=tol, rtol=tol)


@pytest.mark.parametrize("tokens", [9, 1100], ids=["fused", "beside-long-chunk"])
def test_backend_routes_the_shared_expert_through_the_grouped_kernels(
    tokens: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``moe_experts_shared`` of the sm100 backend (one more expert of the kernels, or for a
    chunk whose rows take more than ``SHARED_TILES`` of their tiles, dense GEMMs beside them)
    and of the reference (its dense ops as the residual) agree, in fp32 where both are exact
    up to summation order."""
    from deepinfer_kernels_sm100.backend import Sm100Backend

    ops = object.__new__(Sm100Backend)
    assert ops.fuses_shared_expert and not ref.fuses_shared_expert
    shared_slots = []
    grouped = moe.moe_experts
    monkeypatch.setattr(
        moe, "moe_experts", lambda *a, **k: shared_slots.append(k.get("shared")) or grouped(*a, **k)
    )
    x, weights, indices, w13, w2 = _case((tokens, 32, 24, 6, 2), seed=5, dtype=torch.float32)
    g = torch.Generator().manual_seed(6)
    s13, s2 = torch.randn(48, 32, generator=g) / 6, torch.randn(32, 24, generator=g) / 5
    kw = {"w13": w13, "w2": w2, "shared_w13": s13, "shared_w2": s2, "swiglu_limit": 1.5}
    want = ref.moe_experts_shared(x, weights, indices, **kw)
    dev = {key: t.to(DEVICE) for key, t in kw.items() if isinstance(t, torch.Tensor)}
    got = ops.moe_experts_shared(
        x.to(DEVICE), weights.to(DEVICE), indices.to(DEVICE), swiglu_limit=1.5, **dev
    ).cpu()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # fp32 stacks take the FP32 tiers: 64-row tiles for the long chunk's 367 rows an expert
    fused = tokens <= moe.SHARED_TILES * moe.FP32_LARGE.block_m
    assert len(shared_slots) == 1 and (shared_slots[0] is not None) == fused
