"""The router kernel against the torch reference's ``moe_route`` and a float64 recomputation."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from deepinfer.backends.torch_ref import TorchBackend
from deepinfer_kernels_sm100.router import route

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
REF = TorchBackend("cpu")


def _route_on_device(logits: torch.Tensor, bias: torch.Tensor | None, **kw: object) -> tuple:
    fixed = kw.pop("fixed_indices", None)
    w, i = route(
        logits.to(DEVICE),
        bias.to(DEVICE) if bias is not None else None,
        fixed_indices=fixed.to(DEVICE) if fixed is not None else None,
        **kw,  # type: ignore[arg-type]
    )
    return w.cpu(), i.cpu()


@pytest.mark.parametrize("scoring", ["sqrtsoftplus", "sigmoid", "softmax"])
@pytest.mark.parametrize(
    "case",
    [
        (16, 2, True, True, False),
        (64, 6, True, True, False),
        (8, 3, False, False, False),
        (256, 8, True, True, False),
        (16, 2, False, True, True),
    ],
    ids=["16-top2", "64-top6", "8-top3-plain", "256-top8", "hash-layer"],
)
def test_route_matches_reference(scoring: str, case: tuple[int, int, bool, bool, bool]) -> None:
    """(experts, top-k, selection bias, normalised, hash layer)"""
    experts, topk, biased, norm, hashed = case
    g = torch.Generator().manual_seed(experts * 10 + topk)
    n, hidden = 37, 64
    x = torch.randn(n, hidden, generator=g)
    gate = torch.randn(experts, hidden, generator=g) / hidden**0.5
    bias = torch.randn(experts, generator=g) * 0.1 if biased else None
    fixed = torch.randint(0, experts, (n, topk), generator=g) if hashed else None
    kw = dict(topk=topk, scoring_func=scoring, routed_scaling_factor=1.5, norm_topk_prob=norm)
    want_w, want_i = REF.moe_route(x, gate, bias, fixed_indices=fixed, **kw)
    got_w, got_i = _route_on_device(F.linear(x, gate), bias, fixed_indices=fixed, **kw)
    assert torch.equal(got_i, want_i)
    torch.testing.assert_close(got_w, want_w, atol=1e-6, rtol=1e-5)


def test_softplus_scores_against_float64() -> None:
    """sqrt(softplus) over the whole range, the threshold at 20 and tiny exp(x) included."""
    logits = torch.linspace(-40.0, 40.0, 64).view(4, 16)
    w, i = _route_on_device(
        logits,
        None,
        topk=16,
        scoring_func="sqrtsoftplus",
        routed_scaling_factor=1.0,
        norm_topk_prob=False,
    )
    exact = [[math.sqrt(math.log1p(math.exp(v))) for v in row] for row in logits.double().tolist()]
    want = torch.tensor(exact, dtype=torch.float64).gather(-1, i)
    torch.testing.assert_close(w.double(), want, atol=0, rtol=2e-6)


def test_ties_pick_the_lower_expert_in_order() -> None:
    logits = torch.zeros(3, 10)
    logits[1, 7] = 1.0
    _, i = _route_on_device(
        logits,
        None,
        topk=4,
        scoring_func="sigmoid",
        routed_scaling_factor=1.0,
        norm_topk_prob=True,
    )
    assert i.tolist() == [[0, 1, 2, 3], [7, 0, 1, 2], [0, 1, 2, 3]]
