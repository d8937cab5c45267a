"""The compressor's softmax-pooling kernel against the torch reference and float64."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from deepinfer.backends.compress_verify_ref import plan_windows
from deepinfer.backends.torch_ref import TorchBackend
from deepinfer.models.layouts import SlotTokens
from deepinfer_kernels_sm100.compress import slot_pool, softmax_pool
from deepinfer_kernels_sm100.compress_verify import verify_pool
from deepinfer_kernels_sm100.verify_plan import verify_plan

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _pool64(
    kv: torch.Tensor,
    score: torch.Tensor,
    prev_kv: torch.Tensor | None,
    prev_score: torch.Tensor | None,
) -> torch.Tensor:
    """Overlapping pooling in float64, written out window by window."""
    b, n, r, width = kv.shape
    d = width // 2
    out = torch.empty(b, n, d, dtype=torch.float64)
    for i in range(n):
        if i > 0:
            first_kv, first_sc = kv[:, i - 1, :, :d], score[:, i - 1, :, :d]
        elif prev_kv is not None and prev_score is not None:
            first_kv, first_sc = prev_kv, prev_score
        else:
            first_kv, first_sc = torch.zeros(b, r, d), torch.full((b, r, d), float("-inf"))
        window_kv = torch.cat((first_kv, kv[:, i, :, d:]), dim=1).double()
        window_sc = torch.cat((first_sc, score[:, i, :, d:]), dim=1).double()
        out[:, i] = (window_sc.softmax(dim=1) * window_kv).sum(dim=1)
    return out


@pytest.mark.parametrize(
    "case",
    [
        (3, 1, 4, 40, True, True),  # a CSA decode step, carried first halves
        (2, 5, 4, 24, True, False),  # a CSA prefill chunk, the first window's predecessor absent
        (2, 3, 4, 24, True, True),
        (4, 1, 128, 72, False, False),  # an HCA decode step: one long window
        (1, 6, 16, 20, False, False),
    ],
    ids=["csa-decode", "csa-chunk-fresh", "csa-chunk", "hca-decode", "hca-chunk"],
)
def test_matches_reference(case: tuple[int, int, int, int, bool, bool]) -> None:
    b, n, r, d, overlap, prev = case  # rows, windows, ratio, entry width, overlap, carried halves
    g = torch.Generator().manual_seed(b * 1000 + n * 10 + r)
    width = 2 * d if overlap else d
    kv = torch.randn(b, n, r, width, generator=g)
    score = torch.randn(b, n, r, width, generator=g) * 3
    prev_kv = torch.randn(b, r, d, generator=g) if prev else None
    prev_score = torch.randn(b, r, d, generator=g) * 3 if prev else None
    if prev_score is not None:
        prev_score[0, :, :5] = float("-inf")  # a fresh state's carried halves weigh nothing
    dev = [None if t is None else t.to(DEVICE) for t in (kv, score, prev_kv, prev_score)]
    got = softmax_pool(*dev, overlap).cpu()
    want = TorchBackend("cpu").compress(kv, score, prev_kv, prev_score, overlap)
    assert got.shape == want.shape == (b, n, d) and got.dtype == torch.float32
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    if overlap:
        exact = _pool64(kv, score, prev_kv, prev_score)
    else:
        exact = (score.double().softmax(dim=2) * kv.double()).sum(dim=2)
    torch.testing.assert_close(got.double(), exact, atol=1e-6, rtol=1e-5)
    # Stored as bf16 (the entries' type) the pooled values are rounded as ``Tensor.to`` does.
    low = softmax_pool(*dev, overlap, dtype=torch.bfloat16).cpu()
    assert low.dtype == torch.bfloat16 and torch.equal(low, got.to(torch.bfloat16))


def test_strided_windows() -> None:
    """Windows read through strides (a view of wider rows), as the reference reads them."""
    g = torch.Generator().manual_seed(7)
    rows_kv = torch.randn(2, 3, 4, 100, generator=g)
    rows_sc = torch.randn(2, 3, 4, 100, generator=g)
    kv, score = rows_kv[..., 10:58], rows_sc[..., 10:58]
    got = softmax_pool(kv.to(DEVICE), score.to(DEVICE), None, None, True).cpu()
    want = TorchBackend("cpu").compress(kv, score, None, None, True)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


@dataclass
class _Buffers:
    """One compressor's slot buffers (the fields ``compress_slots`` reads)."""

    kv_buf: torch.Tensor
    score_buf: torch.Tensor
    prev_kv_buf: torch.Tensor | None
    prev_score_buf: torch.Tensor | None
    hist_kv_buf: torch.Tensor | None
    hist_score_buf: torch.Tensor | None
    ratio: int

    @classmethod
    def random(  # noqa: PLR0917
        cls, rows: int, r: int, d: int, overlap: bool, keep: int, g: torch.Generator
    ) -> _Buffers:
        width = 2 * d if overlap else d

        def rand(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, generator=g).to(DEVICE)

        prev = (rand(rows, r, d), rand(rows, r, d) * 3) if overlap else (None, None)
        hist = (rand(rows, keep, width), rand(rows, keep, width)) if keep else (None, None)
        return cls(rand(rows, r, width), rand(rows, r, width) * 3, *prev, *hist, r)

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in vars(self).values() if isinstance(t, torch.Tensor)]

    def copy(self) -> _Buffers:
        fields = vars(self).values()
        return _Buffers(*(t.clone() if isinstance(t, torch.Tensor) else t for t in fields))


