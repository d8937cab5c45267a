"""The stable top-k kernel against the torch reference's picks (exact: same ids, same order)."""

from __future__ import annotations

import pytest
import torch

from deepinfer.backends.torch_ref import TorchBackend
from deepinfer_kernels_sm100 import topk
from deepinfer_kernels_sm100.topk import stable_topk_picks

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
REF = TorchBackend("cpu")


def tied_scores(rows: int, entries: int, seed: int) -> torch.Tensor:
    """ReLU-like scores with many exact ties: zeros, negative zeros, repeated values."""
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(rows, entries, generator=g).relu() * torch.randint(
        0, 3, (rows, entries), generator=g
    )
    s[:, 1::7] = -0.0
    s[:, ::5] = torch.randn(rows, 1, generator=g)  # one value repeated across the row
    s[0, :4] = -torch.rand(4, generator=g)  # negatives
    return s


#: (rows, entries, k, block): ``block`` cuts the radix select's rows into segments
_CASES = {
    "small": (3, 50, 7, None),
    "mid": (4, 300, 64, None),
    "long": (2, 1500, 512, None),
    "k-equals-T": (3, 17, 17, None),
    "k-1": (2, 40, 1, None),
}
_SEGMENTED = {
    "small-4seg": (3, 50, 7, 16),
    "mid-5seg": (2, 300, 64, 64),
    "long-3seg": (2, 1500, 512, 512),
}


@pytest.mark.parametrize(
    ("rows", "entries", "k", "block", "path"),
    [pytest.param(*c, "row-sort", id=f"{n}-row-sort") for n, c in _CASES.items()]
    + [pytest.param(*c, "row-select", id=f"{n}-row-select") for n, c in _CASES.items()]
    + [pytest.param(*c, "radix", id=f"{n}-radix") for n, c in (_CASES | _SEGMENTED).items()],
)
def test_picks_equal_reference(  # noqa: PLR0917
    rows: int,
    entries: int,
    k: int,
    block: int | None,
    path: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rows sorted whole by one program; rows selected from by one program, their keys in
    registers (as when a chunk's rows alone fill the GPU); and rows through the segmented
    radix select, also cut into several segments (``block`` entries each), which place their
    picks after the earlier segments' and count ties across them."""
    if path != "row-sort":
        monkeypatch.setattr(topk, "ROW_SORT_MAX", 0)
        monkeypatch.setattr(topk, "ROW_SORT_MAX_MANY_ROWS", 0)
    if path == "row-select":
        monkeypatch.setattr(topk, "TARGET_PROGRAMS", 1)  # one segment a row
    if path == "radix":
        monkeypatch.setattr(topk, "ROW_SELECT_MAX", 0)
    if block is not None:
        monkeypatch.setattr(topk, "BLOCK", block)
    g = torch.Generator().manual_seed(entries)
    s = tied_scores(rows, entries, entries)
    n_visible = torch.randint(0, entries + 1, (rows,), generator=g)
    n_visible[0] = min(3, entries)  # fewer visible than k: the rest come back -1
    allowed = torch.rand(rows, entries, generator=g) < 0.3
    d = s.to(DEVICE)
    got = stable_topk_picks(d, k).cpu()
    assert torch.equal(got, REF.topk_picks(s, k))
    got = stable_topk_picks(d, k, n_visible=n_visible.to(DEVICE)).cpu()
    want = REF.topk_picks(s, k, n_visible=n_visible)
    assert torch.equal(got, want)
    assert (want[0, min(3, entries) :] == -1).all()
    got = stable_topk_picks(d, k, allowed=allowed.to(DEVICE)).cpu()
    assert torch.equal(got, REF.topk_picks(s, k, allowed=allowed))


def test_leading_dims_and_broadcast_visibility() -> None:
    """[B, S, T] scores with n_visible per query [S] (shared by the batch) and a [B, 1, T] mask,
    as the indexers pass them."""
    s = tied_scores(2 * 3, 90, 5).view(2, 3, 90)
    n_visible = torch.tensor([10, 45, 90])
    allowed = torch.arange(90)[None, None] % 3 != 1
    allowed = allowed.expand(2, 1, 90)
    got = stable_topk_picks(s.to(DEVICE), 16, n_visible=n_visible.to(DEVICE)).cpu()
    assert torch.equal(got, REF.topk_picks(s, 16, n_visible=n_visible))
    got = stable_topk_picks(s.to(DEVICE), 16, allowed=allowed.to(DEVICE)).cpu()
    assert torch.equal(got, REF.topk_picks(s, 16, allowed=allowed))


def test_ties_go_to_the_lower_id() -> None:
    """Independent of the reference: equal scores rank by entry id, -0.0 ties +0.0."""
    s = torch.tensor([[1.0, 3.0, 3.0, 0.0, 3.0, 9.0, -0.0, 0.0]])
    got = stable_topk_picks(s.to(DEVICE), 7).cpu()
    assert got.tolist() == [[5, 1, 2, 4, 0, 3, 6]]
    got = stable_topk_picks(s.to(DEVICE), 4, n_visible=torch.tensor([2]).to(DEVICE)).cpu()
    assert got.tolist() == [[1, 0, -1, -1]]
