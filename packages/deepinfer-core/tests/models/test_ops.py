"""The torch reference ops against float64 recomputations written straight from the spec."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

from deepinfer.backends import moe_ref
from deepinfer.backends.mhc_ref import sinkhorn
from deepinfer.backends.torch_ref import TorchBackend
from deepinfer.models.layers.rope import Rotary

ops = TorchBackend("cpu")
g = torch.Generator().manual_seed(0)


def test_yarn_frequencies_match_the_deepseek_formula() -> None:
    dim, theta, factor, orig = 64, 160000.0, 16.0, 65536
    rot = Rotary.build(
        dim,
        theta,
        {"type": "yarn", "factor": factor, "original_max_position_embeddings": orig,
         "beta_fast": 32, "beta_slow": 1},
        torch.device("cpu"),
    )  # fmt: skip

    def c(k: float) -> float:
        return dim * math.log(orig / (2 * math.pi * k)) / (2 * math.log(theta))

    low, high = max(math.floor(c(32)), 0), min(math.ceil(c(1)), dim - 1)
    want = []
    for i in range(dim // 2):
        f = theta ** (-2 * i / dim)
        smooth = 1 - min(max((i - low) / (high - low), 0.0), 1.0)
        want.append(f / factor * (1 - smooth) + f * smooth)
    torch.testing.assert_close(rot.inv_freq.double(), torch.tensor(want, dtype=torch.float64))


def test_rope_is_interleaved_on_the_tail_and_inverts() -> None:
    x = torch.randn(1, 3, 2, 10, generator=g)
    pos = torch.tensor([0, 5, 9])
    freq = torch.tensor([1.0, 0.1])
    ang = pos[:, None].double() * freq[None].double()
    y = ops.rope(x, ang.cos().float(), ang.sin().float())
    assert torch.equal(y[..., :6], x[..., :6])
    z = (
        torch.complex(x[..., 6::2].double(), x[..., 7::2].double())
        * torch.polar(torch.ones_like(ang), ang)[:, None]
    )
    torch.testing.assert_close(y[..., 6::2].double(), z.real, atol=1e-6, rtol=0)
    torch.testing.assert_close(y[..., 7::2].double(), z.imag, atol=1e-6, rtol=0)
    back = ops.rope(y, ang.cos().float(), ang.sin().float(), inverse=True)
    torch.testing.assert_close(back, x, atol=1e-6, rtol=0)


def test_attention_sink_joins_the_denominator_only() -> None:
    q = torch.randn(1, 2, 3, 8, generator=g)
    kv = torch.randn(1, 5, 8, generator=g)
    mask = torch.rand(1, 2, 5, generator=g) > 0.3
    mask[..., 0] = True
    sinks = torch.randn(3, generator=g)
    got = ops.attention(q, kv, mask, sinks, 0.5)
    want = torch.zeros(1, 2, 3, 8, dtype=torch.float64)
    for s in range(2):
        for h in range(3):
            logits = [
                0.5 * float(q[0, s, h].double() @ kv[0, j].double()) if mask[0, s, j] else None
                for j in range(5)
            ]
            den = math.exp(float(sinks[h])) + sum(math.exp(v) for v in logits if v is not None)
            for j, v in enumerate(logits):
                if v is not None:
                    want[0, s, h] += math.exp(v) / den * kv[0, j].double()
    torch.testing.assert_close(got.double(), want, atol=1e-6, rtol=0)


def _index_attention_f64(
    q: Tensor, kv: Tensor, index: Tensor, sinks: Tensor, scale: float
) -> Tensor:
    """Float64 attention of each query over the keys its index lists, written loop by loop."""
    b, s, h, d = q.shape
    out = torch.zeros(b, s, h, d, dtype=torch.float64)
    for bi in range(b):
        for si in range(s):
            rows = [int(r) for r in index[bi, si] if r >= 0]
            for hi in range(h):
                logits = [scale * float(q[bi, si, hi].double() @ kv[bi, r].double()) for r in rows]
                den = math.exp(float(sinks[hi])) + sum(math.exp(v) for v in logits)
                for r, v in zip(rows, logits, strict=True):
                    out[bi, si, hi] += math.exp(v) / den * kv[bi, r].double()
    return out


def test_sparse_attention_reads_only_the_listed_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    import deepinfer.backends.torch_ref as ref

    b, s, h, d, length, k = 2, 5, 3, 8, 12, 6
    q = torch.randn(b, s, h, d, generator=g)
    kv = torch.randn(b, length, d, generator=g)
    sinks = torch.randn(h, generator=g)
    index = torch.stack([torch.randperm(length, generator=g)[:k] for _ in range(b * s)])
    index = index.view(b, s, k)
    index[0, 1, 2:] = -1  # fewer keys than K
    index[1, 3] = -1  # no key at all: the sink takes everything, the output is zero
    want = _index_attention_f64(q, kv, index, sinks, 0.4)
    got = ops.sparse_attention(q, kv, index, sinks, 0.4)
    torch.testing.assert_close(got.double(), want, atol=1e-6, rtol=0)
    assert torch.equal(got[1, 3], torch.zeros(h, d))
    mask = torch.zeros(b, s, length + 1, dtype=torch.bool)
    mask.scatter_(-1, torch.where(index < 0, length, index), True)
    dense = ops.attention(q, kv, mask[..., :length], sinks, 0.4)
    torch.testing.assert_close(got, dense, atol=1e-6, rtol=0)
    monkeypatch.setattr(ref, "MAX_SCORE_ELEMENTS", b * k * d * 2)  # two query rows per block
    torch.testing.assert_close(
        ops.sparse_attention(q, kv, index, sinks, 0.4), got, atol=1e-6, rtol=0
    )


def test_overlapping_compressor_pools_eight_tokens() -> None:
    r, d, n = 4, 3, 3
    kv = torch.randn(1, n, r, 2 * d, generator=g)
    score = torch.randn(1, n, r, 2 * d, generator=g)
    prev_kv, prev_score = torch.randn(1, r, d, generator=g), torch.randn(1, r, d, generator=g)
    got = ops.compress(kv, score, prev_kv, prev_score, overlap=True)
    for w in range(n):
        if w == 0:
            a_kv, a_sc = prev_kv[0].double(), prev_score[0].double()
        else:
            a_kv, a_sc = kv[0, w - 1, :, :d].double(), score[0, w - 1, :, :d].double()
        slots_kv = torch.cat((a_kv, kv[0, w, :, d:].double()))
        slots_sc = torch.cat((a_sc, score[0, w, :, d:].double()))
        want = (slots_sc.softmax(0) * slots_kv).sum(0)
        torch.testing.assert_close(got[0, w].double(), want, atol=1e-6, rtol=0)
    # At sequence start window -1 is absent and gets weight zero.
    first = ops.compress(kv[:, :1], score[:, :1], None, None, overlap=True)
    want = (score[0, 0, :, d:].double().softmax(0) * kv[0, 0, :, d:].double()).sum(0)
    torch.testing.assert_close(first[0, 0].double(), want, atol=1e-6, rtol=0)


@pytest.mark.parametrize("lead", [(5,), (2, 300), ()])
def test_sinkhorn_matches_float64_and_is_nearly_doubly_stochastic(lead: tuple[int, ...]) -> None:
    logits = torch.randn(*lead, 4, 4, generator=g)
    comb = sinkhorn(logits, iters=20, eps=1e-6)
    assert comb.shape == logits.shape
    want = logits.double().softmax(-1) + 1e-6
    want = want / (want.sum(-2, keepdim=True) + 1e-6)
    for _ in range(19):
        want = want / (want.sum(-1, keepdim=True) + 1e-6)
        want = want / (want.sum(-2, keepdim=True) + 1e-6)
    torch.testing.assert_close(comb.double(), want, atol=1e-6, rtol=0)
    torch.testing.assert_close(comb.sum(-2), torch.ones(*lead, 4), atol=1e-4, rtol=0)
    torch.testing.assert_close(comb.sum(-1), torch.ones(*lead, 4), atol=1e-2, rtol=0)


def test_router_bias_selects_but_does_not_weight() -> None:
    x = torch.randn(6, 8, generator=g)
    w = torch.randn(5, 8, generator=g)
    bias = torch.tensor([0.0, 0.0, 0.0, 0.0, 100.0])
    weights, idx = ops.moe_route(
        x,
        w,
        bias,
        topk=2,
        scoring_func="sqrtsoftplus",
        routed_scaling_factor=1.5,
        norm_topk_prob=True,
    )
    assert (idx == 4).any(-1).all()  # the bias forces expert 4 in
    scores = torch.nn.functional.softplus(x.double() @ w.double().T).sqrt()
    picked = scores.gather(1, idx)
    torch.testing.assert_close(weights.double(), 1.5 * picked / picked.sum(-1, keepdim=True))


def _moe_float64(
    x: torch.Tensor,
    weights: torch.Tensor,
    indices: torch.Tensor,
    *,
    w13: torch.Tensor,
    w2: torch.Tensor,
    limit: float,
) -> torch.Tensor:
    """Routed SwiGLU experts token by token in float64, straight from the spec."""
    inter = w2.shape[-1]
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for slot in range(indices.shape[1]):
            e = int(indices[t, slot])
            if e < 0:
                continue
            gate = w13[e, :inter].double() @ x[t].double()
            up = w13[e, inter:].double() @ x[t].double()
            if limit > 0:
                gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
            h = torch.nn.functional.silu(gate) * up * weights[t, slot].double()
            out[t] += w2[e].double() @ h
    return out


@pytest.mark.parametrize("grouped", [True, False], ids=["grouped-mm", "per-expert"])
def test_moe_experts_match_float64_per_token(
    grouped: bool, monkeypatch: pytest.MonkeyPatch
) -> None:

    if not grouped:  # the path for devices/dtypes without a grouped matmul
        monkeypatch.setitem(moe_ref.GROUPED_MM, ("cpu", torch.float32), None)
    n, d, inter, experts, k, limit = 13, 16, 8, 6, 2, 1.5
    x = torch.randn(n, d, generator=g)
    w13 = torch.randn(experts, 2 * inter, d, generator=g)
    w2 = torch.randn(experts, d, inter, generator=g)
    indices = torch.rand(n, experts, generator=g).argsort(-1)[:, :k]
    indices[3, 1] = -1  # an expert another rank owns
    weights = torch.rand(n, k, generator=g)
    got = ops.moe_experts(x, weights, indices, w13=w13, w2=w2, swiglu_limit=limit)
    assert got.dtype == torch.float32
    want = _moe_float64(x, weights, indices, w13=w13, w2=w2, limit=limit)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


def test_moe_experts_fall_back_when_the_grouped_matmul_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:

    def refuse(*args: object, **kwargs: object) -> torch.Tensor:
        raise RuntimeError("grouped gemm: dims must be multiples of 8")

    key = ("cpu", torch.float32)
    x = torch.randn(5, 16, generator=g)
    w13, w2 = torch.randn(3, 16, 16, generator=g), torch.randn(3, 16, 8, generator=g)
    indices = torch.tensor([[0, 1], [1, 2], [2, 0], [0, 2], [1, 0]])
    weights = torch.rand(5, 2, generator=g)
    monkeypatch.setitem(moe_ref.GROUPED_MM, key, refuse)
    with pytest.warns(RuntimeWarning, match="one matmul per expert"):
        got = ops.moe_experts(x, weights, indices, w13=w13, w2=w2, swiglu_limit=0.0)
    want = _moe_float64(x, weights, indices, w13=w13, w2=w2, limit=0.0)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
    assert moe_ref.GROUPED_MM[key] is None  # decided once, not retried every call


def test_query_blocking_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    import deepinfer.backends.torch_ref as ref

    q = torch.randn(2, 9, 3, 8, generator=g)
    kv = torch.randn(2, 11, 8, generator=g)
    mask = torch.rand(2, 9, 11, generator=g) > 0.3
    sinks = torch.randn(3, generator=g)
    qi = torch.randn(2, 9, 4, 8, generator=g)
    keys = torch.randn(2, 11, 8, generator=g)
    w = torch.randn(2, 9, 4, generator=g)
    vis = torch.arange(9) + 2
    whole = ops.attention(q, kv, mask, sinks, 0.3), ops.indexer_topk(qi, keys, w, vis, 5)
    monkeypatch.setattr(ref, "MAX_SCORE_ELEMENTS", 2 * 3 * 11 * 2)  # two query rows per block
    blocked = ops.attention(q, kv, mask, sinks, 0.3), ops.indexer_topk(qi, keys, w, vis, 5)
    torch.testing.assert_close(blocked[0], whole[0], atol=1e-6, rtol=0)
    assert torch.equal(blocked[1], whole[1])


def test_stable_topk_is_the_head_of_a_stable_descending_sort() -> None:
    """Against Python's sort by (-score, index) on tie-heavy rows with -0.0, +-inf."""
    from deepinfer.backends.topk_ref import stable_topk

    gen = torch.Generator().manual_seed(8)
    for _ in range(50):
        t = int(torch.randint(1, 120, (1,), generator=gen))
        k = int(torch.randint(1, t + 1, (1,), generator=gen))
        x = torch.round(torch.randn(4, t, generator=gen) * 2) / 2  # many equal values
        x[..., ::5] = -0.0  # equal to +0.0: must tie with it
        x[torch.rand(4, t, generator=gen) < 0.2] = float("-inf")
        x[torch.rand(4, t, generator=gen) < 0.05] = float("inf")
        got = stable_topk(x, k)
        for row in range(4):
            values = x[row].tolist()
            want = sorted(range(t), key=lambda i: (-values[i], i))[:k]
            assert got[row].tolist() == want