class _UnfusedKernels(TorchBackend):
    """The reference's torch ops around the pooling kernel: the decode path before the fused
    kernel, whose arithmetic the fused kernel must keep."""

    def compress(self, kv, score, prev_kv, prev_score, overlap, *, dtype=torch.float32):
        return softmax_pool(kv, score, prev_kv, prev_score, overlap, dtype=dtype)


@pytest.mark.parametrize(
    "case",
    [(4, 40, True, 0, True), (4, 40, True, 11, False), (128, 24, False, 0, True),
     (128, 24, False, 131, False)],
    ids=["csa", "csa-history", "hca", "hca-history"],
)  # fmt: skip
def test_slot_pool_matches_the_unfused_ops(case: tuple[int, int, bool, int, bool]) -> None:
    """Every row at every phase (the window completing or not), padding rows in slot 0, the
    projections as two tensors or as halves of one fused GEMM's output: the completed windows
    equal the pooling kernel's on the gathered windows bit for bit, the open ones are zeros,
    every buffer of every real slot ends as the torch ops leave it, and the pooled windows
    agree with the torch reference's pooling; pooled into bf16 they are the fp32 ones rounded
    by torch."""
    r, d, overlap, keep, fused_input = case
    g = torch.Generator().manual_seed(r + d + keep)
    rows = 9
    # 0: padding rows; a column of a [B, 2] upload, as the decode step takes it
    where = torch.tensor([[9, 3], [0, 0], [4, 7], [2, 1], [0, 0], [1, 5], [6, 8], [3, 2]])
    slots = where.to(DEVICE)[:, 1]
    phase = torch.tensor([r - 1, 0, 0, 1, r - 1, r - 2, r - 1, 2], device=DEVICE) % r
    history = torch.randint(0, max(keep, 1), (len(slots),), generator=g).to(DEVICE)
    history_row = history if keep else None
    width = 2 * d if overlap else d
    both = torch.randn(len(slots), 2 * width, generator=g).to(DEVICE)
    kv, score = both[:, :width], both[:, width:] * 3
    if fused_input:
        both[:, width:] *= 3
        score = both[:, width:]  # a column slice, read in place
    bias = torch.randn(r, width, generator=g).to(DEVICE)
    start = _Buffers.random(rows, r, d, overlap, keep, g)
    fused, unfused, reference = start.copy(), start.copy(), start.copy()
    args = (kv, score, bias)
    got = slot_pool(*args, fused, slots, phase, history_row, overlap=overlap)
    want = _UnfusedKernels("cpu").compress_slots(*args, unfused, slots, phase, history_row, overlap)
    ref = TorchBackend("cpu").compress_slots(*args, reference, slots, phase, history_row, overlap)
    real = slots != 0
    assert torch.equal(got[real], want[real])
    assert not got[real & (phase != r - 1)].any()  # open windows: provisional zeros
    # pooled straight into the entries' dtype: the fp32 result rounded once, as torch rounds
    rounded = slot_pool(
        *args, start.copy(), slots, phase, history_row, overlap=overlap, dtype=torch.bfloat16
    )
    assert torch.equal(rounded[real], got[real].to(torch.bfloat16))
    torch.testing.assert_close(got[real], ref[real], atol=1e-5, rtol=1e-5)
    for a, b, c in zip(fused.tensors(), unfused.tensors(), reference.tensors(), strict=True):
        assert torch.equal(a[1:], b[1:])  # row 0: the padding rows' writes, in any order
        assert torch.equal(a[1:], c[1:])
    assert not torch.equal(fused.kv_buf, start.kv_buf)  # the new rows went in


#: A verification pass: T = 6 tokens a row (the last token and 5 drafts), rows of every kind.
VERIFY_SLOTS = (3, 0, 5, 1, 7, 2)  # 0: a padding row
VERIFY_LENGTHS = (6, 0, 1, 3, 6, 4)


def _verify_rows(r: int, keep: int) -> tuple[SlotTokens, torch.Tensor]:
    """(the pass's tokens, its rows' slots [B]): rows starting at every kind of phase (a window
    closing at the first token, at a later one, at none), one padding row."""
    t = 6
    start = torch.tensor([2 * r - 3, 0, r - 1, 3 * r - 2, 4 * r, r + 1]).clamp(min=0)
    lengths = torch.tensor(VERIFY_LENGTHS)
    real = torch.arange(t) < lengths[:, None]
    slots = torch.tensor(VERIFY_SLOTS)
    positions = torch.where(real, start[:, None] + torch.arange(t), 0)
    tokens = SlotTokens(positions.to(DEVICE), torch.where(real, slots[:, None], 0).to(DEVICE),
                        lengths.to(DEVICE))  # fmt: skip
    return tokens, slots.to(DEVICE)


def _seed_open_windows(buffers: _Buffers, tokens: SlotTokens, slots: torch.Tensor) -> None:
    """Make each row's history ring hold its open window's rows (positions before the pass), as
    the decode steps that filled the window left it."""
    if buffers.hist_kv_buf is None or buffers.hist_score_buf is None:
        return
    r, keep = buffers.ratio, buffers.hist_kv_buf.shape[1]
    for row, slot in enumerate(slots.tolist()):
        first = int(tokens.positions[row, 0])
        for p in range(first - first % r, first):
            buffers.hist_kv_buf[slot, p % keep] = buffers.kv_buf[slot, p % r]
            buffers.hist_score_buf[slot, p % keep] = buffers.score_buf[slot, p % r]