def test_indexer_picks_do_not_depend_on_masked_entries() -> None:
    """Tied scores (ReLU zeros) resolve to the lowest entries, however many masked entries
    follow: a captured decode step reads a full-capacity entry buffer, an eager one does not."""
    gen = torch.Generator().manual_seed(5)
    b, heads, c, t, k = 3, 4, 8, 40, 16
    q = torch.randn(b, 1, heads, c, generator=gen)
    keys = torch.randn(b, t, c, generator=gen)
    keys[:, ::3] = 0.0  # every third entry scores exactly 0: a tie among many
    weights = torch.rand(b, 1, heads, generator=gen)
    n_visible = torch.tensor([[t], [t - 5], [12]])
    want = ops.indexer_topk(q, keys, weights, n_visible, k)
    padded = torch.cat((keys, torch.randn(b, 1000, c, generator=gen)), dim=1)
    got = ops.indexer_topk(q, padded, weights, n_visible, k)
    assert torch.equal(got, want)
    # Among the tied zeros the lowest entries win: each row's picks are its k best scores,
    # with equal scores ordered by entry id.
    for row in range(b):
        scores = torch.einsum("hc,tc->ht", q[row, 0], keys[row]).relu()
        scores = (scores * weights[row, 0, :, None]).sum(0)[: int(n_visible[row, 0])]
        order = sorted(range(len(scores)), key=lambda i: (-float(scores[i]), i))[:k]
        picked = [i for i in want[row, 0].tolist() if i >= 0]
        assert picked == order