@pytest.mark.parametrize(
    "case",
    [(4, 40, True, True, True), (4, 40, True, True, False), (128, 24, False, True, True),
     (128, 24, False, True, False), (2, 24, False, False, True)],
    ids=["csa-history", "csa", "hca-history", "hca", "shared-pairs-history"],
)  # fmt: skip
def test_verify_pool_equals_token_by_token_decoding(
    case: tuple[int, int, bool, bool, bool],
) -> None:
    """A verification pass's windows in one kernel against the same tokens fed one decode step
    at a time (``slot_pool``, the decode kernel): every window that closes within a row's real
    tokens pooled to the same bits as the step that completes it, the others zeros, and every
    real slot's open window, history ring and stored previous half left as the steps leave
    them. Against the torch reference (``TorchBackend.compress_verify``, which reads windows
    from the history ring where there is one): the same windows within float tolerance, the
    same buffers bit for bit."""
    r, d, overlap, has_bias, history = case
    t, slack = 6, 5
    keep = slack + 2 * r if history else 0
    g = torch.Generator().manual_seed(r + d + keep)
    width = 2 * d if overlap else d
    both = torch.randn(len(VERIFY_SLOTS), t, 2 * width, generator=g).to(DEVICE)
    both[..., width:] *= 3
    kv, score = both[..., :width], both[..., width:]  # a fused projection's halves, in place
    bias = torch.randn(r, width, generator=g).to(DEVICE) if has_bias else None
    tokens, slots = _verify_rows(r, keep)
    plan = plan_windows(tokens.positions, tokens.slots, tokens.lengths, r)
    start = _Buffers.random(9, r, d, overlap, keep, g)
    _seed_open_windows(start, tokens, slots)
    fused, stepped, reference = start.copy(), start.copy(), start.copy()
    got = verify_pool(kv, score, bias, fused, slots, plan, overlap=overlap)
    want = TorchBackend("cpu").compress_verify(kv, score, bias, reference, slots, plan, overlap)
    assert got.shape == want.shape == (len(VERIFY_SLOTS), -(-t // r), d)
    lengths, compared = torch.tensor(VERIFY_LENGTHS), 0
    for step in range(t):
        rows = (lengths > step).nonzero()[:, 0].to(DEVICE)
        at = tokens.positions[rows, step]
        out = slot_pool(
            kv[rows, step], score[rows, step], bias, stepped, slots[rows], at % r,
            at % keep if keep else None, overlap=overlap,
        )  # fmt: skip
        for i, row in enumerate(rows.tolist()):
            if int(at[i]) % r == r - 1:  # the step completes a window: the pass's window w
                w = (step - (r - 1 - int(plan.positions[row, 0]) % r)) // r
                assert bool(plan.closes[row, w])
                assert torch.equal(got[row, w], out[i, 0])
                compared += 1
    assert compared == int(plan.closes.sum()) > 0
    assert not got[~plan.closes].any()  # windows that stay open: provisional zeros
    torch.testing.assert_close(got[plan.closes], want[plan.closes], atol=1e-5, rtol=1e-5)
    for a, b, c in zip(fused.tensors(), stepped.tensors(), reference.tensors(), strict=True):
        assert torch.equal(a[1:], b[1:])  # slot 0: the padding's
        assert torch.equal(a[1:], c[1:])
    rounded = verify_pool(
        kv, score, bias, start.copy(), slots, plan, overlap=overlap, dtype=torch.bfloat16
    )
    assert torch.equal(rounded, got.to(torch.bfloat16))


@pytest.mark.parametrize("t", [1, 6, 7])
@pytest.mark.parametrize("r", [1, 2, 4, 128])
def test_verify_plan_kernel_equals_the_reference(r: int, t: int) -> None:
    """The plan kernel against the reference's index ops (``plan_windows``), every field:
    rows at positions on and off window boundaries, near the start, of every real length
    (0: a padding row, its tokens at position 0 in slot 0)."""
    g = torch.Generator().manual_seed(r * 10 + t)
    starts = [0, 1, r - 1, r, 3 * r + 1, 517, 1000]
    lengths = [int(torch.randint(0, t + 1, (), generator=g)) for _ in starts] + [0]
    starts.append(0)
    offs = torch.arange(t)
    real = offs[None] < torch.tensor(lengths)[:, None]
    positions = torch.where(real, torch.tensor(starts)[:, None] + offs, 0)
    slot_ids = torch.arange(1, len(starts) + 1)[:, None].expand(-1, t)
    slots = torch.where(real, slot_ids, 0)
    args = (positions.to(DEVICE), slots.to(DEVICE), torch.tensor(lengths).to(DEVICE), r)
    got, want = verify_plan(*args), plan_windows(*args)
    for name in ("phase", "closes", "entry", "source", "position", "open_slots", "count"):
        a, b = getattr(got, name), getattr(want, name)
        assert a.dtype == b.dtype and torch.equal(a, b), name