@pytest.mark.parametrize("lead", [(1, 1), (3, 1), (1, 7), (2, 5)], ids=str)
def test_grouped_linear_is_each_group_against_float64(lead: tuple[int, ...]) -> None:
    """The grouped output projection: group j of ``x`` through rows j of the weight, against a
    float64 recomputation per group; written token-major, so the (g, o) flatten that feeds
    ``wo_b`` is a view; with gradients on, the same values and the float64 gradient."""
    g = torch.Generator().manual_seed(sum(lead))
    groups, width, rows = 4, 64, 32
    x = torch.randn(*lead, groups, width, generator=g)
    weight = torch.randn(groups * rows, width, generator=g) / width**0.5
    want = torch.stack(
        [
            x[..., j, :].double() @ weight[j * rows : (j + 1) * rows].double().T
            for j in range(groups)
        ],
        dim=-2,
    )
    ops = TorchBackend("cpu")
    got = ops.grouped_linear(x, weight)
    assert got.shape == (*lead, groups, rows) and got.is_contiguous()
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
    assert got.flatten(-2).data_ptr() == got.data_ptr()
    xg = x.clone().requires_grad_(True)
    trained = ops.grouped_linear(xg, weight)
    torch.testing.assert_close(trained.double(), want, atol=1e-5, rtol=1e-5)
    trained.sum().backward()
    grad = weight.double().view(groups, rows, width).sum(1).expand(*lead, groups, width)
    assert xg.grad is not None
    torch.testing.assert_close(xg.grad.double(), grad, atol=1e-5, rtol=1e-5)
